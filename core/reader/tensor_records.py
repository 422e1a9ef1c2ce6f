"""Tensor records of a memory section: K/V rows, transposed V columns, recurrent r/s rows.

``read_record`` reads one record header, checks it (known ggml type, whole blocks, payload in
range, model row size when a model is given) and adds its nodes. Failures are findings plus
:class:`Stop`; ``find_resync`` scans forward for the next plausible header after a bad one.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from kvscope.core import ggml_types as gt
from kvscope.core.reader.context import HeaderStop, ParseCtx, Stop
from kvscope.core.reader.record_names import finding_name, record_node_name, section_of_path
from kvscope.core.reader.records import LayerRecord
from kvscope.core.reader.tree import Node

ROWS_KIND = {"k": "k_rows", "v": "v_rows", "r": "r_rows", "s": "s_rows", "p": "p_rows"}
ROLE_WORD = {"k": "K", "v": "V", "r": "r", "s": "s", "p": "p"}


@dataclass(frozen=True)
class Expect:
    """What the model says a record should hold (None fields: unknown)."""

    il: int | None
    n_elements: int | None  # elements per cell row (n_embd_k_gqa, n_embd_v_gqa, n_embd_r, n_embd_s)
    type_id: int | None = None  # e.g. F32 for recurrent state


def header_bytes(rec: LayerRecord) -> bytes:
    """The 12-byte header of ``rec`` as written, used as a resync pattern."""
    if rec.transposed:
        return struct.pack("<iII", rec.type_id, rec.el_bytes, rec.n_embd_v_gqa)
    return struct.pack("<iQ", rec.type_id, rec.row_bytes)


def _name(role: str, index: int, exp: Expect | None) -> str:
    """The record's node name: its role and index, never the model layer (paths stay put when the model changes)."""
    return record_node_name(role, index)


def read_record(
    ctx: ParseCtx,
    parent: Node,
    off: int,
    role: str,
    index: int,
    n_rows: int,
    transposed: bool,
    exp: Expect | None,
    allow_zero_row: bool = False,
) -> tuple[LayerRecord, int]:
    """Read one record at ``off``; returns it and the offset after its payload."""
    src = ctx.src
    name = _name(role, index, exp)
    il = exp.il if exp is not None else None
    what = finding_name(section_of_path(parent.path), role, index, il, ctx.profile is not None)
    if not src.has(off, 12):
        raise ctx.truncated(parent, f"the {what} header", off, 12, il)
    type_id = src.i32(off) or 0
    node = parent.add(Node(name, "layer", off, 12, None, ctx.status()))
    hdr = node.add(Node("header", "layer_header", off, 12, type_id, ctx.status()))

    def fail(code: str, msg: str, **extra: object) -> Stop:
        hdr.status = "unparsed"
        hdr.kind = "unparsed"
        ctx.find("error", code, off, 12, msg, hdr, il, **extra)
        return HeaderStop(off + 12)

    if not gt.is_known_type(type_id):
        raise fail("type_mismatch", f"{what}: unknown ggml type id {type_id}", type_id=type_id)
    tname = gt.type_name(type_id)
    if exp is not None and exp.type_id is not None and exp.type_id != type_id:
        raise fail("type_mismatch", f"{what}: type {tname}, expected {gt.type_name(exp.type_id)}",
                   type_id=type_id, expected=gt.type_name(exp.type_id))
    if transposed:
        el = src.u32(off + 4) or 0
        n_embd = src.u32(off + 8) or 0
        hdr.value = f"{tname} el={el} n_embd_v_gqa={n_embd}"
        if el != gt.type_size(type_id) or not gt.is_element_addressable(type_id):
            raise fail("row_size_mismatch", f"{what}: element size {el} does not fit type {tname} "
                       f"(transposed V needs {gt.type_size(type_id)})", el_bytes=el)
        if exp is not None and exp.n_elements is not None and n_embd != exp.n_elements:
            raise fail("row_size_mismatch", f"{what}: n_embd_v_gqa {n_embd}, model expects {exp.n_elements}",
                       n_embd_v_gqa=n_embd, expected=exp.n_elements)
        data_size = n_embd * n_rows * el
        rec = LayerRecord(role, index, il, type_id, off, off + 12, data_size, n_rows, 0, True, el, n_embd)
    else:
        row = src.u64(off + 4) or 0
        hdr.value = f"{tname} row={row}"
        ts = gt.type_size(type_id)
        if (row == 0 and not allow_zero_row) or (ts and row % ts):
            raise fail("row_size_mismatch", f"{what}: row size {row} is not whole {tname} blocks", row_bytes=row)
        if exp is not None and exp.n_elements is not None:
            want = gt.row_size(type_id, exp.n_elements)
            if row != want:
                raise fail("row_size_mismatch", f"{what}: row size {row}, model expects {want} "
                           f"({exp.n_elements} x {tname})", row_bytes=row, expected=want)
        data_size = row * n_rows
        rec = LayerRecord(role, index, il, type_id, off, off + 12, data_size, n_rows, row)
    rec.trusted = not ctx.untrusted
    rec.node = node
    data_off = off + 12
    have = src.remaining(data_off)
    if data_size > have:
        if have:
            node.add(Node("rows", ROWS_KIND[role], data_off, have, None, ctx.status(), note="truncated"))
        node.fit_to_children()
        ctx.find("error", "truncated", data_off, have,
                 f"file ends inside the {what} payload: {data_size} bytes needed, {have} present",
                 node, il, needed=data_size, file_end=src.size)
        rec.data_size = have
        raise Stop(data_off + have)
    if data_size:
        node.add(Node("rows", ROWS_KIND[role], data_off, data_size, None, ctx.status()))
    node.fit_to_children()
    return rec, data_off + data_size


def looks_like_vtrans_header(ctx: ParseCtx, off: int, n_rows: int, exp: Expect | None) -> bool:
    """True when the 12 bytes at ``off`` read as a plausible transposed-V record header."""
    src = ctx.src
    t = src.i32(off)
    el = src.u32(off + 4)
    n = src.u32(off + 8)
    if t is None or el is None or n is None or not gt.is_known_type(t):
        return False
    if not gt.is_element_addressable(t) or el != gt.type_size(t) or n == 0:
        return False
    if exp is not None and exp.n_elements is not None and n != exp.n_elements:
        return False
    return n * n_rows * el <= src.remaining(off + 12)


def find_resync(ctx: ParseCtx, start: int, limit: int, patterns: list[bytes]) -> int:
    """Offset of the nearest of ``patterns`` in ``[start, limit)``, or -1."""
    best = -1
    for pat in patterns:
        hit = ctx.src.find(pat, start, limit)
        if hit >= 0 and (best < 0 or hit < best):
            best = hit
    return best
