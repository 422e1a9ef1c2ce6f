"""Sliding-window masks for the cell map (pure numpy, no Qt).

A cell of sequence ``s`` at position ``p0`` is outside the window of ``s`` when the sequence's
latest position ``p1`` (its max position among the cells) is ``n_swa`` or more ahead of it,
as llama.cpp's ``llama_hparams::is_masked_swa`` decides for ``LLAMA_SWA_TYPE_STANDARD``
(``p1 - p0 >= n_swa``); ``chunked`` follows ``LLAMA_SWA_TYPE_CHUNKED`` (``p0 < p1 // n_swa * n_swa``).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def seq_max_pos(pos: npt.NDArray[np.int32], seq_start: npt.NDArray[np.int64],
                seq_ids: npt.NDArray[np.int32]) -> dict[int, int]:
    """Max position per sequence id over a cell table (CSR sequence ids)."""
    owner = np.repeat(np.arange(pos.size), np.diff(seq_start))
    out: dict[int, int] = {}
    if seq_ids.size == 0:
        return out
    pair_pos = pos[owner].astype(np.int64)
    order = np.argsort(seq_ids, kind="stable")
    ids, first = np.unique(seq_ids[order], return_index=True)
    maxima = np.maximum.reduceat(pair_pos[order], first)
    return {int(s): int(m) for s, m in zip(ids, maxima, strict=True)}


def swa_masked_pairs(pos: npt.NDArray[np.int32], seq_start: npt.NDArray[np.int64],
                     seq_ids: npt.NDArray[np.int32], n_swa: int, chunked: bool = False) -> npt.NDArray[np.bool_]:
    """One flag per (cell, sequence) pair, aligned with ``seq_ids``: True when outside the window."""
    if n_swa <= 0 or seq_ids.size == 0:
        return np.zeros(seq_ids.size, dtype=bool)
    owner = np.repeat(np.arange(pos.size), np.diff(seq_start))
    p0 = pos[owner].astype(np.int64)
    maxima = seq_max_pos(pos, seq_start, seq_ids)
    p1 = _lookup(seq_ids, maxima)
    if chunked:
        return p0 < (p1 // n_swa) * n_swa
    return (p1 - p0) >= n_swa


def _lookup(seq_ids: npt.NDArray[np.int32], table: dict[int, int]) -> npt.NDArray[np.int64]:
    keys = np.array(sorted(table), dtype=np.int64)
    vals = np.array([table[int(k)] for k in keys], dtype=np.int64)
    return vals[np.searchsorted(keys, seq_ids.astype(np.int64))]


def swa_masked_cells(pos: npt.NDArray[np.int32], seq_start: npt.NDArray[np.int64],
                     seq_ids: npt.NDArray[np.int32], n_swa: int, chunked: bool = False) -> npt.NDArray[np.bool_]:
    """One flag per cell: True when the cell is outside the window of every sequence it holds."""
    pairs = swa_masked_pairs(pos, seq_start, seq_ids, n_swa, chunked)
    n_seq = np.diff(seq_start)
    out = np.zeros(pos.size, dtype=bool)
    if pairs.size:
        owner = np.repeat(np.arange(pos.size), n_seq)
        unmasked = np.bincount(owner[~pairs], minlength=pos.size)
        out = (unmasked == 0) & (n_seq > 0)
    return out
