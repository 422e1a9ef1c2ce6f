"""Structure tree view with a find box: name, kind, offset, size, value and status of every node.

Ctrl+C copies the current node (name, kind, offset, size, value: tab-separated); the context menu copies
its name, path, offset or value, shows its bytes in the hex view, selects it, exports its bytes or the
tree. The value column comes second and takes the room left (long values elide in the middle; the tooltip
has them whole).
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QEvent, QItemSelectionModel, QModelIndex, QObject, QPoint, Qt, Signal
from PySide6.QtGui import QGuiApplication, QKeySequence
from PySide6.QtWidgets import QHBoxLayout, QHeaderView, QLineEdit, QMenu, QTreeView, QVBoxLayout, QWidget

from kvscope.app.base.shortcuts import pass_window_shortcuts
from kvscope.app.base.widgets import plain_label
from kvscope.app.document.doc_index import Selection
from kvscope.app.document.document import Document
from kvscope.app.views.export import CsvTable, doc_export_button
from kvscope.app.views.structure.node_find import find_node
from kvscope.app.views.structure.tree_model import COLUMNS, StructureModel, value_text
from kvscope.app.views.table_tools import install_copy
from kvscope.core.reader.record_names import record_labels
from kvscope.core.reader.tree import Node

VALUE_COLUMN = COLUMNS.index("value")
COPY_VALUE_LIMIT = 1 << 20  # characters of a value a copy takes at most


def node_row_text(node: Node) -> str:
    """The tab-separated line Ctrl+C copies: name, kind, offset, size, value."""
    return "\t".join((node.name, node.kind, str(node.offset), str(node.size), full_value(node)))


def full_value(node: Node) -> str:
    return value_text(node.value, COPY_VALUE_LIMIT)


class StructureView(QWidget):
    """The structure tree; selecting a row selects its node everywhere, and the other way round."""

    showBytes = Signal()  # "show in hex": the window brings the hex view to the front
    export_name = "tree"

    def __init__(self, doc: Document, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.doc = doc
        self.model = StructureModel()
        self.tree = QTreeView()
        self.tree.setModel(self.model)
        self.tree.setUniformRowHeights(True)
        self.tree.setIndentation(14)  # a record is 5 levels deep: Qt's 20 px a level left its name "K lay…" at 1280
        self.tree.setAlternatingRowColors(True)
        self.tree.setSelectionBehavior(QTreeView.SelectionBehavior.SelectRows)
        self.tree.setTextElideMode(Qt.TextElideMode.ElideRight)  # a record says which first: "V layer 2 (rest) in…"
        self.tree.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.tree.customContextMenuRequested.connect(self._on_menu)
        self._fitting = False
        self._value_sized = False
        self.tree.header().sectionResized.connect(self._on_section_resized)
        self.tree.viewport().installEventFilter(self)
        self._fit_columns()
        install_copy(self.tree, self.copy_row)
        self.find_edit = QLineEdit()
        self.find_edit.setPlaceholderText("Find node (name, kind, path, value)…  Enter: next")
        self.find_edit.setClearButtonEnabled(True)
        self.find_edit.setAcceptDrops(False)  # a dropped file opens (the window takes it)
        pass_window_shortcuts(self.find_edit)  # Ctrl+E exports, it does not move to the end of the text
        self.find_edit.returnPressed.connect(self.find_next)
        self.find_status = plain_label()
        self.export_button = doc_export_button(self, doc)
        top = QHBoxLayout()
        top.setContentsMargins(0, 0, 0, 0)
        top.addWidget(self.find_edit, 1)
        top.addWidget(self.find_status)
        top.addWidget(self.export_button)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addLayout(top)
        lay.addWidget(self.tree)
        self.tree.selectionModel().currentRowChanged.connect(self._on_current)
        doc.loaded.connect(self._reload)
        doc.bus.changed.connect(self._on_selection)
        self._syncing = False
        self._find_order: list[Node] = []
        self._reload()

    def _fit_columns(self, file_size: int = 1 << 33) -> None:
        """Shown as name | value | offset | size | kind | status: name and value get the room, the rest what
        their widest text needs (offsets and sizes as wide as this file's size)."""
        header = self.tree.header()
        fm = self.tree.fontMetrics()
        pad = 18
        number = fm.horizontalAdvance(f"{file_size:,}") + pad
        widths = {"name": 180, "kind": fm.horizontalAdvance("layer_header") + pad, "offset": number, "size": number,
                  "status": fm.horizontalAdvance("untrusted") + pad, "value": 160}
        header.setStretchLastSection(False)
        header.setMinimumSectionSize(36)
        self._fitting = True
        for col, name in enumerate(COLUMNS):
            header.setSectionResizeMode(col, QHeaderView.ResizeMode.Interactive)
            header.resizeSection(col, widths[name])
        for visual, name in enumerate(("name", "value", "offset", "size", "kind", "status")):
            header.moveSection(header.visualIndex(COLUMNS.index(name)), visual)
        self._fitting = False
        self._fit_value()

    VALUE_WANTED = 260  # the value column's width the tree asks for when there is room (wanted_width)

    def wanted_width(self) -> int:
        """The width that shows every column whole, the value column :data:`VALUE_WANTED` wide (the page
        gives the tree that much where the window has room for it)."""
        header = self.tree.header()
        others = sum(header.sectionSize(c) for c in range(len(COLUMNS)) if c != VALUE_COLUMN)
        chrome = 2 * self.tree.frameWidth() + self.tree.verticalScrollBar().sizeHint().width() + 4
        return others + self.VALUE_WANTED + chrome

    def _fit_value(self) -> None:
        """The value column takes the width the other columns leave (at least 150 px) until the user sizes it."""
        if self._value_sized:
            return
        header = self.tree.header()
        others = sum(header.sectionSize(c) for c in range(len(COLUMNS)) if c != VALUE_COLUMN)
        self._fitting = True
        header.resizeSection(VALUE_COLUMN, max(150, self.tree.viewport().width() - others))
        self._fitting = False

    def _on_section_resized(self, col: int, _old: int, _new: int) -> None:
        if not self._fitting and col == VALUE_COLUMN:
            self._value_sized = True

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:
        if obj is self.tree.viewport() and event.type() == QEvent.Type.Resize:
            self._fit_value()
        return super().eventFilter(obj, event)

    def _reload(self) -> None:
        res = self.doc.result
        labels = record_labels(res, self.doc.profile) if res is not None else None
        self.model.set_root(res.root if res is not None else None, labels)
        if res is not None:
            self._fit_columns(max(1, res.size))
        self._find_order = list(res.root.walk()) if res is not None else []
        if res is not None:
            root = self.model.index(0, 0)
            self.tree.expand(root)
            for r in range(self.model.rowCount(root)):
                child = self.model.index(r, 0, root)
                node = self.model.node(child)
                if node is not None and node.kind == "memory":
                    self.tree.expand(child)

    def current_node(self) -> Node | None:
        return self.model.node(self.tree.currentIndex())

    def _on_current(self, current: QModelIndex, _previous: QModelIndex) -> None:
        if self._syncing or self.doc.index is None:
            return
        node = self.model.node(current)
        if node is not None:
            self.doc.bus.select(self.doc.index.for_node(node), origin=self)

    def _on_selection(self, sel: Selection) -> None:
        if sel.origin is self or sel.node is None:
            return
        self.show_node(sel.node)

    def show_node(self, node: Node) -> None:
        """Expand to ``node``, make it current and scroll to it (without publishing a selection)."""
        idx = self.model.index_of(node)
        if not idx.isValid():
            return
        self._syncing = True
        try:
            self.tree.selectionModel().setCurrentIndex(
                idx, QItemSelectionModel.SelectionFlag.ClearAndSelect | QItemSelectionModel.SelectionFlag.Rows)
            self.tree.scrollTo(idx)
        finally:
            self._syncing = False

    def focus_find(self) -> None:
        self.find_edit.setFocus(Qt.FocusReason.ShortcutFocusReason)
        self.find_edit.selectAll()

    def find_next(self) -> Node | None:
        """Select the next node (after the current one, wrapping) matching the find text."""
        if not self.find_edit.text().strip() or not self._find_order or self.doc.index is None:
            self.find_status.setText("")
            return None
        node = find_node(self._find_order, self.find_edit.text(), self.current_node(), labels=self.model.labels)
        if node is None:
            self.find_status.setText("not found")
            return None
        self.show_node(node)
        self.doc.bus.select(self.doc.index.for_node(node), origin=self)
        self.find_status.setText("")
        return node

    # -- copy, menu, export ---------------------------------------------------------------------------
    def _clip(self, text: str, what: str) -> str:
        QGuiApplication.clipboard().setText(text)
        self.doc.message.emit(f"copied {what}")
        return text

    def copy_row(self) -> str | None:
        """Copy the current node as one tab-separated line: name, kind, offset, size, value."""
        node = self.current_node()
        return None if node is None else self._clip(node_row_text(node), f"node {node.path}")

    def copy_field(self, field: str) -> str | None:
        """Copy the current node's ``name``, ``path``, ``offset`` or ``value``."""
        node = self.current_node()
        if node is None:
            return None
        text = {"name": node.name, "path": node.path, "offset": str(node.offset), "value": full_value(node)}[field]
        return self._clip(text, f"the {field} of {node.path}")

    def show_in_hex(self) -> None:
        node = self.current_node()
        if node is not None and self.doc.index is not None:
            self.doc.bus.select(self.doc.index.for_node(node), origin=self)
            self.showBytes.emit()

    def _on_menu(self, pos: QPoint) -> None:
        if self.model.node(self.tree.indexAt(pos)) is not None:
            self.tree.setCurrentIndex(self.tree.indexAt(pos))
        self.build_menu().popup(self.tree.viewport().mapToGlobal(pos))

    def build_menu(self) -> QMenu:
        """The context menu of the current node (returned for tests)."""
        node = self.current_node()
        menu = QMenu(self)
        row = menu.addAction("Copy row (name, kind, offset, size, value)", self.copy_row)
        row.setShortcut(QKeySequence(QKeySequence.StandardKey.Copy))

        def copier(field: str) -> Callable[[], object]:
            return lambda: self.copy_field(field)

        for field in ("name", "path", "offset", "value"):
            a = menu.addAction(f"Copy {field}", copier(field))
            a.setEnabled(node is not None and (field != "value" or node.value is not None))
        menu.addSeparator()
        show = menu.addAction("Show bytes in Hex", self.show_in_hex)
        show.setEnabled(node is not None)
        expand = menu.addAction("Expand all below", lambda: self.tree.expandRecursively(self.tree.currentIndex()))
        expand.setEnabled(node is not None and bool(node.children))
        menu.addSeparator()
        menu.addAction("Export tree as CSV…", self.export_button.ask_csv)
        menu.addAction("Export view as PNG…", self.export_button.ask_png)
        return menu

    def export_widget(self) -> QWidget:
        return self.tree

    def csv_table(self) -> CsvTable | None:
        """Every node in file order: path, kind, offset, size, status and value."""
        res = self.doc.result
        if res is None:
            return None
        nodes = list(res.root.walk())
        return (["path", "kind", "offset", "size", "status", "value"],
                ([n.path, n.kind, n.offset, n.size, n.status, value_text(n.value, 400)] for n in nodes))
