"""Property tests for the memory classes of the 2026-10 builds (hybrid-idx, DSA, DSA-iSWA, MSA,
DeepSeek-V4, a hybrid-iSWA memory with an empty base cache) and PLE rows.

Each example builds a small memory of the class, applies random ubatches and sequence operations,
fills every tensor (compressed caches and compressor states included) with random values of its
type, then for
both 2026-10 layouts: writes the whole-context state and every sequence's state (full and
PARTIAL_ONLY), reads it into a fresh context of the same model and writes it again -- the bytes
must be identical -- and, where the reader's structure-only parse (no model) explains every byte,
infers a context from that parse, reads it back and writes it again: identical too. (The real
builds' states of every class are round-tripped with their models in test_mem_class_engine.py.)
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvscope.core import ggml_types as gt
from kvscope.core.memory import FLAG_PARTIAL_ONLY, CacheError, ContextParams, KvCache, MemoryContext, Ubatch
from kvscope.core.memory.composite import LlamaMemory
from kvscope.core.memory.infer import infer_context, load, write
from kvscope.core.memory.layout import Layout
from kvscope.core.memory.recurrent import RecurrentError, RecurrentMemory
from kvscope.core.memory.tensors import quantize_rows
from kvscope.core.reader.parse import read_state
from tests.support.mem_helpers import class_spec

pytestmark = pytest.mark.slow  # hypothesis over every memory class

N_SEQ = 2
LAYOUTS = (Layout.named("2026-10"), Layout.named("2026-10-v4"))
CLASSES = ["dsa", "dsa_iswa", "hybrid_idx", "msa", "dsv4", "hybrid_iswa0"]


def _ops(ctx: MemoryContext, data: st.DataObject) -> None:
    mem = ctx.memory
    recurrent = mem.memory_class in ("hybrid_idx", "hybrid_iswa")
    for _ in range(data.draw(st.integers(1, 6), label="n_ops")):
        op = data.draw(st.sampled_from(["apply", "apply", "apply", "rm", "keep"]), label="op")
        seq = data.draw(st.integers(0, N_SEQ - 1), label="seq")
        try:
            if op == "apply":
                n = data.draw(st.integers(1, 3 if recurrent else 6), label="n")
                start = max(mem.seq_pos_max(seq) + 1, 0)
                mem.apply(Ubatch(list(range(start, start + n)), [[seq]] * n))
            elif op == "rm":
                mem.seq_rm(seq, -1 if recurrent else data.draw(st.integers(-1, 6), label="p0"), -1)
            elif data.draw(st.booleans(), label="keep"):
                mem.seq_keep(seq)
        except (CacheError, RecurrentError):
            pass  # a full cache refuses the ubatch, as llama.cpp's does


def _values(t: torch.Tensor, type_id: int, rng: np.random.Generator) -> None:
    """Fill ``t`` with valid ggml bytes of ``type_id``: random normal values, quantized block by block."""
    bs, size = gt.block_size(type_id), gt.type_size(type_id)
    n_blocks = t.numel() // size
    raw = quantize_rows(rng.normal(0, 1, (n_blocks, bs)).astype(np.float32), type_id)
    t.copy_(torch.from_numpy(raw.reshape(t.shape)))


def _randomize(ctx: MemoryContext, seed: int) -> None:
    """Random payloads (what a model writes: finite values of the cache types) and random cell ext."""
    rng = np.random.default_rng(seed)
    for p in ctx.memory.parts:
        m = p.mem
        if isinstance(m, KvCache):
            for ly in m.layers:
                _values(ly.k, m.type_k, rng)
                if ly.v is not None:
                    _values(ly.v, m.type_v, rng)
            for c in m.cells:
                c.ext[...] = rng.integers(-5, 1000, c.ext.shape)
        elif isinstance(m, RecurrentMemory):
            for il in m.layers:
                _values(m.r[il], m.type_r, rng)
                _values(m.s[il], m.type_s, rng)
            for t in m.p.values():
                _values(t, m.type_r, rng)
        else:
            for d in m.kcache:
                for t in d.values():
                    _values(t, m.type_k, rng)
            for t in [x for d in m.comp for pair in d.values() for x in pair]:
                _values(t, 0, rng)


def _fresh(ctx: MemoryContext, lay: Layout) -> MemoryContext:
    return MemoryContext(LlamaMemory(ctx.memory.spec, ctx.memory.params), lay)


def _holds_cells(ctx: MemoryContext, seq: int) -> bool:
    for c in ctx.memory.kv_caches():
        for cells in c.cells:
            m = cells.pos >= 0
            if seq >= 0:
                m &= cells.seq[:, seq]
            if m.any():
                return True
    return False


def _check(ctx: MemoryContext, lay: Layout, seq: int, flags: int) -> None:
    blob = bytes(ctx.seq_get_data(seq, flags, lay) if seq >= 0 else ctx.get_data(lay))
    again = _fresh(ctx, lay)
    res = again.seq_set_data(blob, seq, flags) if seq >= 0 else again.set_data(blob)
    assert res.ok, res
    assert bytes(again.seq_get_data(seq, flags) if seq >= 0 else again.get_data()) == blob
    if not _holds_cells(ctx, seq):
        return  # a state of empty sections: without a model the reader cannot tell how many there are
    parsed = read_state(data=blob)
    if parsed.n_errors or any(f.code == "trailing_bytes" for f in parsed.findings):
        # the reader's split without a model is a heuristic over the bytes (its gaps are the reader's,
        # reported there); the core is held to every state the reader does explain
        return
    inf = infer_context(parsed, seq_id=seq if seq >= 0 else None)
    loaded = load(inf, blob)
    assert loaded.ok, loaded
    assert bytes(write(inf)) == blob, (lay.name, seq, flags)


@pytest.mark.parametrize("memory_class", CLASSES)
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), seed=st.integers(0, 2**16), unified=st.booleans(), quant=st.booleans(), fa=st.booleans())
def test_write_parse_read_write(memory_class: str, data: st.DataObject, seed: int, unified: bool, quant: bool,
                                fa: bool) -> None:
    t = "q8_0" if quant else "f16"
    params = ContextParams(n_seq_max=N_SEQ, kv_unified=unified, flash_attn=fa or quant, type_k=t, type_v=t,
                           kv_size=16, kv_size_swa=8, kv_size_compressed=(4, 4, 4))
    ctx = MemoryContext.create(class_spec(memory_class), params)
    _ops(ctx, data)
    _randomize(ctx, seed)
    for lay in LAYOUTS:
        _check(ctx, lay, -1, 0)
        for seq in range(N_SEQ):
            for flags in (0, FLAG_PARTIAL_ONLY):
                _check(ctx, lay, seq, flags)


def test_what_the_core_cannot_hold_is_refused_by_name() -> None:
    from kvscope.core.memory import SpecError
    from kvscope.core.memory.spec import MemorySpec

    with pytest.raises(SpecError, match=r"memory class 'shared' is not modelled \(known: kv, iswa, .*dsv4\)"):
        MemorySpec("test", 2, "shared")
    with pytest.raises(SpecError, match="a dsa memory needs its KV caches listed"):
        MemorySpec("test", 2, "dsa", class_spec("dsa").attn[:2])
    spec = class_spec("dsa")
    with pytest.raises(SpecError, match=r"a dsa memory has the KV caches \['kv_mla', 'kv_lid'\]"):
        MemorySpec("test", 3, "dsa", spec.attn, caches=spec.caches[::-1])
    ctx = MemoryContext.create(class_spec("dsv4"), ContextParams(n_seq_max=1, kv_size=16, kv_size_swa=8))
    with pytest.raises(ValueError, match="layout 2026-08 has no verified dsv4 memory"):
        ctx.get_data("2026-08")
