"""Compare a state file with the state a fresh prefill of its tokens gives, record by record, cell by cell.

Sections pair by role (in order), streams by index, cells by what they hold: ``(sequences,
position)`` in a whole-context state, the position alone in a per-sequence one (the file may come
from another sequence id), the sequences alone in a recurrent section (one cell per sequence).
Values are dequantized (gguf-py) and de-rotated where the rows are Hadamard-rotated, then each
record gets a status:

* ``match``: every compared cell within the tolerance (``exact``: bitwise equal as well);
* ``differs``: beyond it, with the largest absolute and relative difference and the first cell;
* ``nonfinite``: the file holds NaN/Inf where the engine computes finite values;
* ``missing``: the engine writes the record, the file does not hold it;
* ``extra``: the file holds a record the engine does not write.

A record dropped among alike layers (llama.cpp PR #21576: ``n_layer`` still counts it, so the
reader sees the first slot empty) is found by aligning the file's records, in file order, with
the engine's: every record of the fresh state is the true value of its layer, so the alignment
that pairs each file record with the layer whose values it holds names the missing layer
exactly. The tolerance scales with each record's RMS and with the cache type's quantization step:
a prefill in other batch sizes, or by another build, does not give bit-identical values.

A trained model amplifies that rounding layer by layer, beyond any fixed tolerance. With a
calibration (``calibrate.Calibration``, measured from the same tokens prefilled under other
schedules) the limits of each record come from :meth:`RecordLimits.record_limits`: the engine's
own variation on the record times a margin, with the fixed tolerance as the floor
(:mod:`kvscope.core.verify.calibrate` holds that rule). This module names what it needs of a
calibration as a protocol, so the calibration, which measures its spreads with
:func:`compare_states`, can sit above it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from kvscope.core import ggml_types as gt
from kvscope.core.analysis.record_values import derotates, record_rows, record_shape
from kvscope.core.reader.records import CellTable, LayerRecord, ParseResult, Section
from kvscope.core.reader.rotation import rotate_blocks
from kvscope.core.reader.source import ByteSource
from kvscope.core.verify.comparison import (
    Cancelled,
    CellsCheck,
    Comparison,
    Limits,
    RecordCheck,
    RecordKey,
    RecordLimits,
    Tolerance,
)

F32A = npt.NDArray[np.float32]
I64A = npt.NDArray[np.int64]
CHUNK_CELLS = 4096  # cells compared at a time (bounds the float32 copies)
SAMPLE_CELLS = 32  # cells an alignment cost looks at
SKIP_COST = 1.5  # cost of leaving a record unpaired (a pair of unrelated records costs at most 2)

Progress = Callable[[int, int, str], None]


# ---------------------------------------------------------------------------------------------
# cells


@dataclass
class _Cells:
    keys: dict[tuple[Any, ...], int]  # key -> cell index in file order
    pos: dict[tuple[Any, ...], int]
    duplicates: int
    beyond: int  # cells at or after the limit


def _cell_index(t: CellTable | None, mode: str, limit: int | None) -> _Cells:
    out = _Cells({}, {}, 0, 0)
    if t is None:
        return out
    start = t.seq_start
    pos = t.pos.tolist()
    ids = t.seq_ids.tolist()
    for i in range(t.count):
        p = int(pos[i])
        if limit is not None and mode != "recurrent" and p >= limit:
            out.beyond += 1
            continue
        seqs = tuple(sorted(ids[start[i]:start[i + 1]]))
        key: tuple[Any, ...] = (p,) if mode == "per_seq" else (seqs,) if mode == "recurrent" else (seqs, p)
        if key in out.keys:
            out.duplicates += 1
            continue
        out.keys[key] = i
        out.pos[key] = p
    return out


def _describe_key(key: tuple[Any, ...], mode: str, index: int | None = None) -> dict[str, Any]:
    d: dict[str, Any] = {}
    if index is not None:
        d["index"] = index
    if mode == "per_seq":
        d["pos"] = key[0]
    elif mode == "rows":
        d["row"] = key[0]
    elif mode == "recurrent":
        d["seqs"] = list(key[0])
    else:
        d["seqs"], d["pos"] = list(key[0]), key[1]
    return d


# ---------------------------------------------------------------------------------------------
# values


def _rows(src: ByteSource, rec: LayerRecord, idx: I64A, like: LayerRecord | None = None) -> F32A:
    """Dequantized, de-rotated rows (``record_rows`` de-rotates rows stored rotated). ``like``: the engine's
    record whose values these bytes hold when the file's structure gives them another role (a V record read
    as a K one after a dropped record): its rotation is the one the bytes were written with."""
    if like is None or like.role == rec.role:
        return record_rows(src, rec, idx)
    raw = record_rows(src, rec, idx, derotate=False)
    return rotate_blocks(raw, like.rot_block) if _rotated(like, raw) else raw


def _present(src: ByteSource, rec: LayerRecord) -> int:
    n, dim = record_shape(rec, src.size - rec.data_offset)
    return n if dim else 0


def _same_shape(a: LayerRecord, b: LayerRecord) -> bool:
    wa = a.n_embd_v_gqa if a.transposed else gt.elements_in_row(a.type_id, a.row_bytes) if gt.is_known_type(
        a.type_id) else None
    wb = b.n_embd_v_gqa if b.transposed else gt.elements_in_row(b.type_id, b.row_bytes) if gt.is_known_type(
        b.type_id) else None
    return wa is not None and wa == wb and wa > 0


def _sample_cost(fs: ByteSource, fr: LayerRecord, gs: ByteSource, gr: LayerRecord, fi: I64A, gi: I64A) -> float:
    """How unlike two records are on a few shared cells: RMS of the difference / RMS of the engine's (at most 2)."""
    if not _same_shape(fr, gr) or not fi.size:
        return 2.0
    n = _present(fs, fr)
    keep = fi < n
    if not keep.any():
        return 2.0
    fi, gi = fi[keep], gi[keep]
    pick = np.unique(np.linspace(0, fi.size - 1, min(SAMPLE_CELLS, fi.size)).astype(np.int64))
    try:
        a, b = _rows(fs, fr, fi[pick], like=gr), _rows(gs, gr, gi[pick])
    except (ValueError, NotImplementedError):
        return 2.0
    with np.errstate(all="ignore"):
        d = a.astype(np.float64) - b
        if not np.isfinite(d).all():
            return 2.0
        scale = float(np.sqrt(np.mean(b.astype(np.float64) ** 2))) or 1e-12
        return min(2.0, float(np.sqrt(np.mean(d * d))) / scale)


