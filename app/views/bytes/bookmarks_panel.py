"""The bookmarks panel beside the hex dump: a file's named byte ranges and their notes.

A click selects the bookmarked bytes (every view follows, the hex view scrolls to them); Add bookmarks
the hex selection, Note… edits a bookmark's annotation, Remove deletes it. The bookmarks live in the
document (:class:`~kvscope.app.document.bookmarks.Bookmarks`, kept per file in the settings) and are
listed in the report the app exports.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QModelIndex, Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QInputDialog,
    QPushButton,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from kvscope.app.base.widgets import plain_label
from kvscope.app.document.bookmark import Bookmark
from kvscope.app.document.document import Document
from kvscope.app.views.row_model import RIGHT, RowTableModel
from kvscope.core.analysis.verdict import plural

COLUMNS = ("name", "offset", "bytes", "note")


class BookmarkModel(RowTableModel[Bookmark]):
    """The document's bookmarks, one a row; the tooltip has the node path and the whole note."""

    columns = COLUMNS

    def __init__(self, doc: Document, parent: Any = None) -> None:
        super().__init__(parent)
        self.doc = doc

    def cell(self, b: Bookmark, col: str, role: int) -> Any:
        if role == Qt.ItemDataRole.DisplayRole:
            return {"name": b.name, "offset": f"{b.start:,}", "bytes": f"{b.length:,}",
                    "note": b.note.replace("\n", " ")}[col]
        if role == Qt.ItemDataRole.ToolTipRole:
            leaf = self.doc.index.leaf_at(b.start) if self.doc.index is not None else None
            where = f"\n{leaf.path}" if leaf is not None else ""
            return f"{b.name}: {b.span_text()}, {plural(b.length, 'byte')}{where}" + (f"\n\n{b.note}" if b.note else "")
        if role == Qt.ItemDataRole.TextAlignmentRole and col in ("offset", "bytes"):
            return RIGHT
        return None


class BookmarksPanel(QWidget):
    """The list and its buttons; ``jump(start, end)`` asks the hex view to select a bookmark's bytes."""

    jump = Signal(int, int)

    def __init__(self, doc: Document, selection: Callable[[], tuple[int, int]], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.doc, self.selection = doc, selection
        self.model = BookmarkModel(doc, self)
        self.table = QTableView()
        self.table.setModel(self.model)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().hide()
        self.table.verticalHeader().setDefaultSectionSize(self.table.fontMetrics().height() + 6)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        self.table.setWordWrap(False)
        self.table.clicked.connect(self._on_click)
        self.table.activated.connect(self._on_click)
        self.add_button = QPushButton("Add")
        self.add_button.setToolTip("bookmark the selected bytes (Ctrl+B in the hex view)")
        self.note_button = QPushButton("Note…")
        self.note_button.setToolTip("write a note on the chosen bookmark")
        self.remove_button = QPushButton("Remove")
        self.add_button.clicked.connect(self.ask_add)
        self.note_button.clicked.connect(self.ask_note)
        self.remove_button.clicked.connect(self.remove_current)
        self.status = plain_label("", wrap=True)
        buttons = QHBoxLayout()
        buttons.setContentsMargins(0, 0, 0, 0)
        for b in (self.add_button, self.note_button, self.remove_button):
            buttons.addWidget(b)
        buttons.addStretch(1)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.table, 1)
        lay.addLayout(buttons)
        lay.addWidget(self.status)
        doc.bookmarks.changed.connect(self.refresh)
        doc.loaded.connect(self.refresh)
        self.refresh()

    def refresh(self) -> None:
        bm = self.doc.bookmarks
        self.model.set_rows(bm.items)
        self.table.resizeColumnsToContents()
        stale = bm.stale
        self.status.setText(("" if bm.items else "No bookmarks: select bytes and press Add (Ctrl+B in the dump).")
                            + (f"Offsets may have moved: {stale}." if stale else ""))
        has = self.current_row() is not None
        self.note_button.setEnabled(has)
        self.remove_button.setEnabled(has)

    def current_row(self) -> int | None:
        rows = self.table.selectionModel().selectedRows()
        return rows[0].row() if rows and rows[0].row() < len(self.doc.bookmarks.items) else None

    def _on_click(self, index: QModelIndex) -> None:
        if index.isValid():
            b = self.doc.bookmarks.items[index.row()]
            self.note_button.setEnabled(True)
            self.remove_button.setEnabled(True)
            self.jump.emit(b.start, b.end)

    def default_name(self, start: int) -> str:
        leaf = self.doc.index.leaf_at(start) if self.doc.index is not None else None
        return leaf.path if leaf is not None else f"bytes at {start:,}"

    def add(self, name: str | None = None, note: str = "") -> Bookmark | None:
        """Bookmark the hex selection as ``name`` (default: the node path at its start)."""
        start, end = self.selection()
        if end <= start:
            return None
        return self.doc.bookmarks.add(start, end, self.default_name(start) if name is None else name, note)

    def ask_add(self) -> None:
        start, end = self.selection()
        if end <= start:
            return
        name, ok = QInputDialog.getText(self, "Bookmark", f"Name for bytes [{start:,}, {end:,}):",
                                        text=self.default_name(start))
        if ok:
            self.add(name)

    def ask_note(self) -> None:
        i = self.current_row()
        if i is None:
            return
        b = self.doc.bookmarks.items[i]
        text, ok = QInputDialog.getMultiLineText(self, "Note", f"Note on {b.name}:", b.note)
        if ok:
            self.doc.bookmarks.update(i, note=text)

    def note_on(self, b: Bookmark) -> None:
        """Select bookmark ``b`` and edit its note."""
        items = self.doc.bookmarks.items
        if b in items:
            self.table.selectRow(items.index(b))
            self.ask_note()

    def remove_current(self) -> None:
        i = self.current_row()
        if i is not None:
            self.doc.bookmarks.remove(i)
