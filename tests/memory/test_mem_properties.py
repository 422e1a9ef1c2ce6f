"""Property tests: random cache contents and operations, then write -> read -> write gives the same
bytes, for every memory class and every layout generation that can express it.

Each example builds a small memory, applies random ubatches and sequence operations, fills the
tensors with random bytes and random cell ext values, then for each layout round-trips the
whole-context blob and every sequence's blob (full and PARTIAL_ONLY) through a fresh context.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvscope.core.memory import FLAG_PARTIAL_ONLY, CacheError, ContextParams, KvCache, MemoryContext, Ubatch
from kvscope.core.memory.layout import Layout, LayoutError
from kvscope.core.memory.recurrent import RecurrentError
from kvscope.core.reader.layouts import GENERATIONS
from tests.support.mem_helpers import spec_of

pytestmark = pytest.mark.slow  # hypothesis

N_SEQ = 3


def _ops(ctx: MemoryContext, data: st.DataObject, recurrent: bool) -> None:
    mem = ctx.memory
    for _ in range(data.draw(st.integers(1, 8), label="n_ops")):
        op = data.draw(st.sampled_from(["apply", "apply", "apply", "rm", "cp", "keep"]), label="op")
        seq = data.draw(st.integers(0, N_SEQ - 1), label="seq")
        try:
            if op == "apply":
                n = data.draw(st.integers(1, 3 if recurrent else 5), label="n")
                start = max(mem.seq_pos_max(seq) + 1, 0)
                mem.apply(Ubatch(list(range(start, start + n)), [[seq]] * n))
            elif op == "rm":
                p0 = -1 if recurrent else data.draw(st.integers(-1, 6), label="p0")
                mem.seq_rm(seq, p0, -1)
            elif op == "cp" and mem.n_stream == 1:
                mem.seq_cp(seq, data.draw(st.integers(0, N_SEQ - 1), label="dst"))
            elif op == "keep" and data.draw(st.booleans(), label="keep"):
                mem.seq_keep(seq)
        except (CacheError, RecurrentError):
            pass  # a full cache refuses the ubatch, as llama.cpp's does


def _randomize(ctx: MemoryContext, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    for p in ctx.memory.parts:
        for t in p.mem.tensors():
            t.copy_(torch.randint(0, 256, t.shape, dtype=torch.uint8, generator=gen))
        if isinstance(p.mem, KvCache):
            for c in p.mem.cells:
                c.ext[...] = rng.integers(-5, 1000, c.ext.shape)


def _layouts(ctx: MemoryContext) -> list[Layout]:
    out = []
    for g in GENERATIONS:
        lay = Layout(g)
        try:
            lay.check_spec(ctx.memory.spec, ctx.memory.n_stream)
        except LayoutError:
            continue
        out.append(lay)
    return out


def _again(ctx: MemoryContext, blob: bytes, lay: Layout, seq: int, flags: int) -> bytes:
    fresh = MemoryContext(ctx.memory.__class__(ctx.memory.spec, ctx.memory.params), lay)
    res = fresh.state_read(blob, seq, flags) if seq >= 0 else fresh.state_read(blob)
    assert res.ok, res
    return bytes(fresh.state_write(seq, flags))


CASES = [("kv", True), ("kv", False), ("kv_mla", True), ("iswa", True), ("recurrent", True), ("hybrid", False),
         ("hybrid_iswa", True)]


@pytest.mark.parametrize(("memory_class", "unified"), CASES, ids=[f"{c}-u{int(u)}" for c, u in CASES])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), seed=st.integers(0, 2**16), ext=st.booleans(), fa=st.booleans())
def test_write_read_write(memory_class: str, unified: bool, data: st.DataObject, seed: int, ext: bool,
                          fa: bool) -> None:
    spec = spec_of(memory_class, ext=ext and memory_class != "recurrent")
    params = ContextParams(n_seq_max=N_SEQ, kv_unified=unified, flash_attn=fa, kv_size=12, kv_size_swa=8)
    ctx = MemoryContext.create(spec, params)
    _ops(ctx, data, memory_class == "recurrent")
    _randomize(ctx, seed)
    layouts = _layouts(ctx)
    assert layouts
    for lay in layouts:
        blob = bytes(ctx.state_write(-1, 0, lay))
        assert _again(ctx, blob, lay, -1, 0) == blob
        for seq in range(N_SEQ):
            for flags in (0, FLAG_PARTIAL_ONLY):
                blob = bytes(ctx.state_write(seq, flags, lay))
                assert _again(ctx, blob, lay, seq, flags) == blob, (lay.name, seq, flags)