def _compare_pair(fs: ByteSource, fr: LayerRecord, gs: ByteSource, gr: LayerRecord, fi: I64A, gi: I64A,
                  tol: Tolerance, out: RecordCheck, keys: list[tuple[Any, ...]], mode: str,
                  cancel: Callable[[], bool], limits: Callable[[Limits, float], Limits] | None = None) -> None:
    if not _same_shape(fr, gr):
        out.status, out.note = "differs", (f"the file's record is {fr.type} x {_width(fr)}, the engine's "
                                            f"{gr.type} x {_width(gr)}")
        return
    n_present = _present(fs, fr)
    if n_present < fr.n_rows:
        out.note = f"the file holds {n_present} of the record's {fr.n_rows} rows (cut short)"
    elif _same_payload(fs, fr, gs, gr, fi, gi):  # every cell in place and bit for bit: nothing to decode
        out.status, out.exact, out.n_cells = "match", True, int(fi.size)
        out.max_abs = out.max_rel = out.rms_rel = out.cell_rms_rel = 0.0
        return
    order = np.argsort(fi, kind="stable")  # cells in file order: the first bad cell is the file's first
    fi_o, gi_o = fi[order], gi[order]
    keep = fi_o < n_present
    lost = int((~keep).sum())
    row_max = np.zeros(fi_o.size, np.float64)
    row_nf = np.zeros(fi_o.size, bool)
    row_d2 = np.zeros(fi_o.size, np.float64)
    row_zero = np.zeros(fi_o.size, bool)  # the file's row is all zeros, the engine's is not
    width = 0
    sum_d2 = sum_b2 = 0.0
    ref_max = 0.0
    n_vals = 0
    exact = lost == 0
    for a0 in range(0, fi_o.size, CHUNK_CELLS):
        if cancel():
            raise Cancelled
        sl = slice(a0, a0 + CHUNK_CELLS)
        k = keep[sl]
        fidx, gidx = fi_o[sl][k], gi_o[sl][k]
        if not fidx.size:
            continue
        raw_a, raw_b = record_rows(fs, fr, fidx, derotate=False), record_rows(gs, gr, gidx, derotate=False)
        exact = exact and bool(np.array_equal(raw_a, raw_b, equal_nan=True))
        rot = gr if fr.role != gr.role else fr  # a record read in another role holds the engine record's rows
        a = rotate_blocks(raw_a, rot.rot_block) if _rotated(rot, raw_a) else raw_a
        b = rotate_blocks(raw_b, gr.rot_block) if _rotated(gr, raw_b) else raw_b
        at = np.flatnonzero(k) + a0
        with np.errstate(all="ignore"):
            width = width or _width_of(a)
            if not width:
                continue
            if a.shape == b.shape:
                row_zero[at] = ~a.any(axis=1) & b.any(axis=1)
            if np.isfinite(a).all() and np.isfinite(b).all():  # the common case: float32 throughout
                d = np.abs(a - b)
                row_max[at] = d.max(axis=1)
                row_d2[at] = np.einsum("ij,ij->i", d, d, dtype=np.float64)
                dv, bv = d.ravel(), b.ravel()
                sum_d2 += float(np.dot(dv, dv))
                sum_b2 += float(np.dot(bv, bv))
                n_vals += int(bv.size)
                ref_max = max(ref_max, float(np.abs(bv).max()))
                continue
            fa, fb = np.isfinite(a), np.isfinite(b)
            b64 = np.where(fb, b, 0.0).astype(np.float64)
            d64 = np.where(fa & fb, np.abs(a.astype(np.float64) - b64), 0.0)
            row_max[at] = d64.max(axis=1)
            row_d2[at] = np.sum(d64 * d64, axis=1)
            row_nf[at] = (~fa & fb).any(axis=1)
            sum_d2 += float(np.sum(d64 * d64))
            sum_b2 += float(np.sum(b64 * b64))
            n_vals += int(fb.sum())
            ref_max = max(ref_max, float(np.abs(b64).max(initial=0.0)))
    tol_max, tol_rms = tol.for_type(gr.type_id)
    scale = (float(np.sqrt(sum_b2 / n_vals)) if n_vals else 0.0) or 1e-12
    max_abs = float(row_max.max(initial=0.0))
    floor = Limits(tol_max * scale, tol_rms)
    lim = limits(floor, ref_max) if limits is not None else floor
    limit_max, limit_rms = lim.max_abs, lim.rms_rel
    if lim.spread_max_rel is not None:
        out.spread_max_rel, out.spread_rms_rel = lim.spread_max_rel, lim.spread_rms_rel
    out.limit_max_abs, out.limit_rms_rel = limit_max, limit_rms
    bad = row_nf | (row_max > limit_max) | ~keep
    out.n_cells = int(keep.sum())
    out.max_abs = max_abs
    out.max_rel = max_abs / ref_max if ref_max else (0.0 if max_abs == 0 else None)
    out.rms_rel = float(np.sqrt(sum_d2 / n_vals)) / scale if n_vals else None
    changed = keep & (row_max > 0)
    if n_vals and width:
        n_changed = int(changed.sum())
        out.cell_rms_rel = (float(np.sqrt(row_d2[changed].sum() / (n_changed * width))) / scale if n_changed
                            else 0.0)
    out.exact = exact
    out.n_bad_cells = int(bad.sum())
    out.n_zero_cells = int((bad & row_zero).sum())
    if bad.any():
        j = int(np.flatnonzero(bad)[0])
        out.first_cell = _describe_key(keys[int(order[j])], mode, int(fi_o[j]))
    nonfinite = int(row_nf.sum())
    if nonfinite:
        out.status = "nonfinite"
        out.note = (out.note + "; " if out.note else "") + f"{nonfinite} cell(s) hold NaN/Inf"
    elif bad.any() or (out.rms_rel is not None and out.rms_rel > limit_rms):
        out.status = "differs"
        if out.n_zero_cells:
            out.note = (out.note + "; " if out.note else "") + (
                f"{out.n_zero_cells} of its {out.n_bad_cells} bad cell(s) hold zeros where the engine computes values")
    else:
        out.status = "match"


