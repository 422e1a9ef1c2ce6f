"""Hex view: a paged table over the file's bytes, its own scroll bar over all rows, and a data inspector."""

from __future__ import annotations

from PySide6.QtCore import QItemSelectionModel, QModelIndex, Qt
from PySide6.QtGui import QKeyEvent, QResizeEvent, QWheelEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QScrollBar,
    QTableView,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from kvscope.app.base.widgets import plain_label
from kvscope.app.document.doc_index import Selection
from kvscope.app.document.document import Document
from kvscope.app.views.bytes.hex_inspect import INSPECT_TYPES, inspect_values
from kvscope.app.views.bytes.hex_model import ASCII_COL, BYTES_PER_ROW, HexModel


class _HexTable(QTableView):
    """A table that never scrolls itself: wheel and navigation keys go to the owning HexView."""

    def __init__(self, owner: HexView) -> None:
        super().__init__()
        self.owner = owner

    def wheelEvent(self, e: QWheelEvent) -> None:
        self.owner.scroll_rows(-round(e.angleDelta().y() / 40))

    def keyPressEvent(self, e: QKeyEvent) -> None:
        if not self.owner.handle_key(e.key()):
            super().keyPressEvent(e)

    def resizeEvent(self, e: QResizeEvent) -> None:
        super().resizeEvent(e)
        self.owner.fit_page()


