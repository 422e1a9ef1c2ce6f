"""Attention read-outs over a KV stream, computed the two ways llama.cpp's CPU build does.

* ``dense`` — the path without flash attention: scores ``K·q`` over every cell the kernel reads
  (also free and masked ones), then the ``-inf`` mask is *added*, softmax, and ``weights × V``
  over the same cells. A NaN anywhere in those rows survives ``+(-inf)`` and ``0 × NaN``, so
  stale NaN rows in free cells poison every sequence of the stream (llama.cpp issue #27068).
* ``skip-masked`` — the CPU flash-attention kernel, which never reads a masked cell.

Pure functions of tensors: the lab feeds them the memory core's dequantized rows.
"""

from __future__ import annotations

from typing import Literal

import torch

Kernel = Literal["dense", "skip-masked"]
KERNELS: tuple[Kernel, ...] = ("dense", "skip-masked")
KV_PAD = 256  # llama_kv_cache::get_padding(): the cells a kernel reads are padded to this


def cells_read(size: int, used_max_p1: int) -> int:
    """``get_n_kv``: how many cells of a stream the attention kernel reads."""
    padded = -(-max(used_max_p1, 1) // KV_PAD) * KV_PAD
    return min(size, max(KV_PAD, padded))


def probe_queries(il: int, n_head_kv: int, head_dim: int, device: torch.device) -> torch.Tensor:
    """A fixed query per layer and KV head (seeded by the layer), shape [n_head_kv, head_dim]."""
    gen = torch.Generator(device="cpu").manual_seed(0x5EED + 7919 * il)
    return torch.randn(n_head_kv, head_dim, generator=gen, dtype=torch.float32).to(device)


def attention_readout(
    k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, q: torch.Tensor, kernel: Kernel
) -> torch.Tensor:
    """Attention output for one query per KV head.

    ``k``: [n_cells, n_head_kv * head_dim_k] float32, ``v``: [n_cells, n_head_kv * head_dim_v],
    ``visible``: bool [n_cells] (cells the sequence may attend to), ``q``: [n_head_kv, head_dim_k].
    Returns [n_head_kv * head_dim_v]. With no visible cell the output is zeros.
    """
    n_head, d_k = q.shape
    if kernel == "skip-masked":
        idx = torch.nonzero(visible, as_tuple=False).flatten()
        k, v = k.index_select(0, idx), v.index_select(0, idx)
        visible = torch.ones(idx.numel(), dtype=torch.bool, device=k.device)
    n_cells = k.shape[0]
    d_v = v.shape[1] // n_head if n_head else 0
    if n_cells == 0 or not bool(visible.any()):
        return torch.zeros(n_head * d_v, dtype=torch.float32, device=q.device)
    kh = k.reshape(n_cells, n_head, d_k).transpose(0, 1)  # [h, cells, d]
    vh = v.reshape(n_cells, n_head, d_v).transpose(0, 1)
    scores = torch.einsum("hcd,hd->hc", kh, q) / float(d_k) ** 0.5
    mask = torch.zeros(n_cells, dtype=torch.float32, device=k.device)
    mask[~visible] = float("-inf")
    weights = torch.softmax(scores + mask, dim=-1)  # NaN + (-inf) stays NaN: as in ggml
    out = torch.einsum("hc,hcd->hd", weights, vh)  # 0 x NaN is NaN: masked NaN rows still poison
    return out.reshape(-1)


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Max |a - b|; ``inf`` when either side has a non-finite value the other does not share."""
    if a.shape != b.shape:
        return float("inf")
    fa, fb = torch.isfinite(a), torch.isfinite(b)
    if not bool(torch.equal(fa, fb)):
        return float("inf")
    if not bool(fa.all()):
        same = torch.equal(torch.nan_to_num(a[~fa], nan=1.5), torch.nan_to_num(b[~fb], nan=1.5))
        if not same:
            return float("inf")
    if not bool(fa.any()):
        return 0.0
    return float((a[fa] - b[fb]).abs().max().item())
