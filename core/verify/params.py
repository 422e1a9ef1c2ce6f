"""The llama.cpp context a state file needs, read from the file itself (and ``--ctx-param`` overrides).

A state file records its streams, cells, cache types, V transposition and (v11/v4) rotation, but
not the context's capacity, thread count or batch sizes. :func:`context_for` derives:

* streams: one KV stream = a unified cache (``kv_unified``); several = one per sequence
  (``n_seq_max`` = the stream count);
* capacity: enough cells per stream for the file's cells, the tokens to re-prefill and one
  more token, padded to 256 as llama.cpp pads ``n_ctx``; ``n_seq_max`` also covers every
  sequence id in the file and the cells of a recurrent memory (one per sequence);
* ``type_k`` / ``type_v``: the first K / V record's ggml type;
* ``flash_attn``: on when V is stored untransposed (``v_trans = 0``), off when transposed, auto
  when no KV record tells;
* ``swa_full``: not recorded; True (the SWA cache holds every cell, so any file fits);
* rotation: a v11/v4 stream written with ``n_rot_k = n_rot_v = 0`` where a default build would
  rotate was saved with ``LLAMA_ATTN_ROT_DISABLE=1``; the child gets the same setting.

Every value says where it came from (``sources``: file, default or override).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvscope.core import ggml_types as gt
from kvscope.core.analysis.verdict import plural
from kvscope.core.engine.llamacpp import PARTIAL_ONLY, CtxParams
from kvscope.core.errors import InputError
from kvscope.core.model.profile import ModelProfile
from kvscope.core.reader.records import KvStream, ParseResult, Section
from kvscope.core.reader.rotation import default_rotation, section_heads

PAD = 256
MAX_SEQ = 256  # LLAMA_MAX_SEQ: llama.cpp refuses a context of more sequences
PER_SEQ_KINDS = ("seq_file", "seq_blob")
ROT_DISABLE = "LLAMA_ATTN_ROT_DISABLE"
_BOOL = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


class ParamsError(InputError, ValueError):
    """A context parameter that cannot be used (bad ``--ctx-param``): one line."""


def pad(n: int, to: int = PAD) -> int:
    return max(to, (n + to - 1) // to * to)


@dataclass
class ContextPlan:
    """The context to restore into and re-prefill in, and the sequence the file belongs to."""

    ctx: CtxParams
    per_seq: bool
    dest_seq: int  # the sequence a per-sequence file is restored into (its source sequence); -1 for the whole context
    flags: int  # PARTIAL_ONLY for a partial per-sequence file
    n_token_capacity: int
    sources: dict[str, str] = field(default_factory=dict)  # parameter -> file | default | override
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"ctx": self.ctx.to_json(), "per_seq": self.per_seq, "dest_seq": self.dest_seq, "flags": self.flags,
                "n_token_capacity": self.n_token_capacity, "sources": dict(self.sources), "notes": list(self.notes)}


def _kv_sections(res: ParseResult) -> list[Section]:
    return [s for s in res.sections if s.kind == "kv"]


def _first_data_stream(res: ParseResult) -> tuple[Section, KvStream] | None:
    for sec in _kv_sections(res):
        for st in sec.streams:
            if st.k_layers:
                return sec, st
    return None


def source_seq(res: ParseResult) -> int:
    """The sequence a per-sequence file was saved from: the blob header's, else its cells', else the
    stream that holds cells (a per-sequence file of a multi-stream cache writes every stream), else 0."""
    if res.kind == "seq_blob" and res.header.get("seq_id") is not None:
        return max(0, int(res.header["seq_id"]))
    ids = res.sequence_ids()
    if ids:
        return max(0, min(ids))
    for sec in _kv_sections(res):
        if (sec.n_stream or 1) > 1:
            for st in sec.streams:
                if st.cell_count:
                    return st.index
    return 0


def _rotation_env(res: ParseResult, profile: ModelProfile | None) -> tuple[tuple[str, str], ...]:
    """``LLAMA_ATTN_ROT_DISABLE=1`` when a v11/v4 file records no rotation where a default build rotates."""
    if not res.layout.features.get("kv_rot"):
        return ()
    found = _first_data_stream(res)
    if found is None:
        return ()
    sec, st = found
    want = default_rotation(st, sec, section_heads(profile, sec))
    if st.n_rot_k == 0 and st.n_rot_v == 0 and any(w for w in want if w):
        return ((ROT_DISABLE, "1"),)
    return ()


def _override_value(key: str, value: str, current: Any) -> Any:
    low = value.strip().lower()
    if key == "flash_attn":
        if low == "auto":
            return None
        if low not in _BOOL:
            raise ParamsError(f"--ctx-param flash_attn={value}: expected true, false or auto")
        return _BOOL[low]
    if isinstance(current, bool):
        if low not in _BOOL:
            raise ParamsError(f"--ctx-param {key}={value}: expected true or false")
        return _BOOL[low]
    if isinstance(current, int):
        try:
            return int(value, 0)
        except ValueError:
            raise ParamsError(f"--ctx-param {key}={value}: expected an integer") from None
    if key in ("type_k", "type_v"):
        if low not in gt.KV_CACHE_TYPE_NAMES:
            raise ParamsError(f"--ctx-param {key}={value}: not a KV cache type ({', '.join(gt.KV_CACHE_TYPE_NAMES)})")
        return low
    return value


def apply_overrides(ctx: CtxParams, overrides: Mapping[str, str], sources: dict[str, str]) -> CtxParams:
    """``ctx`` with ``--ctx-param KEY=VALUE`` applied (``env.NAME=VALUE`` sets a variable in the child)."""
    names = [f.name for f in dataclasses.fields(CtxParams) if f.name != "env"]
    changes: dict[str, Any] = {}
    env = dict(ctx.env)
    for key, value in overrides.items():
        if key.startswith("env."):
            env[key[4:]] = value
            sources[key] = "override"
            continue
        if key not in names:
            raise ParamsError(f"--ctx-param {key}: not a context parameter ({', '.join(names)}, env.NAME)")
        changes[key] = _override_value(key, value, getattr(ctx, key))
        sources[key] = "override"
    try:
        return dataclasses.replace(ctx, **changes, env=tuple(sorted(env.items())))
    except (TypeError, ValueError) as e:
        raise ParamsError(f"--ctx-param: {e}") from None


def context_for(res: ParseResult, profile: ModelProfile | None = None, n_tokens: int = 0,
                overrides: Mapping[str, str] | None = None, n_threads: int | None = None) -> ContextPlan:
    """The context ``res`` restores into; ``n_tokens``: the most tokens one sequence will re-prefill."""
    sources: dict[str, str] = {}
    notes: list[str] = []
    per_seq = res.kind in PER_SEQ_KINDS
    kv = _kv_sections(res)
    n_stream = max([s.n_stream or 1 for s in kv], default=1)
    rec = next((s for s in res.sections if s.kind == "recurrent"), None)
    dest = source_seq(res) if per_seq else -1
    ids = res.sequence_ids()
    if n_stream > 1:
        n_seq_max = n_stream
    else:
        n_seq_max = max([max(ids, default=-1) + 1, dest + 1, rec.cell_count if rec is not None else 0, 1])
    sources["n_seq_max"] = sources["kv_unified"] = "file"
    if n_seq_max > MAX_SEQ:  # garbage read as sequence ids: llama.cpp builds no such context, restore into 0..255
        notes.append(f"the file names sequence {n_seq_max - 1}, beyond llama.cpp's {MAX_SEQ} (LLAMA_MAX_SEQ): "
                     f"n_seq_max {MAX_SEQ}")
        n_seq_max, n_stream = MAX_SEQ, min(n_stream, MAX_SEQ)
        if dest >= MAX_SEQ:
            dest = 0
    cells = max([st.cell_count for s in kv for st in s.streams], default=0)
    per_stream = pad(max(cells, n_tokens) + 1)
    n_ctx = per_stream * (n_stream if n_stream > 1 else 1)
    sources["n_ctx"] = "file"
    notes.append(f"capacity is not recorded: {per_stream} cells per stream (the file's {plural(cells, 'cell')}, "
                 f"{plural(n_tokens, 'token')} to re-prefill and one more, padded to 256)")
    found = _first_data_stream(res)
    type_k = type_v = "f16"
    flash: bool | None = None
    if found is not None:
        _, st = found
        type_k = gt.type_name(st.k_layers[0].type_id)
        # a K-only cache (MLA) has no V record: llama.cpp wants the V type to be the K type there
        type_v = gt.type_name(st.v_layers[0].type_id) if st.v_layers else type_k
        if st.v_trans is not None:
            flash = not bool(st.v_trans)
            sources["flash_attn"] = "file"
            if not flash and gt.is_quantized(gt.type_id_from_name(type_v)):
                # llama.cpp holds a quantized V cache only with flash attention, which does not transpose V:
                # the flag contradicts the cache type (the file is damaged there), and that context refuses it
                flash = True
                notes.append(f"the file says V is transposed, which llama.cpp never writes for a {type_v} V cache "
                             "(only a flash-attention context holds one, untransposed): flash attention on")
        sources["type_k"] = sources["type_v"] = "file"
    elif kv:
        notes.append("no KV record in the file: cache types f16 and flash attention auto assumed")
    if any(s.role == "kv_swa" for s in kv):
        sources["swa_full"] = "default"
        notes.append("swa_full is not recorded: on (the SWA cache holds every cell, so the file fits)")
    env = _rotation_env(res, profile)
    if env:
        sources["env." + ROT_DISABLE] = "file"
        notes.append("the file records no rotation where a default build rotates: run with LLAMA_ATTN_ROT_DISABLE=1")
    threads = n_threads or max(1, min(16, os.cpu_count() or 2))
    for k in ("n_batch", "n_ubatch", "n_threads"):
        sources[k] = "default"
    try:
        ctx = CtxParams(n_ctx=n_ctx, n_batch=2048, n_ubatch=512, n_seq_max=n_seq_max, kv_unified=n_stream == 1,
                        flash_attn=flash, type_k=type_k, type_v=type_v, swa_full=True, n_threads=threads, env=env)
    except ValueError as e:
        raise ParamsError(f"the file's context cannot be built: {e}") from None
    ctx = apply_overrides(ctx, overrides or {}, sources)
    if per_seq and dest >= ctx.n_seq_max:
        raise ParamsError(f"the file is sequence {dest}'s state but n_seq_max is {ctx.n_seq_max}")
    flags = PARTIAL_ONLY if per_seq and res.partial else 0
    # the token buffer the engine gets: the header's n_token_count is not trusted (0xFFFFFFFF would be 16 GiB);
    # a count beyond the context and the tokens the file holds is refused by llama.cpp's own capacity check
    cap = max(ctx.n_ctx, len(res.tokens), 1)
    return ContextPlan(ctx, per_seq, dest, flags, cap, sources, notes)
