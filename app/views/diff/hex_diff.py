"""The side-by-side hex diff: file A's bytes and file B's in one table, aligned by structure.

One row holds 16 bytes of A and the 16 bytes of B that face them (:mod:`kvscope.app.document.hex_align`:
the same record on the same row, a record only one file has beside an empty side), so the two sides
scroll as one. Bytes that differ are painted on a warning background, a side the other file lacks is
greyed; Next/Previous difference (F3 / Shift+F3) jump to the next row whose sides differ, wrapping. Only
the rows in view are read (a page of the table, its own scroll bar over all rows), so a file of any
size scrolls at once.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, QRect, Qt, Signal
from PySide6.QtGui import QColor, QFontDatabase, QFontMetrics, QKeySequence, QPainter, QShortcut, QWheelEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QPushButton,
    QScrollBar,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from kvscope.app.base.theme import WARNING_COLOR
from kvscope.app.base.widgets import plain_label
from kvscope.app.document.hex_align import ROW, Alignment, Row

Index = QModelIndex | QPersistentModelIndex
COLUMNS = ("structure", "A offset", "A bytes", "B offset", "B bytes")
A_BYTES, B_BYTES = 2, 4
ROW_ROLE = Qt.ItemDataRole.UserRole + 1
GROUP_GAP = 6  # px between the two halves of a side's 16 bytes
STRUCTURE_W = 96  # the structure column: the leaf's last two path parts (the whole path in the tooltip)


class HexDiffModel(QAbstractTableModel):
    """A page of the alignment's rows (``base`` .. ``base + page``)."""

    def __init__(self, parent: Any = None) -> None:
        super().__init__(parent)
        self.alignment: Alignment | None = None
        self.base, self.page = 0, 0
        self.current: int | None = None  # the row a jump landed on (drawn framed)
        self._cache: dict[int, tuple[Row, bytes, bytes]] = {}

    def set_alignment(self, al: Alignment | None) -> None:
        self.beginResetModel()
        self.alignment, self.base, self.current = al, 0, None
        self._cache.clear()
        self.endResetModel()

    @property
    def total_rows(self) -> int:
        return self.alignment.total_rows if self.alignment is not None else 0

    def set_page(self, base: int, page: int) -> None:
        self.beginResetModel()
        self.base, self.page = max(0, base), max(0, page)
        self._cache.clear()
        self.endResetModel()

    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else max(0, min(self.page, self.total_rows - self.base))

    def columnCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if role == Qt.ItemDataRole.DisplayRole:
            return COLUMNS[section] if orientation == Qt.Orientation.Horizontal else None
        return None

    def line(self, r: int) -> tuple[Row, bytes, bytes]:
        """Row ``r`` of the page: the aligned row and the bytes of each side."""
        hit = self._cache.get(r)
        if hit is None:
            assert self.alignment is not None
            row = self.alignment.row(self.base + r)
            a, b = self.alignment.bytes_of(row)
            hit = self._cache[r] = (row, a, b)
        return hit

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or self.alignment is None:
            return None
        row, a, b = self.line(index.row())
        col = index.column()
        if role == ROW_ROLE:
            return row, a, b
        seg = self.alignment.segments[row.segment]
        if role == Qt.ItemDataRole.DisplayRole:
            if col == 0:
                return "/".join(seg.path.split(" ↔ ")[0].split("/")[-2:]) if row.first else ""
            if col in (1, 3):
                off = row.a_off if col == 1 else row.b_off
                return "" if off is None else f"{off:08x}"
            return (a if col == A_BYTES else b).hex(" ")
        if role == Qt.ItemDataRole.ToolTipRole:
            where = [f"A {row.a_off:,}" if row.a_off is not None else "not in A",
                     f"B {row.b_off:,}" if row.b_off is not None else "not in B"]
            return f"{seg.path}\n" + " · ".join(where)
        return None


def byte_width(fm: QFontMetrics) -> int:
    """The width of one byte's cell: its two digits and a small gap."""
    return fm.horizontalAdvance("00") + 5


