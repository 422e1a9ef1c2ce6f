"""Failure policies x reader kinds on small synthetic memories.

A "poisoned" blob has every tensor payload byte set to 0xAB and a bad type in its last record, so
the rows of every earlier record are handed over before the check fails (the lab's
``nan_rows_late_fail``). Where those bytes end up tells the policies apart.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvscope.core.memory import ContextParams, MemoryContext, Ubatch
from kvscope.core.memory.policy import ubatch_reserve_bytes
from kvscope.core.reader.parse import read_state
from tests.support.mem_helpers import spec_of

POISON = 0xAB


def _ctx(memory_class: str, flash_attn: bool = False, unified: bool = True) -> MemoryContext:
    params = ContextParams(n_seq_max=2, kv_unified=unified, flash_attn=flash_attn, kv_size=16, kv_size_swa=16)
    ctx = MemoryContext.create(spec_of(memory_class), params)
    gen = torch.Generator().manual_seed(1)
    for seq in (0, 1):
        ctx.memory.apply(Ubatch(list(range(5)), [[seq]] * 5))
    for t in _tensors(ctx):
        t.copy_(torch.randint(1, 150, t.shape, dtype=torch.uint8, generator=gen))
    return ctx


def _tensors(ctx: MemoryContext) -> list[torch.Tensor]:
    return [t for p in ctx.memory.parts for t in p.mem.tensors()]


def _has_poison(ctx: MemoryContext) -> bool:
    return any(bool((t == POISON).any()) for t in _tensors(ctx))


def _state(ctx: MemoryContext) -> tuple[bytes, list[bytes]]:
    meta = ctx.memory.snapshot()
    flat = [np.asarray(x).tobytes() for m in meta for x in (m if isinstance(m, tuple) else [a for c in m for a in c])]
    return b"".join(t.numpy().tobytes() for t in _tensors(ctx)), flat


def _poisoned(ctx: MemoryContext, seq: int = 0) -> bytes:
    blob = bytearray(ctx.seq_get_data(seq))
    tree = read_state(data=bytes(blob))
    assert tree.n_errors == 0
    headers = []
    for node in tree.root.walk():
        if node.kind.endswith("_rows"):
            blob[node.offset : node.end] = bytes([POISON]) * node.size
        if node.kind == "layer_header":
            headers.append(node.offset)
    blob[headers[-1] : headers[-1] + 4] = (7).to_bytes(4, "little")  # the last record's type: q5_1
    return bytes(blob)


@pytest.mark.parametrize("memory_class", ["kv", "recurrent"])
@pytest.mark.parametrize("reader", ["buffer", "file"])
@pytest.mark.parametrize("policy", ["contained", "legacy", "transactional"])
def test_late_failure(policy: str, reader: str, memory_class: str) -> None:
    ctx = _ctx(memory_class)
    blob = _poisoned(ctx)
    before = _state(ctx)
    seq1 = bytes(ctx.seq_get_data(1))
    res = ctx.seq_set_data(blob, 0, policy=policy, reader=reader)
    assert not res.ok and res.returned == 0 and res.check in ("v_type", "s_type")
    assert (res.policy, res.reader) == (policy, reader)
    assert bytes(ctx.seq_get_data(1)) == seq1  # the other sequence is intact under every policy
    if policy == "transactional":
        assert _state(ctx) == before and ctx.memory.seq_pos_max(0) == 4
        return
    assert ctx.memory.seq_pos_max(0) == -1
    # contained zeroes the chosen cells and discards deferred writes; legacy leaves the rows behind
    assert _has_poison(ctx) == (policy == "legacy")


def test_legacy_buffer_applies_deferred_writes_after_the_failure() -> None:
    ctx = _ctx("kv")
    res = ctx.seq_set_data(_poisoned(ctx), 0, policy="legacy", reader="buffer")
    assert res.actions[-1].startswith("deferred tensor writes applied")
    ctx2 = _ctx("kv")
    res2 = ctx2.seq_set_data(_poisoned(ctx2), 0, policy="contained", reader="buffer")
    assert res2.actions[-1] == "io.discard()" and any("zero" in a for a in res2.actions)


@pytest.mark.parametrize("policy", ["contained", "legacy", "transactional"])
def test_huge_cell_count(policy: str) -> None:
    ctx = _ctx("kv")
    blob = bytearray(ctx.seq_get_data(0))
    tree = read_state(data=bytes(blob))
    cc = tree.root.find("/memory/kv/stream0/cell_count")
    assert cc is not None
    blob[cc.offset : cc.offset + 4] = (0x7FFFFFFF).to_bytes(4, "little")
    res = ctx.seq_set_data(bytes(blob), 0, policy=policy)
    assert res.offset == cc.offset
    if policy == "legacy":  # no bound: the ubatch allocation is reported, not performed
        assert res.check == "alloc" and res.alloc_bytes == ubatch_reserve_bytes(0x7FFFFFFF, 1)
    else:
        assert res.check == "cell_count_bound" and res.alloc_bytes is None
    assert ctx.memory.seq_pos_max(0) == (4 if policy == "transactional" else -1)


def test_legacy_small_cell_count_allocates_then_fails_later() -> None:
    ctx = _ctx("kv")
    blob = bytearray(ctx.seq_get_data(0))
    tree = read_state(data=bytes(blob))
    cc = tree.root.find("/memory/kv/stream0/cell_count")
    assert cc is not None
    blob[cc.offset : cc.offset + 4] = (6).to_bytes(4, "little")
    res = ctx.seq_set_data(bytes(blob), 0, policy="legacy")
    assert res.check == "n_seq_id" and res.alloc_bytes == ubatch_reserve_bytes(6, 1)


@pytest.mark.parametrize("policy", ["contained", "legacy"])
def test_whole_restore_of_two_streams(policy: str) -> None:
    ctx = _ctx("kv", unified=False)
    data = bytes(ctx.get_data())
    fresh = MemoryContext.create(ctx.memory.spec, ctx.memory.params)
    res = fresh.set_data(data, policy=policy)
    assert res.ok
    # before PR #27530 clear() ran once per stream, so only the last stream survived
    assert fresh.memory.seq_pos_max(0) == (-1 if policy == "legacy" else 4)
    assert fresh.memory.seq_pos_max(1) == 4


@pytest.mark.parametrize("reader", ["buffer", "file"])
def test_transactional_whole_restore_failure_restores_everything(reader: str) -> None:
    ctx = _ctx("iswa")
    data = bytearray(ctx.get_data())
    tree = read_state(data=bytes(data))
    hdr = tree.root.find("/memory/kv_swa/stream0/K1/header")
    assert hdr is not None
    data[hdr.offset] = 0
    before = _state(ctx)
    res = ctx.set_data(bytes(data), policy="transactional", reader=reader)
    assert res.check == "k_type" and res.section == "kv_swa"
    assert _state(ctx) == before
    res = ctx.set_data(bytes(data), policy="contained", reader=reader)
    assert all(ctx.memory.kv(r).cells[0].used() == 0 for r in ("kv_swa",))


@pytest.mark.parametrize("reader", ["buffer", "file"])
def test_successful_restore_with_either_reader(reader: str) -> None:
    ctx = _ctx("hybrid", flash_attn=True)
    blob = bytes(ctx.seq_get_data(1))
    fresh = MemoryContext.create(ctx.memory.spec, ctx.memory.params)
    res = fresh.seq_set_data(blob, 1, reader=reader)
    assert res.ok and res.returned == len(blob) and res.reader == reader
    assert bytes(fresh.seq_get_data(1)) == blob


def test_policy_objects_are_swappable() -> None:
    from kvscope.core.memory import LegacyPolicy, make_policy

    pol = LegacyPolicy(alloc_limit=100)
    assert make_policy(pol) is pol
    ctx = _ctx("kv")
    blob = bytearray(ctx.seq_get_data(0))
    tree = read_state(data=bytes(blob))
    cc = tree.root.find("/memory/kv/stream0/cell_count")
    assert cc is not None
    blob[cc.offset : cc.offset + 4] = (6).to_bytes(4, "little")
    res = ctx.seq_set_data(bytes(blob), 0, policy=pol)
    assert res.check == "alloc" and res.alloc_bytes == 126
    with pytest.raises(ValueError):
        make_policy("optimistic")
