"""Byte mutations shared by the CI fuzz test and ``bench/fuzz_long.py`` (one definition, same inputs).

A mutation is a tuple ``(op, ...)``; positions are taken modulo the current length so any random
draw applies: ``truncate``, ``flip`` (xor a byte), ``field`` (an extreme value over a real header
or meta field of the fixture), ``word`` (over a 4-aligned word anywhere), ``insert``, ``delete``,
``append``, and ``put`` (an absolute offset, for kept regressions).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def put(buf: bytearray, off: int, width: int, value: int) -> None:
    """Write ``value`` as ``width`` little-endian bytes at ``off`` (clipped to the buffer)."""
    if off < 0 or off >= len(buf):
        return
    raw = (value & ((1 << (8 * width)) - 1)).to_bytes(width, "little")
    end = min(len(buf), off + width)
    buf[off:end] = raw[: end - off]


def apply_mutations(data: bytes, fields: Sequence[tuple[int, int]], muts: Sequence[tuple[Any, ...]]) -> bytes:
    """``data`` with ``muts`` applied in order; ``fields`` are (offset, width) of real header fields."""
    buf = bytearray(data)
    for m in muts:
        op, n = m[0], len(buf)
        if op == "truncate":
            del buf[m[1] % (n + 1) :]
        elif op == "flip" and n:
            buf[m[1] % n] ^= m[2]
        elif op == "field" and fields:
            off, _ = fields[m[1] % len(fields)]
            put(buf, off, m[2], m[3])
        elif op == "word" and n >= 4:
            put(buf, (m[1] % (n // 4)) * 4, m[2], m[3])
        elif op == "insert":
            at = m[1] % (n + 1)
            buf[at:at] = m[2]
        elif op == "delete" and n:
            at = m[1] % n
            del buf[at : at + m[2]]
        elif op == "append":
            buf += m[1]
        elif op == "put":
            put(buf, m[1], m[2], m[3])
    return bytes(buf)
