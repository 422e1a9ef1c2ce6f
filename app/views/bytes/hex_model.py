"""Lazy table model over the memory-mapped bytes: 16 bytes per row, one page of rows at a time.

A 2 GiB file has 134 million rows; item views cannot hold that many (header sections are 32-bit
pixel positions). So the model exposes a *page*: ``page_rows`` rows starting at ``base_row``,
and the hex view drives ``base_row`` from its own scroll bar over all rows. The page's bytes are read
once per page (a few hundred bytes); :class:`HexDelegate` paints each cell straight from them (one Python
call per cell, not one per cell and item-data role).
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

import numpy as np
from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, Qt
from PySide6.QtGui import QColor, QFontDatabase, QPainter, QPen
from PySide6.QtWidgets import QStyle, QStyledItemDelegate, QStyleOptionViewItem

from kvscope.app.base.theme import BOOKMARK_COLOR, kind_color
from kvscope.app.document.source import IndexedBytes
from kvscope.core.reader.tree import Node

BYTES_PER_ROW = 16
ASCII_COL = BYTES_PER_ROW
Index = QModelIndex | QPersistentModelIndex


class HexModel(QAbstractTableModel):
    """One page of a hex dump: columns 0..15 are bytes, column 16 their ASCII."""

    def __init__(self, parent: Any = None) -> None:
        super().__init__(parent)
        self.buf: IndexedBytes = np.zeros(0, np.uint8)
        self.base_row = 0
        self.page_rows = 32
        self.highlight: tuple[int, int] | None = None  # [start, end)
        self._leaves: list[Node] = []
        self._starts: list[int] = []
        self._tints: dict[str, QColor] = {}
        self._hl = QColor("#3d8ee6")
        self._dark = False
        self._font = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
        self._page: tuple[int, bytes] | None = None  # (first offset, bytes) of the page shown
        self.marks: list[tuple[int, int, str]] = []  # bookmarked ranges [start, end) and their names

    # -- setup ------------------------------------------------------------------------------------
    def set_data(self, buf: IndexedBytes, leaves: list[Node]) -> None:
        self.beginResetModel()
        self.buf = buf
        self.base_row = 0
        self.highlight = None
        self._page = None
        self._leaves = leaves
        self._starts = [n.offset for n in leaves]
        self.endResetModel()

    def set_colors(self, highlight: QColor, dark: bool) -> None:
        self._hl = QColor(highlight)
        self._hl.setAlpha(225 if dark else 150)  # over the dark kind tints the selection must stand out
        self._tints = {}
        self._dark = dark
        self._emit_all()

    @property
    def total_rows(self) -> int:
        return (int(self.buf.size) + BYTES_PER_ROW - 1) // BYTES_PER_ROW

    def set_page(self, base_row: int, page_rows: int) -> None:
        """Show rows ``[base_row, base_row + page_rows)`` of the file."""
        base_row = max(0, min(base_row, max(0, self.total_rows - 1)))
        page_rows = max(1, page_rows)
        old = self.rowCount()
        self.base_row, self.page_rows = base_row, page_rows
        self._page = None
        new = self.rowCount()
        if new != old:
            self.beginResetModel()
            self.endResetModel()
        else:
            self._emit_all()
            self.headerDataChanged.emit(Qt.Orientation.Vertical, 0, max(0, new - 1))

    def set_highlight(self, start: int, end: int) -> None:
        self.highlight = (start, end) if end > start else None
        self._emit_all()

    def set_marks(self, marks: list[tuple[int, int, str]]) -> None:
        """The bookmarked ranges (underlined in the bookmark colour, named in the tooltip)."""
        self.marks = sorted(marks)
        self._emit_all()

    def marks_at(self, offset: int) -> list[str]:
        """The names of the bookmarks holding byte ``offset``."""
        return [name for a, b, name in self.marks if a <= offset < b]

    def _emit_all(self) -> None:
        if self.rowCount():
            self.dataChanged.emit(self.index(0, 0), self.index(self.rowCount() - 1, ASCII_COL))

    # -- addressing --------------------------------------------------------------------------------
    def offset_of(self, row: int, col: int) -> int:
        """Absolute offset of a byte cell (the row's first byte for the ASCII column)."""
        return (self.base_row + row) * BYTES_PER_ROW + (0 if col == ASCII_COL else col)

    def cell_of(self, offset: int) -> tuple[int, int] | None:
        """(row, col) of ``offset`` on the current page, or None when it is not shown."""
        row = offset // BYTES_PER_ROW - self.base_row
        if 0 <= row < self.rowCount() and 0 <= offset < self.buf.size:
            return row, offset % BYTES_PER_ROW
        return None

    def _leaf_at(self, offset: int) -> Node | None:
        i = bisect_right(self._starts, offset) - 1
        return self._leaves[i] if 0 <= i < len(self._leaves) and offset < self._leaves[i].end else None

    def _tint(self, kind: str, status: str) -> QColor:
        key = f"{kind}/{status}"
        c = self._tints.get(key)
        if c is None:
            c = kind_color("unparsed" if status == "unparsed" else kind)
            c.setAlpha(70 if self._dark else 45)
            self._tints[key] = c
        return c

    def page_bytes(self) -> tuple[int, bytes]:
        """(first offset, bytes) of the rows shown, read once per page."""
        if self._page is None:
            start = self.base_row * BYTES_PER_ROW
            end = min(int(self.buf.size), start + self.page_rows * BYTES_PER_ROW)
            self._page = (start, bytes(np.asarray(self.buf[start:end], dtype=np.uint8).tobytes()) if end > start
                          else b"")
        return self._page

    def cell_text(self, row: int, col: int) -> str:
        """What cell ``(row, col)`` of the page shows: a byte in hex, or the row's ASCII."""
        first, page = self.page_bytes()
        at = (self.base_row + row) * BYTES_PER_ROW - first
        if col == ASCII_COL:
            return "".join(chr(b) if 32 <= b < 127 else "." for b in page[at : at + BYTES_PER_ROW])
        i = at + col
        return f"{page[i]:02x}" if 0 <= i < len(page) else ""

    def cell_color(self, row: int, col: int) -> QColor | None:
        """The background of a byte cell: the selection, else its leaf kind's tint."""
        if col == ASCII_COL:
            return None
        off = (self.base_row + row) * BYTES_PER_ROW + col
        if off >= self.buf.size:
            return None
        hl = self.highlight
        if hl is not None and hl[0] <= off < hl[1]:
            return self._hl
        leaf = self._leaf_at(off)
        return self._tint(leaf.kind, leaf.status) if leaf is not None else None

    # -- Qt model API ------------------------------------------------------------------------------
    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        if parent.isValid():
            return 0
        return max(0, min(self.page_rows, self.total_rows - self.base_row))

    def columnCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else BYTES_PER_ROW + 1

    def headerData(self, section: int, orientation: Qt.Orientation,
                   role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if role == Qt.ItemDataRole.FontRole:
            return self._font
        if role != Qt.ItemDataRole.DisplayRole:
            return None
        if orientation == Qt.Orientation.Horizontal:
            return "ASCII" if section == ASCII_COL else f"{section:X}"
        return f"{(self.base_row + section) * BYTES_PER_ROW:08x}"

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        row, col = index.row(), index.column()
        start = (self.base_row + row) * BYTES_PER_ROW
        if role == Qt.ItemDataRole.DisplayRole:
            return self.cell_text(row, col)
        if role == Qt.ItemDataRole.FontRole:
            return self._font
        if role == Qt.ItemDataRole.TextAlignmentRole:
            return int(Qt.AlignmentFlag.AlignCenter if col != ASCII_COL else Qt.AlignmentFlag.AlignLeft
                       | Qt.AlignmentFlag.AlignVCenter)
        if col == ASCII_COL:
            return None
        off = start + col
        if role == Qt.ItemDataRole.BackgroundRole:
            return self.cell_color(row, col)
        if role == Qt.ItemDataRole.ToolTipRole and off < self.buf.size:
            leaf = self._leaf_at(off)
            where = f"\n{leaf.path} ({leaf.kind}, {leaf.status})" if leaf is not None else ""
            marked = "".join(f"\nbookmark: {name}" for name in self.marks_at(off))
            return f"offset {off:,} (0x{off:x}){where}{marked}"
        return None


class HexDelegate(QStyledItemDelegate):
    """Paints a hex cell from the model's page bytes: background, text, and a frame on the cursor cell."""

    def __init__(self, model: HexModel, parent: Any = None) -> None:
        super().__init__(parent)
        self.model = model
        self._center = Qt.AlignmentFlag.AlignCenter
        self._left = Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: Index) -> None:
        row, col = index.row(), index.column()
        m = self.model
        rect = option.rect
        color = m.cell_color(row, col)
        if color is not None:
            painter.fillRect(rect, color)
        painter.setFont(m._font)
        painter.setPen(option.palette.text().color())
        text_rect = rect.adjusted(4, 0, -2, 0) if col == ASCII_COL else rect
        painter.drawText(text_rect, self._left if col == ASCII_COL else self._center, m.cell_text(row, col))
        if col != ASCII_COL and m.marks and m.marks_at(m.offset_of(row, col)):
            painter.fillRect(rect.adjusted(0, rect.height() - 3, 0, 0), QColor(BOOKMARK_COLOR))
        if option.state & QStyle.StateFlag.State_HasFocus:
            painter.setPen(QPen(option.palette.highlight().color(), 1.5))
            painter.drawRect(rect.adjusted(1, 1, -1, -1))
