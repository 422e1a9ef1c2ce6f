"""Cross-references of one parse result, so a pick in any view becomes a complete selection.

No Qt here. :class:`DocumentIndex` turns a node, a byte offset, a cell, a layer record, a token
or a finding into a :class:`Selection` that names all of them where they can be known: clicking a
K row byte in the hex view selects the cell that row belongs to; choosing token 7 of a
single-sequence file selects the cell of that sequence at position 7. A per-sequence file of a
recurrent-only memory holds one cell with no sequence id (:mod:`~kvscope.app.document.seq_owner`): the
file's sequence's state at its last position, which its last token maps to.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from kvscope.app.document.seq_owner import implied_owner
from kvscope.core.analysis.verdict import plural
from kvscope.core.findings import Finding
from kvscope.core.reader.records import CellTable, KvStream, LayerRecord, ParseResult, Section
from kvscope.core.reader.tree import Node


@dataclass(frozen=True)
class Selection:
    """What is selected: a byte range plus whatever it stands for. ``origin`` is the view that chose it."""

    offset: int
    length: int
    node: Node | None = None
    cursor: int | None = None  # the byte pointed at (defaults to ``offset``)
    finding: Finding | None = None
    table: int | None = None  # key of a TableRef
    cell: int | None = None  # cell index in file order within ``table``
    record: LayerRecord | None = None
    token: int | None = None
    origin: object | None = None

    @property
    def at(self) -> int:
        return self.offset if self.cursor is None else self.cursor

    def with_origin(self, origin: object) -> Selection:
        return replace(self, origin=origin)


@dataclass(frozen=True)
class TableRef:
    """One cell table (a KV stream's or a recurrent section's) and where it lives."""

    key: int
    label: str
    section_index: int
    section: Section
    stream: KvStream | None
    table: CellTable
    node: Node | None  # the ``cell_meta`` leaf

    @property
    def records(self) -> list[LayerRecord]:
        if self.stream is not None:
            return [*self.stream.k_layers, *self.stream.v_layers]
        return list(self.section.all_layers())


@dataclass(frozen=True)
class TokenLink:
    """How tokens map to cells: token i <-> the cell of ``seq`` at position i in table ``table``. ``implied``:
    the table's cells carry no sequence id and all belong to the file's sequence (``owner`` names it), as
    a per-sequence file's recurrent cell does."""

    table: int
    seq: int
    implied: bool = False
    owner: str = ""

    def text(self, n_tokens: int, n_cells: int, positions: list[int]) -> str:
        """How the tokens view says it: ``token i ↔ the cell of seq 1 at position i``."""
        if not self.implied:
            return f"token i ↔ the cell of seq {self.seq} at position i"
        at = ", ".join(str(p) for p in positions[:3]) or "?"
        return (f"the recurrent state is {plural(n_cells, 'cell')} of {self.owner} (its state after position {at}): "
                f"token {at} ↔ that cell; the {max(0, n_tokens - n_cells)} tokens before it are folded into it and "
                "have no cell of their own")


def _record_rows_kind(kind: str) -> bool:
    return kind.endswith("_rows")


