"""Statistics of rotated K/V rows from the compiled de-rotation kernel, where it runs.

``kvscope.core._derotate`` (``core/_derotate.c``, built when kvscope is installed) decodes q8_0 /
q4_0 blocks, or takes float32 values, applies the inverse Hadamard transform block by block in
registers and keeps the extremes and sums: 4-6x numpy's speed, which materialises the transform
in several passes over memory. It runs on x86-64 CPUs with AVX2; elsewhere, or where it did not
compile, :func:`rotated_stats` answers None and callers keep their numpy path (:func:`kernel`
says which is used). It also answers None for what it does not take (another type, a block size
it does not handle) and for data holding a non-finite value or float32 squares that overflow,
whose statistics the exact numpy path computes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import ModuleType

import numpy as np
import numpy.typing as npt
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

_KIND_F32 = 0
# the block layouts core/_derotate.c decodes: (values, bytes) per block, as gguf-py has them
_LAYOUTS = {GGMLQuantizationType.Q8_0: (1, (32, 34)), GGMLQuantizationType.Q4_0: (2, (32, 18))}


def _load() -> ModuleType | None:
    try:
        from kvscope.core import _derotate
    except ImportError:
        return None
    return _derotate if _derotate.KERNEL is not None else None


_MOD = _load()
_KINDS = {int(t): kind for t, (kind, layout) in _LAYOUTS.items() if GGML_QUANT_SIZES.get(t) == layout}


def disable() -> None:
    """From now on numpy does the work in this process (``bench_rotation --numpy`` measures the kernel's gain)."""
    global _MOD
    _MOD = None


def kernel() -> str | None:
    """The instruction set the kernel runs with here ("avx2"), or None: numpy does the work."""
    return None if _MOD is None else str(_MOD.KERNEL)


@dataclass(frozen=True)
class RotatedStats:
    """Of the de-rotated values: extremes, sum and sum of squares (the rotation keeps it)."""

    min: float
    max: float
    sum: float
    sum_squares: float
    n_values: int


def supports(type_id: int, block: int) -> bool:
    """Whether :func:`rotated_stats` takes whole blocks of ``type_id`` (or float32 values) rotated in ``block``s."""
    if _MOD is None or block < 16 or block > _MOD.MAX_BLOCK or block & (block - 1):
        return False
    return type_id == int(GGMLQuantizationType.F32) or (type_id in _KINDS and block % 32 == 0)


def rotated_stats(data: npt.NDArray[np.uint8] | npt.NDArray[np.float32], type_id: int, block: int
                  ) -> RotatedStats | None:
    """Statistics of ``data`` (raw bytes of whole rotation blocks of ``type_id``, or float32
    values for ``GGML_TYPE_F32``) de-rotated in blocks of ``block`` values; None where the kernel
    does not run or apply, or where a value is not finite (see the module docstring)."""
    if not supports(type_id, block):
        return None
    assert _MOD is not None
    kind = _KIND_F32 if type_id == int(GGMLQuantizationType.F32) else _KINDS[type_id]
    buf = np.ascontiguousarray(data)
    try:
        ok, mn, mx, first, squares, n = _MOD.stats(kind, buf, block)
    except ValueError:  # not whole rotation blocks
        return None
    if not ok:
        return None
    return RotatedStats(mn, mx, math.sqrt(block) * first, squares, n)