def bytes_width(fm: QFontMetrics) -> int:
    """The width of a side's 16 bytes (a gap after the eighth, as hex editors group them)."""
    return ROW * byte_width(fm) + GROUP_GAP + 8


class _BytesDelegate(QStyledItemDelegate):
    """Paints a side's 16 bytes, each that differs from the other side on the warning colour."""

    def __init__(self, view: HexDiffView) -> None:
        super().__init__(view)
        self.view = view

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: Index) -> None:
        line = index.data(ROW_ROLE)
        if line is None:
            super().paint(painter, option, index)
            return
        row, a, b = line
        mine, other = (a, b) if index.column() == A_BYTES else (b, a)
        rect: QRect = option.rect
        painter.save()
        fm = painter.fontMetrics()
        cw = byte_width(fm)
        pal = self.view.palette()
        if not mine:  # the other file has bytes here, this one none
            painter.fillRect(rect, pal.alternateBase())
            painter.setPen(pal.placeholderText().color())
            painter.drawText(rect.adjusted(4, 0, 0, 0), int(Qt.AlignmentFlag.AlignVCenter), "—")
            painter.restore()
            return
        bad = QColor(WARNING_COLOR)
        bad.setAlpha(150)
        for i, byte in enumerate(mine):
            cell = QRect(rect.left() + 4 + i * cw + (GROUP_GAP if i >= ROW // 2 else 0), rect.top(), cw - 2,
                         rect.height())
            if i >= len(other) or other[i] != byte:
                painter.fillRect(cell.adjusted(-1, 1, 1, -1), bad)
            painter.setPen(pal.text().color())
            painter.drawText(cell, int(Qt.AlignmentFlag.AlignCenter), f"{byte:02x}")
        if self.view.model.current == self.view.model.base + index.row():
            painter.setPen(pal.highlight().color())
            painter.drawRect(rect.adjusted(0, 0, -1, -1))
        painter.restore()


class _Table(QTableView):
    def __init__(self, owner: HexDiffView) -> None:
        super().__init__()
        self.owner = owner

    def wheelEvent(self, e: QWheelEvent) -> None:
        self.owner.scroll_rows(-round(e.angleDelta().y() / 40))


class HexDiffView(QWidget):
    """Both files' bytes, aligned and scroll-locked; ``jumped(row)`` after a jump to a difference."""

    jumped = Signal(int)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.model = HexDiffModel(self)
        self.table = _Table(self)
        self.table.setModel(self.model)
        font = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
        self.table.setFont(font)
        self.table.setItemDelegateForColumn(A_BYTES, _BytesDelegate(self))
        self.table.setItemDelegateForColumn(B_BYTES, _BytesDelegate(self))
        self.table.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.table.setShowGrid(False)
        self.table.setWordWrap(False)
        self.table.verticalHeader().hide()
        self.table.verticalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Fixed)
        self.table.verticalHeader().setDefaultSectionSize(self.table.fontMetrics().height() + 4)
        hh = self.table.horizontalHeader()
        hh.setSectionResizeMode(QHeaderView.ResizeMode.Fixed)
        fm = self.table.fontMetrics()
        off_w, side_w = fm.horizontalAdvance("00000000") + 10, bytes_width(fm)
        for col, w in ((0, STRUCTURE_W), (1, off_w), (A_BYTES, side_w), (3, off_w), (B_BYTES, side_w)):
            hh.resizeSection(col, w)
        hh.setSectionResizeMode(0, QHeaderView.ResizeMode.Interactive)
        self.table.setTextElideMode(Qt.TextElideMode.ElideLeft)
        self.scrollbar = QScrollBar(Qt.Orientation.Vertical)
        self.scrollbar.valueChanged.connect(self._on_scroll)
        self.prev_button = QPushButton("◀ Previous difference")
        self.next_button = QPushButton("Next difference ▶")
        self.prev_button.setToolTip("the previous row whose two sides differ (Shift+F3)")
        self.next_button.setToolTip("the next row whose two sides differ (F3)")
        self.prev_button.clicked.connect(lambda: self.jump(backward=True))
        self.next_button.clicked.connect(lambda: self.jump())
        for key, back in (("F3", False), ("Shift+F3", True)):
            sc = QShortcut(QKeySequence(key), self)
            sc.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
            sc.activated.connect(lambda back=back: self.jump(backward=back))
        self.status = plain_label(" ")
        top = QHBoxLayout()
        top.setContentsMargins(0, 0, 0, 0)
        top.addWidget(self.prev_button)
        top.addWidget(self.next_button)
        top.addWidget(self.status, 1)
        body = QHBoxLayout()
        body.setContentsMargins(0, 0, 0, 0)
        body.setSpacing(0)
        body.addWidget(self.table, 1)
        body.addWidget(self.scrollbar)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addLayout(top)
        lay.addLayout(body, 1)
        self._update_buttons()

    def wanted_width(self) -> int:
        """The width that shows every column whole (the document widget narrows the tree to give it)."""
        hh = self.table.horizontalHeader()
        return sum(hh.sectionSize(c) for c in range(hh.count())) + self.scrollbar.sizeHint().width() + \
            2 * self.table.frameWidth() + 4

    def set_alignment(self, al: Alignment | None) -> None:
        self.model.set_alignment(al)
        self.scrollbar.setValue(0)
        self.fit_page()
        self.status.setText(" " if al is None else
                            f"{al.total_rows:,} rows of {ROW} bytes, the same record side by side")
        self._update_buttons()

    def _update_buttons(self) -> None:
        on = self.model.alignment is not None
        self.prev_button.setEnabled(on)
        self.next_button.setEnabled(on)

    def visible_rows(self) -> int:
        return max(1, self.table.viewport().height() // max(1, self.table.verticalHeader().defaultSectionSize()))

    def fit_page(self) -> None:
        rows, total = self.visible_rows(), self.model.total_rows
        self.scrollbar.blockSignals(True)
        self.scrollbar.setRange(0, max(0, total - rows))
        self.scrollbar.setPageStep(rows)
        self.scrollbar.blockSignals(False)
        self.model.set_page(min(self.scrollbar.value(), max(0, total - rows)), rows)

    def resizeEvent(self, e: Any) -> None:
        super().resizeEvent(e)
        self.fit_page()

    def _on_scroll(self, value: int) -> None:
        self.model.set_page(value, self.visible_rows())

    def scroll_rows(self, delta: int) -> None:
        self.scrollbar.setValue(self.scrollbar.value() + delta)

    def show_row(self, row: int) -> None:
        """Scroll ``row`` into view (a third from the top) and frame it."""
        self.model.current = row
        rows = self.visible_rows()
        if not self.model.base <= row < self.model.base + rows:
            self.scrollbar.setValue(max(0, row - rows // 3))
        self.table.viewport().update()

    def show_offset(self, offset: int, side: str = "a") -> int | None:
        """Scroll to the row showing byte ``offset`` of file A (``side="b"``: of B)."""
        al = self.model.alignment
        row = al.row_of(offset, side) if al is not None else None
        if row is not None:
            self.show_row(row)
        return row

    def jump(self, backward: bool = False) -> int | None:
        """Go to the next (previous) row whose sides differ, wrapping; None when there is none."""
        al = self.model.alignment
        if al is None:
            return None
        cur = self.model.current if self.model.current is not None else (-1 if not backward else al.total_rows)
        row = al.next_diff(cur, backward)
        if row is None:
            self.status.setText("the aligned bytes are the same everywhere")
            return None
        self.show_row(row)
        r = al.row(row)
        seg = al.segments[r.segment]
        a = f"A {r.a_off:,}" if r.a_off is not None else "only in B"
        b = f"B {r.b_off:,}" if r.b_off is not None else "only in A"
        self.status.setText(f"row {row:,}: {seg.path} · {a} · {b}")
        self.jumped.emit(row)
        return row
