"""Structure tree view with a find box: name, kind, offset, size, value and status of every node."""

from __future__ import annotations

from PySide6.QtCore import QItemSelectionModel, QModelIndex, Qt
from PySide6.QtWidgets import QHBoxLayout, QHeaderView, QLineEdit, QTreeView, QVBoxLayout, QWidget

from kvscope.app.base.widgets import plain_label
from kvscope.app.document.doc_index import Selection
from kvscope.app.document.document import Document
from kvscope.app.views.structure.tree_model import StructureModel
from kvscope.core.reader.tree import Node


class StructureView(QWidget):
    """The structure tree; selecting a row selects its node everywhere, and the other way round."""

    def __init__(self, doc: Document, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.doc = doc
        self.model = StructureModel()
        self.tree = QTreeView()
        self.tree.setModel(self.model)
        self.tree.setUniformRowHeights(True)
        self.tree.setAlternatingRowColors(True)
        self.tree.setSelectionBehavior(QTreeView.SelectionBehavior.SelectRows)
        header = self.tree.header()
        header.setStretchLastSection(False)
        header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        for col, width in enumerate((210, 85, 70, 62, 140, 64)):
            header.resizeSection(col, width)
        self.find_edit = QLineEdit()
        self.find_edit.setPlaceholderText("Find node (name, kind, path, value)…  Enter: next")
        self.find_edit.setClearButtonEnabled(True)
        self.find_edit.returnPressed.connect(self.find_next)
        self.find_status = plain_label()
        top = QHBoxLayout()
        top.setContentsMargins(0, 0, 0, 0)
        top.addWidget(self.find_edit, 1)
        top.addWidget(self.find_status)
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

    def _reload(self) -> None:
        res = self.doc.result
        self.model.set_root(res.root if res is not None else None)
        self._find_order = list(res.root.walk()) if res is not None else []
        if res is not None:
            root = self.model.index(0, 0)
            self.tree.expand(root)
            for r in range(self.model.rowCount(root)):
                child = self.model.index(r, 0, root)
                node = self.model.node(child)
                if node is not None and node.kind == "memory":
                    self.tree.expand(child)

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
        text = self.find_edit.text().strip().lower()
        if not text or not self._find_order or self.doc.index is None:
            self.find_status.setText("")
            return None
        cur = self.model.node(self.tree.currentIndex())
        start = next((i for i, n in enumerate(self._find_order) if n is cur), -1) + 1
        n = len(self._find_order)
        for k in range(n):
            node = self._find_order[(start + k) % n]
            hay = f"{node.name} {node.kind} {node.path} {node.value if node.value is not None else ''}".lower()
            if text in hay:
                self.show_node(node)
                self.doc.bus.select(self.doc.index.for_node(node), origin=self)
                self.find_status.setText("")
                return node
        self.find_status.setText("not found")
        return None
