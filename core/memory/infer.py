"""A context that can hold a state file, inferred from the reader's parse of it.

:func:`infer_context` takes a :class:`~kvscope.core.reader.records.ParseResult` (and, when given,
the model's profile) and builds a :class:`MemoryContext` with the file's streams, sequence ids,
capacity, V transposition and types. With a model the memory class and layer mapping are the
model's; without one they follow the sections (layers numbered by position, the sliding window
unknown) and :attr:`Inferred.notes` says what was assumed. :func:`load` reads the file into the
context with the API that wrote it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvscope.core import ggml_types as gt
from kvscope.core.memory.context import Data, MemoryContext
from kvscope.core.memory.kv_state import swa_masked
from kvscope.core.memory.layout import FLAG_PARTIAL_ONLY, Layout
from kvscope.core.memory.params import ContextParams, ggml_pad
from kvscope.core.memory.result import ReadResult
from kvscope.core.memory.spec import SWA_STANDARD, AttnLayer, MemorySpec
from kvscope.core.model_profile import ModelProfile
from kvscope.core.reader.records import KvStream, ParseResult, Section

UNKNOWN_SWA = 1 << 30  # "no cell is outside the window": the window of a model not given
_CLASS_BY_ROLES = {
    ("kv",): "kv",
    ("kv_base", "kv_swa"): "iswa",
    ("recurrent",): "recurrent",
    ("kv_attn", "recurrent"): "hybrid",
    ("kv_base", "kv_swa", "recurrent"): "hybrid_iswa",
}


class InferError(ValueError):
    """The parse does not describe a state the memory core can hold (one-line message)."""


@dataclass
class Inferred:
    """A context for a file plus what the file does and does not record."""

    ctx: MemoryContext
    kind: str
    layout: Layout
    seq_id: int  # the source sequence of a per-sequence file (0 when not recorded)
    seq_id_known: bool
    flags: int
    ext_bytes: int  # cell ext bytes in the file
    headers_known: bool  # every KV section has a data header in the file (V transposition, types, widths)
    model_given: bool
    notes: list[str] = field(default_factory=list)
    tokens: list[int] | None = None  # token words, once loaded


def _data_streams(sec: Section) -> list[KvStream]:
    return [st for st in sec.streams if st.k_layers]


def _kv_layers(sec: Section, first_il: int) -> tuple[tuple[AttnLayer, ...], int | None, int | None, bool | None]:
    """Layer widths, K / V types and V transposition of a KV section (from its first data stream)."""
    streams = _data_streams(sec)
    if not streams:
        return (), None, None, None
    st = streams[0]
    layers = []
    for j, k in enumerate(st.k_layers):
        n_k = gt.elements_in_row(k.type_id, k.row_bytes) or 0
        n_v = 0
        if j < len(st.v_layers):
            v = st.v_layers[j]
            n_v = v.n_embd_v_gqa if v.transposed else gt.elements_in_row(v.type_id, v.row_bytes) or 0
        layers.append(AttnLayer(first_il + j, n_k, n_v))
    type_v = st.v_layers[0].type_id if st.v_layers else None
    return tuple(layers), st.k_layers[0].type_id, type_v, bool(st.v_trans)


def _seq_ids(res: ParseResult) -> set[int]:
    out: set[int] = set()
    for sec in res.sections:
        tables = [st.cells for st in sec.streams] if sec.kind == "kv" else [sec.cells]
        for t in tables:
            if t is not None:
                out.update(int(x) for x in t.seq_ids.tolist())
    return out


def _source_seq(res: ParseResult, layout: Layout) -> int | None:
    if res.kind not in ("seq_file", "seq_blob"):
        return None
    if layout.blob_header and res.kind == "seq_blob" and res.header.get("seq_id") is not None:
        return int(res.header["seq_id"])
    ids = _seq_ids(res)
    if ids:
        return min(ids)
    for sec in res.sections:
        if sec.kind == "kv" and (sec.n_stream or 1) > 1:
            for st in sec.streams:
                if st.cell_count:
                    return st.index
    return None


def _structural_spec(res: ParseResult, notes: list[str]) -> tuple[MemorySpec, dict[str, int | bool | None]]:
    roles = tuple(sec.role for sec in res.sections)
    mc = _CLASS_BY_ROLES.get(roles)
    if mc is None:
        raise InferError(f"sections {list(roles)} are not a memory class the core knows")
    kv_secs = [s for s in res.sections if s.kind == "kv"]
    attn: list[AttnLayer] = []
    swa_layers: set[int] = set()
    facts: dict[str, int | bool | None] = {"type_k": None, "type_v": None, "v_trans": None}
    for sec in kv_secs:
        layers, tk, tv, vt = _kv_layers(sec, len(attn))
        if not layers:
            layers = (AttnLayer(len(attn), 32, 32),)
            notes.append(f"{sec.role}: no cells, so its layer widths are not recorded (assumed one 32-wide layer)")
        if sec.role == "kv_swa":
            swa_layers.update(a.il for a in layers)
        attn += layers
        for k, v in (("type_k", tk), ("type_v", tv), ("v_trans", vt)):
            if facts[k] is None:
                facts[k] = v
    rec = next((s for s in res.sections if s.kind == "recurrent"), None)
    n_layer = max(1, len(attn))
    recurrent: tuple[int, ...] = ()
    n_embd_r = n_embd_s = 0
    if rec is not None:
        n_layer = rec.n_layer_written or len(rec.r_layers)
        nr = len(rec.r_layers)
        first = len(attn) if len(attn) + nr <= n_layer else 0
        recurrent = tuple(range(first, first + nr))
        if rec.r_layers:
            n_embd_r = gt.elements_in_row(rec.r_layers[0].type_id, rec.r_layers[0].row_bytes) or 0
            facts["type_r"] = rec.r_layers[0].type_id
        if rec.s_layers:
            n_embd_s = gt.elements_in_row(rec.s_layers[0].type_id, rec.s_layers[0].row_bytes) or 0
            facts["type_s"] = rec.s_layers[0].type_id
    if mc in ("hybrid", "hybrid_iswa", "iswa"):
        notes.append("without --model the layers of each part are numbered by position (the model's layer "
                     "mapping is not in the file)")
    n_swa = 0
    if swa_layers:
        n_swa = UNKNOWN_SWA
        notes.append("without --model the sliding window is unknown: no cell is treated as outside it")
    ext = int(res.layout.features.get("cell_ext_bytes", 0) or 0)
    if ext == 12:
        notes.append("without --model a 12-byte cell ext is taken for M-RoPE (it may be PLE)")
    spec = MemorySpec(
        arch=str(res.header.get("arch") or "unknown"),
        n_layer=max(n_layer, len(attn), 1),
        memory_class=mc,
        attn=tuple(attn),
        swa_layers=frozenset(swa_layers),
        n_swa=n_swa,
        swa_type=SWA_STANDARD if n_swa else 0,
        recurrent_layers=recurrent,
        n_embd_r=n_embd_r,
        n_embd_s=n_embd_s,
        n_pos_per_embd=4 if ext else 1,
    )
    return spec, facts


def _profile_facts(res: ParseResult) -> dict[str, int | bool | None]:
    facts: dict[str, int | bool | None] = {"type_k": None, "type_v": None, "v_trans": None}
    for sec in res.sections:
        if sec.kind == "kv":
            _, tk, tv, vt = _kv_layers(sec, 0)
            for k, v in (("type_k", tk), ("type_v", tv), ("v_trans", vt)):
                if facts[k] is None:
                    facts[k] = v
        elif sec.r_layers:
            facts["type_r"] = sec.r_layers[0].type_id
            if sec.s_layers:
                facts["type_s"] = sec.s_layers[0].type_id
    return facts


def _unmasked_layout(res: ParseResult, spec: MemorySpec, layout: Layout, notes: list[str]) -> Layout:
    """A per-sequence file holding SWA cells outside the window was not written by a masking build:
    among the layouts with the same bytes, take the newest that does not mask."""
    if res.kind not in ("seq_file", "seq_blob") or not layout.swa_perseq_masked or not spec.is_iswa:
        return layout
    outside = False
    for sec in res.sections:
        for st in sec.streams if sec.role == "kv_swa" else []:
            t = st.cells
            if t is not None and t.count:
                outside |= bool(swa_masked(spec.n_swa, spec.swa_type, t.pos, int(t.pos.max())).any())
    if not outside:
        return layout
    names = [str(n) for n in res.layout.features.get("byte_identical_layouts", [])]
    for name in reversed(names):
        cand = Layout.named(name)
        if not cand.swa_perseq_masked:
            notes.append(f"cells outside the sliding window are present: layout {cand.name}, not {layout.name}")
            return cand
    return layout


def infer_context(res: ParseResult, profile: ModelProfile | None = None, device: torch.device | str | None = None,
                  seq_id: int | None = None) -> Inferred:
    """A context whose memory can hold the state ``res`` describes; raises :class:`InferError`.

    ``seq_id`` names the source sequence of a per-sequence file that does not record it.
    """
    if res.kind == "unknown":
        raise InferError("not a llama.cpp state file")
    if res.n_errors:
        first = next(f for f in res.findings if f.severity == "error")
        raise InferError(f"the file is damaged: {first.message} (offset {first.offset})")
    layout = Layout.named(res.layout.name)
    notes: list[str] = []
    if profile is not None:
        spec = MemorySpec.from_profile(profile)
        facts = _profile_facts(res)
    else:
        spec, facts = _structural_spec(res, notes)
    layout = _unmasked_layout(res, spec, layout, notes)
    kv_secs = [s for s in res.sections if s.kind == "kv"]
    n_stream = max([s.n_stream or 1 for s in kv_secs], default=1)
    seq = _source_seq(res, layout)
    ids = _seq_ids(res)
    rec = next((s for s in res.sections if s.kind == "recurrent"), None)
    if seq_id is not None:
        if seq is not None and seq != seq_id:
            raise InferError(f"the file records sequence {seq}; a source sequence id of {seq_id} contradicts it")
        seq = seq_id
    n_seq_max = max([n_stream, max(ids, default=-1) + 1, (seq or 0) + 1, rec.cell_count if rec else 0, 1])
    if n_stream > 1:
        n_seq_max = n_stream
    cells = max([st.cell_count for s in kv_secs if s.role != "kv_swa" for st in s.streams], default=0)
    cells_swa = max([st.cell_count for s in kv_secs if s.role == "kv_swa" for st in s.streams], default=0)
    v_trans = facts["v_trans"]
    if v_trans is None and kv_secs:
        notes.append("no KV record in the file: V transposition assumed off (flash attention)")
    headers_known = not layout.n_stream or all(_data_streams(s) for s in kv_secs)
    params = ContextParams(
        n_ctx=ggml_pad(max(1, cells), 256) * (1 if n_stream == 1 else n_stream),
        n_seq_max=n_seq_max,
        kv_unified=n_stream == 1,
        flash_attn=not v_trans,
        type_k=gt.type_name(int(facts["type_k"])) if facts["type_k"] is not None else "f16",
        type_v=gt.type_name(int(facts["type_v"])) if facts["type_v"] is not None else "f16",
        type_r=gt.type_name(int(facts.get("type_r") or 0)),
        type_s=gt.type_name(int(facts.get("type_s") or 0)),
        n_batch=max([2048, *[i + 1 for i in (res.outputs or {}).get("output_ids", [])]]),
        kv_size=ggml_pad(max(1, cells), 256),
        kv_size_swa=ggml_pad(max(1, cells_swa), 256),
    )
    ctx = MemoryContext.create(spec, params, layout, device)
    if res.header.get("arch"):
        ctx.arch = str(res.header["arch"])
    flags = FLAG_PARTIAL_ONLY if res.partial else 0
    ext = int(res.layout.features.get("cell_ext_bytes", 0) or 0)
    return Inferred(ctx, res.kind, layout, seq if seq is not None else 0, seq is not None, flags, ext,
                    headers_known, profile is not None, notes)


def load(inf: Inferred, data: Data) -> ReadResult:
    """Read the file's bytes into ``inf.ctx`` with the API that wrote them (no token capacity)."""
    ctx, lay = inf.ctx, inf.layout
    if inf.kind == "seq_blob":
        res = ctx.seq_set_data(data, inf.seq_id, inf.flags, lay)
    elif inf.kind == "seq_file":
        res = ctx.seq_load_file(None, inf.seq_id, layout=lay, data=data)
    elif inf.kind == "context_blob":
        res = ctx.set_data(data, lay)
    else:
        res = ctx.load_file(None, layout=lay, data=data)
    inf.tokens = res.tokens
    return res


def write(inf: Inferred, layout: Layout | None = None) -> bytearray:
    """The file again, in ``layout`` (default: its own), as the API that wrote it would."""
    ctx, lay, seq = inf.ctx, layout or inf.layout, inf.seq_id
    if inf.kind == "seq_blob":
        return ctx.seq_get_data(seq, inf.flags, lay)
    if inf.kind == "seq_file":
        return ctx.seq_file_bytes(seq, inf.tokens or [], lay)
    if inf.kind == "context_blob":
        return ctx.get_data(lay)
    return ctx.session_bytes(inf.tokens or [], lay)
