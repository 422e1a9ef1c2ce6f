"""Failure policies: what a restore does at its bound and cleanup points (spec §7.1-7.4).

The read path is written once and consults a policy where llama.cpp's builds differ:

* ``contained`` (0c1e5709, PR #27530): ``cell_count`` bounded before anything is removed or
  allocated; a failed per-sequence KV restore removes the sequence and zeroes the K/V rows of the
  cells it was given; a failed recurrent restore zeroes its rows; a composite undoes the parts it
  already restored as its class does in llama.cpp (``state_clear(seq)``: remove the sequence and
  zero the cells it held alone): a hybrid memory clears the attention part when the recurrent part
  fails, a DSA memory its MLA part when the indexer fails, a hybrid-idx memory drops the sequence
  from all three caches on any failure; deferred buffer writes are discarded.
* ``legacy`` (before the fix, S26-S35 and structurally older): only ``seq_rm`` / ``clear``;
  no bound before ``ubatch_reserve(cell_count)`` (the allocation is reported, never performed,
  and counts as ``bad_alloc`` above ``alloc_limit``); the whole-context restore clears the cache
  once per stream (keeping only the last); no hybrid or DSA undo (those came with the fix); the
  hybrid-idx drop (a class of the fixed builds) only removes the sequence, zeroing nothing; a
  buffer reader applies its deferred writes even after a failure.
* ``transactional``: a failed restore leaves the memory exactly as before (metadata snapshot plus
  an undo journal of every byte range written or zeroed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from kvscope.core.memory.cells import SlotInfo
from kvscope.core.memory.io import StateReader
from kvscope.core.memory.tensors import TensorStore

if TYPE_CHECKING:
    from kvscope.core.memory.kv_cache import KvCache
    from kvscope.core.memory.recurrent import RecurrentMemory


class ReadCtx(Protocol):
    """What a policy uses of the restore (:class:`kvscope.core.memory.state_ctx.ReadCtx`, which holds
    the policy: naming that class here would make the two modules import each other)."""

    def act(self, what: str) -> None: ...


class LlamaMemory(Protocol):
    """What a policy uses of the whole memory (:class:`kvscope.core.memory.composite.LlamaMemory`)."""

    @property
    def store(self) -> TensorStore: ...

    def snapshot(self) -> Any: ...  # opaque to the policy: handed back to restore

    def restore(self, snap: Any) -> None: ...

GIB = 1 << 30


def _cells(n: int) -> str:
    return f"{n} cell{'' if n == 1 else 's'}"


def ubatch_reserve_bytes(n_tokens: int, n_pos_per_embd: int) -> int:
    """Bytes ``llama_batch_allocr::ubatch_reserve(n_tokens, 1)`` allocates (token, pos, n_seq_id,
    seq_id pointer and output flag per token), the allocation a legacy restore attempted."""
    return n_tokens * (4 + 4 * n_pos_per_embd + 4 + 8 + 1)


class FailurePolicy:
    """The ``contained`` policy (llama.cpp 0c1e5709); the others override its hooks."""

    name = "contained"
    bound_before_alloc = True  # per-seq cell_count > size checked before seq_rm / ubatch_reserve
    clear_whole_per_stream = False  # whole-context clear() inside the stream loop (legacy)
    alloc_limit: int | None = None  # legacy: ubatch_reserve sizes above this throw bad_alloc

    def begin(self, mem: LlamaMemory) -> None:
        """Called before the first byte is read."""

    def kv_failure(self, cache: KvCache, seq_id: int, strm: int, sinfo: SlotInfo, r: ReadCtx) -> None:
        """``llama_kv_cache::state_clear``: whole -> clear(true); per-seq -> seq_rm + zero rows."""
        if seq_id == -1:
            cache.clear(True)
            r.act(f"{cache.name}: clear(data)")
            return
        cache.seq_rm(seq_id)
        r.act(f"{cache.name}: seq_rm({seq_id})")
        if not sinfo.empty() and sinfo.idxs[0].size:
            cache.zero_cells(strm, sinfo.idxs[0])
            r.act(f"{cache.name}: zero {_cells(sinfo.idxs[0].size)} of stream {strm}")

    def recurrent_failure(self, mem: RecurrentMemory, seq_id: int, head: int, count: int, r: ReadCtx) -> None:
        """``llama_memory_recurrent::state_clear``."""
        if seq_id == -1:
            mem.clear(True)
            r.act(f"{mem.name}: clear(data)")
            return
        mem.seq_rm(seq_id)
        r.act(f"{mem.name}: seq_rm({seq_id})")
        if count:
            mem.zero_cells(head, count)
            r.act(f"{mem.name}: zero cells [{head}, {head + count})")

    def hybrid_failure(self, attn: KvCache, seq_id: int, sinfos: list[SlotInfo], r: ReadCtx) -> None:
        """``llama_memory_hybrid``: a failed recurrent part also clears the attention part."""
        state_clear(attn, seq_id, r, "hybrid undo")

    def dsa_failure(self, mla: KvCache, seq_id: int, r: ReadCtx) -> None:
        """``llama_kv_cache_dsa``: a failed indexer part also clears the MLA part."""
        state_clear(mla, seq_id, r, "DSA undo")

    def drop_failure(self, attn: KvCache | None, recr: RecurrentMemory, idx: KvCache | None, seq_id: int,
                     r: ReadCtx) -> None:
        """``llama_memory_hybrid_idx::state_drop``: the sequence leaves all three caches."""
        if seq_id == -1:
            for part in (attn, recr, idx):
                if part is not None:
                    part.clear(True)
                    r.act(f"{part.name}: clear(data) (hybrid-idx drop)")
            return
        if attn is not None:
            state_clear(attn, seq_id, r, "hybrid-idx drop")
        recr.seq_rm(seq_id)
        r.act(f"{recr.name}: seq_rm({seq_id}) (hybrid-idx drop)")
        if idx is not None:
            state_clear(idx, seq_id, r, "hybrid-idx drop")

    def io_failure(self, io: StateReader, mem: LlamaMemory, r: ReadCtx) -> None:
        """After the failure reached the context: drop deferred writes (``io.discard()``)."""
        io.discard()
        r.act("io.discard()")

    def success(self, mem: LlamaMemory) -> None:
        """Called after a restore that passed every check."""


class LegacyPolicy(FailurePolicy):
    """Before PR #27530 (S26-S35)."""

    name = "legacy"
    bound_before_alloc = False
    clear_whole_per_stream = True

    def __init__(self, alloc_limit: int = 8 * GIB) -> None:
        self.alloc_limit = alloc_limit

    def kv_failure(self, cache: KvCache, seq_id: int, strm: int, sinfo: SlotInfo, r: ReadCtx) -> None:
        """Only ``clear`` / ``seq_rm``: the rows already handed over stay in free cells."""
        if seq_id == -1:
            cache.clear(True)
            r.act(f"{cache.name}: clear(data)")
        else:
            cache.seq_rm(seq_id)
            r.act(f"{cache.name}: seq_rm({seq_id})")

    def recurrent_failure(self, mem: RecurrentMemory, seq_id: int, head: int, count: int, r: ReadCtx) -> None:
        """Only ``clear`` / ``seq_rm``: no rows are zeroed."""
        if seq_id == -1:
            mem.clear(True)
            r.act(f"{mem.name}: clear(data)")
        else:
            mem.seq_rm(seq_id)
            r.act(f"{mem.name}: seq_rm({seq_id})")

    def hybrid_failure(self, attn: KvCache, seq_id: int, sinfos: list[SlotInfo], r: ReadCtx) -> None:
        """Nothing: the attention part keeps what it restored."""
        r.act(f"{attn.name}: kept (no hybrid undo before PR #27530)")

    def dsa_failure(self, mla: KvCache, seq_id: int, r: ReadCtx) -> None:
        """Nothing: the MLA part keeps what it restored."""
        r.act(f"{mla.name}: kept (no DSA undo before PR #27530)")

    def drop_failure(self, attn: KvCache | None, recr: RecurrentMemory, idx: KvCache | None, seq_id: int,
                     r: ReadCtx) -> None:
        """Remove the sequence (or clear) everywhere, zeroing no rows."""
        for part in (attn, recr, idx):
            if part is None:
                continue
            if seq_id == -1:
                part.clear(True)
                r.act(f"{part.name}: clear(data) (hybrid-idx drop)")
            else:
                part.seq_rm(seq_id)
                r.act(f"{part.name}: seq_rm({seq_id}) (hybrid-idx drop)")

    def io_failure(self, io: StateReader, mem: LlamaMemory, r: ReadCtx) -> None:
        """No ``discard()``: a buffer reader applies its deferred writes anyway."""
        if io.kind == "buffer":
            r.act("deferred tensor writes applied after the failure (no discard())")


