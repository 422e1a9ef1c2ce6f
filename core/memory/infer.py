"""A context that can hold a state file, inferred from the reader's parse of it.

:func:`infer_context` takes a :class:`~kvscope.core.reader.records.ParseResult` (and, when given,
the model's profile) and builds a :class:`MemoryContext` with the file's streams, sequence ids,
capacity, V transposition, types and rotation. With a model the memory class, layer mapping and
sub-cache geometry are the model's (as the build of the file's layout creates them); without one
they follow the sections (:mod:`infer_spec`) and :attr:`Inferred.notes` says what was assumed.
Rotation: a v11/v4 file records ``n_rot_k, n_rot_v`` per KV section, and the context takes them
(``LLAMA_ATTN_ROT_DISABLE`` when they are what a build with it set computes, else pinned per
cache); older files do not, so the model's rule for a default build decides (or what the reader
inferred from the cache types, without a model). :func:`load` reads the file into the context
with the API that wrote it, :func:`write` writes it again.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from kvscope.core import ggml_types as gt
from kvscope.core.errors import InputError
from kvscope.core.memory.context import Data, MemoryContext
from kvscope.core.memory.infer_spec import (
    UNKNOWN_SWA,
    StructureError,
    data_streams,
    file_facts,
    structural_spec,
)
from kvscope.core.memory.kv_state import swa_masked
from kvscope.core.memory.layout import FLAG_PARTIAL_ONLY, Layout
from kvscope.core.memory.params import ContextParams, ggml_pad
from kvscope.core.memory.result import ReadResult
from kvscope.core.memory.retarget import context_for_layout, target_spec
from kvscope.core.memory.rot_rule import cache_rotation
from kvscope.core.memory.spec import MemorySpec, SpecError
from kvscope.core.model.profile import ModelProfile
from kvscope.core.reader.records import ParseResult
from kvscope.core.reader.seq_owner import file_sequence
from kvscope.core.reader.state_kinds import PER_SEQUENCE_KINDS

__all__ = ["UNKNOWN_SWA", "InferError", "Inferred", "infer_context", "load", "write"]
_SWA_ROLES = ("kv_swa", "kv_raw_swa")


class InferError(InputError, ValueError):
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
    # the rotation block sizes of every KV cache are known: recorded (v11/v4), from the model's rule,
    # or what the reader inferred from the cache types; False: a v4 target would need --model
    rot_known: bool = True
    profile: ModelProfile | None = None


def _outputs_needed(res: ParseResult) -> int:
    """Outputs a context must reserve to read the file's output ids (older context states)."""
    top = (res.outputs or {}).get("max_output_id")
    return int(top) + 1 if top is not None else 0


def _unmasked_layout(res: ParseResult, spec: MemorySpec, layout: Layout, notes: list[str]) -> Layout:
    """A per-sequence file holding SWA cells outside the window was not written by a masking build:
    among the layouts with the same bytes, take the newest that does not mask."""
    if res.kind not in PER_SEQUENCE_KINDS or not layout.swa_perseq_masked or not spec.n_swa:
        return layout
    outside = False
    for sec in res.sections:
        for st in sec.streams if sec.role in _SWA_ROLES else []:
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


def _file_rotation(res: ParseResult) -> dict[str, tuple[int, int]]:
    """``(n_rot_k, n_rot_v)`` per KV section as the file records them (v11/v4), or as the reader
    inferred them; a section is left out when a stream of it has no known values."""
    out: dict[str, tuple[int, int]] = {}
    for sec in res.sections:
        if sec.kind != "kv":
            continue
        vals = {(st.n_rot_k, st.n_rot_v) for st in sec.streams if st.data_offset is not None}
        if len(vals) == 1:
            k, v = next(iter(vals))
            if k is not None and v is not None:
                out[sec.role] = (k, v)
    return out