def _width_of(vals: F32A) -> int:
    """Values per row of a decoded block (0: nothing to compare)."""
    return int(vals.shape[1]) if vals.ndim == 2 else 0


def _same_payload(fs: ByteSource, fr: LayerRecord, gs: ByteSource, gr: LayerRecord, fi: I64A, gi: I64A) -> bool:
    """The two records hold the same cells in the same order (every one compared) with the same bytes."""
    n = fr.n_rows
    if (n != gr.n_rows or fi.size != n or fr.data_size != gr.data_size or fr.type_id != gr.type_id
            or fr.transposed != gr.transposed or fr.rotated != gr.rotated or fr.rot_block != gr.rot_block):
        return False
    ident = np.arange(n, dtype=np.int64)
    if not (np.array_equal(fi, ident) and np.array_equal(gi, ident)):
        return False
    step = 16 << 20
    for off in range(0, fr.data_size, step):
        k = min(step, fr.data_size - off)
        a, b = fs.raw(fr.data_offset + off, k), gs.raw(gr.data_offset + off, k)
        if a is None or b is None or a != b:
            return False
    return True


def _rotated(rec: LayerRecord, vals: F32A) -> bool:
    return derotates(rec) and vals.shape[1] % rec.rot_block == 0


def _width(r: LayerRecord) -> int | None:
    if r.transposed:
        return r.n_embd_v_gqa
    return gt.elements_in_row(r.type_id, r.row_bytes) if gt.is_known_type(r.type_id) else None


