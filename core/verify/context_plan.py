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

:func:`check_context` then bounds the whole context once, before any engine starts (``context_for``
calls it): the C types' ranges, ``n_seq_max`` within ``LLAMA_MAX_SEQ``, ``n_threads`` within this
machine's CPUs, ``n_ctx`` at least what the file and the re-prefill need, and the memory the KV cache
and the attention scores of that context would take within the memory this process can have. A value
outside them is a :class:`ContextPlanError` (one line, exit 2): an engine is never asked to allocate
23 GB for ``n_ctx=2147483648`` or to start 100000 threads.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import resource
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvscope.core import ggml_types as gt
from kvscope.core.analysis.verdict import plural
from kvscope.core.engine.session import PARTIAL_ONLY, CtxParams
from kvscope.core.errors import InputError
from kvscope.core.model.profile import ModelProfile
from kvscope.core.reader.records import KvStream, ParseResult, Section
from kvscope.core.reader.rotation import default_rotation, section_heads
from kvscope.core.reader.seq_owner import restore_seq
from kvscope.core.reader.state_kinds import PER_SEQUENCE_KINDS

PAD = 256
MAX_SEQ = 256  # LLAMA_MAX_SEQ: llama.cpp refuses a context of more sequences
ROT_DISABLE = "LLAMA_ATTN_ROT_DISABLE"
UINT32_MAX = (1 << 32) - 1  # n_ctx, n_batch, n_ubatch, n_seq_max are uint32_t in llama_context_params
GGML_MAX_N_THREADS = 512  # ggml's own limit on a thread pool
MEMORY_SHARE = 0.8  # of the memory available, what one engine's context may take at most
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_ENV_VALUE_MAX = 4096
_BOOL = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


class ContextPlanError(InputError, ValueError):
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


def _shown(value: str, limit: int = 40) -> str:
    """A value as an error line shows it: a 100,000-digit number is cut, not printed."""
    return value if len(value) <= limit else f"{value[:limit]}... ({len(value):,} characters)"


def _override_value(key: str, value: str, current: Any) -> Any:
    low = value.strip().lower()
    if key == "flash_attn":
        if low == "auto":
            return None
        if low not in _BOOL:
            raise ContextPlanError(f"--ctx-param flash_attn={_shown(value)}: expected true, false or auto")
        return _BOOL[low]
    if isinstance(current, bool):
        if low not in _BOOL:
            raise ContextPlanError(f"--ctx-param {key}={_shown(value)}: expected true or false")
        return _BOOL[low]
    if isinstance(current, int):
        try:
            n = int(value.strip(), 0)
        except ValueError:
            raise ContextPlanError(f"--ctx-param {key}={_shown(value)}: expected an integer") from None
        if not 1 <= n <= UINT32_MAX:
            raise ContextPlanError(f"--ctx-param {key}={_shown(value)}: expected a positive integer below 2**32")
        return n
    if key in ("type_k", "type_v"):
        if low not in gt.KV_CACHE_TYPE_NAMES:
            raise ContextPlanError(f"--ctx-param {key}={_shown(value)}: not a KV cache type "
                              f"({', '.join(gt.KV_CACHE_TYPE_NAMES)})")
        return low
    return value


def apply_overrides(ctx: CtxParams, overrides: Mapping[str, str], sources: dict[str, str]) -> CtxParams:
    """``ctx`` with ``--ctx-param KEY=VALUE`` applied (``env.NAME=VALUE`` sets a variable in the child)."""
    names = [f.name for f in dataclasses.fields(CtxParams) if f.name != "env"]
    changes: dict[str, Any] = {}
    env = dict(ctx.env)
    for key, value in overrides.items():
        if key.startswith("env."):
            name = key[4:]
            if not _ENV_NAME.fullmatch(name):
                raise ContextPlanError(f"--ctx-param {key}: not an environment variable name (letters, digits, _)")
            if "\0" in value or len(value) > _ENV_VALUE_MAX:
                raise ContextPlanError(f"--ctx-param {key}: the value must be at most {_ENV_VALUE_MAX} characters "
                                  "without a NUL")
            env[name] = value
            sources[key] = "override"
            continue
        if key not in names:
            raise ContextPlanError(f"--ctx-param {_shown(key)}: not a context parameter ({', '.join(names)}, env.NAME)")
        changes[key] = _override_value(key, value, getattr(ctx, key))
        sources[key] = "override"
    if "n_batch" in changes and "n_ubatch" not in changes and ctx.n_ubatch > changes["n_batch"]:
        changes["n_ubatch"] = changes["n_batch"]  # llama.cpp's own rule: a micro-batch is at most the batch
        sources["n_ubatch"] = "override"
    try:
        return dataclasses.replace(ctx, **changes, env=tuple(sorted(env.items())))
    except (TypeError, ValueError) as e:
        raise ContextPlanError(f"--ctx-param: {e}") from None


