"""The Hadamard rotation block sizes of one sub-cache of the memory core (docs §6.1).

The rule is llama.cpp's, kept once in :mod:`kvscope.core.model.rotation_rule` (the reader infers
older layouts' block sizes with it too); this module applies it to a :class:`CacheSpec`, whose
``head_k0``/``head_v0`` are layer 0's head sizes of the cache's own hparams and whose ``n_rot``
pins the block sizes (a context inferred from a v11/v4 file, or a cache sharing another's cells).
"""

from __future__ import annotations

from kvscope.core.memory.spec import CacheSpec, SpecError
from kvscope.core.model.rotation_rule import EndlessRotationLoop, rotation_blocks


def cache_rotation(c: CacheSpec, type_k: int, type_v: int, disabled: bool) -> tuple[int, int]:
    """``(n_rot_k, n_rot_v)`` of sub-cache ``c`` in a context with these cache types."""
    if c.n_rot is not None:
        return c.n_rot
    try:
        return rotation_blocks(c.head_k, c.head_v, type_k, type_v, head_k0=c.head_k0, head_v0=c.head_v0,
                               disabled=disabled, forced_k=c.rot_forced)
    except EndlessRotationLoop as e:
        raise SpecError(f"{c.role}: {e}") from None
