"""Searching the file's bytes: a query (hex pattern, text, integer or float value) as bytes, found piece by piece.

No Qt here. :func:`parse_query` turns ``71 73 67 67`` (hex), ``qsgg`` (text), ``7376`` as u32, ``1.5`` as f16...
into the little-endian bytes llama.cpp writes (a float is searched as the nearest value of its type, which
:func:`searched_value` names). :func:`find` walks the byte source forward or backward in
pieces of :data:`PIECE` bytes (overlapping by the pattern's length), so memory stays bounded whatever the
file's size, and it can be cancelled between pieces.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from typing import Any

import numpy as np

from kvscope.core.errors import UsageError

PIECE = 4 << 20
KINDS: dict[str, str] = {  # kind -> what the entry takes
    "hex": "hex bytes: 71 73 67 67",
    "text": "text (UTF-8): llama",
    "u8": "unsigned 8-bit integer", "i8": "signed 8-bit integer",
    "u16": "unsigned 16-bit integer", "i16": "signed 16-bit integer",
    "u32": "unsigned 32-bit integer", "i32": "signed 32-bit integer",
    "u64": "unsigned 64-bit integer", "i64": "signed 64-bit integer",
    "f16": "16-bit float", "bf16": "bfloat16", "f32": "32-bit float", "f64": "64-bit float",
}
_INT = {"u8": ("<B", 0, 0xFF), "i8": ("<b", -0x80, 0x7F), "u16": ("<H", 0, 0xFFFF), "i16": ("<h", -0x8000, 0x7FFF),
        "u32": ("<I", 0, 0xFFFFFFFF), "i32": ("<i", -(1 << 31), (1 << 31) - 1),
        "u64": ("<Q", 0, (1 << 64) - 1), "i64": ("<q", -(1 << 63), (1 << 63) - 1)}
_FLOAT = {"f16": "<e", "f32": "<f", "f64": "<d"}
Cancelled = Callable[[], bool]
Progress = Callable[[float], None]


class QueryError(UsageError, ValueError):
    """A query that names no bytes (one line, for the find bar)."""


def parse_hex(text: str) -> bytes:
    """``71 73 67 67``, ``71736767``, ``0x71 0x73`` or ``71,73`` as bytes."""
    t = re.sub(r"0[xX]", "", text)
    t = re.sub(r"[\s,;:]", "", t)
    if not t:
        raise QueryError("type hex bytes, e.g. 71 73 67 67")
    if re.fullmatch(r"[0-9a-fA-F]+", t) is None:
        bad = next(c for c in t if c not in "0123456789abcdefABCDEF")
        raise QueryError(f"{bad!r} is not a hex digit")
    if len(t) % 2:
        raise QueryError("an odd number of hex digits: every byte takes two")
    return bytes.fromhex(t)


def _int(text: str) -> int:
    t = text.strip().replace("_", "").replace(",", "")
    try:
        return int(t, 0)
    except ValueError:
        raise QueryError(f"{text.strip()!r} is not an integer") from None


def parse_query(kind: str, text: str) -> bytes:
    """The bytes a query of ``kind`` (one of :data:`KINDS`) stands for; QueryError when it names none."""
    if kind == "hex":
        return parse_hex(text)
    if kind == "text":
        if not text:
            raise QueryError("type the text to find")
        return text.encode("utf-8")
    if kind in _INT:
        fmt, lo, hi = _INT[kind]
        n = _int(text)
        if not lo <= n <= hi:
            raise QueryError(f"{n} does not fit {kind} ({lo}..{hi})")
        return struct.pack(fmt, n)
    if kind in _FLOAT or kind == "bf16":
        try:
            v = float(text.strip().replace("_", ""))
        except ValueError:
            raise QueryError(f"{text.strip()!r} is not a number") from None
        if kind == "bf16":  # round to nearest even, as ggml's fp32 -> bf16 conversion does
            bits = int(np.array([v], np.float32).view(np.uint32)[0])
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 if v == v else (bits >> 16) | 0x40
            return struct.pack("<H", bits & 0xFFFF)
        try:
            return struct.pack(_FLOAT[kind], v)
        except (OverflowError, struct.error):
            raise QueryError(f"{v} is out of range for {kind}") from None
    raise QueryError(f"unknown kind {kind!r}")


def searched_value(kind: str, raw: bytes) -> str:
    """What the bytes of a query stand for, as searched: the nearest ``f16`` to 0.1 is 0.0999755859375."""
    if kind in _FLOAT:
        return repr(struct.unpack(_FLOAT[kind], raw)[0])
    if kind == "bf16":
        return repr(struct.unpack("<f", b"\x00\x00" + raw)[0])
    if kind in _INT:
        return str(struct.unpack(_INT[kind][0], raw)[0])
    return raw.hex(" ")


def _piece(data: Any, lo: int, hi: int) -> bytes:
    return bytes(np.asarray(data[lo:hi], dtype=np.uint8).tobytes())


def find(data: Any, pattern: bytes, start: int, backward: bool = False, cancelled: Cancelled | None = None,
         progress: Progress | None = None, piece: int = PIECE) -> int:
    """The first offset of ``pattern`` at or after ``start`` (``backward``: the last one starting before
    ``start``), or -1; reads ``data`` (indexed ``data[a:b]``) in pieces of ``piece`` bytes."""
    size, k = int(data.size), len(pattern)
    if k == 0 or k > size:
        return -1
    piece = max(piece, 2 * k)
    if not backward:
        pos = max(0, start)
        total = max(1, size - pos)
        while pos + k <= size:
            if cancelled is not None and cancelled():
                return -1
            hi = min(size, pos + piece)
            i = _piece(data, pos, hi).find(pattern)
            if i >= 0:
                return pos + i
            if progress is not None:
                progress(min(1.0, (hi - max(0, start)) / total))
            if hi == size:
                break
            pos = hi - k + 1
        return -1
    end = min(size, start + k - 1)  # a match must start before ``start``
    total = max(1, end)
    while end >= k:
        if cancelled is not None and cancelled():
            return -1
        lo = max(0, end - piece)
        i = _piece(data, lo, end).rfind(pattern)
        if i >= 0:
            return lo + i
        if progress is not None:
            progress(min(1.0, (min(size, start + k - 1) - lo) / total))
        if lo == 0:
            break
        end = lo + k - 1
    return -1


def find_wrapping(data: Any, pattern: bytes, start: int, backward: bool = False,
                  cancelled: Cancelled | None = None, progress: Progress | None = None,
                  piece: int = PIECE) -> tuple[int, bool]:
    """Like :func:`find`, continuing from the other end of the file once; ``(offset, wrapped)``."""
    hit = find(data, pattern, start, backward, cancelled, progress, piece)
    if hit >= 0 or (cancelled is not None and cancelled()):
        return hit, False
    size = int(data.size)
    again = find(data, pattern, size if backward else 0, backward, cancelled, progress, piece)
    return again, True
