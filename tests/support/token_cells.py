"""Damaged copies of a slot file whose token list and KV cells disagree (issue #28), made through the
reader's structure, never through hand-counted offsets: every cell position moved by ``by``
(:func:`shift_positions`), or a token appended to the token list (:func:`append_token`, the plain list or
llama-server's packed payload, with the header's ``n_token_count`` and the payload's ``n_tokens``)."""

from __future__ import annotations

import struct

from kvscope.core.reader.parse import read_state


def _tables(data: bytes):  # type: ignore[no-untyped-def]
    res = read_state(data=data)
    for sec in res.sections:
        if sec.kind == "kv":
            yield from (st.cells for st in sec.streams if st.cells is not None and st.cells.count)
        elif sec.kind == "recurrent" and sec.cells is not None and sec.cells.count:
            yield sec.cells


def shift_positions(data: bytes, by: int = 1) -> bytes:
    """Every cell of every cell table (each KV cache and recurrent state) at its position + ``by``."""
    out = bytearray(data)
    for t in _tables(data):
        for i in range(t.count):
            off = t.record_offset(i)
            struct.pack_into("<i", out, off, struct.unpack_from("<i", out, off)[0] + by)
    return bytes(out)


def append_token(data: bytes, token: int) -> bytes:
    """The token list with one more token at its end (the cells untouched)."""
    res = read_state(data=data)
    node = res.root.find("/tokens")
    assert node is not None and res.kind == "seq_file", "a sequence file with a token list"
    ids = node.find("token_ids")
    end = (ids or node).offset + (ids or node).size
    out = bytearray(data[:end] + struct.pack("<i", token) + data[end:])
    struct.pack_into("<I", out, 8, struct.unpack_from("<I", out, 8)[0] + 1)  # n_token_count (u32 words)
    if ids is not None:  # packed: i32 -1 | u32 version | u32 n_tokens | tokens ...
        at = ids.offset - 4
        struct.pack_into("<I", out, at, struct.unpack_from("<I", out, at)[0] + 1)
    return bytes(out)
