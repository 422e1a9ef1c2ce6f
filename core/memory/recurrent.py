"""``llama_memory_recurrent``: one cell per sequence with r (conv / shift) and s (ssm / wkv) rows.

``size = max(1, n_seq_max)`` cells; ``tail[seq]`` is the cell holding a sequence's state and
``src`` the row a cell's state comes from. Layers without recurrent state hold no tensors; PLE
layers (Qwen4exp) hold a third row, ``p`` (the PLE conv history, of the r type). The
operations follow llama.cpp 0c1e5709 without rollback snapshots (``n_rs_seq = 0``). llama.cpp
moves state rows lazily in the next graph (``s_copy``); :meth:`RecurrentMemory.apply` does that
move at once (a new sequence starts from a zeroed state), so every used cell owns its own rows.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

from kvscope.core import ggml_types as gt
from kvscope.core.errors import InputError
from kvscope.core.memory.cells import I32, Ubatch
from kvscope.core.memory.tensors import TensorStore, dequantize_rows, quantize_rows

POS_MAX = np.iinfo(np.int32).max
RecSnap = tuple[I32, I32, I32, npt.NDArray[np.bool_], int]


class RecurrentError(InputError, ValueError):
    """An operation or construction llama.cpp would reject (one-line message)."""


class RecurrentMemory:
    """Recurrent state of ``layers`` (model layer indices) in ``size`` cells."""

    kind = "recurrent"

    def __init__(self, layers: tuple[int, ...], n_layer: int, n_embd_r: int, n_embd_s: int, type_r: int,
                 type_s: int, size: int, n_seq_max: int, store: TensorStore | None = None,
                 tensors: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None, name: str = "recurrent",
                 ple_layers: tuple[int, ...] = (), n_embd_p: int = 0, n_layer_nextn: int = 0) -> None:
        if size < max(1, n_seq_max):
            raise RecurrentError(f"a recurrent memory needs one cell per sequence ({size} < {n_seq_max})")
        if any(not 0 <= il < n_layer for il in layers):
            raise RecurrentError(f"recurrent layers {layers} are not all in [0, {n_layer})")
        if n_embd_p and any(il not in layers for il in ple_layers):
            raise RecurrentError(f"PLE layers {ple_layers} are not all recurrent layers {layers}")
        self.name = name
        self.store = store or TensorStore()
        self.layers = tuple(layers)
        self.n_layer = n_layer
        self.n_layer_nextn = n_layer_nextn  # MTP blocks among the n_layer: the layout says whether n_layer counts them
        self.n_embd_r, self.n_embd_s = n_embd_r, n_embd_s
        self.n_embd_p = n_embd_p
        self.ple_layers = tuple(il for il in layers if il in set(ple_layers)) if n_embd_p else ()
        self.type_r, self.type_s = type_r, type_s
        self.n_seq_max = n_seq_max
        self.pos: I32 = np.full(size, -1, np.int32)
        self.src: I32 = np.full(size, -1, np.int32)
        self.tail: I32 = np.full(size, -1, np.int32)
        self.seq = np.zeros((size, n_seq_max), dtype=bool)
        self.head = 0
        self.r: dict[int, torch.Tensor] = {}
        self.s: dict[int, torch.Tensor] = {}
        self.p: dict[int, torch.Tensor] = {il: self.store.alloc(size, self.p_row) for il in self.ple_layers}
        for il in self.layers:
            if tensors is not None:
                self.r[il], self.s[il] = tensors[il]
            else:
                self.r[il] = self.store.alloc(size, self.r_row)
                self.s[il] = self.store.alloc(size, self.s_row)
        self._validate(tensors)

    def _validate(self, tensors: dict[int, tuple[torch.Tensor, torch.Tensor]] | None) -> None:
        if tensors is not None and set(tensors) != set(self.layers):
            raise RecurrentError(f"tensors given for layers {sorted(tensors)}, the memory holds {list(self.layers)}")
        for il in self.layers:
            for t, row, what in ((self.r[il], self.r_row, "r"), (self.s[il], self.s_row, "s")):
                if t.dtype != torch.uint8 or tuple(t.shape) != (self.size, row) or not t.is_contiguous():
                    raise RecurrentError(f"layer {il}: {what} must be contiguous uint8 {(self.size, row)}, "
                                         f"got {tuple(t.shape)}")

    @property
    def size(self) -> int:
        """Number of cells."""
        return int(self.pos.size)

    @property
    def r_row(self) -> int:
        """Bytes of one r row."""
        return gt.row_size(self.type_r, self.n_embd_r)

    @property
    def s_row(self) -> int:
        """Bytes of one s row."""
        return gt.row_size(self.type_s, self.n_embd_s)

    @property
    def p_row(self) -> int:
        """Bytes of one PLE row (``ggml_row_size(type_r, ple_conv_state())``)."""
        return gt.row_size(self.type_r, self.n_embd_p)

    def tensors(self) -> list[torch.Tensor]:
        """Every r, s and p tensor."""
        return [t for il in self.layers for t in (self.r[il], self.s[il])] + [self.p[il] for il in self.ple_layers]

    def used(self) -> int:
        """Number of cells held by a sequence."""
        return int(np.count_nonzero(self.seq.any(axis=1)))

    def is_empty(self, i: int) -> bool:
        """True when no sequence holds cell ``i``."""
        return not bool(self.seq[i].any())

    def _free(self, i: int) -> None:
        self.pos[i] = -1
        self.src[i] = -1
        self.seq[i] = False

    # -- memory operations ----------------------------------------------------------------------
    def clear(self, data: bool = True) -> None:
        """``clear``: free every cell; ``data`` also zeroes the state rows."""
        self.pos[:] = -1
        self.src[:] = -1
        self.tail[:] = -1
        self.seq[:] = False
        self.head = 0
        if data:
            for t in self.tensors():
                self.store.zero_all(t)

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        """False when the state cannot be partly erased (llama.cpp's answer)."""
        p0 = max(p0, 0)
        p1 = POS_MAX if p1 < 0 else p1
        if not 0 <= seq_id < min(self.n_seq_max, self.size):
            return False
        t = int(self.tail[seq_id])
        if t >= 0:
            cpos = int(self.pos[t])
            if 0 < p0 <= cpos < p1:
                return False
            if p0 <= cpos < p1:
                self.tail[seq_id] = -1
        new_head = self.size
        for i in np.flatnonzero((self.pos >= p0) & (self.pos < p1) & self.seq[:, seq_id]).tolist():
            self.seq[i, seq_id] = False
            if self.is_empty(i):
                self._free(i)
                new_head = min(new_head, i)
        if new_head < self.head:
            self.head = new_head
        return True

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """``seq_cp``: ``dst`` shares the cell of ``src`` (positions are ignored, as in llama.cpp)."""
        if src == dst or not (0 <= src < self.size and 0 <= dst < self.size):
            return
        td = int(self.tail[dst])
        if td >= 0:
            self.seq[td, dst] = False
            self.tail[dst] = -1
            if self.is_empty(td):
                self._free(td)
        ts = int(self.tail[src])
        if ts >= 0:
            self.seq[ts, dst] = True
            self.tail[dst] = ts

    def seq_keep(self, seq_id: int) -> None:
        """``seq_keep``: free every cell ``seq_id`` does not hold."""
        new_head = self.size
        for i in range(self.size):
            if i != seq_id:
                self.tail[i] = -1
            if not (0 <= seq_id < self.n_seq_max and self.seq[i, seq_id]):
                self._free(i)
                new_head = min(new_head, i)
            else:
                self.seq[i] = False
                self.seq[i, seq_id] = True
        if new_head < self.head:
            self.head = new_head

    def seq_add(self, seq_id: int, p0: int, p1: int, shift: int) -> None:
        """``seq_add``: shift the position of the cell of ``seq_id``."""
        p0 = max(p0, 0)
        p1 = POS_MAX if p1 < 0 else p1
        if shift == 0 or p0 == p1 or not 0 <= seq_id < self.size:
            return
        t = int(self.tail[seq_id])
        if t >= 0 and self.seq[t, seq_id] and p0 <= self.pos[t] < p1:
            self.pos[t] += shift

    def seq_pos_min(self, seq_id: int) -> int:
        """Smallest position of ``seq_id`` (-1: none). As in llama.cpp, whose search starts from INT32_MAX and
        reads it as "none", a sequence whose only positions are INT32_MAX also gives -1."""
        m = self.seq[:, seq_id]
        p = int(self.pos[m].min()) if m.any() else -1
        return -1 if p == (1 << 31) - 1 else p  # INT32_MAX

    def seq_pos_max(self, seq_id: int) -> int:
        """Largest position of ``seq_id`` (-1: none)."""
        m = self.seq[:, seq_id]
        return int(self.pos[m].max()) if m.any() else -1

    # -- placing a ubatch -------------------------------------------------------------------------
    def find_slot(self, ub: Ubatch, move_rows: bool = False) -> bool:
        """``llama_memory_recurrent::find_slot`` (it changes the cells, as llama.cpp's does)."""
        groups = ub.equal_groups()
        size = self.size
        if self.head > self.used() + 2 * len(groups):
            self.head = 0
        for ids, _, _ in groups:
            for j, sid in enumerate(ids):
                if not 0 <= sid < min(size, self.n_seq_max):
                    return False
                t = int(self.tail[sid])
                if j > 0 and t >= 0:
                    self.seq[t, sid] = False
                    self.tail[sid] = -1
                    if self.is_empty(t):
                        self._free(t)
        nxt = self._next_empty(self.head)
        lo, hi = size - 1, 0
        for k, (ids, _, _) in enumerate(groups):
            sid = ids[0]
            t = int(self.tail[sid])
            if not (t >= 0 and int(self.seq[t].sum()) == 1):
                if nxt is None:
                    return False
                if t >= 0:
                    self.pos[nxt], self.src[nxt] = self.pos[t], self.src[t]
                    self.seq[t, sid] = False
                    self.seq[nxt, sid] = True
                self.tail[sid] = nxt
                if k + 1 < len(groups):
                    nxt = self._next_empty(nxt + 1)
            lo, hi = min(lo, int(self.tail[sid])), max(hi, int(self.tail[sid]))
        for k, (ids, _, _) in enumerate(groups):
            dst, src = k + lo, int(self.tail[ids[0]])
            if dst != src:
                for arr in (self.pos, self.src):
                    arr[dst], arr[src] = arr[src], arr[dst]
                self.seq[[dst, src]] = self.seq[[src, dst]]
                swap = self.tail.copy()
                self.tail[swap == src] = dst
                self.tail[swap == dst] = src
        for k, (ids, first, n) in enumerate(groups):
            cell = k + lo
            self.pos[cell] = ub.pos[first + n - 1]
            self.seq[cell] = False
            for sid in ids:
                self.seq[cell, sid] = True
                self.tail[sid] = cell
        rng = np.arange(lo, hi + 1)
        if move_rows:
            self._move_rows(rng, self.src[rng].copy())
        self.src[rng] = rng
        self.head = lo
        return hi - lo + 1 >= len(groups)

    def _next_empty(self, start: int) -> int | None:
        for k in range(self.size):
            i = (start + k) % self.size
            if self.is_empty(i):
                return i
        return None

    def _move_rows(self, dst: npt.NDArray[np.int64], src: I32) -> None:
        """The state copy llama.cpp's next graph does (``s_copy``): rows from ``src`` (-1: zeros)."""
        for t in self.tensors():
            old = t.clone()
            for d, s in zip(dst.tolist(), src.tolist(), strict=True):
                if s < 0:
                    t[d].zero_()
                elif s != d:
                    t[d].copy_(old[s])

    def apply(self, ub: Ubatch) -> list[int]:
        """Place ``ub`` (all or nothing); returns the cells of its sequence groups."""
        snap = self.snapshot()
        if not self.find_slot(ub, move_rows=False):
            self.restore(snap)
            raise RecurrentError(f"no slot for {len(ub.equal_groups())} sequence groups")
        cells = [self.head + k for k in range(len(ub.equal_groups()))]
        self.restore(snap)
        self.find_slot(ub, move_rows=True)
        return cells

    # -- rows ---------------------------------------------------------------------------------------
    def get_r(self, il: int, cells: list[int] | None = None) -> torch.Tensor:
        """r rows as float32 ``[n, n_embd_r]`` for ``cells`` (all when None)."""
        raw = self.r[il]
        return dequantize_rows(raw if cells is None else raw[cells], self.type_r)

    def get_s(self, il: int, cells: list[int] | None = None) -> torch.Tensor:
        """s rows as float32 ``[n, n_embd_s]`` for ``cells`` (all when None)."""
        raw = self.s[il]
        return dequantize_rows(raw if cells is None else raw[cells], self.type_s)

    def set_r(self, il: int, cells: list[int], values: torch.Tensor) -> None:
        """Write float r rows ``[n, n_embd_r]`` into ``cells``."""
        self.r[il][cells] = torch.from_numpy(quantize_rows(values, self.type_r)).to(self.store.device)

    def set_s(self, il: int, cells: list[int], values: torch.Tensor) -> None:
        """Write float s rows ``[n, n_embd_s]`` into ``cells``."""
        self.s[il][cells] = torch.from_numpy(quantize_rows(values, self.type_s)).to(self.store.device)

    def zero_cells(self, head: int, count: int) -> None:
        """Zero the r/s rows of cells ``[head, head + count)`` (``state_clear``)."""
        for il in self.layers:
            self.store.zero(self.r[il].view(-1), head * self.r_row, count * self.r_row)
            self.store.zero(self.s[il].view(-1), head * self.s_row, count * self.s_row)
        for il in self.ple_layers:
            self.store.zero(self.p[il].view(-1), head * self.p_row, count * self.p_row)

    # -- snapshots ----------------------------------------------------------------------------------
    def snapshot(self) -> RecSnap:
        """A copy of the cell metadata."""
        return self.pos.copy(), self.src.copy(), self.tail.copy(), self.seq.copy(), self.head

    def restore(self, snap: RecSnap) -> None:
        """Put back a :meth:`snapshot`."""
        pos, src, tail, seq, head = snap
        self.pos[...] = pos
        self.src[...] = src
        self.tail[...] = tail
        self.seq[...] = seq
        self.head = head