class TransactionalPolicy(FailurePolicy):
    """All or nothing: a failed restore puts back every cell and every byte it touched."""

    name = "transactional"

    def __init__(self) -> None:
        self._snap: Any = None

    def begin(self, mem: LlamaMemory) -> None:
        """Snapshot the metadata and start the undo journal."""
        self._snap = mem.snapshot()
        mem.store.begin_journal()

    def io_failure(self, io: StateReader, mem: LlamaMemory, r: ReadCtx) -> None:
        """Drop deferred writes, undo every byte written, restore the metadata."""
        io.discard()
        mem.store.rollback()
        if self._snap is not None:
            mem.restore(self._snap)
        self._snap = None
        r.act("rolled back to the state before the restore")

    def success(self, mem: LlamaMemory) -> None:
        """Drop the journal and the snapshot."""
        mem.store.commit()
        self._snap = None


def state_clear(cache: KvCache, seq_id: int, r: ReadCtx, why: str) -> None:
    """``llama_kv_cache::state_clear(seq_id)``: remove the sequence and zero the cells it held alone
    (whole: ``clear(true)``); how a composite undoes a sub-cache it already restored."""
    if seq_id == -1:
        cache.clear(True)
        r.act(f"{cache.name}: clear(data) ({why})")
        return
    strm = cache.seq_to_stream(seq_id)
    c = cache.cells[strm]
    alone = np.flatnonzero(c.seq[:, seq_id] & (c.seq.sum(axis=1) == 1)).astype(np.int64)
    cache.seq_rm(seq_id)
    r.act(f"{cache.name}: seq_rm({seq_id}) ({why})")
    if alone.size:
        cache.zero_cells(strm, alone)
        r.act(f"{cache.name}: zero {_cells(alone.size)} of stream {strm} ({why})")


def make_policy(policy: str | FailurePolicy) -> FailurePolicy:
    """A policy object from its name (``contained``, ``legacy``, ``transactional``)."""
    if isinstance(policy, FailurePolicy):
        return policy
    if policy == "contained":
        return FailurePolicy()
    if policy == "legacy":
        return LegacyPolicy()
    if policy == "transactional":
        return TransactionalPolicy()
    raise ValueError(f"unknown failure policy {policy!r} (contained, legacy, transactional)")
