"""Lazy item model over the structure tree (``kvscope.core.reader.tree.Node``).

Children are exposed in chunks through ``canFetchMore``/``fetchMore`` and items are the core's
own Node objects (no copies). A cell table is one leaf node in the core tree, so 100,000 cells
are one row here.

Problems are flagged where they are: a node a finding points at, and every container above it,
gets the finding's severity as an icon and colour and the finding in its tooltip; untrusted,
unparsed and trailing ranges and truncated records get their own icon. A truncated file gets a
second top-level row, "missing (past the end)", holding the records it should still have had. A record
a stream dropped (:mod:`~kvscope.app.document.missing_records`) gets a placeholder row where it would
have been, among its stream's records: ``K? (missing: one of layers 0..3)``, or the layer once Verify
names it. Placeholders are the model's own nodes, never added to the parse's tree.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QAbstractItemModel, QModelIndex, QPersistentModelIndex, QPointF, Qt
from PySide6.QtGui import QBrush, QColor, QFont, QIcon, QPainter, QPen, QPixmap, QPolygonF

from kvscope.app.base.theme import SEVERITY_COLORS, WARNING_COLOR
from kvscope.app.document.missing_records import DroppedRecord
from kvscope.core.analysis.verdict import MissingBytes
from kvscope.core.findings import SEVERITY_RANK, Finding
from kvscope.core.reader.tree import Node

COLUMNS = ("name", "kind", "offset", "size", "value", "status")
CHUNK = 1000
SORT_ROLE = Qt.ItemDataRole.UserRole + 1
NODE_ROLE = Qt.ItemDataRole.UserRole + 2
Index = QModelIndex | QPersistentModelIndex
MISSING_KIND = "missing"
MAX_TIP_FINDINGS = 3


def _icon(shape: str, color: str) -> QIcon:
    """A small painted status icon: ``dot`` (a finding's severity), ``hatch`` (untrusted bytes),
    ``cut`` (truncated or missing), ``ring`` (something below is flagged)."""
    pm = QPixmap(14, 14)
    pm.fill(Qt.GlobalColor.transparent)
    p = QPainter(pm)
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    c = QColor(color)
    if shape == "dot":
        p.setBrush(c)
        p.setPen(Qt.PenStyle.NoPen)
        p.drawEllipse(2, 2, 10, 10)
    elif shape == "ring":
        p.setBrush(Qt.BrushStyle.NoBrush)
        p.setPen(QPen(c, 2))
        p.drawEllipse(3, 3, 8, 8)
    elif shape == "hatch":
        p.fillRect(2, 2, 10, 10, QBrush(c, Qt.BrushStyle.BDiagPattern))
        p.setPen(QPen(c, 1))
        p.drawRect(2, 2, 10, 10)
    else:  # cut: a triangle with its tip cut off
        p.setBrush(c)
        p.setPen(Qt.PenStyle.NoPen)
        p.drawPolygon(QPolygonF([QPointF(2, 12), QPointF(12, 12), QPointF(12, 6), QPointF(7, 2), QPointF(2, 2)]))
    p.end()
    return QIcon(pm)


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


def node_value_text(node: Node, limit: int = 80) -> str:
    """The value column: a magic number as the four letters llama.cpp spells it (``ggsq``, ``ggsn``) with
    the number beside, any other value as :func:`value_text`."""
    v = node.value
    if "magic" in node.name and isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 32:
        letters = v.to_bytes(4, "big")  # llama.cpp's multi-character constants: 'ggsq' = 0x67677371
        if all(0x20 < b < 0x7F for b in letters):
            return f"{letters.decode('ascii')} (0x{v:08x})"
        return f"0x{v:08x}"
    return value_text(v, limit)


class StructureModel(QAbstractItemModel):
    """Rows are Nodes; the single top-level row is the file node."""

    def __init__(self, root: Node | None = None, parent: Any = None) -> None:
        super().__init__(parent)
        self._root: Node | None = None
        self._shown: dict[int, int] = {}  # id(node) -> children exposed so far
        self._rows: dict[int, dict[int, int]] = {}  # id(parent) -> {id(child): row}
        self._warn = QBrush(QColor("#e15759"))
        self._top: list[Node] = []  # the file node, then the missing-bytes node of a truncated file
        self._flags: dict[int, list[Finding]] = {}  # id(node) -> findings about it
        self._below: dict[int, str] = {}  # id(container) -> worst severity of a finding below it
        self._icons: dict[str, QIcon] = {}
        self.missing_node: Node | None = None
        self._virtual: dict[int, list[Node]] = {}  # id(parent) -> placeholders of records it dropped
        self._merged: dict[int, list[Node]] = {}  # id(parent) -> its children with the placeholders
        self._dropped_key: list[tuple[int, int, str]] = []
        self._labels: dict[int, str] = {}  # id(record node) -> its label (kvscope.core.reader.record_names)
        self.set_root(root)

    def set_root(self, root: Node | None, labels: dict[int, str] | None = None) -> None:
        """Show ``root``; ``labels``: the name column's text of record nodes (``record_labels`` of the parse: the
        section, role and model layer, or the index where the layer is not known), their node names otherwise."""
        self.beginResetModel()
        self._root = root
        self._labels = dict(labels or {})
        self._top = [root] if root is not None else []
        self._shown.clear()
        self._rows.clear()
        self._flags.clear()
        self._below.clear()
        self.missing_node = None
        self._virtual.clear()
        self._merged.clear()
        self._dropped_key = []
        self.endResetModel()

    def _kids(self, node: Node) -> list[Node]:
        """``node``'s rows: its children, with the placeholders of the records it dropped in place."""
        if id(node) not in self._virtual:
            return node.children
        merged = self._merged.get(id(node))
        if merged is None:
            merged = list(node.children)
            for ph in self._virtual[id(node)]:
                at = next((i for i, c in enumerate(merged) if c.offset >= ph.offset and c.kind != MISSING_KIND),
                          len(merged))
                merged.insert(at, ph)
            self._merged[id(node)] = merged
        return merged

    def placeholders(self) -> list[Node]:
        """The placeholder rows of dropped records, in file order."""
        return sorted((n for nodes in self._virtual.values() for n in nodes), key=lambda n: n.offset)

    def _set_dropped(self, dropped: list[DroppedRecord]) -> None:
        root = self._root
        assert root is not None
        pairs = []
        for d in dropped:
            f = d.finding
            parent = f.node if isinstance(f.node, Node) else (root.find(f.path) if f.path else None)
            if parent is not None:
                pairs.append((parent, d))
        key = [(id(par), d.offset, d.role) for par, d in pairs]
        if key == self._dropped_key:  # the same records: Verify may name them now
            for (_, d), ph in zip(pairs, self.placeholders(), strict=True):
                ph.name, ph.note = d.name, _dropped_note(d)
            return
        if self._dropped_key:  # other records than before (a new parse resets first): start over
            self.set_root(root, self._labels)
        self._dropped_key = key
        for par, d in pairs:
            ph = Node(d.name, MISSING_KIND, d.offset, 0, None, "unparsed", note=_dropped_note(d))
            ph.parent = par  # the model's own row: the parse's tree is left as it is
            shown = self._shown.get(id(par))
            self._virtual.setdefault(id(par), []).append(ph)
            self._merged.pop(id(par), None)
            row = next(i for i, n in enumerate(self._kids(par)) if n is ph)
            self._rows.pop(id(par), None)
            if shown is None or row > shown:  # not exposed yet: fetchMore brings it
                continue
            pidx = self.index_of(par)
            self._virtual[id(par)].remove(ph)  # announced before it appears
            self._merged.pop(id(par), None)
            self.beginInsertRows(pidx, row, row)
            self._virtual[id(par)].append(ph)
            self._merged.pop(id(par), None)
            self._shown[id(par)] = shown + 1
            self._rows.pop(id(par), None)
            self.endInsertRows()

    def set_problems(self, findings: list[Finding], missing: MissingBytes | None,
                     dropped: list[DroppedRecord] | None = None) -> None:
        """Flag the nodes ``findings`` point at (and their containers); show what ``missing`` says is
        missing past the end of the file as a second top-level row, and a placeholder row for every
        record of ``dropped`` among its stream's records."""
        root = self._root
        if root is None:
            return
        self._set_dropped(list(dropped or []))
        self.layoutAboutToBeChanged.emit()
        self._flags.clear()
        self._below.clear()
        for f in findings:
            node = f.node if isinstance(f.node, Node) else (root.find(f.path) if f.path else None)
            if node is None:
                node = root.deepest_at(f.offset) if f.length else None
            if node is None:
                continue
            self._flags.setdefault(id(node), []).append(f)
            up = node.parent
            while up is not None:
                worst = self._below.get(id(up))
                if worst is None or SEVERITY_RANK[f.severity] > SEVERITY_RANK[worst]:
                    self._below[id(up)] = f.severity
                up = up.parent
        self.layoutChanged.emit()  # same rows, new icons and colours: expanded rows stay expanded
        if self.missing_node is not None:
            self.beginRemoveRows(QModelIndex(), 1, 1)
            self._top, self.missing_node = [root], None
            self.endRemoveRows()
        if missing is not None and missing.missing > 0:
            self.beginInsertRows(QModelIndex(), 1, 1)
            self.missing_node = _missing_tree(missing)
            self._top = [root, self.missing_node]
            self.endInsertRows()

    @property
    def labels(self) -> dict[int, str]:
        """``id(record node) -> label``: what the name column says of records."""
        return self._labels

    def label(self, node: Node) -> str:
        """What the name column says of ``node``: a record's label, any other node's name."""
        return self._labels.get(id(node), node.name)

    def findings_of(self, node: Node) -> list[Finding]:
        """The findings that point at ``node``."""
        return list(self._flags.get(id(node), ()))

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
            return self._top
        node = self.node(parent)
        return self._kids(node) if node is not None else []

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
        if node is None or node.parent is None or node in self._top:
            return QModelIndex()
        par = node.parent
        return self.createIndex(self._row_of(par), 0, par)

    def _row_of(self, node: Node) -> int:
        if node.parent is None:
            return next((i for i, n in enumerate(self._top) if n is node), 0)
        par = node.parent
        rows = self._rows.get(id(par))
        if rows is None:
            rows = {id(c): i for i, c in enumerate(self._kids(par))}
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
        more = min(len(self._kids(node)), have + CHUNK)
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
            n = n.parent
        top = chain[-1]
        if not any(t is top for t in self._top):
            return QModelIndex()
        idx = self.index(self._row_of(top), 0)
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
                return self.label(node)
            if col == "kind":
                return node.kind
            if col == "offset":
                return f"{node.offset:,}"
            if col == "size":
                return f"{node.size:,}"
            if col == "value":
                return node_value_text(node)
            return node.status
        if role == SORT_ROLE:
            return {"offset": node.offset, "size": node.size}.get(col, self.data(index))
        if role == NODE_ROLE:
            return node
        if role == Qt.ItemDataRole.ToolTipRole:
            if node.kind == MISSING_KIND:
                return f"{node.name}: not in the file\nwould be at {node.offset:,}, {node.size:,} bytes" + \
                    (f"\n{node.note}" if node.note else "")
            tip = f"{node.path}\n{node.kind}, {node.status}\noffset {node.offset:,} (0x{node.offset:x}), " \
                  f"size {node.size:,}"
            if node.note:
                tip += f"\n{node.note}"
            if node.value is not None:
                tip += f"\nvalue: {node_value_text(node, 400)}"
            found = self._flags.get(id(node), [])
            for f in found[:MAX_TIP_FINDINGS]:
                tip += f"\n{f.severity} {f.code} @{f.offset:,}: {f.message}"
            if len(found) > MAX_TIP_FINDINGS:
                tip += f"\n… and {len(found) - MAX_TIP_FINDINGS} more findings"
            if not found and id(node) in self._below:
                tip += f"\n{self._below[id(node)]} findings below"  # the worst severity below
            return tip
        if role == Qt.ItemDataRole.DecorationRole and col == "name":
            return self._decoration(node)
        if role == Qt.ItemDataRole.ForegroundRole:
            sev = self._severity(node)
            if sev is not None:
                return QBrush(QColor(SEVERITY_COLORS.get(sev, WARNING_COLOR)))
            if node.status in ("unparsed", "trailing", "untrusted") or node.kind == MISSING_KIND:
                return self._warn
        if role == Qt.ItemDataRole.FontRole and node.status == "untrusted":
            font = QFont()
            font.setItalic(True)
            return font
        if role == Qt.ItemDataRole.TextAlignmentRole and col in ("offset", "size"):
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return None

    # -- flags ------------------------------------------------------------------------------------------
    def _severity(self, node: Node) -> str | None:
        """The worst severity of the findings about ``node`` itself."""
        found = self._flags.get(id(node))
        return max((f.severity for f in found), key=lambda s: SEVERITY_RANK[s]) if found else None

    def flag(self, node: Node) -> str | None:
        """What the icon of ``node`` says: ``missing``, ``truncated``, ``error``/``warning``/``info`` (a
        finding about it), ``untrusted``, ``unparsed``, ``trailing``, ``below-SEVERITY`` or None."""
        if node.kind == MISSING_KIND:
            return "missing"
        if "truncated" in node.note:
            return "truncated"
        sev = self._severity(node)
        if sev is not None:
            return sev
        if node.status != "parsed":
            return node.status
        below = self._below.get(id(node))
        return f"below-{below}" if below is not None else None

    def _decoration(self, node: Node) -> QIcon | None:
        flag = self.flag(node)
        if flag is None:
            return None
        icon = self._icons.get(flag)
        if icon is None:
            if flag in ("missing", "truncated"):
                icon = _icon("cut", WARNING_COLOR)
            elif flag in SEVERITY_COLORS:
                icon = _icon("dot", SEVERITY_COLORS[flag])
            elif flag.startswith("below-"):
                icon = _icon("ring", SEVERITY_COLORS.get(flag[6:], WARNING_COLOR))
            else:
                icon = _icon("hatch", WARNING_COLOR)
            self._icons[flag] = icon
        return icon


def _dropped_note(d: DroppedRecord) -> str:
    if d.layer is not None:
        return (f"the stream holds no {d.role.upper()} record for layer {d.layer}: Verify names it (the engine "
                "writes it, the file does not hold it)")
    return (f"{d.finding.message}. Verify (Tools → Verify) names the layer by comparing with the records a real "
            "llama.cpp writes")


def _missing_tree(m: MissingBytes) -> Node:
    """A detached node for the bytes a truncated file is missing, one child per missing record."""
    top = Node("missing (past the end)", MISSING_KIND, m.file_end, m.missing, None, "unparsed", note=m.text())
    for r in m.records:
        top.add(Node(r.label or r.name, MISSING_KIND, r.offset, r.size, None, "unparsed",
                     note="size estimated from the records before it" if r.estimated else ""))
    return top
