"""Byte mutations shared by the CI fuzz test and ``bench/fuzz_long.py`` (one definition, same inputs).

A mutation is a tuple ``(op, ...)``; positions are taken modulo the current length so any random
draw applies: ``truncate``, ``flip`` (xor a byte), ``field`` (an extreme value over a real header
or meta field of the fixture), ``word`` (over a 4-aligned word anywhere), ``insert``, ``delete``,
``append``, and ``put`` (an absolute offset, for kept regressions).

The same mutations apply to GGUF models: :func:`gguf_fields` lists the structural fields of a
model's header (counts, string lengths, value and element types) for ``field`` mutations, and
:func:`gguf_header` builds hand-made hostile headers.
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


# -- GGUF models -------------------------------------------------------------------------------
# Hand-built GGUF headers and the structural fields of a real one, so the model file can be
# mutated like a state file (the model is untrusted input too).

T_U8, T_U32, T_STR, T_ARR, T_U64 = 0, 4, 8, 9, 10  # gguf value type ids (gguf-py GGUFValueType)
_SCALAR_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def gguf_str(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return len(raw).to_bytes(8, "little") + raw


def gguf_header(kvs: Sequence[tuple[str | bytes, int, bytes]], kv_count: int | None = None, version: int = 3) -> bytes:
    """A GGUF header with no tensors: ``(key, value type, encoded value)`` triples."""
    out = bytearray(b"GGUF")
    out += version.to_bytes(4, "little") + (0).to_bytes(8, "little")
    out += (len(kvs) if kv_count is None else kv_count).to_bytes(8, "little")
    for key, vtype, payload in kvs:
        out += gguf_str(key) + vtype.to_bytes(4, "little") + payload
    return bytes(out)


def gguf_fields(data: bytes) -> list[tuple[int, int]]:
    """(offset, width) of the structural fields of a little-endian GGUF header: the counts, every
    key and string length, value types, array element types and counts (stops where it cannot go on)."""
    return _walk(data)[0]


def gguf_kv_end(data: bytes) -> int:
    """Offset where the key/value section of a GGUF header ends (as far as it can be walked)."""
    return _walk(data)[1]


def _walk(data: bytes) -> tuple[list[tuple[int, int]], int]:
    out: list[tuple[int, int]] = [(8, 8), (16, 8)]
    n = len(data)
    pos = 24

    def u(off: int, w: int) -> int:
        return int.from_bytes(data[off : off + w], "little")

    try:
        kv_count = u(16, 8)
        for _ in range(min(kv_count, 100_000)):
            out.append((pos, 8))
            nxt = pos + 8 + u(pos, 8)
            out.append((nxt, 4))
            vtype, nxt = u(nxt, 4), nxt + 4
            if vtype == T_ARR:
                out += [(nxt, 4), (nxt + 4, 8)]
                itype, count, nxt = u(nxt, 4), u(nxt + 4, 8), nxt + 12
                if itype == T_STR:
                    for k in range(count):
                        if k < 8:
                            out.append((nxt, 8))
                        nxt += 8 + u(nxt, 8)
                        if nxt > n:
                            raise IndexError
                else:
                    nxt += _SCALAR_SIZE[itype] * count
            elif vtype == T_STR:
                out.append((nxt, 8))
                nxt += 8 + u(nxt, 8)
            else:
                nxt += _SCALAR_SIZE[vtype]
            if nxt > n:
                break
            pos = nxt
    except (KeyError, IndexError):
        pass
    return [(o, w) for o, w in out if o + w <= n], min(pos, n)
