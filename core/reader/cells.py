"""Vectorised parsing of cell meta tables (``pos, n_seq_id, [ext], seq ids``).

A table is read as runs of records that share ``n_seq_id``: each run is one reshaped numpy
view, so a 262,144-cell table with uniform records costs a handful of numpy calls and no
per-cell Python loop. Counts are checked against the bytes present before anything is sized.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kvscope.core.reader.records import CellTable
from kvscope.core.reader.source import ByteSource

MAX_SEQ_PER_CELL = 256  # LLAMA_MAX_SEQ: more sequence ids than this in one cell is garbage
WINDOW = 1 << 16  # records examined per vectorised step: bounds memory and stops early on garbage


@dataclass
class CellScan:
    table: CellTable | None
    end: int  # offset after the last complete record
    ok: bool
    bad_offset: int | None = None  # where the first bad or missing record starts
    reason: str = ""  # "truncated" | "n_seq_id"


def min_record_bytes(ext_bytes: int) -> int:
    return 8 + ext_bytes


def scan_cells(src: ByteSource, off: int, count: int | None, ext_bytes: int, limit: int) -> CellScan:
    """Parse ``count`` records at ``off`` (``None``: as many plausible records as there are).

    Stops early, returning what parsed, at a truncated record or an implausible ``n_seq_id``.
    """
    ext_w = ext_bytes // 4
    n_words = max(0, min(limit, src.size) - off) // 4
    words = src.i32_array(off, n_words)
    want = count if count is not None else n_words // (2 + ext_w)
    pos_parts: list[npt.NDArray[np.int32]] = []
    nseq_parts: list[npt.NDArray[np.int32]] = []
    ids_parts: list[npt.NDArray[np.int32]] = []
    ext_parts: list[npt.NDArray[np.int32]] = []
    w = 0
    done = 0
    ok = True
    reason = ""
    while done < want:
        if w + 2 + ext_w > words.size:
            ok, reason = False, "truncated"
            break
        k = int(words[w + 1])
        if k < 0 or k > MAX_SEQ_PER_CELL:
            ok, reason = False, "n_seq_id"
            break
        stride = 2 + ext_w + k
        n_fit = min(want - done, (words.size - w) // stride, WINDOW)
        if n_fit == 0:
            ok, reason = False, "truncated"
            break
        block = words[w : w + n_fit * stride].reshape(n_fit, stride)
        bad = block[:, 1] != k
        first = int(bad.argmax())
        run = first if bad[first] else n_fit
        blk = block[:run]
        pos_parts.append(blk[:, 0])
        nseq_parts.append(np.full(run, k, dtype=np.int32))
        if ext_w:
            ext_parts.append(blk[:, 2 : 2 + ext_w])
        if k:
            ids_parts.append(blk[:, 2 + ext_w :].reshape(-1))
        done += run
        w += run * stride
    if count is None and not ok:
        ok = True  # open-ended scan: stopping at the first implausible record is the answer
        return CellScan(_table(off, pos_parts, nseq_parts, ids_parts, ext_parts, ext_w, ext_bytes, off + 4 * w),
                        off + 4 * w, True, None, reason)
    end = off + 4 * w
    table = _table(off, pos_parts, nseq_parts, ids_parts, ext_parts, ext_w, ext_bytes, end)
    return CellScan(table, end, ok, None if ok else end, reason)


def _table(
    off: int,
    pos_parts: list[npt.NDArray[np.int32]],
    nseq_parts: list[npt.NDArray[np.int32]],
    ids_parts: list[npt.NDArray[np.int32]],
    ext_parts: list[npt.NDArray[np.int32]],
    ext_w: int,
    ext_bytes: int,
    end: int,
) -> CellTable:
    return CellTable(
        offset=off,
        size=end - off,
        pos=np.ascontiguousarray(np.concatenate(pos_parts)) if pos_parts else np.zeros(0, np.int32),
        n_seq=np.concatenate(nseq_parts) if nseq_parts else np.zeros(0, np.int32),
        seq_ids=np.ascontiguousarray(np.concatenate(ids_parts)) if ids_parts else np.zeros(0, np.int32),
        ext=(np.ascontiguousarray(np.concatenate(ext_parts)) if ext_parts else np.zeros((0, ext_w), np.int32))
        if ext_w
        else None,
        ext_bytes=ext_bytes,
    )
