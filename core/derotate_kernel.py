"""The compiled kernels of ``--stats`` (``core/_derotate.c``), where they run.

``kvscope.core._derotate`` (built when kvscope is installed) does two scans in one pass over the
bytes, in registers:

* :func:`value_stats`: the statistics of plain f16 / bf16 / f32 / q8_0 / q4_0 values (decoded
  with F16C, a shift, or ggml's float32 products): extremes, sum and sum of squares of the finite
  values, exact NaN and Inf counts and the first one's position, and which rows (or, for a
  transposed V, which cells) are all zero bytes; :func:`decode` gives the same float32 values
  as numpy decodes them (``record_values.dequantize_rows``), bit for bit but a NaN's payload;
* :func:`rotated_stats`: q8_0 / q4_0 blocks (or float32 values) Hadamard-rotated by llama.cpp,
  de-rotated block by block: 4-6x numpy's speed, which materialises the transform in several
  passes over memory.

They run on x86-64 CPUs with AVX2 and F16C; elsewhere, or where the extension did not compile,
every function here answers None and callers keep their numpy path, the exact reference
(:func:`kernel` says which is used). They also answer None for what they do not take (another
type, a block size not handled) and :func:`rotated_stats` for data holding a non-finite value or
float32 squares that overflow, whose statistics the exact numpy path computes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import ModuleType

import numpy as np
import numpy.typing as npt
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

_KIND_F32 = 0
# the block layouts core/_derotate.c decodes: kernel kind, (values, bytes) per block, as gguf-py has them
_LAYOUTS = {GGMLQuantizationType.Q8_0: (1, (32, 34)), GGMLQuantizationType.Q4_0: (2, (32, 18))}
_VALUE_LAYOUTS = {**_LAYOUTS, GGMLQuantizationType.F32: (_KIND_F32, (1, 4)), GGMLQuantizationType.F16: (3, (1, 2)),
                  GGMLQuantizationType.BF16: (4, (1, 2))}


def _load() -> ModuleType | None:
    try:
        from kvscope.core import _derotate
    except ImportError:
        return None
    return _derotate if _derotate.KERNEL is not None else None


_MOD = _load()
_KINDS = {int(t): kind for t, (kind, layout) in _LAYOUTS.items() if GGML_QUANT_SIZES.get(t) == layout}
# type id -> (kernel kind, values per block, bytes per block) for value_stats / decode
_VALUE_KINDS = {int(t): (kind, *layout) for t, (kind, layout) in _VALUE_LAYOUTS.items()
                if GGML_QUANT_SIZES.get(t) == layout}


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


@dataclass(frozen=True)
class ValueStats:
    """Of plain values: their count, NaN and Inf counts, the flat index of the first of those (-1:
    none), extremes (inf, -inf when no value is finite), sum and sum of squares of the finite
    values, and how many rows (or cells) are all zero bytes (flagged in the buffer passed)."""

    n_values: int
    n_nan: int
    n_inf: int
    first_nonfinite: int
    min: float
    max: float
    sum: float
    sum_squares: float
    n_zero: int


def takes_values(type_id: int) -> bool:
    """Whether :func:`value_stats` and :func:`decode` take ``type_id`` here."""
    return _MOD is not None and type_id in _VALUE_KINDS


def value_stats(data: npt.NDArray[np.uint8], type_id: int, row_bytes: int, zero_flags: npt.NDArray[np.uint8],
                el: int = 0) -> ValueStats | None:
    """Statistics of ``data`` (raw bytes, whole elements/blocks of ``type_id``), a matrix of rows
    of ``row_bytes`` bytes; None where the kernel does not run or take the type or the shape.

    Zero bytes are looked for per row (``el == 0``: ``zero_flags[r]`` says row ``r`` is all zero)
    or, for a transposed V whose rows are columns of ``el``-byte cells, per cell
    (``zero_flags[j]``: cell ``j`` is zero in every row). Only the first flags are written
    (rows, or ``row_bytes // el``); the rest of ``zero_flags`` is left as it was.
    """
    if not takes_values(type_id):
        return None
    assert _MOD is not None
    kind = _VALUE_KINDS[type_id][0]
    try:
        out = _MOD.values(kind, np.ascontiguousarray(data), row_bytes, el, zero_flags)
    except ValueError:  # not whole units or rows, or too few flags
        return None
    return ValueStats(*out)


def decode(raw: npt.NDArray[np.uint8], type_id: int) -> npt.NDArray[np.float32] | None:
    """Float32 values of ``raw`` (any shape whose last axis is whole blocks of ``type_id``), as
    ``record_values.dequantize_rows`` decodes them with numpy; None where the kernel does not run,
    take the type or the shape."""
    if not takes_values(type_id) or raw.ndim == 0:
        return None
    assert _MOD is not None
    kind, bs, ts = _VALUE_KINDS[type_id]
    if raw.shape[-1] % ts:
        return None
    out = np.empty((*raw.shape[:-1], raw.shape[-1] // ts * bs), np.float32)
    _MOD.decode(kind, np.ascontiguousarray(raw), out)
    return out
