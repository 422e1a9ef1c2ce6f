"""``llama_kv_cache``: streams of cells, and per layer the K and V rows as raw ggml bytes.

Storage per layer (uint8 torch tensors, one slab per stream): K ``[n_stream, size, k_row]``; V
``[n_stream, size, v_row]``, or transposed ``[n_stream, n_embd_v, size * el]`` when ``v_trans``
(element ``j`` of cell ``i`` at byte ``(j * size + i) * el`` of the stream, as in llama.cpp).
Layers without V (MLA) have ``v = None``. The sequence operations follow llama.cpp 0c1e5709;
``seq_add`` moves positions only (the K re-rotation llama.cpp runs on the next update is not
modelled) and a cross-stream ``seq_cp`` copies the stream's buffers at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from kvscope.core import ggml_types as gt
from kvscope.core.errors import InputError
from kvscope.core.memory.cells import I64, TOKEN_NULL, CellsSnap, KvCells, SlotInfo, Ubatch, index_runs
from kvscope.core.memory.spec import LLAMA_MAX_SEQ, SWA_NONE, AttnLayer
from kvscope.core.memory.tensors import TensorStore, dequantize_rows, quantize_rows

POS_MAX = np.iinfo(np.int32).max


class CacheError(InputError, ValueError):
    """An operation or construction llama.cpp would reject (one-line message)."""


@dataclass
class KvLayer:
    """Storage of one model layer in one cache."""

    il: int
    n_embd_k: int
    n_embd_v: int  # 0: no V
    k: torch.Tensor
    v: torch.Tensor | None


class KvCache:
    """One ``llama_kv_cache`` over the attention layers ``layers``."""

    kind = "kv"

    def __init__(self, layers: tuple[AttnLayer, ...], type_k: int, type_v: int, v_trans: bool, size: int,
                 n_seq_max: int, unified: bool, n_swa: int = 0, swa_type: int = SWA_NONE,
                 store: TensorStore | None = None, n_pos_per_embd: int = 1, tensors: list[KvLayer] | None = None,
                 name: str = "kv", n_rot_k: int = 0, n_rot_v: int = 0, has_ext: bool | None = None) -> None:
        if size <= 0:
            raise CacheError(f"cache size {size} must be positive")
        if not 1 <= n_seq_max <= LLAMA_MAX_SEQ:
            raise CacheError(f"n_seq_max {n_seq_max} must be in [1, {LLAMA_MAX_SEQ}]")
        if v_trans and not gt.is_element_addressable(type_v):
            raise CacheError(f"a transposed V cannot hold {gt.type_name(type_v)} (needs flash attention)")
        for a in layers:
            for n, t, what in ((a.n_embd_k, type_k, "K"), (a.n_embd_v, type_v, "V")):
                if n % gt.block_size(t):
                    raise CacheError(f"layer {a.il}: {what} width {n} is not whole {gt.type_name(t)} blocks")
        self.name = name
        self.store = store or TensorStore()
        self.type_k, self.type_v, self.v_trans = type_k, type_v, v_trans
        self.n_seq_max = n_seq_max
        self.n_stream = 1 if unified else n_seq_max
        self.n_swa, self.swa_type = n_swa, swa_type
        self.n_pos_per_embd = n_pos_per_embd
        # Hadamard rotation block sizes written (v11/v4) and checked on restore; 0 = not rotated
        self.n_rot_k = n_rot_k
        self.n_rot_v = n_rot_v
        # whether its cells carry llama_kv_cell_ext (None: the model's rule, as the layout applies it)
        self.has_ext = has_ext
        self.cells = [KvCells(size, n_seq_max) for _ in range(self.n_stream)]
        self.layers = tensors if tensors is not None else [self._alloc(a, size) for a in layers]
        self._validate(layers, size)

    # -- construction -------------------------------------------------------------------------
    @property
    def size(self) -> int:
        """Cells per stream."""
        return self.cells[0].size

    def k_row(self, layer: KvLayer) -> int:
        """Bytes of one K row of ``layer``."""
        return gt.row_size(self.type_k, layer.n_embd_k)

    def v_row(self, layer: KvLayer) -> int:
        """Bytes of one V row of ``layer``."""
        return gt.row_size(self.type_v, layer.n_embd_v)

    @property
    def v_el(self) -> int:
        """Bytes of one V element (``ggml_type_size``; transposed V)."""
        return gt.type_size(self.type_v)

    def _alloc(self, a: AttnLayer, size: int) -> KvLayer:
        s = self.store
        k = s.alloc(self.n_stream, size, gt.row_size(self.type_k, a.n_embd_k))
        v: torch.Tensor | None = None
        if a.n_embd_v:
            v = (s.alloc(self.n_stream, a.n_embd_v, size * gt.type_size(self.type_v)) if self.v_trans
                 else s.alloc(self.n_stream, size, gt.row_size(self.type_v, a.n_embd_v)))
        return KvLayer(a.il, a.n_embd_k, a.n_embd_v, k, v)

    def _validate(self, layers: tuple[AttnLayer, ...], size: int) -> None:
        """Every tensor has the shape its layer kind needs (K, plain V, transposed V, no V)."""
        if [(x.il, x.n_embd_k, x.n_embd_v) for x in self.layers] != [(a.il, a.n_embd_k, a.n_embd_v) for a in layers]:
            raise CacheError("the layer tensors do not match the layer list")
        for ly in self.layers:
            want_k = (self.n_stream, size, self.k_row(ly))
            if ly.k.dtype != torch.uint8 or tuple(ly.k.shape) != want_k or not ly.k.is_contiguous():
                raise CacheError(f"layer {ly.il}: K must be contiguous uint8 {want_k}, got {tuple(ly.k.shape)}")
            if ly.n_embd_v == 0:
                if ly.v is not None:
                    raise CacheError(f"layer {ly.il} has no V (width 0) but a V tensor was given")
                continue
            want_v = ((self.n_stream, ly.n_embd_v, size * self.v_el) if self.v_trans
                      else (self.n_stream, size, self.v_row(ly)))
            if ly.v is None or ly.v.dtype != torch.uint8 or tuple(ly.v.shape) != want_v or not ly.v.is_contiguous():
                got = None if ly.v is None else tuple(ly.v.shape)
                raise CacheError(f"layer {ly.il}: V must be contiguous uint8 {want_v}, got {got}")

    def tensors(self) -> list[torch.Tensor]:
        """Every K and V tensor of the cache."""
        return [t for ly in self.layers for t in (ly.k, ly.v) if t is not None]

    def seq_to_stream(self, seq_id: int) -> int:
        """The stream of sequence ``seq_id`` (CacheError when out of range)."""
        if not 0 <= seq_id < self.n_seq_max:
            raise CacheError(f"seq_id {seq_id} out of range [0, {self.n_seq_max})")
        return 0 if self.n_stream == 1 else seq_id

    def stream_of(self, seq_id: int) -> KvCells:
        """The cells of the stream of sequence ``seq_id``."""
        return self.cells[self.seq_to_stream(seq_id)]

    # -- memory operations ----------------------------------------------------------------------
    def clear(self, data: bool = True) -> None:
        """Empty every stream; ``data`` also zeroes the buffers."""
        for c in self.cells:
            c.reset()
        if data:
            for t in self.tensors():
                self.store.zero_all(t)

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        """``llama_kv_cache::seq_rm``: drop ``seq_id`` (-1: every sequence) from positions ``[p0, p1)``."""
        p0 = max(p0, 0)
        p1 = POS_MAX if p1 < 0 else p1
        if seq_id >= 0:
            c = self.stream_of(seq_id)
            c.move_head(c.seq_rm(c.pos_in(p0, p1) & c.seq[:, seq_id], seq_id))
            return True
        if seq_id != -1:
            raise CacheError(f"seq_id {seq_id} is not valid")
        for c in self.cells:
            m = c.pos_in(p0, p1)
            c.rm(m)
            c.move_head(m)
        return True

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """``llama_kv_cache::seq_cp``: add ``dst`` to the cells of ``src`` (a stream copy across streams)."""
        s0, s1 = self.seq_to_stream(src), self.seq_to_stream(dst)
        if s0 == s1:
            if src == dst:
                return
            c = self.cells[s0]
            m = c.pos_in(max(p0, 0), POS_MAX if p1 < 0 else p1) & c.seq[:, src]
            c.seq[m, dst] = True
            return
        if (p0 > 0 and p0 + 1 < self.size) or (p1 > 0 and p1 + 1 < self.size):
            raise CacheError("seq_cp() across streams is only supported for full KV buffers")
        a, b = self.cells[s0], self.cells[s1]
        b.reset()
        m = a.seq[:, src]
        b.pos[m] = a.pos[m]
        b.seq[m, dst] = True
        b.ext[m] = a.ext[m]
        b.shift[m] = a.shift[m]
        b.head = a.head
        for ly in self.layers:
            ly.k[s1].copy_(ly.k[s0])
            if ly.v is not None:
                ly.v[s1].copy_(ly.v[s0])

    def seq_keep(self, seq_id: int) -> None:
        """``llama_kv_cache::seq_keep``: keep only ``seq_id`` in its stream."""
        c = self.stream_of(seq_id)
        has = c.seq[:, seq_id].copy()
        others = c.nonempty() & ~has
        c.seq[has] = False
        c.seq[has, seq_id] = True
        c.rm(others)
        c.move_head(others)

    def seq_add(self, seq_id: int, p0: int, p1: int, shift: int) -> None:
        """``llama_kv_cache::seq_add``: shift the positions of ``seq_id`` in ``[p0, p1)``."""
        if self.n_pos_per_embd > 1:
            raise CacheError("seq_add() is only supported for n_pos_per_embd() == 1")
        c = self.stream_of(seq_id)
        if shift == 0:
            return
        p0 = max(p0, 0)
        p1 = POS_MAX if p1 < 0 else p1
        if p0 == p1:
            return
        m = c.pos_in(p0, p1) & c.seq[:, seq_id]
        c.pos[m] += shift
        c.shift[m] += shift
        gone = m & (c.pos < 0)
        c.rm(gone)
        hit = np.flatnonzero(gone)
        c.head = int(hit[0]) if hit.size else 0

    def seq_pos_min(self, seq_id: int) -> int:
        """Smallest position of ``seq_id`` (-1: none)."""
        return self.stream_of(seq_id).seq_pos_min(seq_id)

    def seq_pos_max(self, seq_id: int) -> int:
        """Largest position of ``seq_id`` (-1: none)."""
        return self.stream_of(seq_id).seq_pos_max(seq_id)

    # -- placing a ubatch --------------------------------------------------------------------------
    def find_slot(self, ub: Ubatch, cont: bool = False) -> SlotInfo:
        """Cells for ``ub`` without changing anything; an empty :class:`SlotInfo` when none fit."""
        groups: list[tuple[tuple[int, ...], int, int]]
        if self.n_stream == 1:
            groups = [((ub.seq_ids[0][0],), 0, ub.n_tokens)]
        else:
            groups = ub.equal_groups()
            if any(len(ids) != 1 for ids, _, _ in groups):
                raise CacheError("with several streams each token must belong to one sequence")
        res = SlotInfo()
        for ids, _, n in groups:
            strm = self.seq_to_stream(ids[0])
            idx = self.cells[strm].find(n, cont, self.n_swa, self.swa_type)
            if idx is None:
                return SlotInfo()
            res.strm.append(strm)
            res.idxs.append(idx)
        return res

    def apply_ubatch(self, sinfo: SlotInfo, ub: Ubatch) -> None:
        """``llama_kv_cache::apply_ubatch``: take over the cells, purge what an SWA overwrite hid."""
        rm_max = np.full(self.n_seq_max, -1, np.int64)
        pos = np.asarray(ub.pos, dtype=np.int32)
        single = all(len(s) == 1 for s in ub.seq_ids)
        first = np.asarray([s[0] for s in ub.seq_ids], dtype=np.int64)
        for s in set(first.tolist()) | {x for ids in ub.seq_ids for x in ids}:
            self.seq_to_stream(s)
        t = 0
        for strm, idxs in zip(sinfo.strm, sinfo.idxs, strict=True):
            c = self.cells[strm]
            n = int(idxs.size)
            for idx in idxs[c.pos[idxs] != -1].tolist():  # cells taken over from a masked SWA sequence
                s = int(np.flatnonzero(c.seq[idx])[0])
                rm_max[s] = max(rm_max[s], int(c.pos[idx]))
                c.rm_at(idx)
            c.pos[idxs] = pos[t : t + n]
            if ub.pos_2d is not None or ub.tokens is not None:
                xy = np.asarray(ub.pos_2d[t : t + n], dtype=np.int32) if ub.pos_2d is not None else 0
                c.ext[idxs, 0:2] = xy
                c.ext[idxs, 2] = np.asarray(ub.tokens[t : t + n]) if ub.tokens is not None else TOKEN_NULL
            if single:
                c.seq[idxs, first[t : t + n]] = True
            else:
                for k, idx in enumerate(idxs.tolist()):
                    c.seq[idx, list(ub.seq_ids[t + k])] = True
            t += n
        for s in np.flatnonzero(rm_max >= 0).tolist():
            c = self.stream_of(s)
            lo = c.seq_pos_min(s)
            if 0 <= lo <= rm_max[s]:
                self.seq_rm(s, lo, int(rm_max[s]) + 1)
        for strm, idxs in zip(sinfo.strm, sinfo.idxs, strict=True):
            self.cells[strm].head = int(idxs[-1]) + 1

    def apply(self, ub: Ubatch) -> SlotInfo:
        """find_slot + apply_ubatch; raises :class:`CacheError` when the ubatch does not fit."""
        sinfo = self.find_slot(ub)
        if sinfo.empty():
            raise CacheError(f"no slot for {ub.n_tokens} tokens")
        self.apply_ubatch(sinfo, ub)
        return sinfo

    # -- rows ---------------------------------------------------------------------------------------
    def layer(self, il: int) -> KvLayer:
        """Storage of model layer ``il``."""
        for ly in self.layers:
            if ly.il == il:
                return ly
        raise CacheError(f"layer {il} is not in this cache")

    def k_rows(self, il: int, stream: int) -> torch.Tensor:
        """K bytes of one stream, ``[size, k_row]`` (a view)."""
        return self.layer(il).k[stream]

    def v_rows(self, il: int, stream: int) -> torch.Tensor:
        """V bytes of one stream as ``[size, v_row]`` (a copy when V is stored transposed)."""
        ly = self.layer(il)
        if ly.v is None:
            raise CacheError(f"layer {il} has no V")
        if not self.v_trans:
            return ly.v[stream]
        el = self.v_el
        return ly.v[stream].view(ly.n_embd_v, self.size, el).transpose(0, 1).reshape(self.size, ly.n_embd_v * el)

    def get_k(self, il: int, stream: int, cells: list[int] | None = None) -> torch.Tensor:
        """K as float32 ``[n, n_embd_k]`` (dequantized) for ``cells`` (all when None)."""
        raw = self.k_rows(il, stream)
        return dequantize_rows(raw if cells is None else raw[cells], self.type_k)

    def get_v(self, il: int, stream: int, cells: list[int] | None = None) -> torch.Tensor:
        """V as float32 ``[n, n_embd_v]`` (dequantized) for ``cells`` (all when None)."""
        raw = self.v_rows(il, stream)
        return dequantize_rows(raw if cells is None else raw[cells], self.type_v)

    def set_k_raw(self, il: int, stream: int, cells: list[int], raw: torch.Tensor) -> None:
        """Write raw K rows (uint8 ``[n, k_row]``) into ``cells``."""
        self.layer(il).k[stream][cells] = raw.to(self.store.device)

    def set_v_raw(self, il: int, stream: int, cells: list[int], raw: torch.Tensor) -> None:
        """Write raw V rows (uint8 ``[n, v_row]``) into ``cells`` (transposed as stored)."""
        ly = self.layer(il)
        if ly.v is None:
            raise CacheError(f"layer {il} has no V")
        raw = raw.to(self.store.device)
        if not self.v_trans:
            ly.v[stream][cells] = raw
            return
        el = self.v_el
        v3 = ly.v[stream].view(ly.n_embd_v, self.size, el)
        v3[:, cells, :] = raw.view(len(cells), ly.n_embd_v, el).transpose(0, 1)

    def set_k(self, il: int, stream: int, cells: list[int], values: torch.Tensor) -> None:
        """Quantize float rows ``[n, n_embd_k]`` into the K rows of ``cells``."""
        self.set_k_raw(il, stream, cells, torch.from_numpy(quantize_rows(values, self.type_k)))

    def set_v(self, il: int, stream: int, cells: list[int], values: torch.Tensor) -> None:
        """Quantize float rows ``[n, n_embd_v]`` into the V rows of ``cells``."""
        self.set_v_raw(il, stream, cells, torch.from_numpy(quantize_rows(values, self.type_v)))

    # -- snapshots ----------------------------------------------------------------------------------
    def snapshot(self) -> list[CellsSnap]:
        """Cell metadata of every stream."""
        return [c.snapshot() for c in self.cells]

    def restore(self, snap: list[CellsSnap]) -> None:
        """Put back a :meth:`snapshot`."""
        for c, s in zip(self.cells, snap, strict=True):
            c.restore(s)

    def zero_cells(self, strm: int, idxs: I64) -> None:
        """Zero the K/V rows of cells ``idxs`` of stream ``strm`` (``state_zero_data``)."""
        runs = index_runs(idxs)
        size = self.size
        for ly in self.layers:
            kr = self.k_row(ly)
            kf = ly.k[strm].view(-1)
            for a, b in runs:
                self.store.zero(kf, a * kr, (b - a) * kr)
            if ly.v is None:
                continue
            vf = ly.v[strm].view(-1)
            if not self.v_trans:
                vr = self.v_row(ly)
                for a, b in runs:
                    self.store.zero(vf, a * vr, (b - a) * vr)
            else:
                el = self.v_el
                for a, b in runs:
                    self.store.zero(vf, a * el, (b - a) * el, size * el, ly.n_embd_v)
