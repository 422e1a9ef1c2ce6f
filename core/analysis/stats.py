"""Payload statistics of a parsed state (``kvscope inspect --stats``).

:func:`scan_stats` walks every K/V/r/s/p record of a :class:`ParseResult` in bounded steps of
whole rows (or whole columns of a transposed V), dequantizes each step to float32 and counts
NaN/Inf, all-zero rows (what a failed restore's cleanup leaves) and min/max/mean/RMS of the
finite values; it appends ``nonfinite_values`` / ``zero_rows`` findings to the result.
Records are decoded with :mod:`kvscope.core.analysis.record_values` (dequantized, de-rotated).

Where the compiled kernel runs (:mod:`kvscope.core.derotate_kernel`: x86-64 with AVX2 and F16C),
a step of f16/bf16/f32/q8_0/q4_0 rows is decoded and reduced in one pass over its bytes, zero rows
included (:func:`~kvscope.core.derotate_kernel.value_stats`), and rotated q8_0/q4_0 rows are
de-rotated there; the numpy path beside it is the reference and the fallback, with the same answers.

A cold file (pages of its payload not in the page cache) is read once, front to back, by a feed
(:class:`~kvscope.core.analysis.cold_feed.ColdFeed`): reader threads keep several 8 MiB reads in
flight, past the page cache where the file system allows it (``O_DIRECT``), into a ring of
buffers the steps reduce in place, on two threads or more, while the next chunks come in. The
compiled kernel releases the GIL, so the reads, the reductions and the disk all overlap.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from gguf import GGMLQuantizationType

from kvscope.core import ggml_types as gt
from kvscope.core.analysis import cold_feed
from kvscope.core.analysis.cold_feed import ColdFeed
from kvscope.core.analysis.record_values import Bytes, dequantize_rows, derotates, record_shape, source_of
from kvscope.core.derotate_kernel import rotated_stats, value_stats
from kvscope.core.findings import Finding
from kvscope.core.reader.record_names import finding_name
from kvscope.core.reader.records import LayerRecord, ParseResult
from kvscope.core.reader.rotation import rotate_blocks
from kvscope.core.reader.source import ByteSource
from kvscope.core.textsafe import plural, safe_text

F32A = npt.NDArray[np.float32]
U8A = npt.NDArray[np.uint8]
I64A = npt.NDArray[np.int64]

_WORK = 1 << 20  # bytes per step actually used (faster than big steps: the passes stay in cache)
_F16, _F32 = GGMLQuantizationType.F16, int(GGMLQuantizationType.F32)
_WORD = {8: np.uint64, 4: np.uint32, 2: np.uint16, 1: np.uint8}
_ROLE = {"k": "K", "v": "V"}


@dataclass
class LayerStats:
    """Statistics of one record; min/max/mean/rms are over finite values (NaN when there are none)."""

    section: str
    section_index: int
    stream: int | None
    role: str
    index: int
    il: int | None
    type: str
    data_offset: int
    data_size: int
    n_rows: int
    trusted: bool = True
    n_values: int = 0
    n_nonfinite: int = 0
    n_nan: int = 0
    n_inf: int = 0
    zero_rows: int = 0
    min: float = math.nan
    max: float = math.nan
    mean: float = math.nan
    rms: float = math.nan
    first_nonfinite: int | None = None  # flat value index (transposed V: column-major, as stored)
    first_zero_row: int | None = None  # cell index
    note: str = ""
    # values are of the de-rotated rows (stored Hadamard-rotated in blocks of rot_block);
    # rot_inferred: nothing in the file says so, the model and cache types do
    derotated: bool = False
    rot_block: int = 0
    rot_inferred: bool = False

    def to_json(self) -> dict[str, Any]:
        """JSON-safe dict (non-finite floats become None)."""
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()}


@dataclass
class StatsReport:
    """Per-record statistics of one state, in file order."""

    path: str
    layers: list[LayerStats] = field(default_factory=list)

    def by_role(self) -> list[dict[str, Any]]:
        """Totals per (section, role): records, values, non-finite, zero rows, min/max/mean/rms."""
        groups: dict[tuple[int, str, str], list[LayerStats]] = {}
        for ls in self.layers:
            groups.setdefault((ls.section_index, ls.section, ls.role), []).append(ls)
        out = []
        for (_, sec, role), items in groups.items():
            fin = [(x, x.n_values - x.n_nonfinite) for x in items if x.n_values > x.n_nonfinite]
            nf = sum(k for _, k in fin)
            out.append({"section": sec, "role": role, "records": len(items),
                        "n_values": sum(x.n_values for x in items), "n_nonfinite": sum(x.n_nonfinite for x in items),
                        "zero_rows": sum(x.zero_rows for x in items),
                        "min": min((x.min for x, _ in fin), default=None),
                        "max": max((x.max for x, _ in fin), default=None),
                        "mean": sum(x.mean * k for x, k in fin) / nf if nf else None,
                        "rms": math.sqrt(sum(x.rms**2 * k for x, k in fin) / nf) if nf else None})
        return out

    def to_json(self) -> dict[str, Any]:
        """``{"layers": [...], "roles": [...]}``, JSON-safe."""
        return {"layers": [ls.to_json() for ls in self.layers], "roles": self.by_role()}

    def to_text(self, markdown: bool = False) -> str:
        """A table, one row per record."""
        def g(v: float) -> str:
            return f"{v:.4g}" if math.isfinite(v) else "-"

        head = ["section", "stream", "rec", "layer", "type", "rows", "nonfinite", "zero rows",
                "min", "max", "mean", "rms", "note"]
        rows = [[ls.section, "" if ls.stream is None else f"s{ls.stream}", _ROLE.get(ls.role, ls.role),
                 f"#{ls.index}" if ls.il is None else str(ls.il), ls.type, str(ls.n_rows), str(ls.n_nonfinite),
                 str(ls.zero_rows), g(ls.min), g(ls.max), g(ls.mean), g(ls.rms), _note(ls)] for ls in self.layers]
        title = f"{'## ' if markdown else ''}payload statistics: {plural(len(self.layers), 'record')}"
        if not rows:
            return title + "\n"
        if markdown:
            lines = [title, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            lines += ["| " + " | ".join(r) + " |" for r in rows]
        else:
            w = [max(len(head[i]), *(len(r[i]) for r in rows)) for i in range(len(head))]
            lines = [title] + ["  " + "  ".join(c.ljust(w[i]) for i, c in enumerate(r)).rstrip() for r in [head, *rows]]
        return "\n".join(safe_text(line) for line in lines) + "\n"  # file-derived text escaped


def _note(ls: LayerStats) -> str:
    if not ls.derotated:
        return ls.note
    rot = f"de-rotated (Hadamard, block {ls.rot_block}{', inferred' if ls.rot_inferred else ''})"
    return f"{rot}; {ls.note}" if ls.note else rot


# -- scanning -----------------------------------------------------------------------------------


@dataclass
class _Step:
    """Byte range ``[lo, hi)`` of one record's payload; ``rows`` rows/columns from ``first``."""

    lo: int
    hi: int
    first: int  # first row (plain) / column (transposed) / cell (transposed column piece)
    rows: int
    piece: bool = False  # part of one row (plain) or of one column (transposed)


