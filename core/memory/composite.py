"""The memory of a context: one or more parts in llama.cpp's write order (spec §4.2, §4.4).

=============  ====================================  ==========================================
class          parts (write order)                   PARTIAL_ONLY (where the layout honours it)
=============  ====================================  ==========================================
kv             ``kv``                                ignored
iswa           ``kv_base``, ``kv_swa``               ``kv_swa`` only
recurrent      ``recurrent``                         ignored (the whole state is partial)
hybrid         ``kv_attn``, ``recurrent``            ``recurrent`` only; a failed recurrent
                                                     part also clears the attention part
hybrid_iswa    ``kv_base``, ``kv_swa``, ``recurrent``  ``kv_swa``, ``recurrent``
=============  ====================================  ==========================================

Sequence operations fan out to every part. ``seq_pos_min/max`` follow llama.cpp: an iSWA
memory answers from its SWA cache, a hybrid one with ``[max(mins), min(maxes)]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvscope.core.memory.cells import CellsSnap, SlotInfo, Ubatch
from kvscope.core.memory.kv_cache import CacheError, KvCache
from kvscope.core.memory.kv_state import read_kv, write_kv
from kvscope.core.memory.layout import FLAG_ON_DEVICE, Layout, LayoutError
from kvscope.core.memory.params import ContextParams
from kvscope.core.memory.recurrent import RecSnap, RecurrentMemory
from kvscope.core.memory.recurrent_state import read_recurrent, write_recurrent
from kvscope.core.memory.result import RestoreFailure
from kvscope.core.memory.spec import SWA_NONE, AttnLayer, MemorySpec
from kvscope.core.memory.state_ctx import ReadCtx, WriteCtx
from kvscope.core.memory.tensors import TensorStore

Component = KvCache | RecurrentMemory
MemorySnap = list[list[CellsSnap] | RecSnap]


@dataclass
class Part:
    """One component of the memory and whether ``PARTIAL_ONLY`` drops it."""

    role: str
    mem: Component
    partial_skip: bool


class LlamaMemory:
    """``llama_memory_i`` for a model: built from a :class:`MemorySpec` and :class:`ContextParams`."""

    def __init__(self, spec: MemorySpec, params: ContextParams, device: torch.device | str | None = None) -> None:
        self.spec = spec
        self.params = params
        self.store = TensorStore(device)
        self.parts: list[Part] = []
        mc = spec.memory_class

        def cache(layers: tuple[AttnLayer, ...], size: int, name: str, n_swa: int = 0,
                  swa_type: int = SWA_NONE) -> KvCache:
            return KvCache(layers, params.type_id_k, params.type_id_v, params.v_trans, size, params.n_seq_max,
                           params.kv_unified, n_swa, swa_type, self.store, spec.n_pos_per_embd, name=name)

        if mc == "kv":
            self.parts.append(Part("kv", cache(spec.attn, params.n_ctx_seq, "kv"), False))
        elif mc in ("iswa", "hybrid_iswa"):
            self.parts.append(Part("kv_base", cache(spec.attn_base(), params.n_ctx_seq, "kv_base"), True))
            self.parts.append(Part("kv_swa", cache(spec.attn_swa(), params.swa_size(spec.n_swa), "kv_swa",
                                                   spec.n_swa, spec.swa_type), False))
        elif mc == "hybrid":
            self.parts.append(Part("kv_attn", cache(spec.attn, params.n_ctx_seq, "kv_attn"), True))
        if mc in ("recurrent", "hybrid", "hybrid_iswa"):
            rec = RecurrentMemory(spec.recurrent_layers, spec.n_layer, spec.n_embd_r, spec.n_embd_s,
                                  params.type_id_r, params.type_id_s, params.recurrent_size, params.n_seq_max,
                                  store=self.store)
            self.parts.append(Part("recurrent", rec, False))

    # -- parts ------------------------------------------------------------------------------------
    @property
    def memory_class(self) -> str:
        """The spec's memory class (kv, iswa, recurrent, hybrid, hybrid_iswa)."""
        return self.spec.memory_class

    def part(self, role: str) -> Component:
        """The component with role ``role`` (KeyError when there is none)."""
        for p in self.parts:
            if p.role == role:
                return p.mem
        raise KeyError(f"this {self.memory_class} memory has no {role!r} part")

    def kv(self, role: str | None = None) -> KvCache:
        """The KV cache of ``role`` (default: the first one)."""
        for p in self.parts:
            if isinstance(p.mem, KvCache) and (role is None or p.role == role):
                return p.mem
        raise KeyError(f"this {self.memory_class} memory has no KV cache {role or ''}".rstrip())

    def recurrent(self) -> RecurrentMemory:
        """The recurrent component (KeyError when there is none)."""
        for p in self.parts:
            if isinstance(p.mem, RecurrentMemory):
                return p.mem
        raise KeyError(f"this {self.memory_class} memory has no recurrent part")

    @property
    def n_stream(self) -> int:
        """KV streams of the attention caches."""
        return self.params.n_stream

    def parts_for(self, layout: Layout, flags: int) -> list[Part]:
        """The parts a state with ``flags`` holds in ``layout``."""
        drop = layout.partial(self.memory_class, flags)
        return [p for p in self.parts if not (drop and p.partial_skip)]

    # -- sequence operations -------------------------------------------------------------------------
    def clear(self, data: bool = True) -> None:
        """``llama_memory_clear``: empty every part; ``data`` also zeroes the buffers."""
        for p in self.parts:
            p.mem.clear(data)

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        """``llama_memory_seq_rm`` on every part; False when a part refuses (recurrent)."""
        ok = True
        for p in self.parts:
            ok = p.mem.seq_rm(seq_id, p0, p1) and ok
        return ok

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """``llama_memory_seq_cp`` on every part."""
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
        if self.memory_class == "iswa":
            return [self.part("kv_swa")]
        if self.memory_class == "hybrid_iswa":
            return [self.part("kv_swa"), self.recurrent()]
        return [p.mem for p in self.parts]

    def seq_pos_min(self, seq_id: int) -> int:
        """``llama_memory_seq_pos_min`` with the composite rules (module docstring)."""
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
        for p in self.parts_for(w.layout, w.flags):
            if isinstance(p.mem, KvCache):
                write_kv(p.mem, w, seq_id)
            else:
                write_recurrent(p.mem, w, seq_id)

    def state_read(self, r: ReadCtx, seq_id: int) -> None:
        """``state_read(io, seq_id, flags)``: parts in order; raises :class:`RestoreFailure`."""
        attn_sinfos: list[SlotInfo] | None = None
        attn: KvCache | None = None
        for p in self.parts_for(r.layout, r.flags):
            if isinstance(p.mem, KvCache):
                sinfos = read_kv(p.mem, r, seq_id)
                if p.role == "kv_attn":
                    attn, attn_sinfos = p.mem, sinfos
                continue
            try:
                read_recurrent(p.mem, r, seq_id)
            except RestoreFailure:
                if attn is not None and attn_sinfos is not None:
                    r.policy.hybrid_failure(attn, seq_id, attn_sinfos, r)
                raise

    # -- snapshots ----------------------------------------------------------------------------------
    def snapshot(self) -> MemorySnap:
        """Cell metadata of every part (tensor bytes are not included)."""
        return [p.mem.snapshot() for p in self.parts]

    def restore(self, snap: MemorySnap) -> None:
        """Put back a :meth:`snapshot`."""
        for p, s in zip(self.parts, snap, strict=True):
            if isinstance(p.mem, KvCache) and isinstance(s, list):
                p.mem.restore(s)
                continue
            if isinstance(p.mem, RecurrentMemory) and isinstance(s, tuple):
                p.mem.restore(s)
            else:
                raise ValueError("snapshot does not match the memory")
