"""Cell metadata of one KV stream (``llama_kv_cells``) and the ubatch/slot types around it.

A cell holds a position (-1: empty), the set of sequences that see it, its ``llama_kv_cell_ext``
(x, y, tok; reset to 0, 0, -1) and the pending RoPE shift. Everything is column-wise numpy, so
sequence operations on large caches are a few vectorized calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from kvscope.core.memory.spec import is_masked_swa

I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]
POS_MAX = np.iinfo(np.int32).max
TOKEN_NULL = -1
CellsSnap = tuple[I32, npt.NDArray[np.bool_], I32, I32, int]


@dataclass
class Ubatch:
    """Tokens to place: positions, sequence ids per token, and optional ids / 2-D positions.

    With several KV streams the tokens must come as equal-sized groups, one sequence per group
    (``llama_batch_allocr::split_equal``); a recurrent memory needs the same shape.
    """

    pos: Sequence[int]
    seq_ids: Sequence[Sequence[int]]
    tokens: Sequence[int] | None = None
    pos_2d: Sequence[tuple[int, int]] | None = None  # (x, y) per token (M-RoPE)

    def __post_init__(self) -> None:
        if len(self.seq_ids) != len(self.pos):
            raise ValueError("one sequence-id list per token is needed")
        if self.tokens is not None and len(self.tokens) != len(self.pos):
            raise ValueError("one token id per token is needed")
        if self.pos_2d is not None and len(self.pos_2d) != len(self.pos):
            raise ValueError("one 2-D position per token is needed")
        if any(len(s) == 0 for s in self.seq_ids):
            raise ValueError("every token needs at least one sequence id")

    @property
    def n_tokens(self) -> int:
        """Number of tokens in the ubatch."""
        return len(self.pos)

    def groups(self) -> list[tuple[tuple[int, ...], int, int]]:
        """(seq ids, first token, token count) of each group of tokens with the same ids."""
        out: list[tuple[tuple[int, ...], int, int]] = []
        for i, s in enumerate(self.seq_ids):
            key = tuple(s)
            if out and out[-1][0] == key:
                ids, first, n = out[-1]
                out[-1] = (ids, first, n + 1)
            else:
                out.append((key, i, 1))
        return out

    def equal_groups(self) -> list[tuple[tuple[int, ...], int, int]]:
        """The groups, checked to be equally sized and to name distinct sequence sets."""
        g = self.groups()
        if len({n for _, _, n in g}) > 1 or len({ids for ids, _, _ in g}) != len(g):
            raise ValueError("tokens must come as equal-sized groups, one group per sequence set")
        return g


@dataclass
class SlotInfo:
    """Where a ubatch goes: per sequence group, its stream and the chosen cell indices."""

    strm: list[int] = field(default_factory=list)
    idxs: list[I64] = field(default_factory=list)

    def empty(self) -> bool:
        """True when no cells were found (``find_slot`` failed)."""
        return not self.idxs

    def runs(self, k: int = 0) -> list[tuple[int, int]]:
        """Maximal runs ``[a, b)`` of consecutive cell indices of group ``k``."""
        return index_runs(self.idxs[k]) if self.idxs else []


def index_runs(idx: I64) -> list[tuple[int, int]]:
    """Maximal runs of consecutive values of a sorted index array."""
    if idx.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(idx) != 1)
    starts = np.r_[0, breaks + 1]
    ends = np.r_[breaks, idx.size - 1]
    return [(int(idx[s]), int(idx[e]) + 1) for s, e in zip(starts, ends, strict=True)]


class KvCells:
    """Per-cell metadata of one stream plus its ``head`` (where the next slot search starts)."""

    def __init__(self, size: int, n_seq_max: int) -> None:
        self.pos: I32 = np.full(size, -1, np.int32)
        self.seq = np.zeros((size, n_seq_max), dtype=bool)
        self.ext: I32 = np.zeros((size, 3), np.int32)
        self.ext[:, 2] = TOKEN_NULL
        self.shift: I32 = np.zeros(size, np.int32)
        self.head = 0

    @property
    def size(self) -> int:
        """Number of cells in the stream."""
        return int(self.pos.size)

    @property
    def n_seq_max(self) -> int:
        """Number of sequences a cell can belong to."""
        return int(self.seq.shape[1])

    def used(self) -> int:
        """Number of non-empty cells (``llama_kv_cells::is_empty`` is ``pos == -1``: a cell restored at
        another negative position holds its sequences and is written out)."""
        return int(np.count_nonzero(self.pos != -1))

    def nonempty(self) -> npt.NDArray[np.bool_]:
        """Mask of the non-empty cells (``pos != -1``, as llama.cpp's ``is_empty``)."""
        return np.not_equal(self.pos, -1)

    def seq_pos_min(self, s: int) -> int:
        """Smallest position of sequence ``s`` in this stream (-1: none)."""
        m = self.seq[:, s]
        return int(self.pos[m].min()) if m.any() else -1

    def seq_pos_max(self, s: int) -> int:
        """Largest position of sequence ``s`` in this stream (-1: none)."""
        m = self.seq[:, s]
        return int(self.pos[m].max()) if m.any() else -1

    def seq_pos_max_all(self) -> I64:
        """``seq_pos_max`` of every sequence (-1 where a sequence has no cell here)."""
        p = np.where(self.seq, self.pos[:, None].astype(np.int64), -1)
        return p.max(axis=0) if self.size else np.full(self.n_seq_max, -1, np.int64)

    # -- cell edits (vectorized over a mask) ---------------------------------------------------
    def rm(self, mask: npt.NDArray[np.bool_]) -> None:
        """Empty the cells of ``mask``."""
        self.pos[mask] = -1
        self.seq[mask] = False
        self.ext[mask] = (0, 0, TOKEN_NULL)
        self.shift[mask] = 0

    def seq_rm(self, mask: npt.NDArray[np.bool_], s: int) -> npt.NDArray[np.bool_]:
        """Drop sequence ``s`` from the cells of ``mask`` (they must hold it); returns the emptied."""
        self.seq[mask, s] = False
        emptied = mask & ~self.seq.any(axis=1)
        self.rm(emptied)
        return emptied

    def rm_at(self, i: int) -> None:
        """Empty cell ``i``."""
        self.pos[i] = -1
        self.seq[i] = False
        self.ext[i] = (0, 0, TOKEN_NULL)
        self.shift[i] = 0

    def reset(self) -> None:
        """Empty every cell and restart the slot search at 0."""
        self.rm(np.ones(self.size, dtype=bool))
        self.head = 0

    def pos_in(self, p0: int, p1: int) -> npt.NDArray[np.bool_]:
        """Mask of the cells whose position is in ``[p0, p1)``."""
        return (self.pos >= p0) & (self.pos < p1)

    def move_head(self, emptied: npt.NDArray[np.bool_]) -> None:
        """If a cell before ``head`` was freed, restart the next search there."""
        hit = np.flatnonzero(emptied)
        if hit.size and int(hit[0]) < self.head:
            self.head = int(hit[0])

    # -- snapshots ------------------------------------------------------------------------------
    def snapshot(self) -> CellsSnap:
        """A copy of the metadata (for a transactional restore)."""
        return self.pos.copy(), self.seq.copy(), self.ext.copy(), self.shift.copy(), self.head

    def restore(self, snap: CellsSnap) -> None:
        """Put back a :meth:`snapshot`."""
        pos, seq, ext, shift, head = snap
        self.pos[...] = pos
        self.seq[...] = seq
        self.ext[...] = ext
        self.shift[...] = shift
        self.head = head

    # -- slot search -------------------------------------------------------------------------------
    def usable(self, n_swa: int, swa_type: int) -> npt.NDArray[np.bool_]:
        """Cells ``find_slot`` may take: empty, or held by one sequence and SWA-masked for it."""
        ok = np.equal(self.pos, -1)
        single = (self.seq.sum(axis=1) == 1) & ~ok
        if single.any() and swa_type:
            pmax = self.seq_pos_max_all()
            for i in np.flatnonzero(single):
                s = int(np.flatnonzero(self.seq[i])[0])
                if is_masked_swa(n_swa, swa_type, int(self.pos[i]), int(pmax[s]) + 1):
                    ok[i] = True
        return ok

    def find(self, n_tokens: int, cont: bool, n_swa: int, swa_type: int) -> I64 | None:
        """``llama_kv_cache::find_slot`` for one sequence group of ``n_tokens`` tokens."""
        size = self.size
        if n_tokens > size:
            return None
        head = self.head
        if head > self.used() + 2 * n_tokens:
            head = 0
        usable = self.usable(n_swa, swa_type)
        if not cont:
            order = np.r_[np.arange(head % size, size), np.arange(0, head % size)].astype(np.int64)
            hit = order[usable[order]]
            return hit[:n_tokens] if hit.size >= n_tokens else None
        tested = 0
        while True:
            if head + n_tokens > size:
                tested += size - head
                head = 0
                continue
            block = usable[head : head + n_tokens]
            if block.all():
                return np.arange(head, head + n_tokens, dtype=np.int64)
            k = int(np.flatnonzero(~block)[0])
            head += k + 1
            tested += k + 1
            if tested >= size:
                return None
