"""Memory operations with llama.cpp semantics, construction checks, sizing and float views."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from kvscope.core import ggml_types as gt
from kvscope.core.memory import (
    CacheError,
    ContextParams,
    KvCache,
    MemoryContext,
    MemorySpec,
    ParamsError,
    RecurrentMemory,
    SpecError,
    Ubatch,
)
from kvscope.core.memory.kv_cache import KvLayer
from kvscope.core.memory.recurrent import RecurrentError
from kvscope.core.memory.spec import SWA_CHUNKED, SWA_STANDARD, AttnLayer, is_masked_swa
from kvscope.core.memory.tensors import ConversionError
from tests.support.mem_helpers import spec_of

F16, F32, Q8_0, Q4_0 = (gt.type_id_from_name(n) for n in ("f16", "f32", "q8_0", "q4_0"))
LAYERS = (AttnLayer(0, 32, 32), AttnLayer(1, 32, 0))


def _kv(size: int = 16, v_trans: bool = True, n_seq_max: int = 2, unified: bool = True, n_swa: int = 0,
        swa_type: int = 0) -> KvCache:
    return KvCache(LAYERS, F16, F16, v_trans, size, n_seq_max, unified, n_swa, swa_type)


def _fragmented() -> KvCache:
    kv = _kv()
    kv.apply(Ubatch(list(range(16)), [[0]] * 16))
    kv.seq_rm(0, 2, 4)
    kv.seq_rm(0, 8, 10)
    return kv


def test_find_slot_contiguous_and_not() -> None:
    kv = _fragmented()
    assert kv.cells[0].head == 2
    ub = Ubatch([20, 21, 22], [[1]] * 3)
    assert kv.find_slot(ub, cont=False).idxs[0].tolist() == [2, 3, 8]
    assert kv.find_slot(ub, cont=True).empty()
    assert kv.find_slot(Ubatch([20, 21], [[1]] * 2), cont=True).idxs[0].tolist() == [2, 3]
    kv.apply(ub)
    assert kv.cells[0].head == 9 and kv.seq_pos_min(1) == 20 and kv.seq_pos_max(1) == 22


def test_per_sequence_restore_needs_contiguous_cells_before_2026() -> None:
    spec = MemorySpec("test", 2, "kv", LAYERS)
    params = ContextParams(n_seq_max=2, kv_unified=True, flash_attn=False, kv_size=16)
    src = MemoryContext.create(spec, params)
    src.memory.apply(Ubatch([0, 1, 2], [[1]] * 3))
    for layout, ok in (("2025-08", False), ("2026-04", True)):
        blob = bytes(src.seq_get_data(1, layout=layout))
        dst = MemoryContext(src.memory.__class__(spec, params), layout)
        kv = dst.memory.kv()
        kv.apply(Ubatch(list(range(16)), [[0]] * 16))
        kv.seq_rm(0, 2, 4)
        kv.seq_rm(0, 8, 10)
        res = dst.seq_set_data(blob, 1)
        assert res.ok == ok, (layout, res)
        if ok:
            assert np.flatnonzero(kv.cells[0].seq[:, 1]).tolist() == [2, 3, 8]
            assert bytes(dst.seq_get_data(1)) == blob


def test_swa_cells_are_reused_and_purged() -> None:
    kv = _kv(size=8, n_swa=3, swa_type=SWA_STANDARD)
    kv.apply(Ubatch(list(range(8)), [[0]] * 8))
    assert kv.find_slot(Ubatch([8], [[0]])).idxs[0].tolist() == [0]  # pos 0 is out of the window of 8
    kv.apply(Ubatch([8, 9], [[0]] * 2))
    assert kv.seq_pos_min(0) == 2 and kv.seq_pos_max(0) == 9
    assert is_masked_swa(3, SWA_STANDARD, 5, 8) and not is_masked_swa(3, SWA_STANDARD, 6, 8)
    assert is_masked_swa(4, SWA_CHUNKED, 3, 5) and not is_masked_swa(4, SWA_CHUNKED, 4, 5)


def test_sequence_operations() -> None:
    kv = _kv(n_seq_max=3)
    kv.apply(Ubatch(list(range(6)), [[0]] * 6))
    kv.seq_cp(0, 1, 2, 4)
    assert (kv.seq_pos_min(1), kv.seq_pos_max(1)) == (2, 3)
    kv.seq_add(0, 3, -1, 10)
    assert kv.seq_pos_max(0) == 15 and kv.seq_pos_max(1) == 13  # shared cells move for both
    kv.seq_add(0, 0, 2, -5)  # positions below 0: the cells go
    assert kv.seq_pos_min(0) == 2 and kv.cells[0].used() == 4
    kv.seq_keep(1)
    assert kv.cells[0].used() == 2 and kv.seq_pos_max(0) == -1
    kv.seq_rm(1, 13, -1)
    assert (kv.seq_pos_min(1), kv.seq_pos_max(1)) == (2, 2)
    kv.seq_rm(-1)
    assert kv.cells[0].used() == 0
    kv.layers[0].k.fill_(7)
    kv.clear(data=False)
    assert int(kv.layers[0].k[0, 0, 0]) == 7
    kv.clear(data=True)
    assert int(kv.layers[0].k.sum()) == 0


def test_cross_stream_copy_moves_rows() -> None:
    kv = _kv(unified=False)
    kv.apply(Ubatch([0, 1], [[0]] * 2))
    kv.layers[0].k[0].fill_(5)
    kv.seq_cp(0, 1)
    assert kv.seq_pos_max(1) == 1 and int(kv.layers[0].k[1, 0, 0]) == 5
    with pytest.raises(CacheError):
        kv.seq_cp(0, 1, 3, 5)


def test_composite_positions() -> None:
    ctx = MemoryContext.create(spec_of("hybrid"), ContextParams(n_seq_max=2, kv_size=16))
    ctx.memory.apply(Ubatch([0, 1, 2], [[0]] * 3))
    assert (ctx.memory.seq_pos_min(0), ctx.memory.seq_pos_max(0)) == (2, 2)  # [max(mins), min(maxes)]
    iswa = MemoryContext.create(spec_of("iswa"), ContextParams(n_seq_max=1, kv_size=16, kv_size_swa=8))
    with pytest.raises(CacheError):  # 12 tokens do not fit the 8-cell SWA cache at once
        iswa.memory.apply(Ubatch(list(range(12)), [[0]] * 12))
    assert iswa.memory.kv("kv_base").cells[0].used() == 0  # all or nothing
    iswa.memory.apply(Ubatch(list(range(8)), [[0]] * 8))
    iswa.memory.apply(Ubatch(list(range(8, 12)), [[0]] * 4))
    assert iswa.memory.kv("kv_base").seq_pos_min(0) == 0
    assert iswa.memory.seq_pos_min(0) == iswa.memory.kv("kv_swa").seq_pos_min(0) > 0


def test_recurrent_operations_and_state_copy() -> None:
    rec = RecurrentMemory((0, 1), 2, 4, 8, F32, F32, 3, 3)
    cells = rec.apply(Ubatch([0, 1, 2], [[0]] * 3))
    assert cells == [0] and rec.pos[0] == 2
    rec.set_r(0, [0], torch.ones(1, 4))
    rec.seq_cp(0, 1)
    assert rec.seq[0, 1] and rec.tail[1] == 0
    assert rec.seq_rm(0, 1, -1) is False  # a recurrent state cannot lose its end
    rec.apply(Ubatch([3], [[1]]))  # seq 1 leaves the shared cell: its state is copied
    t1 = int(rec.tail[1])
    assert t1 != 0 and torch.equal(rec.get_r(0, [t1]), torch.ones(1, 4)) and rec.pos[t1] == 3
    rec.apply(Ubatch([0], [[2]]))  # a new sequence starts from a zeroed state
    assert float(rec.get_r(0, [int(rec.tail[2])]).abs().sum()) == 0.0
    rec.seq_add(1, 0, -1, 5)
    assert rec.seq_pos_max(1) == 8
    rec.seq_keep(1)
    assert rec.used() == 1 and rec.seq_pos_max(0) == -1


@pytest.mark.parametrize("type_name", ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1"])
def test_float_views(type_name: str) -> None:
    t = gt.type_id_from_name(type_name)
    kv = KvCache((AttnLayer(0, 64, 64),), t, t, False, 8, 1, True)
    x = torch.randn(3, 64)
    kv.set_k(0, 0, [1, 2, 5], x)
    kv.set_v(0, 0, [1, 2, 5], x)
    raw = kv.k_rows(0, 0)[[1, 2, 5]].clone()
    tol = {"f32": 0.0, "f16": 2e-3, "bf16": 2e-2, "q8_0": 5e-2}.get(type_name, 0.5)
    assert float((kv.get_k(0, 0, [1, 2, 5]) - x).abs().max()) <= tol
    kv.set_k_raw(0, 0, [1, 2, 5], raw)  # raw bytes round-trip exactly
    assert torch.equal(kv.k_rows(0, 0)[[1, 2, 5]], raw)
    assert torch.equal(kv.get_v(0, 0, [1, 2, 5]), kv.get_k(0, 0, [1, 2, 5]))


def test_transposed_v_layout() -> None:
    kv = KvCache((AttnLayer(0, 32, 4),), F16, F16, True, 8, 1, True)
    vals = torch.arange(8, dtype=torch.float32).reshape(2, 4)
    kv.set_v(0, 0, [3, 6], vals)
    el = kv.layers[0].v
    assert el is not None
    col = el[0].view(4, 8, 2)  # element j of cell i at byte (j * size + i) * 2
    assert torch.equal(col[:, 3, :].reshape(-1), torch.from_numpy(np.arange(4, dtype=np.float16).view(np.uint8)))
    assert torch.equal(kv.get_v(0, 0, [3, 6]), vals)


def test_unsupported_quantization_is_a_clear_error() -> None:
    iq4 = gt.type_id_from_name("iq4_nl")
    kv = KvCache((AttnLayer(0, 32, 32),), iq4, iq4, False, 4, 1, True)
    assert kv.get_k(0, 0).shape == (4, 32)
    with pytest.raises(ConversionError, match="iq4_nl"):
        kv.set_k(0, 0, [0], torch.zeros(1, 32))


def test_construction_checks() -> None:
    bad = KvLayer(0, 32, 32, torch.zeros(1, 8, 63, dtype=torch.uint8), torch.zeros(1, 32, 16, dtype=torch.uint8))
    with pytest.raises(CacheError, match="K must be"):
        KvCache((AttnLayer(0, 32, 32),), F16, F16, True, 8, 1, True, tensors=[bad])
    novalue = KvLayer(1, 32, 0, torch.zeros(1, 8, 64, dtype=torch.uint8), torch.zeros(1, 8, 64, dtype=torch.uint8))
    with pytest.raises(CacheError, match="no V"):
        KvCache((AttnLayer(1, 32, 0),), F16, F16, False, 8, 1, True, tensors=[novalue])
    with pytest.raises(CacheError, match="transposed"):
        KvCache(LAYERS, F16, Q8_0, True, 8, 1, True)
    with pytest.raises(RecurrentError, match="r must be"):
        RecurrentMemory((0,), 1, 4, 4, F32, F32, 2, 2, tensors={0: (torch.zeros(2, 15, dtype=torch.uint8),
                                                                      torch.zeros(2, 16, dtype=torch.uint8))})
    with pytest.raises(SpecError):
        MemorySpec("x", 2, "iswa", LAYERS)
    with pytest.raises(SpecError):
        MemorySpec("x", 2, "hybrid", LAYERS)


def test_context_sizing_rules() -> None:
    p = ContextParams(n_ctx=700, n_seq_max=3, kv_unified=False)
    assert (p.n_ctx_actual, p.n_ctx_seq, p.n_stream, p.v_trans) == (768, 256, 3, False)
    p = ContextParams(n_ctx=300, n_seq_max=4, kv_unified=True, swa_full=False, n_ubatch=256)
    assert (p.n_ctx_seq, p.n_stream, p.swa_size(8), p.recurrent_size) == (512, 1, 512, 4)
    assert ContextParams(n_ctx=4096, swa_full=False, n_ubatch=512).swa_size(1024) == 1536
    with pytest.raises(ParamsError, match="flash attention"):
        ContextParams(type_v="q8_0", flash_attn=False)
    with pytest.raises(ParamsError):
        ContextParams(type_k="q2_k")


def test_device() -> None:
    ctx = MemoryContext.create(spec_of("kv"), ContextParams(kv_size=8), device="cpu")
    assert ctx.memory.kv().layers[0].k.device.type == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            MemoryContext.create(spec_of("kv"), ContextParams(kv_size=8), device="cuda")
        return
    gpu = MemoryContext.create(spec_of("hybrid"), ContextParams(kv_size=8, n_seq_max=2), device="cuda")
    gpu.memory.apply(Ubatch([0, 1], [[1]] * 2))
    gpu.memory.kv().set_k(1, 0, [0, 1], torch.ones(2, 32))
    blob = bytes(gpu.seq_get_data(1))
    cpu = MemoryContext.create(spec_of("hybrid"), ContextParams(kv_size=8, n_seq_max=2))
    assert cpu.seq_set_data(blob, 1).ok and bytes(cpu.seq_get_data(1)) == blob
    assert gpu.seq_set_data(blob, 1, reader="file").ok and bytes(gpu.seq_get_data(1)) == blob


@pytest.mark.parametrize("policy", ["contained", "transactional"])
def test_file_api_streams_through_files(policy: str, tmp_path: Path) -> None:
    spec = MemorySpec("test", 2, "kv", (AttnLayer(0, 1024, 1024), AttnLayer(1, 1024, 1024)))
    params = ContextParams(n_seq_max=2, kv_unified=True, flash_attn=False, kv_size=512)
    ctx = MemoryContext.create(spec, params)
    ctx.memory.apply(Ubatch(list(range(400)), [[1]] * 400))
    for t in ctx.memory.kv().tensors():
        t.copy_(torch.randint(0, 256, t.shape, dtype=torch.uint8))
    seq_path, ses_path = tmp_path / "s.seqstate", tmp_path / "c.session"
    n = ctx.seq_save_file(seq_path, 1, [7] * 400)
    assert n == seq_path.stat().st_size > 2 * (1 << 20)  # big enough for the memory-mapped read path
    assert ctx.save_file(ses_path, [1, 2, 3]) == ses_path.stat().st_size
    fresh = MemoryContext.create(spec, params)
    res = fresh.seq_load_file(seq_path, 1, policy=policy)
    assert res.ok and res.returned == n and res.tokens == [7] * 400 and res.reader == "file"
    assert bytes(fresh.seq_file_bytes(1, [7] * 400)) == seq_path.read_bytes()
    assert fresh.load_file(ses_path, policy=policy).ok
    assert bytes(fresh.session_bytes([1, 2, 3])) == ses_path.read_bytes()
    before = [t.clone() for t in fresh.memory.kv().tensors()]
    cut = tmp_path / "cut.seqstate"
    cut.write_bytes(seq_path.read_bytes()[: n - 1000])
    res = fresh.seq_load_file(cut, 1, policy=policy)
    assert res.check == "truncated" and res.returned == 0
    same = all(torch.equal(a, b) for a, b in zip(before, fresh.memory.kv().tensors(), strict=True))
    assert same == (policy == "transactional")
    assert fresh.memory.seq_pos_max(1) == (399 if policy == "transactional" else -1)
    junk = tmp_path / "junk.session"
    junk.write_bytes(ses_path.read_bytes() + b"1234")
    res = fresh.load_file(junk)
    assert (res.ok, res.returned, res.check) == (False, False, "trailing") and fresh.memory.seq_pos_max(1) == 399
