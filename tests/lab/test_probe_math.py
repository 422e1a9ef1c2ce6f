"""The two attention kernels: dense reads masked cells (NaN poisons), skip-masked never does."""

from __future__ import annotations

import math

import pytest
import torch

from kvscope.core.lab.probe_math import attention_readout, cells_read, max_abs_diff, probe_queries


def _kv(n: int = 8, h: int = 2, d: int = 4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    k, v = torch.randn(n, h * d, generator=g), torch.randn(n, h * d, generator=g)
    return k, v, probe_queries(3, h, d, torch.device("cpu"))


def test_kernels_agree_on_clean_rows() -> None:
    k, v, q = _kv()
    vis = torch.tensor([True, True, False, True, False, False, True, True])
    dense = attention_readout(k, v, vis, q, "dense")
    skip = attention_readout(k, v, vis, q, "skip-masked")
    assert dense.shape == (8,) and torch.allclose(dense, skip, atol=1e-6)
    # reference: softmax over the visible cells only, per head
    kh, vh = k[vis].reshape(-1, 2, 4), v[vis].reshape(-1, 2, 4)
    for h in range(2):
        w = torch.softmax(kh[:, h] @ q[h] / 2.0, dim=0)
        assert torch.allclose(dense[h * 4 : (h + 1) * 4], w @ vh[:, h], atol=1e-6)


@pytest.mark.parametrize("poison", ["k", "v"])
def test_nan_in_a_masked_cell(poison: str) -> None:
    k, v, q = _kv()
    vis = torch.tensor([True] * 4 + [False] * 4)
    clean = attention_readout(k, v, vis, q, "dense")
    (k if poison == "k" else v)[6] = float("nan")  # a masked (e.g. free) cell
    assert not torch.isfinite(attention_readout(k, v, vis, q, "dense")).any()
    assert torch.equal(attention_readout(k, v, vis, q, "skip-masked"), clean)


def test_zeroed_masked_rows_are_harmless() -> None:
    k, v, q = _kv()
    vis = torch.tensor([True] * 4 + [False] * 4)
    clean = attention_readout(k, v, vis, q, "dense")
    k[4:], v[4:] = 0, 0
    assert torch.allclose(attention_readout(k, v, vis, q, "dense"), clean, atol=1e-6)


def test_no_visible_cell_and_helpers() -> None:
    k, v, q = _kv()
    out = attention_readout(k, v, torch.zeros(8, dtype=torch.bool), q, "skip-masked")
    assert torch.equal(out, torch.zeros(8))
    assert cells_read(512, 7) == 256 and cells_read(256, 7) == 256 and cells_read(1024, 300) == 512
    a = torch.tensor([1.0, 2.0])
    assert max_abs_diff(a, a) == 0.0 and max_abs_diff(a, torch.tensor([1.0, 2.5])) == 0.5
    assert math.isinf(max_abs_diff(a, torch.tensor([1.0, float("nan")])))
    nan = torch.tensor([float("nan")])
    assert max_abs_diff(nan, nan) == 0.0
