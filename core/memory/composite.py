"""The memory of a context: one or more parts in llama.cpp's write order (spec §4, classes C0).

=============  ================================================  ==================================
class          parts (write order)                               PARTIAL_ONLY keeps
=============  ================================================  ==================================
kv             ``kv``                                            everything (the flag is ignored)
iswa           ``kv_base``, ``kv_swa``                           ``kv_swa``
recurrent      ``recurrent``                                     everything
hybrid         ``kv_attn``, ``recurrent``                        ``recurrent``
hybrid_iswa    ``kv_base``, ``kv_swa``, ``recurrent``            ``kv_swa``, ``recurrent``
hybrid_idx     ``kv_attn``, ``recurrent``, ``kv_idx``            ``recurrent``
dsa            ``kv_mla``, ``kv_lid``                            everything
dsa_iswa       ``kv_mla``, ``kv_lid``, ``kv_swa``                ``kv_swa``
msa            ``kv_base``, ``kv_idx``                           everything
dsv4           header, ``kv_raw_base``, ``kv_raw_swa``,          header, ``kv_raw_swa``, compressor
               K-cache blocks, compressor blocks (``dsv4``)      blocks
=============  ================================================  ==================================

How each class reads (order, cross-part cleanup) is in :mod:`kvscope.core.memory.classes`.
Sequence operations fan out to every part (DeepSeek-V4 removes only whole sequences, or positions
past its end). ``seq_pos_min/max`` follow llama.cpp: an iSWA / DSA-iSWA memory answers from its
SWA cache, DSA from its MLA cache, MSA from its base cache, DeepSeek-V4 from its raw SWA cache
(its minimum is its maximum), a hybrid one with ``[max(mins), min(maxes)]`` of attention and
recurrent parts.
"""

from __future__ import annotations

import torch

from kvscope.core.memory.cells import CellsSnap, SlotInfo, Ubatch
from kvscope.core.memory.classes import Component, Part, read_memory, write_memory
from kvscope.core.memory.dsv4 import Dsv4Blocks, Dsv4Snap
from kvscope.core.memory.kv_cache import CacheError, KvCache
from kvscope.core.memory.layout import FLAG_ON_DEVICE, FLAG_PARTIAL_ONLY, Layout, LayoutError
from kvscope.core.memory.params import ContextParams
from kvscope.core.memory.recurrent import RecSnap, RecurrentMemory
from kvscope.core.memory.rot_rule import cache_rotation
from kvscope.core.memory.spec import CLASS_ROLES, NEW_CLASSES, SWA_NONE, CacheSpec, MemorySpec
from kvscope.core.memory.state_ctx import ReadCtx, WriteCtx
from kvscope.core.memory.tensors import TensorStore

__all__ = ["Component", "LlamaMemory", "MemorySnap", "Part"]

MemorySnap = list[list[CellsSnap] | RecSnap | Dsv4Snap]


