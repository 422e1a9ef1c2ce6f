"""Hex view: a paged table over the file's bytes, its own scroll bar over all rows, a find bar and a data inspector.

Selection works as in hex editors: click a byte, shift+click / drag / shift+arrows to select a range; the
range is the document's selection (every view follows it). Ctrl+C copies the selected bytes as hex; the
context menu copies them as a C array, Python bytes or values (decoded as the record's own type), copies
the offset or node path, goes to an offset, selects the node, exports the bytes or the view, bookmarks the
range (Ctrl+B; the Bookmarks tab beside lists them, a click jumps back). The inspector shows the cursor
byte as every common type and the selection as its record's values.

This module paints, pages and selects; what is done with the selection lives beside it: copying,
exporting, finding and the context menu in :mod:`~kvscope.app.views.bytes.hex_actions`, corrupting into
a copy in :mod:`~kvscope.app.views.bytes.corrupt_action`, the bookmarks list in
:mod:`~kvscope.app.views.bytes.bookmarks_panel`.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QItemSelectionModel, QModelIndex, QPoint, Qt, Signal
from PySide6.QtGui import QContextMenuEvent, QKeyEvent, QKeySequence, QMouseEvent, QResizeEvent, QWheelEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QMenu,
    QPlainTextEdit,
    QScrollBar,
    QSplitter,
    QTableView,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from kvscope.app.base.tasks import Task
from kvscope.app.base.widgets import plain_label
from kvscope.app.document.bookmark import Bookmark
from kvscope.app.document.doc_index import Selection
from kvscope.app.document.document import Document
from kvscope.app.views.bytes.bookmarks_panel import BookmarksPanel
from kvscope.app.views.bytes.corrupt_action import CorruptAction
from kvscope.app.views.bytes.corrupt_dialog import CorruptDialog
from kvscope.app.views.bytes.find_bar import FindBar
from kvscope.app.views.bytes.hex_actions import HexActions
from kvscope.app.views.bytes.hex_inspect import INSPECT_TYPES, inspect_values
from kvscope.app.views.bytes.hex_model import ASCII_COL, BYTES_PER_ROW, HexDelegate, HexModel
from kvscope.app.views.bytes.selection_values import Decoded, decode_selection
from kvscope.app.views.export import CsvTable, doc_export_button
from kvscope.core.reader.tree import Node

SHOWN_VALUES = 256  # values the inspector lists (the copy takes them all)
DUMP_FLOOR = 300  # the dump's minimum width (px)


class _HexTable(QTableView):
    """A table that never scrolls or selects by itself: wheel, keys and mouse go to the owning HexView."""

    def __init__(self, owner: HexView) -> None:
        super().__init__()
        self.owner = owner

    def wheelEvent(self, e: QWheelEvent) -> None:
        self.owner.scroll_rows(-round(e.angleDelta().y() / 40))

    def keyPressEvent(self, e: QKeyEvent) -> None:
        if not self.owner.handle_key(e):
            super().keyPressEvent(e)

    def mousePressEvent(self, e: QMouseEvent) -> None:
        off = self.owner.offset_at(e.position().toPoint())
        if off is None:
            return
        self.setFocus(Qt.FocusReason.MouseFocusReason)
        shift = bool(e.modifiers() & Qt.KeyboardModifier.ShiftModifier)
        if e.button() == Qt.MouseButton.LeftButton:
            self.owner.press(off, shift)
        elif e.button() == Qt.MouseButton.RightButton and not self.owner.in_selection(off):
            self.owner.press(off, False)
            self.owner.release()

    def mouseMoveEvent(self, e: QMouseEvent) -> None:
        if e.buttons() & Qt.MouseButton.LeftButton and self.owner.dragging:
            pos = e.position().toPoint()
            h = self.viewport().height()
            if pos.y() < 0:
                self.owner.scroll_rows(-1)
            elif pos.y() > h:
                self.owner.scroll_rows(1)
            pos.setY(max(1, min(h - 2, pos.y())))
            off = self.owner.offset_at(pos, clamp=True)
            if off is not None:
                self.owner.drag_to(off)

    def mouseReleaseEvent(self, e: QMouseEvent) -> None:
        if e.button() == Qt.MouseButton.LeftButton:
            self.owner.release()

    def mouseDoubleClickEvent(self, e: QMouseEvent) -> None:
        off = self.owner.offset_at(e.position().toPoint())
        if off is not None:
            self.owner.select_node_at(off)

    def contextMenuEvent(self, e: QContextMenuEvent) -> None:
        self.owner.context_menu(e.globalPos())

    def resizeEvent(self, e: QResizeEvent) -> None:
        super().resizeEvent(e)
        self.owner.fit_page()

    def viewportEvent(self, e: QEvent) -> bool:
        if e.type() == QEvent.Type.Resize:  # e.g. the horizontal scroll bar came or went: fewer or more rows
            self.owner.fit_page()
        return super().viewportEvent(e)


class HexView(QWidget):
    """16 bytes per row; the selected range is highlighted; the cursor byte and the range feed the inspector."""

    export_name = "hex"
    copyWritten = Signal(str, str)  # (the corrupted copy's path, what was done to it)

    def __init__(self, doc: Document, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.doc = doc
        self.cursor_offset = 0
        self.anchor = 0  # where a shift-selection starts
        self.dragging = False
        self._dragged = False
        self.decoded: Decoded | None = None
        self.model = HexModel(self)
        self.table = _HexTable(self)
        self.table.setModel(self.model)
        self.table.setItemDelegate(HexDelegate(self.model, self.table))
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
        fm = self.table.fontMetrics()
        cw = fm.horizontalAdvance("00") + 9
        for c in range(BYTES_PER_ROW):
            hh.resizeSection(c, cw)
        self._char_w = fm.horizontalAdvance("M")
        hh.resizeSection(ASCII_COL, self._char_w * 16 + 16)
        hh.setStretchLastSection(False)  # the ASCII header as wide as its 16 columns, not over the empty rest
        self.scrollbar = QScrollBar(Qt.Orientation.Vertical)
        self.scrollbar.valueChanged.connect(self._on_scroll)
        self.find_bar = FindBar(doc, lambda: self.cursor_offset)
        self.find_bar.found.connect(self._on_found)
        self.find_bar.nodeFound.connect(self._on_node_found)
        self.find_bar.escaped.connect(lambda: self.table.setFocus())
        self.export_button = doc_export_button(self, doc)
        self.location = plain_label()
        self.location.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.location.setWordWrap(True)
        self.inspector = QTableWidget(len(INSPECT_TYPES), 2)
        self.inspector.setHorizontalHeaderLabels(["type", "value (little-endian)"])
        value_header = self.inspector.horizontalHeaderItem(1)
        assert value_header is not None  # made by setHorizontalHeaderLabels
        value_header.setToolTip("the bytes at the cursor read as each type, little-endian")
        self.inspector.verticalHeader().hide()
        self.inspector.horizontalHeader().setStretchLastSection(True)
        self.inspector.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.inspector.setWordWrap(False)
        self.inspector.verticalHeader().setDefaultSectionSize(self.inspector.fontMetrics().height() + 6)
        self.inspector.setColumnWidth(0, 52)
        for r, t in enumerate(INSPECT_TYPES):
            self.inspector.setItem(r, 0, QTableWidgetItem(t))
            self.inspector.setItem(r, 1, QTableWidgetItem("-"))
        self.values = QPlainTextEdit()
        self.values.setReadOnly(True)
        self.values.setPlaceholderText("Select bytes of a K/V/r/s payload or the token array to see their values.")
        side = QWidget()
        sl = QVBoxLayout(side)
        sl.setContentsMargins(0, 0, 0, 0)
        sl.addWidget(self.location)
        sl.addWidget(self.inspector, 3)
        self.bookmarks = BookmarksPanel(doc, lambda: self.selection)
        self.bookmarks.jump.connect(lambda a, b: self.select_range(a, b, cursor=a))
        self.side_tabs = QTabWidget()  # the selection's values, the file's bookmarks
        self.side_tabs.setDocumentMode(True)
        self.side_tabs.addTab(self.values, "Values")
        self.side_tabs.addTab(self.bookmarks, "Bookmarks")
        self.side_tabs.setTabToolTip(0, "the selected bytes as their record's values, in its own type")
        doc.bookmarks.changed.connect(self._title_bookmarks)
        self._title_bookmarks()
        sl.addWidget(self.side_tabs, 2)
        side.setMinimumWidth(200)
        dump = QWidget()
        dl = QHBoxLayout(dump)
        dl.setContentsMargins(0, 0, 0, 0)
        dl.setSpacing(0)
        dl.addWidget(self.table, 1)
        dl.addWidget(self.scrollbar)
        # a floor, not the whole dump: an 800 px window must still fit (the dump scrolls sideways there); the
        # document widget narrows the tree so that all 16 hex and ASCII columns show when the window has room
        dump.setMinimumWidth(DUMP_FLOOR)
        self.side = side
        self.split = QSplitter(Qt.Orientation.Horizontal)
        self.split.addWidget(dump)
        self.split.addWidget(side)
        self.split.setStretchFactor(0, 1)
        self.split.setSizes([640, 260])
        top = QHBoxLayout()
        top.addWidget(self.find_bar, 1)
        top.addWidget(self.export_button)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(2)
        lay.addLayout(top)
        lay.addWidget(self.split, 1)
        self.table.selectionModel().currentChanged.connect(self._on_current)
        doc.loaded.connect(self._reload)
        doc.bus.changed.connect(self._on_selection)
        self._syncing = False
        self.byte_actions = HexActions(self, self)
        self.corrupter = CorruptAction(doc, lambda: self.selection, self, self.copyWritten.emit)
        self._reload()

    def wanted_width(self) -> int:
        """The width that shows the whole dump beside the inspector at its minimum (the document widget
        narrows the tree to give it, :meth:`~kvscope.app.shell.document_widget.DocumentWidget.give_hex_room`)."""
        return self.dump_width() + self.side.minimumWidth() + self.split.handleWidth() + 2

    def resizeEvent(self, e: QResizeEvent) -> None:
        super().resizeEvent(e)
        self.fit_dump()

    def fit_dump(self) -> None:
        """Narrow the inspector (not below its minimum) until the dump shows all its columns."""
        sizes = self.split.sizes()
        need = self.dump_width()
        if len(sizes) != 2 or sizes[0] >= need or sizes[1] <= self.side.minimumWidth():
            return
        side = max(self.side.minimumWidth(), sizes[1] - (need - sizes[0]))
        self.split.setSizes([sum(sizes) - side, side])

    def dump_width(self) -> int:
        """The width that shows the offsets, the 16 hex columns and the 16 ASCII columns whole."""
        hh, vh = self.table.horizontalHeader(), self.table.verticalHeader()
        offsets = max(vh.sizeHint().width(), self.table.fontMetrics().horizontalAdvance("00000000") + 12)
        cols = sum(hh.sectionSize(c) for c in range(hh.count()))
        return offsets + cols + 2 * self.table.frameWidth() + self.scrollbar.sizeHint().width() + 4

    # -- paging -----------------------------------------------------------------------------------
    def _reload(self) -> None:
        leaves = self.doc.index.leaves if self.doc.index is not None else []
        self.model.set_data(self.doc.data, leaves)
        self.model.set_colors(self.palette().highlight().color(), self.palette().window().color().lightness() < 128)
        self.cursor_offset = self.anchor = 0
        self.fit_page()
        self._update_inspector()
        self.update_values()

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
        if rows != self.scrollbar.pageStep():
            self.fit_page()
        if not (self.model.base_row <= row < self.model.base_row + rows):
            self.scrollbar.setValue(max(0, row - rows // 3))

    # -- addressing -------------------------------------------------------------------------------
    @property
    def n_bytes(self) -> int:
        """The file's size in bytes (``size()`` stays QWidget's)."""
        return int(self.doc.data.size)

    def offset_at(self, pos: QPoint, clamp: bool = False) -> int | None:
        """The byte under viewport point ``pos`` (a hex cell, or a character of the ASCII column)."""
        idx = self.table.indexAt(pos)
        if not idx.isValid():
            if not clamp:
                return None
            row = self.table.rowAt(pos.y())
            if row < 0:
                return None
            col = BYTES_PER_ROW - 1 if pos.x() > 0 else 0
            idx = self.model.index(row, col)
        col = idx.column()
        if col == ASCII_COL:
            x = pos.x() - self.table.columnViewportPosition(ASCII_COL) - 4
            col = max(0, min(BYTES_PER_ROW - 1, int(x // max(1, self._char_w))))
        off = self.model.offset_of(idx.row(), col)
        if off >= self.n_bytes:
            return self.n_bytes - 1 if clamp and self.n_bytes else None
        return off

    @property
    def selection(self) -> tuple[int, int]:
        """``(start, end)`` of the highlighted bytes (the cursor byte when nothing wider is selected)."""
        hl = self.model.highlight
        if hl is not None and hl[0] <= self.cursor_offset < hl[1]:
            return hl
        return self.cursor_offset, min(self.n_bytes, self.cursor_offset + 1)

    def in_selection(self, offset: int) -> bool:
        a, b = self.selection
        return a <= offset < b

    # -- cursor and selection -------------------------------------------------------------------------
    def _place_cursor(self) -> None:
        cell = self.model.cell_of(self.cursor_offset)
        self._syncing = True
        try:
            sm = self.table.selectionModel()
            if cell is None:
                sm.clearCurrentIndex()
                sm.clearSelection()
            else:
                sm.setCurrentIndex(self.model.index(*cell), QItemSelectionModel.SelectionFlag.NoUpdate)
        finally:
            self._syncing = False

    def goto(self, offset: int, publish: bool = False) -> None:
        """Move the cursor (and the selection anchor) to ``offset``, clamped to the file, and scroll it into view."""
        if self.n_bytes == 0:
            return
        self.cursor_offset = self.anchor = max(0, min(offset, self.n_bytes - 1))
        self.ensure_visible(self.cursor_offset)
        self._place_cursor()
        self._update_inspector()
        if publish and self.doc.index is not None:
            self.doc.bus.select(self.doc.index.for_offset(self.cursor_offset), origin=self)

    def select_range(self, start: int, end: int, cursor: int | None = None, publish: bool = True) -> None:
        """Select bytes ``[start, end)`` (clamped to the file); the cursor goes to ``cursor`` (default: the end)."""
        if self.n_bytes == 0:
            return
        start = max(0, min(start, self.n_bytes - 1))
        end = max(start + 1, min(end, self.n_bytes))
        cur = end - 1 if cursor is None else max(start, min(cursor, end - 1))
        self.cursor_offset = cur
        self.anchor = start if cur != start else end - 1
        self.ensure_visible(cur)
        self._place_cursor()
        self.model.set_highlight(start, end)
        self._update_inspector()
        if publish and self.doc.index is not None:
            sel = self.doc.index.for_offset(start)
            self.doc.bus.select(Selection(start, end - start, sel.node, cursor=cur, record=sel.record,
                                          table=sel.table, cell=sel.cell, token=sel.token), origin=self)
        self.update_values()

    def extend_to(self, offset: int, publish: bool = True) -> None:
        """Grow or shrink the selection from the anchor to ``offset`` (shift+click, shift+arrows)."""
        offset = max(0, min(offset, self.n_bytes - 1))
        lo, hi = min(self.anchor, offset), max(self.anchor, offset) + 1
        anchor = self.anchor
        self.select_range(lo, hi, cursor=offset, publish=publish)
        self.anchor = anchor

    def press(self, offset: int, shift: bool) -> None:
        self.dragging, self._dragged = True, False
        if shift:
            self.extend_to(offset)
        else:
            self.goto(offset, publish=True)

    def drag_to(self, offset: int) -> None:
        if offset != self.cursor_offset or self._dragged:
            self._dragged = True
            self.extend_to(offset, publish=False)

    def release(self) -> None:
        if self.dragging and self._dragged:
            self.extend_to(self.cursor_offset)
        self.dragging = self._dragged = False

    def select_node_at(self, offset: int) -> None:
        """Select the whole leaf holding ``offset``."""
        idx = self.doc.index
        leaf = idx.leaf_at(offset) if idx is not None else None
        if leaf is not None and idx is not None:
            self.doc.bus.select(idx.for_node(leaf))

    def select_all(self) -> None:
        if self.n_bytes:
            self.select_range(0, self.n_bytes, cursor=0)

    def _title_bookmarks(self) -> None:
        n = len(self.doc.bookmarks.items)
        self.model.set_marks([(b.start, b.end, b.name) for b in self.doc.bookmarks.items])
        self.side_tabs.setTabText(1, f"Bookmarks ({n:,})" if n else "Bookmarks")

    def bookmark_selection(self) -> None:
        """Bookmark the selected bytes (asks for a name) and show the list."""
        self.side_tabs.setCurrentWidget(self.bookmarks)
        self.bookmarks.ask_add()

    def handle_key(self, e: QKeyEvent) -> bool:
        if e.key() == Qt.Key.Key_B and e.modifiers() == Qt.KeyboardModifier.ControlModifier:
            self.bookmark_selection()
            return True
        if e.matches(QKeySequence.StandardKey.Copy):
            self.copy("hex")
            return True
        if e.matches(QKeySequence.StandardKey.SelectAll):
            self.select_all()
            return True
        key = e.key()
        rows = self.visible_rows()
        moves = {
            Qt.Key.Key_Left: -1, Qt.Key.Key_Right: 1, Qt.Key.Key_Up: -BYTES_PER_ROW, Qt.Key.Key_Down: BYTES_PER_ROW,
            Qt.Key.Key_PageUp: -BYTES_PER_ROW * rows, Qt.Key.Key_PageDown: BYTES_PER_ROW * rows,
        }
        shift = bool(e.modifiers() & Qt.KeyboardModifier.ShiftModifier)
        target: int | None = None
        if key in moves:
            target = self.cursor_offset + moves[Qt.Key(key)]
        elif key == Qt.Key.Key_Home:
            target = 0
        elif key == Qt.Key.Key_End:
            target = self.n_bytes - 1
        if target is None:
            return False
        if shift:
            self.extend_to(target)
        else:
            self.goto(target, publish=True)
        return True

    def _on_current(self, current: QModelIndex, _prev: QModelIndex) -> None:
        if self._syncing or not current.isValid():
            return
        off = self.model.offset_of(current.row(), current.column())
        if off < self.n_bytes:
            self.goto(off, publish=True)

    def _on_selection(self, sel: Selection) -> None:
        self.model.set_highlight(sel.offset, sel.offset + sel.length)
        if sel.origin is self:
            return
        self.goto(sel.at)
        if sel.length > 1:
            self.anchor = sel.offset
        self.update_values()

    def _on_found(self, offset: int, length: int) -> None:
        self.select_range(offset, offset + length, cursor=offset)

    def _on_node_found(self, node: Node) -> None:
        if self.doc.index is not None:
            self.doc.bus.select(self.doc.index.for_node(node))

    def focus_find(self, kind: str | None = None) -> None:
        self.find_bar.focus(kind)

    # -- inspector ------------------------------------------------------------------------------------
    def _update_inspector(self) -> None:
        off = self.cursor_offset
        leaf = self.doc.index.leaf_at(off) if self.doc.index is not None else None
        where = f" · {leaf.path}" if leaf is not None else ""
        a, b = self.selection
        span = f" · selected {b - a:,} bytes [{a:,}, {b:,})" if b - a > 1 else ""
        self.location.setText(f"offset {off:,} (0x{off:x}){where}{span}")
        self.location.setToolTip(self.location.text())
        for r, (_, text) in enumerate(inspect_values(self.doc.data, off)):
            item = self.inspector.item(r, 1)
            if item is not None:
                item.setText(text)

    def update_values(self) -> Decoded | None:
        """Decode the selection as its record's values into the Values tab; the decoded values (None: untyped)."""
        a, b = self.selection
        idx = self.doc.index
        self.decoded = decode_selection(idx, self.doc.data, a, b - a) if idx is not None and b > a else None
        d = self.decoded
        self.values.setPlainText("" if d is None else f"{d.summary()}\n{d.text(SHOWN_VALUES)}")
        return d

    # -- actions (hex_actions, corrupt_action, bookmarks_panel) ---------------------------------------
    def copy(self, fmt: str = "hex") -> str | None:
        """Copy the selected bytes as ``hex``, ``c`` or ``python`` (:meth:`HexActions.copy`)."""
        return self.byte_actions.copy(fmt)

    def copy_values(self) -> str | None:
        return self.byte_actions.copy_values()

    def copy_offset(self) -> str:
        return self.byte_actions.copy_offset()

    def copy_path(self) -> str | None:
        return self.byte_actions.copy_path()

    def context_menu(self, at: QPoint) -> QMenu:
        """The context menu of the bytes (shown at global point ``at``; returned for tests)."""
        return self.byte_actions.context_menu(at)

    def build_menu(self) -> QMenu:
        return self.byte_actions.build_menu()

    def ask_goto(self) -> None:
        self.byte_actions.ask_goto()

    def find_selection(self) -> None:
        self.byte_actions.find_selection()

    def export_bytes(self, path: str) -> Task | None:
        """Write the selected bytes to ``path`` (:meth:`HexActions.export_bytes`)."""
        return self.byte_actions.export_bytes(path)

    def corrupt_selection(self) -> CorruptDialog | None:
        """Ask how to corrupt the selection and the copy's name (window-modal); the copy is written on OK."""
        return self.corrupter.ask()

    def write_corrupted(self, mode: str, dest: str, seed: int = 0) -> Task | None:
        """Write the selection corrupted by ``mode`` to ``dest`` (a new file, atomically, in the background);
        ``copyWritten(path, what was done)`` when it is there."""
        return self.corrupter.write(mode, dest, seed)

    def note_on_bookmark(self, b: Bookmark) -> None:
        """Edit the note of bookmark ``b`` (in the Bookmarks tab)."""
        self.side_tabs.setCurrentWidget(self.bookmarks)
        self.bookmarks.note_on(b)

    # -- export ---------------------------------------------------------------------------------------
    def export_widget(self) -> QWidget:
        return self.split

    def csv_table(self) -> CsvTable | None:
        return None
