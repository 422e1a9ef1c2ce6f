"""Vectorised parsing of cell meta tables (``pos, n_seq_id, [ext], seq ids``).

A table is read as runs of records that share ``n_seq_id``: each run is one reshaped numpy
array, so a 262,144-cell table with uniform records costs a handful of numpy calls and no
per-cell Python loop. The bytes are read window by window (at most ``WINDOW`` records and
``WINDOW_WORDS`` words at a time), never as one array the size of the rest of the file.

Untrusted sizes never drive allocation: :func:`scan_cells` grows its arrays with the records it
actually parses, and parses at most ``MAX_RECORDS`` (2**24) of them: more is reported as
``reason == "budget"`` (a count that the bytes could hold, a hole of zeros in a sparse file
being plausible empty records, is not trusted further than that). :func:`scan_extent` finds
where plausible records end without building any table, in memory bounded by one window
whatever the file's size.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from kvscope.core.reader.records import CellTable
from kvscope.core.reader.source import ByteSource

MAX_SEQ_PER_CELL = 256  # LLAMA_MAX_SEQ: more sequence ids than this in one cell is garbage
WINDOW = 1 << 16  # records examined per vectorised step: bounds memory and stops early on garbage
WINDOW_WORDS = 1 << 20  # words read per step at most (4 MiB)
MAX_RECORDS = 1 << 24  # the most records one table holds (as MAX_PLAUSIBLE_CELLS): a fixed memory budget
OPEN_SCAN_RECORDS = MAX_RECORDS  # an open-ended scan looks at this many records at most
TAIL_ENDS = 65  # record end offsets an extent keeps, for walking back from its end


@dataclass
class CellScan:
    table: CellTable | None
    end: int  # offset after the last complete record
    ok: bool
    bad_offset: int | None = None  # where the first bad or missing record starts
    reason: str = ""  # "truncated" | "n_seq_id" | "budget" (more than MAX_RECORDS asked for)


@dataclass
class CellExtent:
    """How far plausible cell records run from an offset (no table is built)."""

    count: int  # records
    end: int  # offset after the last of them
    reason: str = ""  # why the scan stopped: "truncated" | "n_seq_id" | "" (asked-for count reached)
    ends: list[int] = field(default_factory=list)  # end offsets after count-len+1 .. count records

    def end_after(self, n: int) -> int | None:
        """Offset after the first ``n`` records, when ``n`` is among the last ``TAIL_ENDS``."""
        i = len(self.ends) - 1 - (self.count - n)
        return self.ends[i] if 0 <= i < len(self.ends) else None


def min_record_bytes(ext_bytes: int) -> int:
    return 8 + ext_bytes


def _next_run(src: ByteSource, pos: int, left: int, ext_w: int,
              end_lim: int) -> tuple[int, npt.NDArray[np.int32] | None, str]:
    """The next run of records sharing ``n_seq_id`` at byte ``pos``: ``(k, rows, reason)``.

    ``rows`` is ``(run, 2 + ext_w + k)`` int32 (None with a reason when no record fits or the
    first one is implausible); at most ``left`` records, ``WINDOW`` records and ``WINDOW_WORDS`` words.
    """
    if pos + 4 * (2 + ext_w) > end_lim:
        return 0, None, "truncated"
    k = src.i32(pos + 4)
    assert k is not None
    if k < 0 or k > MAX_SEQ_PER_CELL:
        return k, None, "n_seq_id"
    stride = 2 + ext_w + k
    n_fit = min(left, (end_lim - pos) // (4 * stride), WINDOW, max(1, WINDOW_WORDS // stride))
    if n_fit == 0:
        return k, None, "truncated"
    block = src.i32_array(pos, n_fit * stride).reshape(n_fit, stride)
    bad = block[:, 1] != k
    first = int(bad.argmax())
    run = first if bad[first] else n_fit
    return k, block[:run], ""


def scan_cells(src: ByteSource, off: int, count: int | None, ext_bytes: int, limit: int,
               max_records: int = OPEN_SCAN_RECORDS) -> CellScan:
    """Parse ``count`` records at ``off`` (``None``: as many plausible records as there are, up to
    ``max_records``).

    Stops early, returning what parsed, at a truncated record or an implausible ``n_seq_id``.
    """
    ext_w = ext_bytes // 4
    end_lim = min(limit, src.size)
    fit = max(0, end_lim - off) // (4 * (2 + ext_w))  # records the bytes could hold at most
    want = min(max_records, fit) if count is None else min(count, MAX_RECORDS)
    # Columns grow with the records actually parsed (doubling), never sized from the count alone.
    cap = min(want, fit, WINDOW)
    pos = np.empty(cap, np.int32)
    nseq = np.empty(cap, np.int32)
    ext = np.empty((cap, ext_w), np.int32) if ext_w else None
    ids_parts: list[npt.NDArray[np.int32]] = []
    cur = off
    done = 0
    ok = True
    reason = ""
    while done < want:
        k, blk, why = _next_run(src, cur, want - done, ext_w, end_lim)
        if blk is None:
            ok, reason = False, why
            break
        run = int(blk.shape[0])
        if done + run > pos.size:
            cap = min(max(2 * pos.size, done + run), want)
            pos, nseq = _grow(pos, cap), _grow(nseq, cap)
            ext = _grow(ext, cap) if ext is not None else None
        pos[done : done + run] = blk[:, 0]
        nseq[done : done + run] = k
        if ext is not None:
            ext[done : done + run] = blk[:, 2 : 2 + ext_w]
        if k:
            ids_parts.append(np.ascontiguousarray(blk[:, 2 + ext_w :]).reshape(-1))
        done += run
        cur += 4 * run * (2 + ext_w + k)
    if ok and count is not None and count > want:
        ok, reason = False, "budget"  # more records than any table kvscope reads
    table = CellTable(
        offset=off,
        size=cur - off,
        pos=pos[:done].copy() if done < pos.size else pos,
        n_seq=nseq[:done].copy() if done < nseq.size else nseq,
        seq_ids=np.concatenate(ids_parts) if len(ids_parts) > 1 else ids_parts[0] if ids_parts
        else np.zeros(0, np.int32),
        ext=(ext[:done].copy() if done < ext.shape[0] else ext) if ext is not None else None,
        ext_bytes=ext_bytes,
    )
    if count is None and not ok:
        return CellScan(table, cur, True, None, reason)  # open-ended: the first implausible record ends it
    return CellScan(table, cur, ok, None if ok else cur, reason)


def _grow(a: npt.NDArray[np.int32], n: int) -> npt.NDArray[np.int32]:
    out = np.empty((n, *a.shape[1:]), a.dtype)
    out[: a.shape[0]] = a
    return out


def scan_extent(src: ByteSource, off: int, ext_bytes: int, limit: int, max_records: int,
                min_n_seq: int = 0) -> CellExtent:
    """How many plausible records follow ``off`` (at most ``max_records``), building no table.

    ``min_n_seq``: records with fewer sequence ids end the scan (a KV cache writes only cells
    that hold a sequence, so from the n_stream layouts on its records have at least one).
    Memory is one window of records whatever the file's size; time is linear in the records
    looked at (``max_records`` bounds it).
    """
    ext_w = ext_bytes // 4
    end_lim = min(limit, src.size)
    cur = off
    done = 0
    reason = ""
    ends = [off]
    while done < max_records:
        k, blk, why = _next_run(src, cur, max_records - done, ext_w, end_lim)
        if blk is None:
            reason = why
            break
        if k < min_n_seq:
            reason = "n_seq_id"
            break
        run = int(blk.shape[0])
        step = 4 * (2 + ext_w + k)
        m = min(run, TAIL_ENDS)
        ends = (ends + [cur + step * j for j in range(run - m + 1, run + 1)])[-TAIL_ENDS:]
        done += run
        cur += step * run
    return CellExtent(done, cur, reason, ends)