class LlamaMemory:
    """``llama_memory_i`` for a model: built from a :class:`MemorySpec` and :class:`ContextParams`."""

    def __init__(self, spec: MemorySpec, params: ContextParams, device: torch.device | str | None = None) -> None:
        self.spec = spec
        self.params = params
        self.store = TensorStore(device)
        self.parts: list[Part] = []
        caches = {c.role: c for c in spec.kv_caches()}
        for role in CLASS_ROLES[spec.memory_class]:
            if role == "recurrent":
                rec = RecurrentMemory(spec.recurrent_layers, spec.n_layer, spec.n_embd_r, spec.n_embd_s,
                                      params.type_id_r, params.type_id_s, params.recurrent_size, params.n_seq_max,
                                      store=self.store, ple_layers=spec.ple_layers, n_embd_p=spec.n_embd_p,
                                      n_layer_nextn=spec.n_layer_nextn)
                self.parts.append(Part("recurrent", rec, False))
            elif role in caches:
                cs = caches[role]
                self.parts.append(Part(role, self._cache(cs), not cs.partial_keep))
        if spec.dsv4 is not None:
            sizes = tuple(params.compressed_size(i, b.ratio) for i, b in enumerate(spec.dsv4.kcaches))
            blocks = Dsv4Blocks(spec.dsv4, params.type_id_k, sizes, params.n_seq_max, self.store)
            self.parts.append(Part("dsv4", blocks, False))

    def _cache(self, cs: CacheSpec) -> KvCache:
        spec, params = self.spec, self.params
        unified = params.kv_unified if cs.unified is None else cs.unified
        size = params.n_ctx_seq if cs.size == "base" else params.swa_size(spec.n_swa, unified)
        n_rot_k, n_rot_v = cache_rotation(cs, params.type_id_k, params.type_id_v, params.rot_disabled)
        return KvCache(cs.layers, params.type_id_k, params.type_id_v, params.v_trans, size, params.n_seq_max,
                       unified, spec.n_swa if cs.swa else 0, spec.swa_type if cs.swa else SWA_NONE, self.store,
                       cs.n_pos_per_embd or spec.n_pos_per_embd, name=cs.role, n_rot_k=n_rot_k, n_rot_v=n_rot_v,
                       has_ext=cs.ext)

    # -- parts ------------------------------------------------------------------------------------
    @property
    def memory_class(self) -> str:
        """The spec's memory class (kv, iswa, recurrent, hybrid, hybrid_iswa, hybrid_idx, dsa, dsa_iswa, msa, dsv4)."""
        return self.spec.memory_class

    def part(self, role: str) -> Component:
        """The component with role ``role`` (KeyError when there is none)."""
        for p in self.parts:
            if p.role == role:
                return p.mem
        raise KeyError(f"this {self.memory_class} memory has no {role!r} part")

    def has(self, role: str) -> bool:
        """Does the memory have a part called ``role``."""
        return any(p.role == role for p in self.parts)

    def kv(self, role: str | None = None) -> KvCache:
        """The KV cache of ``role`` (default: the first one)."""
        for p in self.parts:
            if isinstance(p.mem, KvCache) and (role is None or p.role == role):
                return p.mem
        raise KeyError(f"this {self.memory_class} memory has no KV cache {role or ''}".rstrip())

    def kv_caches(self) -> list[KvCache]:
        """Every KV cache, in write order."""
        return [p.mem for p in self.parts if isinstance(p.mem, KvCache)]

    def recurrent(self) -> RecurrentMemory:
        """The recurrent component (KeyError when there is none)."""
        for p in self.parts:
            if isinstance(p.mem, RecurrentMemory):
                return p.mem
        raise KeyError(f"this {self.memory_class} memory has no recurrent part")

    def dsv4(self) -> Dsv4Blocks:
        """DeepSeek-V4's compressed caches and compressor states (KeyError for other classes)."""
        for p in self.parts:
            if isinstance(p.mem, Dsv4Blocks):
                return p.mem
        raise KeyError(f"this {self.memory_class} memory has no DeepSeek-V4 blocks")

    @property
    def n_stream(self) -> int:
        """KV streams of the attention caches."""
        return self.params.n_stream

    def partial(self, layout: Layout, flags: int) -> bool:
        """Does ``PARTIAL_ONLY`` leave parts out of this memory's state in ``layout``."""
        if self.memory_class in NEW_CLASSES:
            return bool(flags & FLAG_PARTIAL_ONLY)
        return layout.partial(self.memory_class, flags)

    def parts_for(self, layout: Layout, flags: int) -> list[Part]:
        """The parts a state with ``flags`` holds in ``layout`` (DeepSeek-V4's blocks: always listed)."""
        drop = self.partial(layout, flags)
        return [p for p in self.parts if not (drop and p.partial_skip)]

    # -- sequence operations -------------------------------------------------------------------------
    def clear(self, data: bool = True) -> None:
        """``llama_memory_clear``: empty every part; ``data`` also zeroes the buffers."""
        for p in self.parts:
            p.mem.clear(data)

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        """``llama_memory_seq_rm`` on every part; False when a part refuses (recurrent, DeepSeek-V4)."""
        if self.memory_class == "dsv4":
            return self._dsv4_seq_rm(seq_id, p0, p1)
        ok = True
        for p in self.parts:
            ok = p.mem.seq_rm(seq_id, p0, p1) and ok
        return ok

    def _dsv4_seq_rm(self, seq_id: int, p0: int, p1: int) -> bool:
        """``llama_kv_cache_dsv4::seq_rm``: whole sequences, or positions past the end (no rollback)."""
        if p1 >= 0:
            return False
        raw = [self.kv("kv_raw_base"), self.kv("kv_raw_swa")]
        if p0 > 0:
            if not 0 <= seq_id < self.params.n_seq_max or p0 <= self.seq_pos_max(seq_id):
                return False  # a rollback inside the sequence needs snapshots, which are not modelled
            for c in raw:
                c.seq_rm(seq_id, p0, -1)
            return True
        for c in raw:
            c.seq_rm(seq_id, p0, p1)
        self.dsv4().seq_rm(seq_id)
        return True

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """``llama_memory_seq_cp`` on every part."""
        if self.memory_class == "dsv4" and (p0 > 0 or p1 >= 0):
            raise CacheError("DSV4 only supports full sequence copies")
        for p in self.parts:
            p.mem.seq_cp(src, dst, p0, p1)

    def seq_keep(self, seq_id: int) -> None:
        """``llama_memory_seq_keep`` on every part."""
        for p in self.parts:
            p.mem.seq_keep(seq_id)

    def seq_add(self, seq_id: int, p0: int, p1: int, shift: int) -> None:
        """``llama_memory_seq_add`` on every part."""
        for p in self.parts:
            p.mem.seq_add(seq_id, p0, p1, shift)

    def _pos_parts(self) -> list[Component]:
        mc = self.memory_class
        if mc in ("iswa", "dsa_iswa"):
            return [self.part("kv_swa")]
        if mc == "hybrid_iswa":
            return [self.part("kv_swa"), self.recurrent()]
        if mc in ("hybrid", "hybrid_idx"):
            return [p.mem for p in self.parts if p.role in ("kv_attn", "recurrent")]
        if mc == "dsa":
            return [self.part("kv_mla")]
        if mc == "msa":
            return [self.part("kv_base")]
        if mc == "dsv4":
            return [self.part("kv_raw_swa")]
        return [p.mem for p in self.parts]

    def seq_pos_min(self, seq_id: int) -> int:
        """``llama_memory_seq_pos_min`` with the composite rules (module docstring)."""
        if self.memory_class == "dsv4":
            return self.seq_pos_max(seq_id)
        return max(m.seq_pos_min(seq_id) for m in self._pos_parts())

    def seq_pos_max(self, seq_id: int) -> int:
        """``llama_memory_seq_pos_max`` with the composite rules (module docstring)."""
        return min(m.seq_pos_max(seq_id) for m in self._pos_parts())

    def apply(self, ub: Ubatch) -> dict[str, SlotInfo | list[int]]:
        """Place a ubatch in every part (all or nothing); returns the cells per part."""
        snap = self.snapshot()
        out: dict[str, SlotInfo | list[int]] = {}
        try:
            for p in self.parts:
                out[p.role] = p.mem.apply(ub)
        except (CacheError, ValueError):
            self.restore(snap)
            raise
        return out

    # -- state ----------------------------------------------------------------------------------------
    def state_write(self, w: WriteCtx, seq_id: int) -> None:
        """``state_write(io, seq_id, flags)`` of every part the flags keep."""
        w.layout.check_spec(self.spec, self.n_stream)
        if w.flags & FLAG_ON_DEVICE:
            raise LayoutError("ON_DEVICE blobs (payloads kept in device buffers) are not modelled")
        if seq_id != -1 and not 0 <= seq_id < self.params.n_seq_max:
            raise CacheError(f"seq_id {seq_id} out of range [0, {self.params.n_seq_max})")
        write_memory(self, w, seq_id)

    def state_read(self, r: ReadCtx, seq_id: int) -> None:
        """``state_read(io, seq_id, flags)``: parts in the class's order; raises :class:`RestoreFailure`."""
        read_memory(self, r, seq_id)

    # -- snapshots ----------------------------------------------------------------------------------
    def snapshot(self) -> MemorySnap:
        """Cell metadata of every part (tensor bytes are not included)."""
        return [p.mem.snapshot() for p in self.parts]

    def restore(self, snap: MemorySnap) -> None:
        """Put back a :meth:`snapshot`."""
        for p, s in zip(self.parts, snap, strict=True):
            mem = p.mem
            if isinstance(mem, KvCache):
                if not isinstance(s, list):
                    raise ValueError("snapshot does not match the memory")
                mem.restore(s)
            elif isinstance(mem, RecurrentMemory):
                if not (isinstance(s, tuple) and s):
                    raise ValueError("snapshot does not match the memory")
                mem.restore(s)
            elif s != ():
                raise ValueError("snapshot does not match the memory")
