"""Typed results of a parse: cell tables, layer records, memory sections, the whole file.

These hold offsets and small metadata only; tensor payloads stay in the memory map and are
read on demand (statistics, heatmaps, diffs) through :class:`LayerRecord` offsets.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from kvscope.core.findings import Finding
from kvscope.core.ggml_types import type_name
from kvscope.core.jsonout import HOLE, PIECE, JsonArray, item_separator, item_template
from kvscope.core.reader.tree import Node


@dataclass
class CellTable:
    """Cell meta of one stream in file order, stored column-wise (CSR for sequence ids)."""

    offset: int
    size: int
    pos: npt.NDArray[np.int32]
    n_seq: npt.NDArray[np.int32]
    seq_ids: npt.NDArray[np.int32]  # all ids concatenated, cell after cell
    ext: npt.NDArray[np.int32] | None = None  # (n, 2 or 3): x, y[, tok] when the cell extension is present
    ext_bytes: int = 0

    @property
    def count(self) -> int:
        return int(self.pos.size)

    @property
    def seq_start(self) -> npt.NDArray[np.int64]:
        starts = np.zeros(self.count + 1, dtype=np.int64)
        np.cumsum(self.n_seq, out=starts[1:])
        return starts

    def record_offset(self, i: int) -> int:
        """Absolute offset of cell record ``i``."""
        return int(self.offset + i * (8 + self.ext_bytes) + 4 * int(self.n_seq[:i].sum()))

    def seqs_of(self, i: int) -> list[int]:
        s = self.seq_start
        return [int(x) for x in self.seq_ids[s[i] : s[i + 1]]]

    def as_pairs(self) -> list[list[Any]]:
        """``[[pos, [seq ids]], ...]`` as in the fixtures' manifests."""
        return [x for piece in self.pair_pieces() for x in piece]

    def pair_pieces(self, piece: int = PIECE) -> Iterator[list[list[Any]]]:
        """:meth:`as_pairs` in pieces of ``piece`` cells (streamed JSON holds one piece at a time)."""
        lo = 0
        for a in range(0, self.count, piece):
            b = min(self.count, a + piece)
            pos = self.pos[a:b].tolist()
            ns = self.n_seq[a:b]
            hi = lo + int(ns.sum())
            ids = self.seq_ids[lo:hi].tolist()
            if len(ids) == b - a and bool((ns == 1).all()):  # the common case: one sequence per cell
                yield [[p, [s]] for p, s in zip(pos, ids, strict=True)]
            elif not ids and not bool(ns.any()):
                yield [[p, []] for p in pos]
            else:
                st = [0, *np.cumsum(ns).tolist()]
                yield [[p, ids[st[i] : st[i + 1]]] for i, p in enumerate(pos)]
            lo = hi

    def pair_text(self, indent: int | None, piece: int = PIECE) -> Iterator[str]:
        """:meth:`pair_pieces` already encoded as JSON (see :attr:`JsonArray.encoded`): one
        ``%``-format of a per-cell template per piece, no lists built."""
        templates: dict[int, str] = {}
        sep = item_separator(indent)
        lo = 0
        for a in range(0, self.count, piece):
            b = min(self.count, a + piece)
            ns = self.n_seq[a:b]
            hi = lo + int(ns.sum())
            if self.seq_ids.size < hi:  # the table was cut inside the ids: the general path
                text = json.dumps(list(self._pairs_slow(a, b, lo)), indent=indent)
                yield text[1 : len(text) - (1 if indent is None else 2)]
                lo = hi
                continue
            st = np.zeros(b - a, np.int64)
            np.cumsum(ns[:-1], out=st[1:])
            flat = np.empty(b - a + hi - lo, np.int64)
            at = np.arange(b - a) + st
            flat[at] = self.pos[a:b]
            rest = np.ones(flat.size, bool)
            rest[at] = False
            flat[rest] = self.seq_ids[lo:hi]
            ks = np.unique(ns)
            for k in ks.tolist():
                if k not in templates:
                    templates[k] = item_template([HOLE, [HOLE] * k], indent)
            body = sep.join([templates[int(ks[0])]] * (b - a)) if ks.size == 1 else \
                sep.join([templates[k] for k in ns.tolist()])
            yield body % tuple(flat.tolist())
            lo = hi

    def _pairs_slow(self, a: int, b: int, lo: int) -> Iterator[list[Any]]:
        """The pairs of cells ``a..b-1`` (sequence ids from ``lo``) one by one: the general path."""
        ids = self.seq_ids.tolist()
        for i in range(a, b):
            k = int(self.n_seq[i])
            yield [int(self.pos[i]), ids[lo : lo + k]]
            lo += k

    def json_cells(self, lazy: bool) -> list[list[Any]] | JsonArray:
        """The ``cells`` of the JSON output: a list, or (``lazy``) a :class:`JsonArray` of pieces."""
        return JsonArray(self.pair_pieces, self.pair_text) if lazy else self.as_pairs()

    def json_ext(self, lazy: bool) -> list[Any] | JsonArray:
        """The ``cell_ext`` of the JSON output (rows of x, y[, tok])."""
        ext = self.ext
        assert ext is not None
        if not lazy:
            return ext.tolist()  # type: ignore[no-any-return]

        def text(indent: int | None) -> Iterator[str]:
            row = item_template([HOLE] * int(ext.shape[1]), indent)
            sep = item_separator(indent)
            for i in range(0, len(ext), PIECE):
                part = ext[i : i + PIECE]
                yield sep.join([row] * len(part)) % tuple(part.reshape(-1).tolist())

        return JsonArray(lambda: (ext[i : i + PIECE].tolist() for i in range(0, len(ext), PIECE)), text)

    def seq_set(self) -> list[int]:
        return sorted({int(x) for x in np.unique(self.seq_ids)})

    def cells_of_seq(self, seq: int) -> npt.NDArray[np.int64]:
        """Indices (in file order) of cells that hold ``seq``."""
        starts = self.seq_start
        hit = np.nonzero(self.seq_ids == seq)[0]
        return np.searchsorted(starts, hit, side="right") - 1