def context_for(res: ParseResult, profile: ModelProfile | None = None, n_tokens: int = 0,
                overrides: Mapping[str, str] | None = None, n_threads: int | None = None) -> ContextPlan:
    """The context ``res`` restores into; ``n_tokens``: the most tokens one sequence will re-prefill."""
    sources: dict[str, str] = {}
    notes: list[str] = []
    per_seq = res.kind in PER_SEQUENCE_KINDS
    kv = _kv_sections(res)
    n_stream = max([s.n_stream or 1 for s in kv], default=1)
    rec = next((s for s in res.sections if s.kind == "recurrent"), None)
    dest = restore_seq(res)
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
        raise ContextPlanError(f"the file's context cannot be built: {e}") from None
    recorded = {k for k, v in sources.items() if v == "file"}
    file_ctx, ctx = ctx, apply_overrides(ctx, overrides or {}, sources)
    if per_seq and dest >= ctx.n_seq_max:
        raise ContextPlanError(f"the file is sequence {dest}'s state but n_seq_max is {ctx.n_seq_max}")
    check_context(ctx, res, profile, n_tokens, sources)
    check_recorded(file_ctx, ctx, recorded & {k for k, v in sources.items() if v == "override"}, n_stream)
    flags = PARTIAL_ONLY if per_seq and res.partial else 0
    # the token buffer the engine gets: the header's n_token_count is not trusted (0xFFFFFFFF would be 16 GiB);
    # a count beyond the context and the tokens the file holds is refused by llama.cpp's own capacity check
    cap = max(ctx.n_ctx, len(res.tokens), 1)
    return ContextPlan(ctx, per_seq, dest, flags, cap, sources, notes)


# -- the bounds -------------------------------------------------------------------------------------
def cpu_limit() -> int:
    """The most threads an engine may be given: this machine's CPUs (ggml's own cap above that)."""
    return max(1, min(GGML_MAX_N_THREADS, os.cpu_count() or 1))


def _read_int(path: str) -> int | None:
    try:
        with open(path) as fh:
            text = fh.read(64).strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def available_memory() -> int | None:
    """Bytes a new engine process can allocate here: the kernel's MemAvailable, this cgroup's room under its
    limit and the address-space limit, whichever is least (None: none of them known)."""
    found: list[int] = []
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError, IndexError):
        pass
    limit, current = _read_int("/sys/fs/cgroup/memory.max"), _read_int("/sys/fs/cgroup/memory.current")
    if limit is not None:
        found.append(max(0, limit - (current or 0)))
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY and soft > 0:
        found.append(soft)
    return min(found) if found else None


def _type_bytes(name: str) -> float:
    """Bytes per element of a cache type (a block type's block over its elements)."""
    tid = gt.type_id_from_name(name)
    return gt.type_size(tid) / gt.block_size(tid)


