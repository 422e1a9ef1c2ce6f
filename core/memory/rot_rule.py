"""The Hadamard rotation block sizes a ``llama_kv_cache`` picks in its constructor (docs §6.1).

llama.cpp (b11434 ``src/llama-kv-cache.cpp:307-357``; 0c1e5709 computes the same as booleans and
derives the same block sizes in ``build_input_k_rot``) decides per cache instance::

    hk_all = the head size shared by every layer of the cache (0: no layer, -1: they differ)
    rot_k  = !disabled && hk_all > 0 && quantized(type_k) && n_embd_head_k() % 64 == 0
    rot_k  = true for the lightning-indexer caches of DeepSeek32/DeepSeek4/GLM-DSA/Dots3Note
    rot_v  = !disabled && hv_all > 0 && quantized(type_v) && n_embd_head_v() % 64 == 0
    n_rot_k = rot_k ? 64 doubled while hk_all % (2 * n_rot_k) == 0 : 0      (hk_all as uint32)
    n_rot_v = rot_v ? 64 : 0

``n_embd_head_k()`` is layer 0's head size of the cache's own hparams, which need not be one of
the cache's layers. ``disabled`` is ``LLAMA_ATTN_ROT_DISABLE`` (:attr:`ContextParams.rot_disabled`).
"""

from __future__ import annotations

from kvscope.core import ggml_types as gt
from kvscope.core.memory.spec import CacheSpec, SpecError

BLOCK = 64
_U32 = 0xFFFFFFFF


def head_all(heads: tuple[int, ...]) -> int:
    """``n_embd_head_{k,v}_all``: the common head size, 0 for no layer, -1 when the layers differ."""
    if not heads:
        return 0
    return heads[0] if len(set(heads)) == 1 else -1


def cache_rotation(c: CacheSpec, type_k: int, type_v: int, disabled: bool) -> tuple[int, int]:
    """``(n_rot_k, n_rot_v)`` of sub-cache ``c`` in a context with these cache types."""
    if c.n_rot is not None:
        return c.n_rot
    hk, hv = head_all(c.head_k), head_all(c.head_v)
    k0 = c.head_k0 if c.head_k0 is not None else (c.head_k[0] if c.head_k else 0)
    v0 = c.head_v0 if c.head_v0 is not None else (c.head_v[0] if c.head_v else 0)
    rot_k = (not disabled and hk > 0 and gt.is_quantized(type_k) and k0 % BLOCK == 0) or c.rot_forced
    rot_v = not disabled and hv > 0 and gt.is_quantized(type_v) and v0 % BLOCK == 0
    n_k = 0
    if rot_k:
        if hk == 0:
            raise SpecError(f"{c.role}: a forced K rotation of a cache without layers never finishes in llama.cpp "
                            "(its block-size loop does not end)")
        n_k = BLOCK
        while (hk & _U32) % (2 * n_k) == 0:
            n_k *= 2
    return n_k, BLOCK if rot_v else 0
