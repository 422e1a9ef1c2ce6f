"""Typed results of a parse: cell tables, layer records, memory sections, the whole file.

These hold offsets and small metadata only; tensor payloads stay in the memory map and are
read on demand (statistics, heatmaps, diffs) through :class:`LayerRecord` offsets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from kvscope.core.findings import Finding
from kvscope.core.ggml_types import type_name
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
        starts = self.seq_start
        ids = self.seq_ids.tolist()
        return [[int(p), ids[int(starts[i]) : int(starts[i + 1])]] for i, p in enumerate(self.pos.tolist())]

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
    # where it cannot be known (set by ``kvscope.core.rotation.annotate``)
    rotated: bool | None = None
    rot_block: int = 0

    @property
    def type(self) -> str:
        return type_name(self.type_id)

    @property
    def size(self) -> int:
        return self.data_offset + self.data_size - self.header_offset

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"il": self.il, "type": self.type}
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

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index, "offset": self.offset, "cell_count": self.cell_count}
        out["cells"] = self.cells.as_pairs() if self.cells is not None else []
        if self.cells is not None and self.cells.ext is not None:
            out["cell_ext_bytes"] = self.cells.ext_bytes
            out["cell_ext"] = self.cells.ext.tolist()
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
    node: Node | None = field(default=None, repr=False)

    def all_layers(self) -> list[LayerRecord]:
        if self.kind == "kv":
            return [lr for s in self.streams for lr in (*s.k_layers, *s.v_layers)]
        return [*self.r_layers, *self.s_layers, *self.p_layers]

    def to_json(self) -> dict[str, Any]:
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
            out["streams"] = [s.to_json() for s in self.streams]
        else:
            out.update(
                cell_count=self.cell_count,
                cells=self.cells.as_pairs() if self.cells is not None else [],
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

    def layer_records(self) -> list[tuple[Section, LayerRecord]]:
        return [(sec, lr) for sec in self.sections for lr in sec.all_layers()]