def context_bytes(ctx: CtxParams, profile: ModelProfile | None) -> tuple[int, int]:
    """(KV cache bytes, attention score bytes) the context ``ctx`` allocates for ``profile``'s model, roughly
    from above: every attention layer's K and V rows for every cell (the SWA cache held full), and without
    flash attention the f32 scores of one micro-batch against every cell of a stream for the widest layer."""
    if profile is None:
        return 0, 0
    layers = profile.attn_layers
    kb, vb = _type_bytes(ctx.type_k), _type_bytes(ctx.type_v)
    per_cell = sum(profile.n_embd_k_gqa(il) * kb + (profile.n_embd_v_gqa(il) * vb if profile.has_v(il) else 0)
                   for il in layers)
    kv = int(math.ceil(per_cell * ctx.n_ctx))
    streams = 1 if ctx.kv_unified else ctx.n_seq_max
    per_stream = max(1, ctx.n_ctx // max(1, streams))
    ubatch = min(ctx.n_ubatch, ctx.n_batch, per_stream)
    heads = max(profile.n_head, default=0)
    scores = 0 if ctx.flash_attn or not layers else 4 * heads * per_stream * ubatch
    return kv, scores


def _gib(n: float) -> str:
    return f"{n / (1 << 30):,.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):,.0f} MiB"


def check_recorded(file_ctx: CtxParams, ctx: CtxParams, overridden: set[str], n_stream: int) -> None:
    """Refuse an override of what the file records (its cache types, its V layout, its KV streams) with another
    value: llama.cpp restores a state only into a context of the same, so the restore would fail and a healthy
    file would read as damaged. ``overridden``: the keys read from the file that ``--ctx-param`` set."""
    fa = {None: "auto", True: "true", False: "false"}
    for key in ("type_k", "type_v"):
        if key in overridden and getattr(ctx, key) != getattr(file_ctx, key):
            raise ContextPlanError(f"--ctx-param {key}={getattr(ctx, key)}: the file's {key[-1].upper()} cache is "
                              f"{getattr(file_ctx, key)}, and llama.cpp restores it only into a {key} "
                              f"{getattr(file_ctx, key)} cache (leave {key} out)")
    if "flash_attn" in overridden and ctx.flash_attn != file_ctx.flash_attn:
        how = ("untransposed (saved with flash attention)" if file_ctx.flash_attn
               else "transposed (saved without flash attention)")
        raise ContextPlanError(f"--ctx-param flash_attn={fa[ctx.flash_attn]}: the file stores V {how}, and llama.cpp "
                          f"restores it only with flash_attn={fa[file_ctx.flash_attn]} (leave flash_attn out)")
    if overridden & {"kv_unified", "n_seq_max"}:
        streams = 1 if ctx.kv_unified else ctx.n_seq_max
        if streams != n_stream:
            given = ", ".join(f"--ctx-param {k}={str(getattr(ctx, k)).lower()}" for k in ("kv_unified", "n_seq_max")
                              if k in overridden)
            raise ContextPlanError(f"{given}: that context has {plural(streams, 'KV stream')}, the file "
                              f"{n_stream}: llama.cpp restores it only into as many (leave "
                              f"{' and '.join(k for k in ('kv_unified', 'n_seq_max') if k in overridden)} out)")


def check_context(ctx: CtxParams, res: ParseResult, profile: ModelProfile | None, n_tokens: int,
                  sources: Mapping[str, str]) -> None:
    """Refuse a context no engine should be started with (:class:`ContextPlanError`, one line): see the module
    docstring. ``n_tokens``: the most tokens one sequence re-prefills."""
    def named(key: str, value: object) -> str:
        return f"--ctx-param {key}={value}" if sources.get(key) == "override" else f"{key} {value}"

    for key in ("n_ctx", "n_batch", "n_ubatch", "n_seq_max"):
        if getattr(ctx, key) > UINT32_MAX:
            raise ContextPlanError(f"{named(key, getattr(ctx, key))}: beyond llama.cpp's 32-bit {key}")
    if ctx.n_seq_max > MAX_SEQ:
        raise ContextPlanError(f"{named('n_seq_max', ctx.n_seq_max)}: llama.cpp holds at most {MAX_SEQ} sequences "
                          "(LLAMA_MAX_SEQ)")
    cpus = cpu_limit()
    if ctx.n_threads > cpus:
        raise ContextPlanError(f"{named('n_threads', ctx.n_threads)}: this machine has {plural(cpus, 'CPU')}; "
                          f"give 1 to {cpus}")
    streams = 1 if ctx.kv_unified else ctx.n_seq_max
    kv = _kv_sections(res)
    cells = max([st.cell_count for s in kv for st in s.streams], default=0)
    need = max(cells, n_tokens) + 1
    if kv and ctx.n_ctx // max(1, streams) < need:
        where = f" over {plural(streams, 'stream')}" if streams > 1 else ""
        raise ContextPlanError(f"{named('n_ctx', ctx.n_ctx)}{where} is too small for the file: a stream must hold its "
                          f"{plural(cells, 'cell')}, the {plural(n_tokens, 'token')} to re-prefill and one more "
                          f"({need}{' per stream, ' + str(need * streams) + ' in all' if streams > 1 else ''})")
    kv_bytes, scores = context_bytes(ctx, profile)
    have = available_memory()
    if have is not None and kv_bytes + scores > MEMORY_SHARE * have:
        what = [f"{_gib(kv_bytes)} of KV cache"] + ([f"{_gib(scores)} of attention scores"] if scores else [])
        given = [named(k, getattr(ctx, k)) for k in ("n_ctx", "n_ubatch", "n_seq_max", "type_k", "type_v")
                 if sources.get(k) == "override"] or [f"n_ctx {ctx.n_ctx}"]
        raise ContextPlanError(f"{', '.join(given)}: the context would take about {' and '.join(what)}, more than "
                          f"{MEMORY_SHARE:.0%} of the {_gib(have)} of memory available here: refused before any "
                          "engine starts")