@dataclass
class _Part:
    n: int = 0
    n_nan: int = 0
    n_inf: int = 0
    s: float = 0.0
    q: float = 0.0
    mn: float = math.inf
    mx: float = -math.inf
    first_bad: int = -1  # value index inside the step
    zero: I64A | None = None  # rows/cells all-zero inside the step
    weight: int = 1  # parts of a row/cell the step covers
    n_fin: int = -1  # values the sums cover, when not n - n_nan - n_inf (de-rotated blocks with a NaN)


def _steps(rec: LayerRecord, n_rows: int, work: int) -> Iterator[_Step]:
    if rec.transposed:  # units are columns (one dim over all cells), split at elements
        unit, count, grain = rec.n_rows * rec.el_bytes, rec.n_embd_v_gqa, rec.el_bytes
    else:  # units are rows (one cell), split at blocks
        unit, count, grain = rec.row_bytes, n_rows, gt.type_size(rec.type_id)
    if unit <= work:
        k = max(1, work // unit)
        for c in range(0, count, k):
            m = min(k, count - c)
            yield _Step(c * unit, (c + m) * unit, c, m)
        return
    piece = max(grain, work // grain * grain)
    for c in range(count):
        for b in range(0, unit, piece):
            e = min(unit, b + piece)
            yield _Step(c * unit + b, c * unit + e, b // grain if rec.transposed else c,
                        (e - b) // grain if rec.transposed else 1, True)


def _fast_f16(i16: npt.NDArray[np.int16], i32: npt.NDArray[np.int32]) -> F32A:
    """f16 -> f32 by bit moves (exact for finite values, 2x numpy's cast); Inf/NaN become |x| >= 2**16."""
    np.copyto(i32, i16)  # sign-extends: bits 16..31 copy the sign
    np.left_shift(i32, 13, out=i32)  # exponent+mantissa to bits 13..27; bits 28..31 copy the sign
    np.bitwise_and(i32, np.int32(-0x70000001), out=i32)  # keep the sign in bit 31 only (0x8fffffff)
    f = i32.view(np.float32)
    np.multiply(f, np.float32(2.0**112), out=f)  # rebias the exponent (15 -> 127); subnormals come out right
    return f


def _sum(f: F32A) -> float:
    """Float32 sum as 1024 column sums: 2x numpy's pairwise sum, in a ufunc loop that runs
    outside the GIL (einsum does not) and without BLAS (whose own threads contend with ours)."""
    n = f.size - f.size % 1024
    head = float(f[:n].reshape(-1, 1024).sum(axis=0).sum()) if n else 0.0
    return head + float(f[n:].sum())


class _Scratch(threading.local):
    """Per-thread aligned buffers of one step."""

    def __init__(self, work: int) -> None:
        size = max(work, 256)  # a step is at most max(work, one block)
        self.raw = np.empty(size, np.uint8)
        self.i32 = np.empty(size // 2, np.int32)
        self.flags = np.empty(size, np.uint8)  # the kernel's zero rows / cells (at most one per byte)


def _scan_step(src: ByteSource, rec: LayerRecord, st: _Step, scratch: _Scratch, decode: bool, blas: bool,
               feed: ColdFeed | None = None) -> _Part:
    need, off = st.hi - st.lo, rec.data_offset + st.lo
    if feed is None:
        return _reduce_step(src, rec, st, scratch, decode, blas, None)
    try:
        return _reduce_step(src, rec, st, scratch, decode, blas, feed.take(off, need, scratch.raw))
    finally:
        feed.done(off, need)


def _reduce_step(src: ByteSource, rec: LayerRecord, st: _Step, scratch: _Scratch, decode: bool, blas: bool,
                 raw: U8A | None) -> _Part:
    """The step's statistics, of ``raw`` (its bytes, lent by the feed) or of one pread of them."""
    if raw is None:
        need = st.hi - st.lo
        raw = scratch.raw[:need] if need <= scratch.raw.size else np.empty(need, np.uint8)  # one pread
        if src.readinto(rec.data_offset + st.lo, raw) != raw.size:
            raise ValueError("payload bytes past the end of the file")
    p = _Part()
    if decode and not derotates(rec) and _kernel_step(raw, rec, st, scratch, p):
        return p
    # all-zero rows / cells, on the raw bytes
    if rec.transposed:
        w = raw.view(_WORD[rec.el_bytes])
        mat = w.reshape(1, -1) if st.piece else w.reshape(st.rows, -1)
        p.weight = 1 if st.piece else st.rows
        if np.count_nonzero(mat) < mat.size:
            z = np.flatnonzero(~mat.any(axis=0))
            p.zero = (z + st.first) if st.piece else z
    else:
        wb = next(b for b in (8, 4, 2, 1) if rec.row_bytes % b == 0 and raw.size % b == 0)
        w = raw.view(_WORD[wb])
        if np.count_nonzero(w) < w.size:
            p.zero = (np.array([st.first]) if not w.any() else np.zeros(0, np.int64)) if st.piece else \
                np.flatnonzero(~w.reshape(st.rows, -1).any(axis=1)) + st.first
    if decode and derotates(rec) and raw.size % rec.row_bytes == 0:
        _rotated_stats(raw, rec.type_id, rec.rot_block, rec.row_bytes, p)
    elif decode:
        _value_stats(raw, rec.type_id, scratch, blas, p)
    return p


def _kernel_step(raw: U8A, rec: LayerRecord, st: _Step, scratch: _Scratch, p: _Part) -> bool:
    """The step's value statistics and zero rows (or cells) from the compiled kernel, in one pass
    over the bytes: what the numpy path below computes for f16/bf16/f32/q8_0/q4_0 rows. False
    (``p`` untouched) where the kernel does not run or take the type."""
    if rec.transposed:  # rows are columns of cells, or one piece of a column
        row_bytes, el = (raw.size if st.piece else raw.size // max(1, st.rows)), rec.el_bytes
    else:
        row_bytes, el = (raw.size if st.piece else rec.row_bytes), 0
    flags = scratch.flags if raw.size <= scratch.flags.size else np.empty(raw.size, np.uint8)
    k = value_stats(raw, rec.type_id, row_bytes, flags, el) if row_bytes else None
    if k is None:
        return False
    p.n, p.n_nan, p.n_inf, p.first_bad = k.n_values, k.n_nan, k.n_inf, k.first_nonfinite
    p.mn, p.mx, p.s, p.q = k.min, k.max, k.sum, k.sum_squares
    if rec.transposed:
        p.weight = 1 if st.piece else st.rows
        if k.n_zero:
            z = np.flatnonzero(flags[: row_bytes // el])
            p.zero = (z + st.first) if st.piece else z
    elif k.n_zero:
        p.zero = np.array([st.first]) if st.piece else np.flatnonzero(flags[: raw.size // row_bytes]) + st.first
    return True


_ROT_PIECE = 256 << 10  # bytes de-rotated at a time: the float32 passes stay in cache (2x faster than 1 MiB)


@np.errstate(all="ignore")
def _rotated_stats(raw: U8A, type_id: int, block: int, row_bytes: int, p: _Part) -> None:
    """Value statistics of de-rotated rows. Non-finite counts are of the stored values (a NaN
    spreads over its whole block when de-rotated); min/max/mean/RMS are of the de-rotated values
    of the blocks that hold no NaN/Inf (RMS is the same either way: the rotation is orthonormal,
    and so is the sum: of the rotated values only each block's first one adds up, times
    sqrt(block), as every other Hadamard row sums to zero)."""
    r = rotated_stats(raw, type_id, block)  # the whole step in one compiled pass, where the kernel takes it
    if r is not None:
        p.n = p.n_fin = r.n_values
        p.s, p.q, p.mn, p.mx = r.sum, r.sum_squares, r.min, r.max
        return
    piece = max(row_bytes, _ROT_PIECE // row_bytes * row_bytes)
    root = math.sqrt(block)
    p.n, p.n_fin, done = 0, 0, 0
    for lo in range(0, raw.size, piece):
        r = rotated_stats(raw[lo : lo + piece], type_id, block)
        if r is not None:  # q8_0 / q4_0 decoded and de-rotated in one compiled pass
            p.s, p.q, p.n_fin, done = p.s + r.sum, p.q + r.sum_squares, p.n_fin + r.n_values, done + r.n_values
            p.mn, p.mx = min(p.mn, r.min), max(p.mx, r.max)
            continue
        f = dequantize_rows(raw[lo : lo + piece], type_id).reshape(-1, block)
        flat = f.reshape(-1)
        q = float(np.dot(flat, flat))  # non-finite when a value is (or when float32 overflows)
        if not math.isfinite(q):
            fin = np.isfinite(f)
            nf = int(f.size - np.count_nonzero(fin))
            if nf:
                nan = int(np.count_nonzero(np.isnan(f)))
                p.n_nan, p.n_inf = p.n_nan + nan, p.n_inf + nf - nan
                if p.first_bad < 0:
                    p.first_bad = done + int(np.argmin(fin.reshape(-1)))
                f = f[fin.all(axis=1)]
            g = f.reshape(-1).astype(np.float64)
            q = float(np.dot(g, g))
        done += flat.size
        if f.size:
            k = rotated_stats(f, _F32, block)  # the extremes from the compiled transform (f is finite here)
            if k is not None:
                mn, mx = k.min, k.max
            else:
                d = rotate_blocks(f, block)
                mn, mx = float(d.min()), float(d.max())
            p.s += root * float(f[:, 0].sum(dtype=np.float64))
            p.q += q
            p.mn, p.mx = min(p.mn, mn), max(p.mx, mx)
            p.n_fin += int(f.size)
    p.n = done


@np.errstate(all="ignore")  # NaN/Inf/overflow are what we count, not errors
def _value_stats(raw: U8A, type_id: int, scratch: _Scratch, blas: bool, p: _Part) -> None:
    fast = type_id == _F16
    if fast:  # min/max and Inf/NaN straight from the bits (half the bytes of float32 passes)
        i16 = raw.view(np.int16)
        top, low = int(i16.max()), int(i16.view(np.uint16).max())  # largest >= +0, most negative
        bad = top >= 0x7C00 or low >= 0xFC00  # exponent 31: Inf or NaN
        if not bad:
            f = _fast_f16(i16, scratch.i32[: raw.size // 2])
            if top < 0 or low < 0x8000:  # all negative, or no negative: no shortcut
                p.mn, p.mx = float(f.min()), float(f.max())
            else:
                h = np.array([low, top], np.uint16).view(np.float16)
                p.mn, p.mx = float(h[0]), float(h[1])
            p.s = _sum(f)
    else:  # a NaN or Inf anywhere makes the sum non-finite
        f = dequantize_rows(raw, type_id).reshape(-1)
        p.s = _sum(f)
        bad = not math.isfinite(p.s)
        if not bad:
            p.mn, p.mx = float(f.min()), float(f.max())
    p.n = raw.size // 2 if fast else int(f.size)
    if not bad:
        if blas:
            p.q = float(np.dot(f, f))
        else:  # f is a scratch or a fresh array, never the file's bytes
            p.q = _sum(np.square(f, out=f))
        bad = not math.isfinite(p.q)  # float32 overflow: redo in float64 below
    if bad:
        f = dequantize_rows(raw, type_id).reshape(-1)
        fin = np.isfinite(f)
        nf = int(f.size - np.count_nonzero(fin))
        p.n_nan = int(np.count_nonzero(np.isnan(f)))
        p.n_inf = nf - p.n_nan
        p.first_bad = int(np.argmin(fin)) if nf else -1
        good = f[fin].astype(np.float64) if nf else f.astype(np.float64)
        p.s, p.q = float(good.sum()), float(np.dot(good, good))
        p.mn, p.mx = (float(good.min()), float(good.max())) if good.size else (math.inf, -math.inf)


def _merge(ls: LayerStats, rec: LayerRecord, parts: Iterator[tuple[_Step, _Part]], n_rows: int,
           parts_per_row: int) -> None:
    n = nan = inf = 0
    covered = 0  # values the sums cover
    s = q = 0.0
    mn, mx = math.inf, -math.inf
    first_bad = -1
    zc: npt.NDArray[np.int32] | None = None
    for st, p in parts:
        if first_bad < 0 and p.first_bad >= 0:
            first_bad = (st.lo // rec.el_bytes if rec.transposed else n) + p.first_bad
        covered += p.n_fin if p.n_fin >= 0 else p.n - p.n_nan - p.n_inf
        n, nan, inf, s, q = n + p.n, nan + p.n_nan, inf + p.n_inf, s + p.s, q + p.q
        mn, mx = min(mn, p.mn), max(mx, p.mx)
        if p.zero is not None and p.zero.size:
            if zc is None:
                zc = np.zeros(n_rows, np.int32)
            np.add.at(zc, p.zero, p.weight)
    ls.n_values, ls.n_nan, ls.n_inf, ls.n_nonfinite = n, nan, inf, nan + inf
    fin = covered
    if fin:
        ls.min, ls.max, ls.mean, ls.rms = mn, mx, s / fin, math.sqrt(max(q, 0.0) / fin)
    if derotates(rec):
        ls.derotated, ls.rot_block = True, rec.rot_block
    ls.first_nonfinite = first_bad if first_bad >= 0 else None
    if zc is not None:
        zero = np.flatnonzero(zc >= parts_per_row)
        ls.zero_rows = int(zero.size)
        ls.first_zero_row = int(zero[0]) if zero.size else None


def unwritten_rows(res: ParseResult, ls: LayerStats) -> str | None:
    """Why llama.cpp itself leaves the rows of record ``ls`` all zero in a healthy state, or None.

    ``llama_kv_cache_msa`` (MiniMax-M3: ``kv_base`` beside the indexer's ``kv_idx``) gives its indexer cache K
    and V tensors, but the model graph (``src/models/minimax-m3.cpp``, b11434) only ever copies the indexer's
    K into it (``cpy_k``), and only on the sparse layers, which run only with flash attention and a cache
    that is not unified over several sequences (``msa_enabled = flash_attn && (n_seq_max == 1 ||
    !kv_unified)``); otherwise every layer runs dense attention and the indexer cache is never written.
    A file says flash attention was off by its transposed V (``v_trans`` 1) and a unified cache by one
    stream; how many sequences the context had it does not say."""
    roles = {sec.role for sec in res.sections}
    sec = res.sections[ls.section_index] if 0 <= ls.section_index < len(res.sections) else None
    if sec is None or sec.role != "kv_idx" or "kv_base" not in roles:
        return None
    if ls.role == "v":
        return "llama.cpp never writes the MSA indexer cache's V (MiniMax-M3 stores only the indexer's K)"
    if ls.role != "k":
        return None
    base = next(s for s in res.sections if s.role == "kv_base")
    stream = next((st for st in base.streams if st.index == ls.stream), None)
    if stream is not None and stream.v_trans == 1:
        return ("without flash attention (V stored transposed) MiniMax-M3 runs dense attention and never "
                "writes the indexer's K")
    if len(base.streams) == 1:
        return ("expected when the context held several sequences in its unified cache: MiniMax-M3 then runs "
                "dense attention and never writes the indexer's K")
    return None


def _add_findings(res: ParseResult, rec: LayerRecord, ls: LayerStats) -> None:
    path = rec.node.path if rec.node is not None else ""
    sec = res.sections[ls.section_index] if 0 <= ls.section_index < len(res.sections) else None
    what = finding_name(sec.role if sec is not None else None, rec.role, rec.index, rec.il, res.model_path is not None)
    new: list[Finding] = []
    if ls.n_nonfinite and ls.first_nonfinite is not None:
        if rec.transposed:
            off, length = rec.data_offset + ls.first_nonfinite * rec.el_bytes, rec.el_bytes
            where = f"cell {ls.first_nonfinite % rec.n_rows}, dim {ls.first_nonfinite // rec.n_rows}"
        else:
            row = ls.first_nonfinite // max(1, record_shape(rec)[1])
            off, length, where = rec.data_offset + row * rec.row_bytes, rec.row_bytes, f"cell {row}"
        new.append(Finding("error", "nonfinite_values", off, length,
                           f"{what}: {ls.n_nonfinite} non-finite values ({ls.n_nan} NaN, {ls.n_inf} Inf); "
                           f"first at {where}", path, rec.il,
                           {"n_nan": ls.n_nan, "n_inf": ls.n_inf, "n_values": ls.n_values}))
    if ls.zero_rows and ls.first_zero_row is not None:
        z = ls.first_zero_row
        off, length = ((rec.data_offset + z * rec.el_bytes, rec.el_bytes) if rec.transposed
                       else (rec.data_offset + z * rec.row_bytes, rec.row_bytes))
        why = unwritten_rows(res, ls) if ls.zero_rows == ls.n_rows else None
        message = f"{what}: {ls.zero_rows} of {ls.n_rows} cells are all zero bytes (first: cell {z})"
        new.append(Finding("info" if why else "warning", "zero_rows", off, length,
                           f"{message}: {why}" if why else message, path, rec.il,
                           {"count": ls.zero_rows, "first_cell": z}))
    res.findings.extend(f for f in new if f not in res.findings)


def _plan(rec: LayerRecord, ls: LayerStats, size: int, work: int) -> tuple[list[_Step], int, int, bool] | None:
    """(steps, rows, parts per row, decode) for one record; None (with a note) when nothing to scan."""
    avail = max(0, size - rec.data_offset)
    n, dim = record_shape(rec, avail)
    full = rec.n_rows * (rec.n_embd_v_gqa * rec.el_bytes if rec.transposed else rec.row_bytes)
    if min(rec.data_size, avail) < full:
        ls.note = "truncated" + ("" if rec.transposed else f": {n} of {rec.n_rows} rows")
    if n == 0 or full == 0:
        ls.note = ls.note or "empty"
        return None
    ts = gt.type_size(rec.type_id)
    decode = dim > 0
    try:
        if decode:
            dequantize_rows(np.zeros(ts, np.uint8), rec.type_id)  # one block: can gguf-py decode it?
        else:
            ls.note = f"rows are not whole {rec.type} blocks: values not decoded"
    except NotImplementedError:
        decode, ls.note = False, f"{rec.type} values not decoded"
    per_row = rec.n_embd_v_gqa if rec.transposed else -(-rec.row_bytes // max(ts, work // ts * ts))
    if derotates(rec) and rec.row_bytes > work:  # a rotated row is decoded whole
        work = rec.row_bytes
        per_row = 1
    return list(_steps(rec, n, work)), (rec.n_rows if rec.transposed else n), per_row, decode


def scan_stats(res: ParseResult, chunk_bytes: int = 64 << 20, data: Bytes = None,
               threads: int | None = None) -> StatsReport:
    """Scan every layer record of ``res``; append ``nonfinite_values``/``zero_rows`` findings.

    Payloads are read from ``data`` (or ``res.path``) with ``pread`` in steps of at most
    ``chunk_bytes`` raw bytes (whole rows/blocks; at most 1 MiB, which keeps the passes in cache)
    into per-thread buffers, on ``threads`` worker threads (default: half the CPUs, at most 4, for
    payloads over 8 MiB; at least 2 where there are 2 CPUs when a cold file's feed reads it).
    Truncated and empty payloads are scanned as far as whole rows are present, with a note.
    Raises :class:`FileChangedError` when the file changed during the scan (or since ``data`` was
    opened).
    """
    with source_of(res, data) as src:
        return _scan(res, src, chunk_bytes, threads)


def _scan(res: ParseResult, src: ByteSource, chunk_bytes: int, threads: int | None) -> StatsReport:
    work = max(1, min(chunk_bytes, _WORK))
    report = StatsReport(res.path)
    jobs: list[tuple[LayerRecord, LayerStats, list[_Step], int, int, bool]] = []
    for si, sec in enumerate(res.sections):
        units = [(st.index, [*st.k_layers, *st.v_layers], st.n_rot_inferred) for st in sec.streams] \
            if sec.kind == "kv" else [(None, sec.all_layers(), False)]
        for stream, recs, inferred in units:
            for rec in recs:
                ls = LayerStats(sec.role, si, stream, rec.role, rec.index, rec.il, rec.type, rec.data_offset,
                                rec.data_size, rec.n_rows, rec.trusted)
                ls.rot_inferred = inferred and derotates(rec)
                report.layers.append(ls)
                plan = _plan(rec, ls, src.size, work)
                if plan is not None:
                    jobs.append((rec, ls, *plan))
    tasks = [(rec, st, decode) for rec, _, steps, _, _, decode in jobs for st in steps]
    # the steps run in file order (records in the report's order may not be: synthetic files), so a
    # cold file's feed reads it front to back; they are merged in the report's order afterwards
    order = sorted(range(len(tasks)), key=lambda i: tasks[i][0].data_offset + tasks[i][1].lo)
    ranges = [(tasks[i][0].data_offset + tasks[i][1].lo, tasks[i][0].data_offset + tasks[i][1].hi) for i in order]
    start, end = (ranges[0][0], max(hi for _, hi in ranges)) if ranges else (0, 0)
    feed = None
    ranges_in_order = all(a[1] <= b[1] for a, b in zip(ranges, ranges[1:], strict=False))
    if src.is_file and end - start >= cold_feed.FEED_MIN and hasattr(os, "RWF_NOWAIT") and ranges_in_order \
            and cold_feed.is_cold(src.path, start, end):
        feed = cold_feed.ColdFeed.open(src, start, end, ranges)  # (steps of overlapping records: read by the steps)
    cpus = os.cpu_count() or 1
    nthreads = threads if threads is not None else (
        1 if len(tasks) <= 8 else max(min(4, cpus // 2), min(2, cpus) if feed is not None else 1))
    scratch = _Scratch(work)

    def run(task: tuple[LayerRecord, _Step, bool]) -> _Part:
        return _scan_step(src, task[0], task[1], scratch, task[2], nthreads <= 1, feed)

    pool = ThreadPoolExecutor(nthreads) if nthreads > 1 and len(tasks) > 1 else None
    try:
        in_order = [tasks[i] for i in order]
        parts: list[_Part | None] = [None] * len(tasks)
        for i, part in zip(order, pool.map(run, in_order) if pool is not None else map(run, in_order), strict=True):
            parts[i] = part
        done = iter(parts)
        for rec, ls, steps, n, per_row, _ in jobs:
            _merge(ls, rec, ((st, p) for st in steps if (p := next(done)) is not None), n, per_row)
            _add_findings(res, rec, ls)
    finally:
        if feed is not None:
            feed.stop()  # before the pool's shutdown: a step waiting for a chunk no reader will read returns
        if pool is not None:
            pool.shutdown(cancel_futures=True)
        if feed is not None:
            feed.close()
    return report
