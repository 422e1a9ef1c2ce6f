"""How each memory class writes and reads its parts: order, PARTIAL_ONLY, cross-part cleanup.

llama.cpp's ``state_write`` / ``state_read`` of every class (``docs/state-format-classes.md`` C0),
over the KV and recurrent pieces (:mod:`kv_state`, :mod:`recurrent_state`) and DeepSeek-V4's blocks
(:mod:`dsv4`). The cleanup a class runs when a later part fails goes through the failure policy
(:mod:`policy`), so ``contained`` is llama.cpp's code, ``legacy`` the builds before PR #27530 and
``transactional`` all or nothing:

* ``hybrid``: a failed recurrent part undoes the attention part it read (``state_clear``);
* ``dsa`` (and the DSA half of ``dsa_iswa``): a failed indexer part undoes the MLA part;
* ``hybrid_idx``: attention (recording its slot layout), recurrent, then the indexer adopting that
  layout; any failure drops the sequence from all three (``state_drop``);
* ``dsv4``: header checks, the raw iSWA pair, then (full mode) ``clear_compressed`` and the K-cache
  blocks, then the compressor blocks; nothing is undone;
* every other class reads its parts in order and undoes nothing across them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import kvscope.core.memory.dsv4 as dsv4
from kvscope.core.memory.cells import SlotInfo
from kvscope.core.memory.kv_cache import KvCache
from kvscope.core.memory.kv_state import read_kv, write_kv
from kvscope.core.memory.layout import FLAG_PARTIAL_ONLY, Layout
from kvscope.core.memory.recurrent import RecurrentMemory
from kvscope.core.memory.recurrent_state import read_recurrent, write_recurrent
from kvscope.core.memory.result import RestoreFailure
from kvscope.core.memory.state_ctx import ReadCtx, WriteCtx

Component = KvCache | RecurrentMemory | dsv4.Dsv4Blocks


@dataclass
class Part:
    """One component of the memory and whether ``PARTIAL_ONLY`` drops it."""

    role: str
    mem: Component
    partial_skip: bool


class LlamaMemory(Protocol):
    """What the class dispatch reads of a memory (:class:`kvscope.core.memory.composite.LlamaMemory`,
    which calls it: naming the class here would make the two modules import each other)."""

    @property
    def memory_class(self) -> str: ...

    def parts_for(self, layout: Layout, flags: int) -> list[Part]: ...

    def partial(self, layout: Layout, flags: int) -> bool: ...

    def has(self, role: str) -> bool: ...

    def kv(self, role: str | None = None) -> KvCache: ...

    def recurrent(self) -> RecurrentMemory: ...

    def dsv4(self) -> dsv4.Dsv4Blocks: ...


def write_memory(mem: LlamaMemory, w: WriteCtx, seq_id: int) -> None:
    """Every part the flags keep, in write order (DeepSeek-V4: with its header and blocks)."""
    if mem.memory_class == "dsv4":
        _write_dsv4(mem, w, seq_id)
        return
    for p in mem.parts_for(w.layout, w.flags):
        if isinstance(p.mem, KvCache):
            write_kv(p.mem, w, seq_id)
        elif isinstance(p.mem, RecurrentMemory):
            write_recurrent(p.mem, w, seq_id)


def _write_dsv4(mem: LlamaMemory, w: WriteCtx, seq_id: int) -> None:
    partial = bool(w.flags & FLAG_PARTIAL_ONLY)
    dsv4.write_header(w, partial)
    if not partial:
        write_kv(mem.kv("kv_raw_base"), w, seq_id)
    swa = mem.kv("kv_raw_swa")
    write_kv(swa, w, seq_id)
    blocks = mem.dsv4()
    if not partial:
        dsv4.write_kcaches(blocks, w, seq_id, swa.seq_pos_max(seq_id) if seq_id >= 0 else -1)
    dsv4.write_comps(blocks, w, seq_id)


def read_memory(mem: LlamaMemory, r: ReadCtx, seq_id: int) -> None:
    """``state_read`` of the memory's class; raises :class:`RestoreFailure` after its cleanup."""
    mc = mem.memory_class
    if mc == "dsv4":
        _read_dsv4(mem, r, seq_id)
    elif mc == "hybrid_idx":
        _read_hybrid_idx(mem, r, seq_id)
    elif mc in ("dsa", "dsa_iswa"):
        _read_dsa(mem, r, seq_id)
    else:
        _read_in_order(mem, r, seq_id)


def _read_in_order(mem: LlamaMemory, r: ReadCtx, seq_id: int) -> None:
    """kv, iswa, recurrent, msa, hybrid_iswa (nothing undone across parts) and hybrid."""
    attn: KvCache | None = None
    attn_sinfos: list[SlotInfo] | None = None
    for p in mem.parts_for(r.layout, r.flags):
        if isinstance(p.mem, KvCache):
            sinfos = read_kv(p.mem, r, seq_id)
            if p.role == "kv_attn":
                attn, attn_sinfos = p.mem, sinfos
        elif isinstance(p.mem, RecurrentMemory):
            try:
                read_recurrent(p.mem, r, seq_id)
            except RestoreFailure:
                if attn is not None and attn_sinfos is not None:
                    r.policy.hybrid_failure(attn, seq_id, attn_sinfos, r)
                raise


def _read_dsa(mem: LlamaMemory, r: ReadCtx, seq_id: int) -> None:
    """``llama_kv_cache_dsa`` (mla, then lid undoing mla on failure); dsa_iswa: that, then its SWA cache."""
    keep = {p.role for p in mem.parts_for(r.layout, r.flags)}
    if "kv_mla" in keep:
        mla = mem.kv("kv_mla")
        read_kv(mla, r, seq_id)
        try:
            read_kv(mem.kv("kv_lid"), r, seq_id)
        except RestoreFailure:
            r.policy.dsa_failure(mla, seq_id, r)
            raise
    if "kv_swa" in keep:
        read_kv(mem.kv("kv_swa"), r, seq_id)


def _read_hybrid_idx(mem: LlamaMemory, r: ReadCtx, seq_id: int) -> None:
    """``llama_memory_hybrid_idx::state_read``: the indexer adopts the attention cache's slot layout."""
    partial = mem.partial(r.layout, r.flags)
    attn = mem.kv("kv_attn")
    idx = mem.kv("kv_idx") if mem.has("kv_idx") else None
    recr = mem.recurrent()
    try:
        sinfos: list[SlotInfo] = []
        if not partial:
            sinfos = read_kv(attn, r, seq_id)
        read_recurrent(recr, r, seq_id)
        if not partial and idx is not None:
            read_kv(idx, r, seq_id, mirror=sinfos)
    except RestoreFailure:
        r.policy.drop_failure(attn, recr, idx, seq_id, r)
        raise


def _read_dsv4(mem: LlamaMemory, r: ReadCtx, seq_id: int) -> None:
    """``llama_kv_cache_dsv4::state_read``."""
    partial = dsv4.read_header(r, bool(r.flags & FLAG_PARTIAL_ONLY))
    if not partial:
        read_kv(mem.kv("kv_raw_base"), r, seq_id)
    read_kv(mem.kv("kv_raw_swa"), r, seq_id)
    blocks = mem.dsv4()
    if not partial:
        if seq_id >= 0:
            blocks.clear_seq(seq_id)
        else:
            blocks.clear(True)
        r.act(f"dsv4: clear_compressed({seq_id})")
        dsv4.read_kcaches(blocks, r, seq_id)
    dsv4.read_comps(blocks, r, seq_id)
