"""The data inspector's readings: the little-endian value at an offset as every common type (no Qt)."""

from __future__ import annotations

import math
import struct

from kvscope.app.document.source import IndexedBytes

INSPECT_TYPES = ("u8", "i8", "u16", "i16", "u32", "i32", "u64", "i64", "f16", "bf16", "f32", "f64")
_FORMATS = {"u8": "<B", "i8": "<b", "u16": "<H", "i16": "<h", "u32": "<I", "i32": "<i",
            "u64": "<Q", "i64": "<q", "f16": "<e", "f32": "<f", "f64": "<d"}
_SIZES = {"u8": 1, "i8": 1, "u16": 2, "i16": 2, "u32": 4, "i32": 4, "u64": 8, "i64": 8,
          "f16": 2, "bf16": 2, "f32": 4, "f64": 8}


def _float_text(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return f"{v:.7g}"


def read_value(buf: IndexedBytes, offset: int, type_name: str) -> int | float | None:
    """The value of ``type_name`` at ``offset`` (None when the bytes run past the end)."""
    n = _SIZES[type_name]
    if offset < 0 or offset + n > buf.size:
        return None
    raw = bytes(buf[offset : offset + n])
    if type_name == "bf16":
        return float(struct.unpack("<f", b"\x00\x00" + raw)[0])
    return struct.unpack(_FORMATS[type_name], raw)[0]  # type: ignore[no-any-return]


def inspect_values(buf: IndexedBytes, offset: int) -> list[tuple[str, str]]:
    """``(type, text)`` for every inspector type; ``-`` where the file ends too soon."""
    out: list[tuple[str, str]] = []
    for t in INSPECT_TYPES:
        v = read_value(buf, offset, t)
        if v is None:
            out.append((t, "-"))
        elif isinstance(v, float):
            out.append((t, _float_text(v)))
        else:
            out.append((t, f"{v}" if t.startswith("i") or v < 10 else f"{v} (0x{v:x})"))
    return out
