"""A byte range as text for the clipboard: hex, a C array, Python bytes (pure Python, no Qt).

The bytes come from the document's byte source (a numpy array or a :class:`~kvscope.core.reader.source.ByteSource`:
both are indexed ``data[a:b]``); copies are bounded by :data:`COPY_LIMIT` so a click on a 4 GiB leaf never
builds a 12 GiB string.
"""

from __future__ import annotations

from typing import Any

import numpy as np

COPY_LIMIT = 4 << 20  # bytes a text copy takes at most
PIECE = 16 << 20  # bytes read at once (a ByteSource slice takes at most 64 MiB)
FORMATS = ("hex", "c", "python")


class TooLarge(ValueError):
    """The range is larger than a text copy takes (:data:`COPY_LIMIT`)."""


def read_bytes(data: Any, offset: int, length: int, limit: int = COPY_LIMIT) -> bytes:
    """``length`` bytes at ``offset`` of ``data`` (clipped to its end); TooLarge beyond ``limit``."""
    size = int(data.size)
    lo = max(0, min(offset, size))
    hi = max(lo, min(offset + length, size))
    if hi - lo > limit:
        raise TooLarge(f"{hi - lo:,} bytes is more than a copy takes ({limit:,} bytes): export them instead")
    return b"".join(np.asarray(data[a : min(hi, a + PIECE)], dtype=np.uint8).tobytes() for a in range(lo, hi, PIECE))


def as_hex(raw: bytes, per_line: int = 0) -> str:
    """``71 73 67 67`` (a new line every ``per_line`` bytes when > 0)."""
    text = raw.hex(" ")
    if per_line <= 0 or len(raw) <= per_line:
        return text
    step = 3 * per_line
    return "\n".join(text[i : i + step].rstrip() for i in range(0, len(text), step))


def as_c_array(raw: bytes, name: str = "data", per_line: int = 12) -> str:
    """``unsigned char data[4] = { 0x71, 0x73, 0x67, 0x67 };`` (wrapped every ``per_line`` bytes)."""
    items = [f"0x{b:02x}" for b in raw]
    if len(items) <= per_line:
        return f"unsigned char {name}[{len(raw)}] = {{ {', '.join(items)} }};"
    lines = [",".join(f" {x}" for x in items[i : i + per_line]) for i in range(0, len(items), per_line)]
    return f"unsigned char {name}[{len(raw)}] = {{\n" + ",\n".join(f"   {line}" for line in lines) + "\n};"


def as_python(raw: bytes) -> str:
    """``b"\\x71\\x73\\x67\\x67"``: every byte escaped, so binary data reads the same everywhere."""
    return 'b"' + "".join(f"\\x{b:02x}" for b in raw) + '"'


def format_bytes(raw: bytes, fmt: str) -> str:
    """``raw`` in one of :data:`FORMATS`."""
    if fmt == "hex":
        return as_hex(raw)
    if fmt == "c":
        return as_c_array(raw)
    if fmt == "python":
        return as_python(raw)
    raise ValueError(f"unknown format {fmt!r} (one of {', '.join(FORMATS)})")