# ---------------------------------------------------------------------------------------------
# alignment


def _align(costs: dict[tuple[int, int], float], n: int, m: int) -> list[tuple[int | None, int | None]]:
    """A monotone pairing of file records 0..n-1 with engine records 0..m-1 of least total cost
    (an unpaired record costs SKIP_COST; only the pairs in ``costs`` may be made)."""
    inf = float("inf")
    dp = [[inf] * (m + 1) for _ in range(n + 1)]
    back: list[list[int]] = [[0] * (m + 1) for _ in range(n + 1)]
    dp[0][0] = 0.0
    for i in range(n + 1):
        for j in range(m + 1):
            cur = dp[i][j]
            if cur == inf:
                continue
            if i < n and j < m and (i, j) in costs and cur + costs[(i, j)] < dp[i + 1][j + 1]:
                dp[i + 1][j + 1], back[i + 1][j + 1] = cur + costs[(i, j)], 1
            if i < n and cur + SKIP_COST < dp[i + 1][j]:
                dp[i + 1][j], back[i + 1][j] = cur + SKIP_COST, 2  # file record i unpaired: extra
            if j < m and cur + SKIP_COST < dp[i][j + 1]:
                dp[i][j + 1], back[i][j + 1] = cur + SKIP_COST, 3  # engine record j unpaired: missing
    out: list[tuple[int | None, int | None]] = []
    i, j = n, m
    while i or j:
        step = back[i][j]
        if step == 1:
            out.append((i - 1, j - 1))
            i, j = i - 1, j - 1
        elif step == 2:
            out.append((i - 1, None))
            i -= 1
        else:
            out.append((None, j - 1))
            j -= 1
    out.reverse()
    return out


# ---------------------------------------------------------------------------------------------
# sections and streams


@dataclass
class _Unit:
    """One stream of a KV section, or a recurrent section: its cells and records."""

    cells: CellTable | None
    records: list[LayerRecord]


def _units(sec: Section) -> dict[int | None, _Unit]:
    if sec.kind == "kv":
        return {st.index: _Unit(st.cells, [*st.k_layers, *st.v_layers]) for st in sec.streams}
    if sec.kind == "recurrent":
        return {None: _Unit(sec.cells, [r for r in (*sec.r_layers, *sec.s_layers)])}
    return {None: _Unit(None, list(sec.records))}


def _nonempty(r: LayerRecord) -> bool:
    return r.data_size > 0 and (r.row_bytes > 0 or r.transposed)