class HexView(QWidget):
    """16 bytes per row; the selected node's bytes are highlighted; the cursor byte feeds the inspector."""

    def __init__(self, doc: Document, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.doc = doc
        self.cursor_offset = 0
        self.model = HexModel(self)
        self.table = _HexTable(self)
        self.table.setModel(self.model)
        self.table.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.table.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setShowGrid(False)
        self.table.setWordWrap(False)
        vh = self.table.verticalHeader()
        vh.setSectionResizeMode(QHeaderView.ResizeMode.Fixed)
        vh.setDefaultSectionSize(self.table.fontMetrics().height() + 4)
        hh = self.table.horizontalHeader()
        hh.setSectionResizeMode(QHeaderView.ResizeMode.Fixed)
        hh.setMinimumSectionSize(10)
        cw = self.table.fontMetrics().horizontalAdvance("00") + 9
        for c in range(BYTES_PER_ROW):
            hh.resizeSection(c, cw)
        hh.resizeSection(ASCII_COL, self.table.fontMetrics().horizontalAdvance("M" * 16) + 16)
        hh.setStretchLastSection(True)
        self.scrollbar = QScrollBar(Qt.Orientation.Vertical)
        self.scrollbar.valueChanged.connect(self._on_scroll)
        self.location = plain_label()
        self.location.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.inspector = QTableWidget(len(INSPECT_TYPES), 2)
        self.inspector.setHorizontalHeaderLabels(["type", "value (little-endian)"])
        self.inspector.verticalHeader().hide()
        self.inspector.horizontalHeader().setStretchLastSection(True)
        self.inspector.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.inspector.setFixedWidth(250)
        self.inspector.setWordWrap(False)
        self.inspector.verticalHeader().setDefaultSectionSize(self.inspector.fontMetrics().height() + 6)
        self.inspector.setColumnWidth(0, 52)
        self.location.setWordWrap(True)
        self.location.setFixedWidth(250)
        for r, t in enumerate(INSPECT_TYPES):
            self.inspector.setItem(r, 0, QTableWidgetItem(t))
            self.inspector.setItem(r, 1, QTableWidgetItem("-"))
        side = QVBoxLayout()
        side.addWidget(self.location)
        side.addWidget(self.inspector, 1)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(2)
        lay.addWidget(self.table, 1)
        lay.addWidget(self.scrollbar)
        lay.addLayout(side)
        self.table.selectionModel().currentChanged.connect(self._on_current)
        doc.loaded.connect(self._reload)
        doc.bus.changed.connect(self._on_selection)
        self._syncing = False
        self._reload()

    # -- paging -----------------------------------------------------------------------------------
    def _reload(self) -> None:
        leaves = self.doc.index.leaves if self.doc.index is not None else []
        self.model.set_data(self.doc.data, leaves)
        self.model.set_colors(self.palette().highlight().color(), self.palette().window().color().lightness() < 128)
        self.cursor_offset = 0
        self.fit_page()
        self._update_inspector()

    def visible_rows(self) -> int:
        h = self.table.viewport().height()
        return max(1, h // max(1, self.table.verticalHeader().defaultSectionSize()))

    def fit_page(self) -> None:
        rows = self.visible_rows()
        total = self.model.total_rows
        self.scrollbar.blockSignals(True)
        self.scrollbar.setRange(0, max(0, total - rows))
        self.scrollbar.setPageStep(rows)
        self.scrollbar.blockSignals(False)
        self.model.set_page(min(self.scrollbar.value(), max(0, total - rows)), rows)
        self._place_cursor()

    def _on_scroll(self, value: int) -> None:
        self.model.set_page(value, self.visible_rows())
        self._place_cursor()

    def scroll_rows(self, delta: int) -> None:
        self.scrollbar.setValue(self.scrollbar.value() + delta)

    def ensure_visible(self, offset: int) -> None:
        row = offset // BYTES_PER_ROW
        rows = self.visible_rows()
        if not (self.model.base_row <= row < self.model.base_row + rows):
            self.scrollbar.setValue(max(0, row - rows // 3))

    # -- cursor -----------------------------------------------------------------------------------
    def _place_cursor(self) -> None:
        cell = self.model.cell_of(self.cursor_offset)
        self._syncing = True
        try:
            sm = self.table.selectionModel()
            if cell is None:
                sm.clearCurrentIndex()
                sm.clearSelection()
            else:
                sm.setCurrentIndex(self.model.index(*cell), QItemSelectionModel.SelectionFlag.ClearAndSelect)
        finally:
            self._syncing = False

    def goto(self, offset: int, publish: bool = False) -> None:
        """Move the cursor to ``offset`` (clamped to the file) and scroll it into view."""
        size = int(self.doc.data.size)
        if size == 0:
            return
        self.cursor_offset = max(0, min(offset, size - 1))
        self.ensure_visible(self.cursor_offset)
        self._place_cursor()
        self._update_inspector()
        if publish and self.doc.index is not None:
            self.doc.bus.select(self.doc.index.for_offset(self.cursor_offset), origin=self)

    def handle_key(self, key: int) -> bool:
        moves = {
            Qt.Key.Key_Left: -1, Qt.Key.Key_Right: 1, Qt.Key.Key_Up: -BYTES_PER_ROW, Qt.Key.Key_Down: BYTES_PER_ROW,
            Qt.Key.Key_PageUp: -BYTES_PER_ROW * self.visible_rows(),
            Qt.Key.Key_PageDown: BYTES_PER_ROW * self.visible_rows(),
        }
        if key in moves:
            self.goto(self.cursor_offset + moves[Qt.Key(key)], publish=True)
            return True
        if key == Qt.Key.Key_Home:
            self.goto(0, publish=True)
            return True
        if key == Qt.Key.Key_End:
            self.goto(int(self.doc.data.size) - 1, publish=True)
            return True
        return False

    def _on_current(self, current: QModelIndex, _prev: QModelIndex) -> None:
        if self._syncing or not current.isValid():
            return
        off = self.model.offset_of(current.row(), current.column())
        if off < self.doc.data.size:
            self.goto(off, publish=True)

    def _update_inspector(self) -> None:
        off = self.cursor_offset
        leaf = self.doc.index.leaf_at(off) if self.doc.index is not None else None
        where = f" · {leaf.path}" if leaf is not None else ""
        self.location.setText(f"offset {off:,} (0x{off:x}){where}")
        self.location.setToolTip(self.location.text())
        for r, (_, text) in enumerate(inspect_values(self.doc.data, off)):
            item = self.inspector.item(r, 1)
            if item is not None:
                item.setText(text)

    def _on_selection(self, sel: Selection) -> None:
        self.model.set_highlight(sel.offset, sel.offset + sel.length)
        if sel.origin is self:
            return
        self.goto(sel.at)
