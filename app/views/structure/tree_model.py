"""Lazy item model over the structure tree (``kvscope.core.reader.tree.Node``).

Children are exposed in chunks through ``canFetchMore``/``fetchMore`` and items are the core's
own Node objects (no copies). A cell table is one leaf node in the core tree, so 100,000 cells
are one row here.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QAbstractItemModel, QModelIndex, QPersistentModelIndex, Qt
from PySide6.QtGui import QBrush, QColor, QFont

from kvscope.core.reader.tree import Node

COLUMNS = ("name", "kind", "offset", "size", "value", "status")
CHUNK = 1000
SORT_ROLE = Qt.ItemDataRole.UserRole + 1
NODE_ROLE = Qt.ItemDataRole.UserRole + 2
Index = QModelIndex | QPersistentModelIndex


def value_text(value: Any, limit: int = 80) -> str:
    """A one-line rendering of a node's decoded value."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value}" if -10 < value < 10 else f"{value} (0x{value & 0xFFFFFFFFFFFFFFFF:x})"
    text = value if isinstance(value, str) else repr(value)
    text = text.replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


class StructureModel(QAbstractItemModel):
    """Rows are Nodes; the single top-level row is the file node."""

    def __init__(self, root: Node | None = None, parent: Any = None) -> None:
        super().__init__(parent)
        self._root: Node | None = None
        self._shown: dict[int, int] = {}  # id(node) -> children exposed so far
        self._rows: dict[int, dict[int, int]] = {}  # id(parent) -> {id(child): row}
        self._warn = QBrush(QColor("#e15759"))
        self.set_root(root)

    def set_root(self, root: Node | None) -> None:
        self.beginResetModel()
        self._root = root
        self._shown.clear()
        self._rows.clear()
        self.endResetModel()

    @property
    def root(self) -> Node | None:
        return self._root

    # -- structure -------------------------------------------------------------------------------
    def node(self, index: Index) -> Node | None:
        if not index.isValid():
            return None
        obj = index.internalPointer()
        return obj if isinstance(obj, Node) else None

    def _children(self, parent: Index) -> list[Node]:
        if not parent.isValid():
            return [self._root] if self._root is not None else []
        node = self.node(parent)
        return node.children if node is not None else []

    def _shown_count(self, parent: Index) -> int:
        kids = self._children(parent)
        if not parent.isValid():
            return len(kids)
        node = self.node(parent)
        key = id(node)
        if key not in self._shown:
            self._shown[key] = min(len(kids), CHUNK)
        return self._shown[key]

    def index(self, row: int, column: int, parent: Index = QModelIndex()) -> QModelIndex:  # noqa: B008
        if column < 0 or column >= len(COLUMNS) or row < 0 or row >= self._shown_count(parent):
            return QModelIndex()
        return self.createIndex(row, column, self._children(parent)[row])

    def parent(self, index: Index = QModelIndex()) -> QModelIndex:  # type: ignore[override]  # noqa: B008
        node = self.node(index)
        if node is None or node.parent is None or node is self._root:
            return QModelIndex()
        par = node.parent
        return self.createIndex(self._row_of(par), 0, par)

    def _row_of(self, node: Node) -> int:
        if node is self._root or node.parent is None:
            return 0
        par = node.parent
        rows = self._rows.get(id(par))
        if rows is None:
            rows = {id(c): i for i, c in enumerate(par.children)}
            self._rows[id(par)] = rows
        return rows[id(node)]

    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        if parent.isValid() and parent.column() != 0:
            return 0
        return self._shown_count(parent)

    def columnCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        return len(COLUMNS)

    def hasChildren(self, parent: Index = QModelIndex()) -> bool:  # noqa: B008
        return bool(self._children(parent))

    def canFetchMore(self, parent: Index) -> bool:
        return parent.isValid() and self._shown_count(parent) < len(self._children(parent))

    def fetchMore(self, parent: Index) -> None:
        node = self.node(parent)
        if node is None:
            return
        have = self._shown_count(parent)
        more = min(len(node.children), have + CHUNK)
        if more <= have:
            return
        self.beginInsertRows(parent, have, more - 1)
        self._shown[id(node)] = more
        self.endInsertRows()

    def index_of(self, node: Node) -> QModelIndex:
        """The index of ``node``, exposing lazily fetched rows on the way."""
        if self._root is None:
            return QModelIndex()
        chain: list[Node] = []
        n: Node | None = node
        while n is not None:
            chain.append(n)
            if n is self._root:
                break
            n = n.parent
        if not chain or chain[-1] is not self._root:
            return QModelIndex()
        idx = self.index(0, 0)
        for child in reversed(chain[:-1]):
            row = self._row_of(child)
            while self._shown_count(idx) <= row and self.canFetchMore(idx):
                self.fetchMore(idx)
            idx = self.index(row, 0, idx)
        return idx

    # -- data ------------------------------------------------------------------------------------
    def headerData(self, section: int, orientation: Qt.Orientation,
                   role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return COLUMNS[section]
        return None

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        node = self.node(index)
        if node is None:
            return None
        col = COLUMNS[index.column()]
        if role == Qt.ItemDataRole.DisplayRole:
            if col == "name":
                return node.name
            if col == "kind":
                return node.kind
            if col == "offset":
                return f"{node.offset:,}"
            if col == "size":
                return f"{node.size:,}"
            if col == "value":
                return value_text(node.value)
            return node.status
        if role == SORT_ROLE:
            return {"offset": node.offset, "size": node.size}.get(col, self.data(index))
        if role == NODE_ROLE:
            return node
        if role == Qt.ItemDataRole.ToolTipRole:
            tip = f"{node.path}\n{node.kind}, {node.status}\noffset {node.offset:,} (0x{node.offset:x}), " \
                  f"size {node.size:,}"
            if node.note:
                tip += f"\n{node.note}"
            if node.value is not None:
                tip += f"\nvalue: {value_text(node.value, 400)}"
            return tip
        if role == Qt.ItemDataRole.ForegroundRole and node.status in ("unparsed", "trailing", "untrusted"):
            return self._warn
        if role == Qt.ItemDataRole.FontRole and node.status == "untrusted":
            f = QFont()
            f.setItalic(True)
            return f
        if role == Qt.ItemDataRole.TextAlignmentRole and col in ("offset", "size"):
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return None