class _Comparer:
    def __init__(self, file_res: ParseResult, fs: ByteSource, fresh_res: ParseResult, gs: ByteSource,
                 per_seq: bool, limit_pos: int | None, tol: Tolerance, progress: Progress | None,
                 cancel: Callable[[], bool], calibration: RecordLimits | None = None) -> None:
        self.fres, self.fs, self.gres, self.gs = file_res, fs, fresh_res, gs
        self.per_seq, self.limit, self.tol = per_seq, limit_pos, tol
        self.progress, self.cancel = progress, cancel
        self.calibration = calibration
        self.out = Comparison(tolerance=tol, calibration=calibration)
        self.total = sum(len(u.records) for s in fresh_res.sections for u in _units(s).values()) or 1
        self.done = 0

    def _limits(self, role: str, stream: int | None, gr: LayerRecord) -> Callable[[Limits, float], Limits] | None:
        """The calibration's limits for the engine's record ``gr`` (None: the fixed tolerance alone)."""
        cal = self.calibration
        if cal is None:
            return None
        key: RecordKey = (role, stream, gr.role, gr.il)

        def limits(floor: Limits, ref_max: float) -> Limits:
            return cal.record_limits(key, floor, ref_max)

        return limits

    def _tick(self, label: str) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress(min(self.done, self.total), self.total, label)

    def run(self) -> Comparison:
        by_role: dict[str, list[tuple[int, Section]]] = {}
        for i, s in enumerate(self.fres.sections):
            by_role.setdefault(s.role, []).append((i, s))
        used: set[int] = set()
        for gi, gsec in enumerate(self.gres.sections):
            cands = [x for x in by_role.get(gsec.role, []) if x[0] not in used]
            if cands:
                fi, fsec = cands[0]
                used.add(fi)
                self._section(fi, fsec, gsec)
            else:
                self._whole(gi, gsec, "missing", f"the file has no {gsec.role} section")
        for fi, fsec in enumerate(self.fres.sections):
            if fi not in used:
                self._whole(fi, fsec, "extra", f"the engine writes no {fsec.role} section")
        return self.out

    def _whole(self, idx: int, sec: Section, status: str, note: str) -> None:
        for stream, unit in _units(sec).items():
            for r in unit.records:
                if _nonempty(r):
                    self.out.records.append(RecordCheck(sec.role, idx, stream, r.role, r.il, status, r.type,
                                                        note=note))
                self._tick(f"{sec.role} {r.role}{r.il}")

    def _section(self, idx: int, fsec: Section, gsec: Section) -> None:
        funits, gunits = _units(fsec), _units(gsec)
        mode = ("recurrent" if gsec.kind == "recurrent" else "rows" if gsec.kind.startswith("dsv4") else
                "per_seq" if self.per_seq else "whole")
        for stream in sorted({*funits, *gunits}, key=lambda s: -1 if s is None else s):
            fu = funits.get(stream, _Unit(None, []))
            gu = gunits.get(stream, _Unit(None, []))
            self._stream(idx, gsec.role, stream, fu, gu, mode)

    def _rows_unit(self, idx: int, role: str, fu: _Unit, gu: _Unit) -> None:
        """DeepSeek-V4 blocks: no cell table; rows pair by index (block i of the file with block i of the engine)."""
        frecs = [r for r in fu.records if _nonempty(r)]
        grecs = [r for r in gu.records if _nonempty(r)]
        if self.limit is not None:
            if frecs or grecs:
                self.out.notes.append(f"{role}: compressed blocks fold in the media chunks: not compared")
            return
        by_key = {(r.role, r.il): r for r in frecs}
        for gr in grecs:
            fr = by_key.pop((gr.role, gr.il), None)
            chk = RecordCheck(role, idx, None, gr.role, gr.il, "missing", gr.type)
            if fr is None:
                chk.note = f"the file holds no {gr.role} block record for layer {gr.il}"
            else:
                chk.file_index = frecs.index(fr)
                n = min(_present(self.fs, fr), gr.n_rows)
                rows = np.arange(n, dtype=np.int64)
                if not n:
                    chk.status, chk.note = "differs", "no rows in common"
                else:
                    _compare_pair(self.fs, fr, self.gs, gr, rows, rows, self.tol, chk, [(i,) for i in range(n)],
                                  "rows", self.cancel, self._limits(role, None, gr))
                if fr.n_rows != gr.n_rows:
                    chk.status = "differs" if chk.status == "match" else chk.status
                    chk.note = (chk.note + "; " if chk.note else "") + (
                        f"the file holds {fr.n_rows} rows, the engine {gr.n_rows}")
            self.out.records.append(chk)
            self._tick(f"{role} {gr.role}{gr.il}")
        for fr in by_key.values():
            self.out.records.append(RecordCheck(role, idx, None, fr.role, fr.il, "extra", fr.type,
                                                file_index=frecs.index(fr), note="the engine writes no such block"))

    def _stream(self, idx: int, role: str, stream: int | None, fu: _Unit, gu: _Unit, mode: str) -> None:
        limit = self.limit
        if mode == "rows":
            self._rows_unit(idx, role, fu, gu)
            return
        if mode == "recurrent" and limit is not None:  # a recurrent state folds in every token, media included
            if fu.records or gu.records:
                self.out.notes.append(f"{role}: the recurrent state folds in the media chunks: not compared")
            for _ in gu.records:
                self._tick(role)
            return
        fc, gc = _cell_index(fu.cells, mode, limit), _cell_index(gu.cells, mode, limit)
        common = [k for k in fc.keys if k in gc.keys]
        frecs = [r for r in fu.records if _nonempty(r)]
        grecs = [r for r in gu.records if _nonempty(r)]
        if not (frecs or grecs or fc.keys or gc.keys):
            return
        cc = CellsCheck(role, idx, stream, len(fc.keys) + fc.duplicates + fc.beyond, len(gc.keys), len(common),
                        not_compared=fc.beyond)
        miss = [k for k in gc.keys if k not in fc.keys]
        extra = [k for k in fc.keys if k not in gc.keys]
        cc.missing, cc.extra = len(miss), len(extra) + fc.duplicates
        if miss:
            cc.first_missing = _describe_key(miss[0], mode)
        if extra:
            cc.first_extra = _describe_key(extra[0], mode, fc.keys[extra[0]])
        if mode == "recurrent":
            cc.position_differs = sum(1 for k in common if fc.pos[k] != gc.pos[k])
        self.out.cells.append(cc)
        fi = np.array([fc.keys[k] for k in common], dtype=np.int64)
        gi = np.array([gc.keys[k] for k in common], dtype=np.int64)
        n, m = len(frecs), len(grecs)
        if n == m and all(a.role == b.role for a, b in zip(frecs, grecs, strict=True)):
            pairs: list[tuple[int | None, int | None]] = [(i, i) for i in range(n)]
        else:
            band = abs(n - m) + 1
            costs = {(i, j): _sample_cost(self.fs, frecs[i], self.gs, grecs[j], fi, gi)
                     for i in range(n) for j in range(m) if abs(i - j) <= band}
            pairs = _align(costs, n, m)
        for a, b in pairs:
            if self.cancel():
                raise Cancelled
            if b is None:
                assert a is not None
                fr = frecs[a]
                self.out.records.append(RecordCheck(role, idx, stream, fr.role, fr.il, "extra", fr.type, file_index=a,
                                                    note="the engine writes no record here"))
                continue
            gr = grecs[b]
            chk = RecordCheck(role, idx, stream, gr.role, gr.il, "missing", gr.type)
            if a is None:
                chk.note = f"the file holds no {gr.role.upper()} record for layer {gr.il}"
            else:
                fr = frecs[a]
                chk.file_index = a
                if (fr.role, fr.il) != (gr.role, gr.il):
                    chk.file_il = fr.il
                    chk.note = (f"the file's {fr.role.upper()} record #{fr.index} (read as layer {fr.il}) holds layer "
                                f"{gr.il}'s {gr.role.upper()} values")
                if not common:
                    chk.status, chk.note = "differs", chk.note or "no cell in common with the engine's state"
                else:
                    note = chk.note
                    _compare_pair(self.fs, fr, self.gs, gr, fi, gi, self.tol, chk, common, mode, self.cancel,
                                  self._limits(role, stream, gr))
                    if note and chk.note != note:
                        chk.note = note + "; " + chk.note
            self.out.records.append(chk)
            self._tick(f"{role} {gr.role}{gr.il}")


def compare_states(file_res: ParseResult, file_src: ByteSource, fresh_res: ParseResult, fresh_src: ByteSource, *,
                   per_seq: bool, limit_pos: int | None = None, tolerance: Tolerance | None = None,
                   progress: Progress | None = None,
                   cancel: Callable[[], bool] | threading.Event | None = None,
                   calibration: RecordLimits | None = None) -> Comparison:
    """Every record of ``file_res`` against ``fresh_res`` (the engine's prefill of the same tokens).

    ``per_seq``: the two are one sequence's state (cells pair by position); ``limit_pos``: compare
    only cells below it. ``progress(done, total, label)`` after each record; ``cancel`` (a callable
    or an Event) is checked between chunks and raises :class:`Cancelled`. ``calibration``: the
    engine's own variation per record, which sets the limits (the tolerance stays their floor).
    """
    if cancel is None:
        def check() -> bool:
            return False
    elif isinstance(cancel, threading.Event):
        check = cancel.is_set
    else:
        check = cancel
    return _Comparer(file_res, file_src, fresh_res, fresh_src, per_seq, limit_pos, tolerance or Tolerance(),
                     progress, check, calibration).run()
