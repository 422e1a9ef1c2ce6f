"""The Hadamard rotation block sizes a ``llama_kv_cache`` picks in its constructor: the one copy of the rule.

llama.cpp (b11434 ``src/llama-kv-cache.cpp:314-357``; 0c1e5709 computes the same as booleans and
derives the same block sizes in ``build_input_k_rot``) decides per cache instance::

    hk_all = the head size shared by every layer of the cache (0: no layer, -1: they differ)
    rot_k  = !disabled && hk_all > 0 && quantized(type_k) && n_embd_head_k() % 64 == 0
    rot_k  = true for the lightning-indexer caches of DeepSeek32/DeepSeek4/GLM-DSA/Dots3Note
    rot_v  = !disabled && hv_all > 0 && quantized(type_v) && n_embd_head_v() % 64 == 0
    n_rot_k = rot_k ? 64 doubled while hk_all % (2 * n_rot_k) == 0 : 0      (hk_all as uint32)
    n_rot_v = rot_v ? 64 : 0

``n_embd_head_k()`` is layer 0's head size of the cache's own hparams, which need not be one of
the cache's layers (``head_k0``). ``disabled`` is ``LLAMA_ATTN_ROT_DISABLE``. The reader
(:mod:`kvscope.core.reader.rotation`, which infers the block sizes of layouts that do not store
them) and the memory core (:mod:`kvscope.core.memory.rot_rule`, which builds caches) both ask here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvscope.core import ggml_types as gt
from kvscope.core.model.memory_plan import DSA_ROTATED_LID, ExpectedSection
from kvscope.core.model.profile import ModelProfile

BLOCK = 64  # the smallest rotation block, and V's only one
_U32 = 0xFFFFFFFF


class EndlessRotationLoop(ValueError):
    """A forced K rotation of a cache without layers: llama.cpp's block-size loop never ends."""


# the caches built on hparams of their own (an indexer copy), whose layer-0 head size is their own
OWN_HEAD_ROLES = ("kv_lid", "kv_idx")


@dataclass(frozen=True)
class CacheHeads:
    """What the rule reads of one cache: its layers' head sizes, layer 0's of its hparams, the forced K rule."""

    k: tuple[int, ...]
    v: tuple[int, ...]
    k0: int
    v0: int
    forced_k: bool = False

    def blocks(self, type_k: int | None, type_v: int | None, disabled: bool = False) -> tuple[int, int]:
        """``(n_rot_k, n_rot_v)`` of this cache with these cache types."""
        return rotation_blocks(self.k, self.v, type_k, type_v, head_k0=self.k0, head_v0=self.v0,
                               disabled=disabled, forced_k=self.forced_k)


def indexer_key_length(plan: Sequence[ExpectedSection]) -> int:
    """``indexer.key_length`` as the plan's indexer sections show it (0: no indexer)."""
    for s in plan:
        if s.role == "kv_lid" and s.head_k:
            return s.head_k[0]
        if s.role == "kcache_lid":
            return s.param("ne0") or 0
    return 0


def planned_cache_heads(profile: ModelProfile, plan: Sequence[ExpectedSection], s: ExpectedSection) -> CacheHeads:
    """The rule's inputs for the planned cache ``s`` of ``profile`` (``plan``: the model's whole plan).

    llama.cpp forces K rotation for the lightning-indexer caches of DeepSeek32/DeepSeek4/GLM-DSA/
    Dots3Note: any of their caches whose full K head size equals ``indexer.key_length`` (the indexer
    copy always; a cache on the model's own hparams only when the model's key_length happens to be the
    same), except the hybrid-idx indexer.
    """
    own = s.role in OWN_HEAD_ROLES
    k0 = s.head_k[0] if own and s.head_k else (profile.head_size_k(0) if profile.n_layer else 0)
    v0 = profile.head_size_v(0) if profile.n_layer else 0
    kl = indexer_key_length(plan)
    full_k = s.head_k[0] if own and s.head_k else profile.head_dim_k
    forced = profile.arch in DSA_ROTATED_LID and kl > 0 and full_k == kl and s.role != "kv_idx"
    return CacheHeads(tuple(s.head_k), tuple(s.head_v), k0, v0, forced)


def head_all(heads: Sequence[int]) -> int:
    """``n_embd_head_{k,v}_all``: the common head size, 0 for no layer, -1 when the layers differ."""
    if not heads:
        return 0
    return heads[0] if len(set(heads)) == 1 else -1


def rotation_blocks(head_k: Sequence[int], head_v: Sequence[int], type_k: int | None, type_v: int | None, *,
                    head_k0: int | None = None, head_v0: int | None = None, disabled: bool = False,
                    forced_k: bool = False) -> tuple[int, int]:
    """``(n_rot_k, n_rot_v)`` of a cache whose layers have these K and V head sizes and these cache
    types (None: no records of that side). ``head_k0``/``head_v0`` default to the first layer's
    head size; ``forced_k`` is the lightning-indexer rule."""
    hk, hv = head_all(head_k), head_all(head_v)
    k0 = head_k0 if head_k0 is not None else (head_k[0] if head_k else 0)
    v0 = head_v0 if head_v0 is not None else (head_v[0] if head_v else 0)
    quant_k = type_k is not None and gt.is_quantized(type_k)
    quant_v = type_v is not None and gt.is_quantized(type_v)
    rot_k = (not disabled and hk > 0 and quant_k and k0 % BLOCK == 0) or forced_k
    rot_v = not disabled and hv > 0 and quant_v and v0 % BLOCK == 0
    n_k = 0
    if rot_k:
        if hk == 0:
            raise EndlessRotationLoop("a forced K rotation of a cache without layers never finishes in llama.cpp "
                                      "(its block-size loop does not end)")
        n_k = BLOCK
        while (hk & _U32) % (2 * n_k) == 0:
            n_k *= 2
    return n_k, BLOCK if rot_v else 0