@dataclass
class LayerRecord:
    """One tensor record: K, V, r, s or p rows of one layer in one stream/section."""

    role: str  # "k" | "v" | "r" | "s" | "p"
    index: int  # position among records of this role in the section
    il: int | None  # model layer index (None when unknown without a model)
    type_id: int
    header_offset: int
    data_offset: int
    data_size: int
    n_rows: int  # cells
    row_bytes: int = 0  # bytes per cell row (0 for transposed V)
    transposed: bool = False
    el_bytes: int = 0  # transposed V: bytes per element
    n_embd_v_gqa: int = 0  # transposed V: elements per cell
    trusted: bool = True
    node: Node | None = field(default=None, repr=False)
    # K/V rows stored Hadamard-rotated in blocks of ``rot_block`` elements: True/False, or None
    # where it cannot be known (set by ``kvscope.core.reader.rotation.annotate``)
    rotated: bool | None = None
    rot_block: int = 0

    @property
    def type(self) -> str:
        return type_name(self.type_id)

    @property
    def size(self) -> int:
        return self.data_offset + self.data_size - self.header_offset

    def to_json(self) -> dict[str, Any]:
        # ``il``: the model layer, None where it is not known (kvscope.core.reader.record_names); ``index``: the
        # record's place among the records of its role in its section and stream, always known
        out: dict[str, Any] = {"il": self.il, "index": self.index, "type": self.type}
        if self.transposed:
            out["el_bytes"] = self.el_bytes
            out["n_embd_v_gqa"] = self.n_embd_v_gqa
        else:
            out["row_bytes"] = self.row_bytes
        out.update(
            offset=self.header_offset,
            size=self.size,
            data_offset=self.data_offset,
            n_rows=self.n_rows,
            trusted=self.trusted,
        )
        if self.role in ("k", "v"):
            out["rotated"] = self.rotated
        return out


@dataclass
class KvStream:
    index: int
    offset: int
    cell_count: int
    cells: CellTable | None = None
    v_trans: int | None = None
    n_layer: int | None = None
    data_offset: int | None = None  # offset of the data header (u32 v_trans) when the stream has one
    # v11/v4 rotation fields as written; for older layouts inferred from the model and cache
    # types (``n_rot_inferred``), or None where nothing tells
    n_rot_k: int | None = None
    n_rot_v: int | None = None
    n_rot_inferred: bool = False
    k_layers: list[LayerRecord] = field(default_factory=list)
    v_layers: list[LayerRecord] = field(default_factory=list)
    end: int = 0
    trusted: bool = True

    def to_json(self, lazy: bool = False) -> dict[str, Any]:
        """JSON-able dict; ``lazy``: the cell arrays are :class:`JsonArray` pieces (for write_json)."""
        out: dict[str, Any] = {"index": self.index, "offset": self.offset, "cell_count": self.cell_count}
        out["cells"] = self.cells.json_cells(lazy) if self.cells is not None else []
        if self.cells is not None and self.cells.ext is not None:
            out["cell_ext_bytes"] = self.cells.ext_bytes
            out["cell_ext"] = self.cells.json_ext(lazy)
        out.update(
            v_trans=self.v_trans,
            n_layer=self.n_layer,
            n_rot_k=self.n_rot_k,
            n_rot_v=self.n_rot_v,
            n_rot_inferred=self.n_rot_inferred,
            k_layers=[lr.to_json() for lr in self.k_layers],
            v_layers=[lr.to_json() for lr in self.v_layers],
            trusted=self.trusted,
        )
        return out


