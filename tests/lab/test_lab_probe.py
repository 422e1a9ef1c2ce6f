"""The inference probe: which cells each kernel reads (SWA window, free and masked cells, streams), the
recurrent rows, stale-cell counts, and the per-component sections of a sequence."""

from __future__ import annotations

import math

import pytest
import torch

from kvharness.fixtures import DATA
from kvscope.core.lab.probe import component_bytes, probe_sequences, seq_cells, stale_cells
from kvscope.core.lab.probe_math import attention_readout, probe_queries
from kvscope.core.lab.scenario import load_scenario
from kvscope.core.memory import AttnLayer, ContextParams, KvCache, MemoryContext, MemorySpec, Ubatch
from kvscope.core.memory.spec import SWA_STANDARD

N_SWA = 3


def _iswa() -> MemoryContext:
    """Layer 0 in a sliding-window cache (window 3), layer 1 in the base cache; seq 0 at 0..5, seq 1 at 0..2."""
    spec = MemorySpec("test", 2, "iswa", (AttnLayer(0, 32, 32), AttnLayer(1, 32, 32)), swa_layers=frozenset({0}),
                      n_swa=N_SWA, swa_type=SWA_STANDARD)
    ctx = MemoryContext.create(spec, ContextParams(n_seq_max=2, kv_unified=True, flash_attn=False, kv_size=16,
                                                   kv_size_swa=16))
    ctx.memory.apply(Ubatch(list(range(6)), [[0]] * 6))
    ctx.memory.apply(Ubatch(list(range(3)), [[1]] * 3))
    gen = torch.Generator().manual_seed(3)
    for p in ctx.memory.parts:
        assert isinstance(p.mem, KvCache)
        for ly in p.mem.layers:
            cells = list(range(9))
            p.mem.set_k(ly.il, 0, cells, torch.randn(9, 32, generator=gen))
            p.mem.set_v(ly.il, 0, cells, torch.randn(9, 32, generator=gen))
    return ctx


def _nan_at(ctx: MemoryContext, role: str, il: int, pos: int, seq: int) -> int:
    cache = ctx.memory.kv(role)
    cells = cache.cells[0]
    cell = int(((cells.pos == pos) & cells.seq[:, seq]).nonzero()[0][0])
    cache.set_k(il, 0, [cell], torch.full((1, 32), float("nan")))
    return cell


def test_swa_window_masks_old_cells_for_skip_masked_only() -> None:
    ctx = _iswa()
    base = probe_sequences(ctx, None, [0, 1])
    _nan_at(ctx, "kv_swa", 0, 0, 0)  # pos 0 of seq 0 is outside the window of its next position 6
    p = probe_sequences(ctx, None, [0, 1])
    assert p[0].next_pos == 6
    assert [s[:2] for s in p[0].segments] == [("kv_base", 1), ("kv_swa", 0)]  # components in memory order
    assert not bool(torch.isfinite(p[0].segment("dense", "kv_swa", 0)).all())
    assert bool(torch.isfinite(p[0].segment("dense", "kv_base", 1)).all())
    assert torch.equal(p[0].vectors["skip-masked"], base[0].vectors["skip-masked"])
    # seq 1 (next position 3) still sees its own pos 0, and the NaN cell is masked for it: dense only
    assert math.isinf(p[1].diff(base[1])["dense"]) and p[1].diff(base[1])["skip-masked"] == 0.0


def test_visible_cells_of_the_window() -> None:
    ctx = _iswa()
    cache = ctx.memory.kv("kv_swa")
    cells = cache.cells[0]
    visible = torch.from_numpy(cells.seq[:, 0] & (cells.pos >= 6 - N_SWA + 1))[:16]
    q = probe_queries(0, 1, 32, torch.device("cpu"))
    want = attention_readout(cache.get_k(0, 0)[:16], cache.get_v(0, 0)[:16], visible, q, "skip-masked")
    got = probe_sequences(ctx, None, [0])[0].segment("skip-masked", "kv_swa", 0)
    assert torch.equal(got, want)


def test_base_cache_nan_in_other_sequence_poisons_dense_only() -> None:
    ctx = _iswa()
    base = probe_sequences(ctx, None, [0])
    _nan_at(ctx, "kv_base", 1, 1, 1)  # a cell of seq 1: masked for seq 0
    d = probe_sequences(ctx, None, [0])[0].diff(base[0])
    assert math.isinf(d["dense"]) and d["skip-masked"] == 0.0


def test_stale_cells_after_seq_rm() -> None:
    ctx = _iswa()
    assert stale_cells(ctx, 0) == {"kv_base": (0, 0), "kv_swa": (0, 0)}
    _nan_at(ctx, "kv_swa", 0, 4, 0)
    ctx.memory.seq_rm(0)
    assert stale_cells(ctx, 0) == {"kv_base": (6, 0), "kv_swa": (6, 1)}
    assert seq_cells(ctx, 0) == {"kv_base": (0, -1, -1), "kv_swa": (0, -1, -1)}
    assert seq_cells(ctx, 1) == {"kv_base": (3, 0, 2), "kv_swa": (3, 0, 2)}


def test_recurrent_rows_and_an_empty_sequence() -> None:
    sc = load_scenario(DATA / "lab/llamacpp-2026-10-01/mamba")
    ctx = sc.live
    rec = ctx.memory.recurrent()
    p = probe_sequences(ctx, sc.profile, [0, 1])
    width = len(rec.layers) * (rec.n_embd_r + rec.n_embd_s)
    assert p[0].vectors["dense"].shape == (width,) and torch.equal(p[0].vectors["dense"], p[0].vectors["skip-masked"])
    assert p[0].next_pos == 7
    ctx2 = MemoryContext.create(ctx.memory.spec, ctx.memory.params, ctx.layout)
    empty = probe_sequences(ctx2, sc.profile, [0])[0]
    assert empty.next_pos == 0 and not bool(empty.vectors["dense"].any())


@pytest.mark.parametrize("sc", ["llama", "llama/fa1-unified1", "mamba", "gemma2", "lfm2"])
def test_component_sections_make_the_sequence_blob(sc: str) -> None:
    ctx = load_scenario(DATA / "lab/llamacpp-2026-10-01" / sc).live
    for seq in (0, 1):
        parts = component_bytes(ctx, seq)
        assert list(parts) == [p.role for p in ctx.memory.parts]
        assert bytes(ctx.seq_get_data(seq))[8:] == b"".join(parts.values())  # after the io magic + seq id