def _rotation(res: ParseResult, spec: MemorySpec, params: ContextParams, layout: Layout, model_given: bool,
              rot_disabled: bool | None, notes: list[str]) -> tuple[MemorySpec, ContextParams, bool]:
    """The rotation the context must have: (spec with pinned caches, params, every cache's rotation known)."""
    caches = spec.kv_caches()
    tk, tv = params.type_id_k, params.type_id_v
    seen = _file_rotation(res)
    with_data = {s.role for s in res.sections if s.kind == "kv" and any(st.data_offset is not None for st in s.streams)}
    if not layout.kv_rot:
        # not in the bytes: the model's rule for the build (rot_disabled: what the user says it ran with)
        disabled = bool(rot_disabled)
        if model_given:
            return spec, replace(params, rot_disabled=disabled), True
        if rot_disabled:
            return spec.with_rotation({c.role: (0, 0) for c in caches}), replace(params, rot_disabled=True), True
        pins = {c.role: seen[c.role] for c in caches if c.role in seen}
        known = all(c.role in seen for c in caches if c.role in with_data)
        return spec.with_rotation(pins), params, known

    def fits(disabled: bool) -> bool:
        return all(cache_rotation(c, tk, tv, disabled) == seen[c.role] for c in caches if c.role in seen)

    choices = [rot_disabled] if rot_disabled is not None else [False, True]
    found = next((d for d in choices if fits(d)), None)
    disabled = bool(rot_disabled) if found is None else found
    if found is None:
        if model_given:
            notes.append("the file's rotation fields are not what the model's caches compute (with or without "
                         "LLAMA_ATTN_ROT_DISABLE): the context takes the file's values")
    elif disabled and not fits(False):
        notes.append("the rotation fields are what a build run with LLAMA_ATTN_ROT_DISABLE=1 writes")
    pins = {c.role: seen[c.role] for c in caches
            if c.role in seen and cache_rotation(c, tk, tv, disabled) != seen[c.role]}
    return spec.with_rotation(pins) if pins else spec, replace(params, rot_disabled=disabled), True


