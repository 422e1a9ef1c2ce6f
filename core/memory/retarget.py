"""The memory another build creates for the same model, holding the same state.

Between the 2026-10 (0c1e5709) and 2026-10-v4 (b11434) builds one memory changes shape: Qwen4exp's
k-pool indexer cache (``llama_memory_hybrid_idx``, ``attention.compress_ratios`` set) caches rows of
``2 x key_length`` in b11434 ("raw key | pooled key") and of ``key_length`` in 0c1e5709 (docs §10).
:func:`context_for_layout` builds the target build's memory for the model and copies the state
over: cell metadata as it is, rows of the same width as they are, a widened row with its raw half
kept and the pooled half zero (b11434's restore marks every pool of the sequence stale, so it is
recomputed before it is read), a narrowed row with its raw half. The rotation block sizes are the
target build's rule for the widened cache.
"""

from __future__ import annotations

import torch

from kvscope.core.memory.composite import LlamaMemory
from kvscope.core.memory.context import MemoryContext
from kvscope.core.memory.kv_cache import KvCache
from kvscope.core.memory.layout import Layout
from kvscope.core.memory.recurrent import RecurrentMemory
from kvscope.core.memory.spec import MemorySpec
from kvscope.core.model.profile import ModelProfile


def target_spec(spec: MemorySpec, profile: ModelProfile | None, source: Layout, target: Layout) -> MemorySpec | None:
    """The model's memory in ``target``'s build when its geometry differs from ``spec`` (None: the same)."""
    if profile is None or source.kv_rot == target.kv_rot:
        return None
    other = MemorySpec.from_profile(profile, target.kv_rot)
    widths = [[(a.il, a.n_embd_k, a.n_embd_v) for a in c.layers] for c in spec.kv_caches()]
    if widths == [[(a.il, a.n_embd_k, a.n_embd_v) for a in c.layers] for c in other.kv_caches()]:
        return None
    return other


def _copy_rows(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Rows of ``src`` into ``dst`` ([..., row] bytes): the common prefix, the rest of ``dst`` zero."""
    n = min(dst.shape[-1], src.shape[-1])
    dst.zero_()
    dst[..., :n] = src[..., :n]


def context_for_layout(ctx: MemoryContext, spec: MemorySpec, target: Layout) -> MemoryContext:
    """A context of ``spec`` (the target build's memory of the same model) with ``ctx``'s state."""
    mem = LlamaMemory(spec, ctx.memory.params, ctx.memory.store.device)
    for new, old in zip(mem.parts, ctx.memory.parts, strict=True):
        if new.role != old.role:
            raise ValueError(f"the target memory has part {new.role} where the source has {old.role}")
        a, b = new.mem, old.mem
        if isinstance(a, KvCache) and isinstance(b, KvCache):
            a.restore(b.snapshot())
            for la, lb in zip(a.layers, b.layers, strict=True):
                _copy_rows(la.k, lb.k)
                if la.v is not None and lb.v is not None:
                    _copy_rows(la.v, lb.v)
        elif isinstance(a, RecurrentMemory) and isinstance(b, RecurrentMemory):
            a.restore(b.snapshot())
            for ta, tb in zip(a.tensors(), b.tensors(), strict=True):
                ta.copy_(tb)
        else:
            for ta, tb in zip(a.tensors(), b.tensors(), strict=True):
                ta.copy_(tb)
    out = MemoryContext(mem, target, ctx.arch, ctx.outputs)
    return out
