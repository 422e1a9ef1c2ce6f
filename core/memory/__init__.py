"""kvscope's memory core: llama.cpp's KV-cache / recurrent memories in torch, byte-exact state I/O.

The only part of kvscope that imports torch. Every memory class of the 2026-10 builds is modelled
(kv, iswa, recurrent, hybrid, hybrid_iswa, hybrid_idx, dsa, dsa_iswa, msa, dsv4: see
:mod:`.composite` and :mod:`.classes`), with each KV sub-cache's Hadamard rotation block sizes
(:mod:`.rot_rule`). Build a context with :meth:`MemoryContext.create` (a
:class:`~kvscope.core.model.profile.ModelProfile` or a :class:`MemorySpec`, and
:class:`ContextParams`), or infer one from a state file with :func:`infer_context`; then write any
layout generation (``state_write``, ``seq_get_data``, ``get_data``, ``save_file`` ...) and restore
with llama.cpp's checks and a chosen failure policy (``state_read``, ``seq_set_data``,
``set_data``, ``load_file`` ... -> :class:`ReadResult`). A model or state the core cannot hold is
refused with :class:`SpecError` / ``InferError`` naming what is missing.
"""

from kvscope.core.memory.cells import SlotInfo, Ubatch
from kvscope.core.memory.composite import LlamaMemory
from kvscope.core.memory.containers import Outputs
from kvscope.core.memory.context import MemoryContext
from kvscope.core.memory.kv_cache import CacheError, KvCache
from kvscope.core.memory.layout import FLAG_PARTIAL_ONLY, Layout, LayoutError
from kvscope.core.memory.params import ContextParams, ParamsError
from kvscope.core.memory.policy import FailurePolicy, LegacyPolicy, TransactionalPolicy, make_policy
from kvscope.core.memory.recurrent import RecurrentMemory
from kvscope.core.memory.result import ReadResult
from kvscope.core.memory.spec import AttnLayer, CacheSpec, Dsv4Block, Dsv4Spec, MemorySpec, SpecError

__all__ = [
    "FLAG_PARTIAL_ONLY",
    "AttnLayer",
    "CacheError",
    "CacheSpec",
    "ContextParams",
    "Dsv4Block",
    "Dsv4Spec",
    "FailurePolicy",
    "KvCache",
    "Layout",
    "LayoutError",
    "LegacyPolicy",
    "LlamaMemory",
    "MemoryContext",
    "MemorySpec",
    "Outputs",
    "ParamsError",
    "ReadResult",
    "RecurrentMemory",
    "SlotInfo",
    "SpecError",
    "TransactionalPolicy",
    "Ubatch",
    "make_policy",
]