class DocumentIndex:
    """Lookups over one :class:`ParseResult` (built once per parse, cheap: no payload is read)."""

    def __init__(self, res: ParseResult) -> None:
        self.res = res
        self.root = res.root
        self.tables: list[TableRef] = []
        self.records: list[tuple[int, Section, KvStream | None, LayerRecord]] = []
        self._rec_by_node: dict[int, LayerRecord] = {}
        self._table_of_rec: dict[int, int] = {}
        self._cell_starts: dict[int, npt.NDArray[np.int64]] = {}
        self._token_cells_cache: tuple[npt.NDArray[np.int32], npt.NDArray[np.int64]] | None = None
        for si, sec in enumerate(res.sections):
            units: list[tuple[KvStream | None, CellTable | None, list[LayerRecord]]]
            if sec.kind == "kv":
                units = [(st, st.cells, [*st.k_layers, *st.v_layers]) for st in sec.streams]
            else:
                units = [(None, sec.cells, sec.all_layers())]
            for stream, cells, recs in units:
                key: int | None = None
                if cells is not None:
                    key = len(self.tables)
                    label = sec.role if stream is None else f"{sec.role} · stream {stream.index}"
                    self.tables.append(TableRef(key, label, si, sec, stream, cells, self._cells_node(cells)))
                for rec in recs:
                    self.records.append((si, sec, stream, rec))
                    if key is not None:
                        self._table_of_rec[id(rec)] = key
                    if rec.node is not None:
                        for n in rec.node.walk():
                            self._rec_by_node[id(n)] = rec
        self.tokens_node = next((n for n in self.root.walk() if n.kind == "tokens"), None)
        self.token_link, self.token_link_reason = self._token_link()
        self._leaves = [leaf for leaf in self.root.leaves() if leaf is not self.root]
        self._leaf_starts = [leaf.offset for leaf in self._leaves]

    # -- small lookups -------------------------------------------------------------------------
    def _cells_node(self, cells: CellTable) -> Node | None:
        if cells.size <= 0:
            return None
        n = self.root.deepest_at(cells.offset)
        return n if n is not None and n.kind == "cell_meta" and n.offset == cells.offset else None

    @property
    def leaves(self) -> list[Node]:
        """Leaves in file order (they tile the file)."""
        return self._leaves

    def leaf_at(self, offset: int) -> Node | None:
        i = bisect_right(self._leaf_starts, offset) - 1
        if i < 0:
            return None
        leaf = self._leaves[i]
        return leaf if leaf.offset <= offset < leaf.end else None

    def record_of(self, node: Node | None) -> LayerRecord | None:
        return None if node is None else self._rec_by_node.get(id(node))

    def table_of(self, rec: LayerRecord) -> TableRef | None:
        key = self._table_of_rec.get(id(rec))
        return None if key is None else self.tables[key]

    def cell_record_range(self, key: int, i: int) -> tuple[int, int]:
        """(offset, length) of cell record ``i`` of table ``key``."""
        t = self.tables[key].table
        return t.record_offset(i), 8 + t.ext_bytes + 4 * int(t.n_seq[i])

    def cell_at(self, key: int, offset: int) -> int | None:
        """The cell whose meta record holds byte ``offset``."""
        t = self.tables[key].table
        if t.count == 0:
            return None
        starts = self._cell_starts.get(key)
        if starts is None:
            idx = np.arange(t.count, dtype=np.int64)
            starts = t.offset + idx * (8 + t.ext_bytes) + 4 * t.seq_start[:-1]
            self._cell_starts[key] = starts
        i = int(np.searchsorted(starts, offset, side="right")) - 1
        return i if 0 <= i < t.count else None

    def row_at(self, rec: LayerRecord, offset: int) -> tuple[int, int, int] | None:
        """(cell, offset, length) of the payload row/element of ``rec`` holding byte ``offset``."""
        rel = offset - rec.data_offset
        if rel < 0 or rec.n_rows <= 0:
            return None
        if rec.transposed:
            if rec.el_bytes <= 0:
                return None
            k = rel // rec.el_bytes
            return int(k % rec.n_rows), rec.data_offset + k * rec.el_bytes, rec.el_bytes
        if rec.row_bytes <= 0:
            return None
        row = rel // rec.row_bytes
        if row >= rec.n_rows:
            return None
        return int(row), rec.data_offset + row * rec.row_bytes, rec.row_bytes

    # -- tokens <-> cells ---------------------------------------------------------------------------
    def _token_link(self) -> tuple[TokenLink | None, str]:
        if not self.res.tokens:
            return None, "this file holds no tokens"
        kv = [t for t in self.tables if t.section.kind == "kv" and t.table.count]
        tables = kv or [t for t in self.tables if t.table.count]
        if not tables:
            return None, "this file holds no cells"
        seqs = sorted({s for t in tables for s in t.table.seq_set()})
        if not seqs and not kv:  # a per-sequence file's recurrent cells: the file's own sequence
            ref = tables[0]
            owner = implied_owner(self.res, ref.section, ref.table)
            if owner is not None:
                return TokenLink(ref.key, owner.column, implied=True, owner=owner.label), ""
        if len(seqs) != 1:
            return None, f"tokens map to cells only in single-sequence files (this one holds {len(seqs)} sequences)"
        return TokenLink(tables[0].key, seqs[0]), ""

    def token_link_text(self) -> str:
        """How tokens map to cells, in words (why they do not, when they do not)."""
        link = self.token_link
        if link is None:
            return self.token_link_reason
        t = self.tables[link.table].table
        return link.text(len(self.res.tokens), t.count, [int(p) for p in t.pos[: min(t.count, 3)]])

    def cell_of_token(self, i: int) -> int | None:
        lookup = self._token_cells()
        if lookup is None:
            return None
        positions, cells = lookup
        k = int(np.searchsorted(positions, i))
        return int(cells[k]) if k < positions.size and positions[k] == i else None

    def _token_cells(self) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int64]] | None:
        """The linked sequence's cells sorted by position, built once (the token list asks per row)."""
        if self._token_cells_cache is None:
            link = self.token_link
            if link is None:
                return None
            t = self.tables[link.table].table
            idx = np.arange(t.count, dtype=np.int64) if link.implied else t.cells_of_seq(link.seq)
            order = np.argsort(t.pos[idx], kind="stable")
            self._token_cells_cache = (t.pos[idx][order], idx[order])
        return self._token_cells_cache

    def token_of_cell(self, key: int, i: int) -> int | None:
        link = self.token_link
        if link is None or key != link.table:
            return None
        t = self.tables[key].table
        if not link.implied and link.seq not in t.seqs_of(i):
            return None
        pos = int(t.pos[i])
        return pos if 0 <= pos < len(self.res.tokens) else None

    # -- selections ----------------------------------------------------------------------------------
    def for_node(self, node: Node) -> Selection:
        """The node's byte range; its layer record / cell table when it belongs to one. A node for bytes a
        truncated file is missing (kind ``missing``, past its end), or for a record a stream dropped (a
        placeholder of the tree), selects the finding that says so."""
        if node.kind == "missing" and node.offset >= self.res.size:
            cut = [f for f in self.res.findings if f.code == "truncated" and f.severity == "error"]
            if cut:
                return self.for_finding(max(cut, key=lambda f: f.offset))
        if node.kind == "missing" and node.size == 0:  # the placeholder of a dropped record: its finding
            gap = next((f for f in self.res.findings if f.code == "missing_layer" and f.offset == node.offset), None)
            if gap is not None:
                return self.for_finding(gap)
        rec = self.record_of(node)
        table = next((t.key for t in self.tables if t.node is node), None)
        if rec is not None:
            ref = self.table_of(rec)
            table = ref.key if ref is not None else None
        return Selection(node.offset, node.size, node, record=rec, table=table)

    def for_offset(self, offset: int) -> Selection:
        """The leaf holding ``offset``, narrowed to a cell record or payload row where there is one."""
        leaf = self.leaf_at(offset)
        if leaf is None:
            return Selection(offset, 0, None, cursor=offset)
        if leaf.kind == "cell_meta":
            ref = next((t for t in self.tables if t.node is leaf), None)
            if ref is not None:
                i = self.cell_at(ref.key, offset)
                if i is not None:
                    return replace(self.for_cell(ref.key, i), node=leaf, cursor=offset)
        rec = self.record_of(leaf)
        if rec is not None and _record_rows_kind(leaf.kind):
            hit = self.row_at(rec, offset)
            ref = self.table_of(rec)
            if hit is not None:
                cell, off, length = hit
                has_cell = ref is not None and cell < ref.table.count
                return Selection(off, length, leaf, cursor=offset, record=rec, table=ref.key if ref else None,
                                 cell=cell if has_cell else None,
                                 token=self.token_of_cell(ref.key, cell) if ref is not None and has_cell else None)
        if leaf.kind == "tokens" and self.res.tokens and leaf.size == 4 * len(self.res.tokens):
            i = (offset - leaf.offset) // 4
            return replace(self.for_token(i), cursor=offset)
        return replace(self.for_node(leaf), cursor=offset)

    def for_cell(self, key: int, i: int) -> Selection:
        ref = self.tables[key]
        off, length = self.cell_record_range(key, i)
        return Selection(off, length, ref.node, table=key, cell=i, token=self.token_of_cell(key, i))

    def for_record(self, rec: LayerRecord) -> Selection:
        ref = self.table_of(rec)
        if rec.node is not None:
            return Selection(rec.node.offset, rec.node.size, rec.node, record=rec, table=ref.key if ref else None)
        return Selection(rec.header_offset, rec.size, None, record=rec, table=ref.key if ref else None)

    def for_token(self, i: int) -> Selection:
        """Token ``i``'s cell when tokens map to cells, else its 4 bytes in the token array."""
        cell = self.cell_of_token(i)
        if cell is not None and self.token_link is not None:
            return replace(self.for_cell(self.token_link.table, cell), token=i)
        node = self.tokens_node
        if node is not None and node.size == 4 * len(self.res.tokens):
            return Selection(node.offset + 4 * i, 4, node, token=i)
        if node is not None:
            return Selection(node.offset, node.size, node, token=i)
        return Selection(0, 0, None, token=i)

    def for_finding(self, f: Finding) -> Selection:
        node = f.node if isinstance(f.node, Node) else None
        if node is None and f.path:
            node = self.root.find(f.path)
        if node is None:
            node = self.leaf_at(f.offset)
        rec = self.record_of(node)
        ref = self.table_of(rec) if rec is not None else None
        return Selection(f.offset, f.length, node, cursor=f.offset, finding=f, record=rec,
                         table=ref.key if ref is not None else None)
