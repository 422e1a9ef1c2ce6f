"""Raw K/V rows of the five types the compiled value kernel takes (f16, bf16, f32, q8_0, q4_0), with
the bit patterns that matter written where a test asks: subnormals, the largest finite values,
zeros of both signs, Inf and NaN of several payloads, all-zero rows. The kernel's tests
(tests/analysis/test_derotate_kernel.py) and the scan's (tests/analysis/test_stats.py) draw from them."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

F16, BF16, F32 = GGMLQuantizationType.F16, GGMLQuantizationType.BF16, GGMLQuantizationType.F32
Q8, Q4 = GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q4_0
KERNEL_TYPES = [F16, BF16, F32, Q8, Q4]
ELEMENT_TYPES = [F16, BF16, F32]  # the types a transposed V can have

_HALF = [0x0001, 0x03FF, 0x8001, 0x83FF, 0x7BFF, 0xFBFF, 0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFFFF]
# bit patterns of one element (f16, bf16, f32) or of a q8_0/q4_0 block's f16 scale
SPECIAL: dict[GGMLQuantizationType, list[int]] = {
    F16: _HALF,  # ±subnormal (smallest, largest), ±65504, ±0, ±Inf, quiet, signalling and negative NaN
    BF16: [0x0001, 0x007F, 0x8001, 0x7F7F, 0xFF7F, 0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0xFFFF],
    # 0x5F800000 is 2**64 (its square overflows float32), 0x7F7FFFFF the largest float32 (so does a sum of two)
    F32: [0x00000001, 0x807FFFFF, 0x7F7FFFFF, 0xFF7FFFFF, 0x5F800000, 0x00000000, 0x80000000, 0x7F800000,
          0xFF800000, 0x7FC00000, 0x7F800001, 0xFFFFFFFF],
    Q8: _HALF,
    Q4: _HALF,
}


def plain_rows(qt: GGMLQuantizationType, n_rows: int, units: int, seed: int,
               specials: Sequence[tuple[int, int]] = (), zero_rows: Sequence[int] = ()) -> np.ndarray:
    """``[n_rows, units * type size]`` uint8: rows of ``units`` elements (or blocks) of ``qt`` with
    random finite values (random quants under random finite scales), each ``(unit, pattern)`` of
    ``specials`` written over unit ``unit % (n_rows * units)`` (its scale, for q8_0/q4_0), then the
    ``zero_rows`` zeroed."""
    rng = np.random.default_rng(seed)
    ts = GGML_QUANT_SIZES[qt][1]
    n = n_rows * units
    specials = specials if n else ()
    if qt in (Q8, Q4):
        raw = rng.integers(0, 256, (n, ts), dtype=np.uint8)
        raw[:, :2] = (rng.standard_normal(n) * 0.01).astype(np.float16).view(np.uint8).reshape(-1, 2)
        for i, pat in specials:
            raw[i % n, :2] = np.array([pat], "<u2").view(np.uint8)
    else:
        vals = (rng.standard_normal(n) * rng.choice([1e-3, 1.0, 1e4])).astype(np.float32)
        arr = vals.astype(np.float16) if qt == F16 else vals
        raw = arr.view(np.uint8).reshape(n, arr.itemsize)
        if qt == BF16:
            raw = raw[:, 2:].copy()  # the high halves: bf16 by truncation
        word = np.dtype("<u4") if qt == F32 else np.dtype("<u2")
        for i, pat in specials:
            raw[i % n] = np.array([pat], word).view(np.uint8)
    raw = raw.reshape(n_rows, units * ts)
    raw[list(zero_rows)] = 0
    return np.ascontiguousarray(raw)