@dataclass
class Section:
    """One memory section: a ``llama_kv_cache`` or a ``llama_memory_recurrent`` state."""

    role: str  # kv | kv_base | kv_swa | kv_attn | recurrent
    kind: str  # "kv" | "recurrent"
    offset: int
    size: int = 0
    role_certain: bool = True
    trusted: bool = True
    # kv
    n_stream: int | None = None
    streams: list[KvStream] = field(default_factory=list)
    # recurrent
    cell_count: int = 0
    cells: CellTable | None = None
    s_trans: int | None = None
    n_layer_written: int | None = None
    r_layers: list[LayerRecord] = field(default_factory=list)
    s_layers: list[LayerRecord] = field(default_factory=list)
    p_layers: list[LayerRecord] = field(default_factory=list)
    # DeepSeek-V4 blocks (kind dsv4_header / dsv4_kcache / dsv4_comp): header words and records
    fields: dict[str, int] = field(default_factory=dict)
    records: list[LayerRecord] = field(default_factory=list)
    node: Node | None = field(default=None, repr=False)

    def all_layers(self) -> list[LayerRecord]:
        if self.kind == "kv":
            return [lr for s in self.streams for lr in (*s.k_layers, *s.v_layers)]
        if self.kind.startswith("dsv4"):
            return list(self.records)
        return [*self.r_layers, *self.s_layers, *self.p_layers]

    def to_json(self, lazy: bool = False) -> dict[str, Any]:
        """JSON-able dict; ``lazy``: the cell arrays are :class:`JsonArray` pieces (for write_json)."""
        out: dict[str, Any] = {
            "role": self.role,
            "kind": self.kind,
            "offset": self.offset,
            "size": self.size,
            "role_certain": self.role_certain,
            "trusted": self.trusted,
        }
        if self.kind == "kv":
            out["n_stream"] = self.n_stream
            out["streams"] = [s.to_json(lazy) for s in self.streams]
        elif self.kind.startswith("dsv4"):
            out.update(self.fields)
            out["records"] = [lr.to_json() for lr in self.records]
        else:
            out.update(
                cell_count=self.cell_count,
                cells=self.cells.json_cells(lazy) if self.cells is not None else [],
                s_trans=self.s_trans,
                n_layer_written=self.n_layer_written,
                r_layers=[lr.to_json() for lr in self.r_layers],
                s_layers=[lr.to_json() for lr in self.s_layers],
            )
            if self.p_layers:
                out["p_layers"] = [lr.to_json() for lr in self.p_layers]
        return out


@dataclass
class LayoutChoice:
    name: str
    confidence: float
    alternatives: list[dict[str, Any]] = field(default_factory=list)
    features: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "confidence": round(self.confidence, 3),
            "alternatives": self.alternatives,
            "features": self.features,
        }


@dataclass
class ParseResult:
    """Everything a parse found, trusted or not, plus findings with absolute offsets."""

    path: str
    size: int
    kind: str  # seq_file | session_file | seq_blob | context_blob | unknown
    root: Node
    layout: LayoutChoice
    header: dict[str, Any] = field(default_factory=dict)
    tokens: list[int] = field(default_factory=list)
    token_payload: dict[str, Any] | None = None
    outputs: dict[str, Any] | None = None
    sections: list[Section] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    partial: bool = False
    partial_certain: bool = False
    memory_offset: int | None = None
    memory_end: int | None = None
    model_path: str | None = None

    @property
    def n_errors(self) -> int:
        return sum(1 for f in self.findings if f.severity == "error")

    def sequence_ids(self) -> set[int]:
        """Every sequence id the cell tables of every section hold."""
        ids = [t.seq_ids for sec in self.sections
               for t in ([st.cells for st in sec.streams] if sec.kind == "kv" else [sec.cells]) if t is not None]
        return {int(x) for x in np.unique(np.concatenate(ids))} if ids else set()

    def layer_records(self) -> list[tuple[Section, LayerRecord]]:
        return [(sec, lr) for sec in self.sections for lr in sec.all_layers()]