def _compressed_sizes(res: ParseResult, spec: MemorySpec, kv_size: int, per_seq: bool) -> tuple[int, ...] | None:
    """Rows per stream of DeepSeek-V4's K caches: what the blocks show (a per-sequence block holds
    ``min(size, (pos_max + 1) / ratio)`` rows, so only a capped count fixes the size)."""
    if spec.dsv4 is None:
        return None
    by_role = {s.role: s for s in res.sections}
    swa = by_role.get("kv_raw_swa")
    pos = [int(st.cells.pos.max()) for st in (swa.streams if swa else []) if st.cells is not None and st.cells.count]
    pos_max = max(pos, default=-1)
    out = []
    for blk in spec.dsv4.kcaches:
        rule = ggml_pad(max(1, -(-kv_size // blk.ratio)), 256)
        sec = by_role.get(blk.role)
        if sec is None:
            out.append(rule)
            continue
        n_rows = int(sec.fields.get("n_rows", 0))
        if not per_seq:
            out.append(max(1, n_rows))
        elif n_rows < (pos_max + 1) // blk.ratio:
            out.append(max(1, n_rows))  # capped: the cache holds exactly this many rows
        else:
            out.append(max(rule, ggml_pad(max(1, n_rows), 256)))
    return tuple(out)


def _dsv4_partial(res: ParseResult) -> bool:
    """A DeepSeek-V4 state records PARTIAL_ONLY in its mode word."""
    head = next((s for s in res.sections if s.kind == "dsv4_header"), None)
    return head is not None and head.fields.get("mode") == 1


def infer_context(res: ParseResult, profile: ModelProfile | None = None, device: torch.device | str | None = None,
                  seq_id: int | None = None, rot_disabled: bool | None = None) -> Inferred:
    """A context whose memory can hold the state ``res`` describes; raises :class:`InferError`.

    ``seq_id`` names the source sequence of a per-sequence file that does not record it.
    ``rot_disabled`` says how the writing build ran (``LLAMA_ATTN_ROT_DISABLE``); None infers it
    (a v11/v4 file records it; older files are taken from a default build).
    """
    if res.kind == "unknown":
        raise InferError("not a llama.cpp state file")
    if res.n_errors:
        first = next(f for f in res.findings if f.severity == "error")
        raise InferError(f"the file is damaged: {first.message} (offset {first.offset})")
    layout = Layout.named(res.layout.name)
    notes: list[str] = []
    try:
        spec = MemorySpec.from_profile(profile, layout.kv_rot) if profile is not None else structural_spec(res, notes)
    except (StructureError, SpecError) as e:
        raise InferError(str(e)) from None
    facts = file_facts(res)
    layout = _unmasked_layout(res, spec, layout, notes)
    kv_secs = [s for s in res.sections if s.kind == "kv"]
    n_stream = max([s.n_stream or 1 for s in kv_secs], default=1)
    owner = file_sequence(res)  # the one rule (None: a whole-context file, or no byte names the sequence)
    seq = owner.seq if owner is not None else None
    ids = res.sequence_ids()
    rec = next((s for s in res.sections if s.kind == "recurrent"), None)
    if seq_id is not None:
        if seq is not None and seq != seq_id:
            raise InferError(f"the file records sequence {seq}; a source sequence id of {seq_id} contradicts it")
        seq = seq_id
    n_seq_max = max([n_stream, max(ids, default=-1) + 1, (seq or 0) + 1, rec.cell_count if rec else 0, 1])
    if n_stream > 1:
        n_seq_max = n_stream
    cells = max([st.cell_count for s in kv_secs if s.role not in _SWA_ROLES for st in s.streams], default=0)
    cells_swa = max([st.cell_count for s in kv_secs if s.role in _SWA_ROLES for st in s.streams], default=0)
    v_trans = facts["v_trans"]
    if v_trans is None and kv_secs:
        notes.append("no KV record in the file: V transposition assumed off (flash attention)")
    headers_known = not layout.n_stream or all(data_streams(s) or any(st.data_offset is not None for st in s.streams)
                                               for s in kv_secs)
    kv_size = ggml_pad(max(1, cells), 256)
    per_seq = res.kind in PER_SEQUENCE_KINDS
    try:
        params = ContextParams(
            n_ctx=kv_size * (1 if n_stream == 1 else n_stream),
            n_seq_max=n_seq_max,
            kv_unified=n_stream == 1,
            flash_attn=not v_trans,
            type_k=gt.type_name(int(facts["type_k"])) if facts["type_k"] is not None else "f16",
            type_v=gt.type_name(int(facts["type_v"])) if facts["type_v"] is not None else "f16",
            type_r=gt.type_name(int(facts.get("type_r") or 0)),
            type_s=gt.type_name(int(facts.get("type_s") or 0)),
            n_batch=max(2048, _outputs_needed(res)),
            kv_size=kv_size,
            kv_size_swa=ggml_pad(max(1, cells_swa), 256),
            kv_size_compressed=_compressed_sizes(res, spec, kv_size, per_seq),
        )
        spec, params, rot_known = _rotation(res, spec, params, layout, profile is not None, rot_disabled, notes)
        ctx = MemoryContext.create(spec, params, layout, device)
    except (SpecError, ValueError) as e:
        raise InferError(f"the memory core cannot hold this state: {e}") from None
    if res.header.get("arch"):
        ctx.arch = str(res.header["arch"])
    flags = FLAG_PARTIAL_ONLY if res.partial or _dsv4_partial(res) else 0
    ext = int(res.layout.features.get("cell_ext_bytes", 0) or 0)
    return Inferred(ctx, res.kind, layout, seq if seq is not None else 0, seq is not None, flags, ext,
                    headers_known, profile is not None, notes, rot_known=rot_known, profile=profile)


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
    """The file again, in ``layout`` (default: its own), as the API that wrote it would.

    Where that layout's build creates another memory for the model (Qwen4exp's indexer rows), the
    state is carried over into it first (:mod:`kvscope.core.memory.retarget`).
    """
    ctx, lay, seq = inf.ctx, layout or inf.layout, inf.seq_id
    other = target_spec(ctx.memory.spec, inf.profile, inf.layout, lay)
    if other is not None:
        ctx = context_for_layout(ctx, other, lay)
    if inf.kind == "seq_blob":
        return ctx.seq_get_data(seq, inf.flags, lay)
    if inf.kind == "seq_file":
        return ctx.seq_file_bytes(seq, inf.tokens or [], lay)
    if inf.kind == "context_blob":
        return ctx.get_data(lay)
    return ctx.session_bytes(inf.tokens or [], lay)
