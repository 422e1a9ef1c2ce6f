"""An independent byte walker for llama.cpp state files, used by ``tools/gen_fixtures.py`` to record
the layout of every generated fixture (the manifests' ``generator_parse``).

It is written from llama.cpp's own writers (``llama_context::state_*``, ``llama_kv_cache::
state_write``, ``llama_memory_recurrent::state_write``, the composite memories and
``llama_kv_cache_dsv4::state_write`` of the pinned trees) and ``docs/state-format.md``, and shares
no code with ``kvscope.core.reader``: the fixtures check the reader, so the reader cannot check
itself through them. It does not guess: the caller says which memory class wrote the bytes,
with which flags and which optional fields (``Plan``), and ``walk`` consumes every byte or raises
``WalkError``.

Roles are named as llama.cpp names the sub-caches: ``kv`` (a plain ``llama_kv_cache``),
``kv_base``/``kv_swa`` (iSWA), ``kv_attn``/``recurrent`` (hybrid), ``kv_mla``/``kv_lid`` (DSA),
``kv_idx`` (hybrid_idx indexer, MSA indexer), and for DeepSeek-V4 ``dsv4_header``, the raw iSWA's
``kv_base``/``kv_swa``, the K caches ``kv_csa``/``kv_hca``/``kv_lid`` and the compressor states
``csa_state``/``hca_state``/``lid_state``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import gguf

SESSION_MAGIC = 0x6767736E
SEQ_MAGIC = 0x67677371
IO_MAGIC = 0xAF143CD8
DSV4_MAGIC = 0x34565344
PARTIAL_ONLY = 1


class WalkError(Exception):
    """The bytes do not follow the plan: one line saying where."""


@dataclass(frozen=True)
class Plan:
    """What the walker needs to know besides the bytes."""

    memory: str  # llama.cpp memory class, e.g. "llama_memory_hybrid_iswa"
    flags: int = 0  # llama_state_seq_flags the state was written with (seq blobs only)
    rot_fields: bool = False  # KV data headers carry u32 n_rot_k, u32 n_rot_v (seq v4 / session v11)
    cell_ext_bytes: int = 0  # llama_kv_cell_ext bytes per KV cell record (0 or 12)
    no_v_roles: frozenset[str] = frozenset()  # KV roles whose caches hold K only (MLA)
    recr_layers: tuple[int, ...] = ()  # model layers with recurrent state tensors (r_l/s_l non-null)
    ple_layers: frozenset[int] = frozenset()  # recurrent layers that also have a PLE conv-history row (p_l)
    has_idx: bool = True  # llama_memory_hybrid_idx: the model has an indexer cache


def _type_name(t: int) -> str:
    try:
        return gguf.GGMLQuantizationType(t).name.lower()
    except ValueError as exc:
        raise WalkError(f"unknown ggml type id {t}") from exc


def _type_size(t: int) -> tuple[int, int]:
    """(block size, bytes per block) of ggml type ``t``."""
    return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(t)]


@dataclass
class _Cursor:
    data: bytes
    pos: int = 0
    end: int = field(default=-1)

    def __post_init__(self) -> None:
        if self.end < 0:
            self.end = len(self.data)

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > self.end:
            raise WalkError(f"{what} at offset {self.pos}: needs {n} bytes, {self.end - self.pos} left")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def u32(self, what: str) -> int:
        return int(struct.unpack("<I", self.take(4, what))[0])

    def i32(self, what: str) -> int:
        return int(struct.unpack("<i", self.take(4, what))[0])

    def u64(self, what: str) -> int:
        return int(struct.unpack("<Q", self.take(8, what))[0])


def _row_bytes_ok(t: int, row_bytes: int) -> None:
    blk, size = _type_size(t)
    if row_bytes % size != 0:
        raise WalkError(f"row of {row_bytes} bytes is not a whole number of {_type_name(t)} blocks")


def _kv_section(c: _Cursor, role: str, plan: Plan) -> dict[str, Any]:
    start = c.pos
    n_stream = c.u32(f"{role} n_stream")
    if not 1 <= n_stream <= 4096:
        raise WalkError(f"{role}: implausible n_stream {n_stream} at offset {start}")
    streams = []
    has_v = role not in plan.no_v_roles
    for s in range(n_stream):
        st: dict[str, Any] = {"cell_count_offset": c.pos}
        cell_count = c.u32(f"{role} stream {s} cell_count")
        st["cell_count"] = cell_count
        if cell_count == 0:
            streams.append(st)
            continue
        if cell_count * 8 > c.end - c.pos:
            raise WalkError(f"{role} stream {s}: cell_count {cell_count} exceeds the data")
        cells: list[list[Any]] = []
        ext: list[list[int]] = []
        for _ in range(cell_count):
            pos = c.i32("cell pos")
            n_seq = c.u32("cell n_seq_id")
            if n_seq > 4096:
                raise WalkError(f"{role}: implausible n_seq_id {n_seq} at offset {c.pos - 4}")
            if plan.cell_ext_bytes:
                raw = c.take(plan.cell_ext_bytes, "cell ext")
                ext.append(list(struct.unpack(f"<{plan.cell_ext_bytes // 4}i", raw)))
            seqs = [c.i32("cell seq_id") for _ in range(n_seq)]
            cells.append([pos, seqs])
        st["v_trans_offset"] = c.pos
        v_trans = c.u32(f"{role} v_trans")
        n_layer = c.u32(f"{role} n_layer")
        if v_trans > 1 or n_layer > 4096:
            raise WalkError(f"{role}: implausible v_trans {v_trans} / n_layer {n_layer} "
                            f"at offset {st['v_trans_offset']}")
        st["v_trans"] = v_trans
        st["n_layer"] = n_layer
        if plan.rot_fields:
            st["n_rot_k"] = c.u32(f"{role} n_rot_k")
            st["n_rot_v"] = c.u32(f"{role} n_rot_v")
        k_layers, k_off = [], []
        for il in range(n_layer):
            t = c.i32(f"{role} K type (layer {il})")
            row = c.u64(f"{role} K row size (layer {il})")
            _row_bytes_ok(t, row)
            k_off.append(c.pos)
            c.take(cell_count * row, f"{role} K rows (layer {il})")
            k_layers.append({"type": _type_name(t), "row_bytes": row})
        v_layers: list[dict[str, Any]] = []
        v_off = []
        if has_v:
            for il in range(n_layer):
                t = c.i32(f"{role} V type (layer {il})")
                if v_trans:
                    el = c.u32(f"{role} V element size (layer {il})")
                    n_embd = c.u32(f"{role} V n_embd_v_gqa (layer {il})")
                    if el != _type_size(t)[1]:
                        raise WalkError(f"{role}: V element size {el} does not match {_type_name(t)}")
                    v_off.append(c.pos)
                    c.take(n_embd * cell_count * el, f"{role} V columns (layer {il})")
                    v_layers.append({"type": _type_name(t), "el_bytes": el, "n_embd_v_gqa": n_embd})
                else:
                    row = c.u64(f"{role} V row size (layer {il})")
                    _row_bytes_ok(t, row)
                    v_off.append(c.pos)
                    c.take(cell_count * row, f"{role} V rows (layer {il})")
                    v_layers.append({"type": _type_name(t), "row_bytes": row})
        st["k_layers"] = k_layers
        st["v_layers"] = v_layers
        st["k_data_offsets"] = k_off
        st["v_data_offsets"] = v_off
        st["cells_pos_seqids"] = cells
        if plan.cell_ext_bytes:
            st["cell_ext_bytes"] = plan.cell_ext_bytes
            st["cell_ext_values"] = ext
        streams.append(st)
    return {"name": role, "kind": "kv", "offset": start, "n_stream": n_stream, "streams": streams, "end": c.pos}


def _recurrent_section(c: _Cursor, plan: Plan) -> dict[str, Any]:
    start = c.pos
    cell_count = c.u32("recurrent cell_count")
    if cell_count * 8 > c.end - c.pos:
        raise WalkError(f"recurrent: cell_count {cell_count} exceeds the data")
    cells = []
    for _ in range(cell_count):
        pos = c.i32("recurrent cell pos")
        n_seq = c.u32("recurrent cell n_seq_id")
        if n_seq > 4096:
            raise WalkError(f"recurrent: implausible n_seq_id {n_seq}")
        cells.append([pos, [c.i32("recurrent cell seq_id") for _ in range(n_seq)]])
    s_trans = c.u32("recurrent s_trans")
    n_layer = c.u32("recurrent n_layer")
    if s_trans != 0:
        raise WalkError(f"recurrent: s_trans {s_trans} (llama.cpp writes 0)")
    if n_layer > 4096:
        raise WalkError(f"recurrent: implausible n_layer {n_layer}")

    def records(what: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for il in plan.recr_layers:
            t = c.i32(f"recurrent {what} type (layer {il})")
            _type_name(t)
            row = c.u64(f"recurrent {what} row size (layer {il})")
            _row_bytes_ok(t, row)
            rec: dict[str, Any] = {"il": il, "type": _type_name(t), "row_bytes": row, "data_offset": c.pos}
            c.take(cell_count * row, f"recurrent {what} rows (layer {il})")
            if what == "R" and il in plan.ple_layers:
                p_row = c.u64(f"recurrent P row size (layer {il})")
                rec["p_row_bytes"] = p_row
                rec["p_data_offset"] = c.pos
                c.take(cell_count * p_row, f"recurrent P rows (layer {il})")
            out.append(rec)
        return out

    if n_layer <= max(plan.recr_layers, default=-1):
        raise WalkError(f"recurrent: n_layer {n_layer} does not cover the recurrent layers {plan.recr_layers}")
    r_layers = records("R")
    s_layers = records("S")
    return {
        "name": "recurrent",
        "kind": "recurrent",
        "offset": start,
        "cell_count_offset": start,
        "cell_count": cell_count,
        "s_trans": s_trans,
        "n_layer_written": n_layer,
        "r_layers": [{"type": r["type"], "row_bytes": r["row_bytes"]} for r in r_layers],
        "s_layers": [{"type": r["type"], "row_bytes": r["row_bytes"]} for r in s_layers],
        "p_layers": [{"il": r["il"], "row_bytes": r["p_row_bytes"]} for r in r_layers if "p_row_bytes" in r],
        "cells_pos_seqids": cells,
        "end": c.pos,
    }


def _tensor_stream(c: _Cursor, what: str, ns: int) -> dict[str, Any]:
    t = c.i32(f"{what} type")
    ne0 = c.u64(f"{what} ne0")
    rows = c.u64(f"{what} rows")
    row_size = c.u64(f"{what} row_size")
    blk, size = _type_size(t)
    if ne0 % blk or row_size != ne0 // blk * size:
        raise WalkError(f"{what}: row_size {row_size} does not match {ne0} x {_type_name(t)}")
    off = c.pos
    c.take(ns * rows * row_size, f"{what} payload")
    return {"type": _type_name(t), "ne0": ne0, "rows": rows, "row_size": row_size, "data_offset": off}


def _dsv4_k_cache(c: _Cursor, role: str) -> dict[str, Any]:
    start = c.pos
    version = c.u32(f"{role} version")
    n_rows = c.u32(f"{role} n_rows")
    ns = c.u32(f"{role} ns")
    n_layer = c.u32(f"{role} n_layer")
    if version not in (1, 2) or ns > 4096 or n_layer > 4096:
        raise WalkError(f"{role}: implausible K-cache header at offset {start}")
    layers = []
    for _ in range(n_layer):
        il = c.u32(f"{role} layer id")
        rec = _tensor_stream(c, f"{role} layer {il}", ns)
        if rec["rows"] != n_rows:
            raise WalkError(f"{role} layer {il}: {rec['rows']} rows, header says {n_rows}")
        layers.append({"il": il, **rec})
    return {
        "name": role,
        "kind": "dsv4_k_cache",
        "offset": start,
        "version": version,
        "n_rows": n_rows,
        "ns": ns,
        "n_layer": n_layer,
        "layers": layers,
        "end": c.pos,
    }


def _dsv4_comp_state(c: _Cursor, role: str) -> dict[str, Any]:
    start = c.pos
    version = c.u32(f"{role} version")
    ratio = c.u32(f"{role} ratio")
    state_size = c.u32(f"{role} state_size")
    n_embd_state = c.u32(f"{role} n_embd_state")
    ns = c.u32(f"{role} ns")
    n_layer = c.u32(f"{role} n_layer")
    if version != 1 or ns > 4096 or n_layer > 4096:
        raise WalkError(f"{role}: implausible compressor-state header at offset {start}")
    layers = []
    for _ in range(n_layer):
        il = c.u32(f"{role} layer id")
        kv = _tensor_stream(c, f"{role} layer {il} kv", ns)
        score = _tensor_stream(c, f"{role} layer {il} score", ns)
        layers.append({"il": il, "kv": kv, "score": score})
    return {
        "name": role,
        "kind": "dsv4_comp_state",
        "offset": start,
        "version": version,
        "ratio": ratio,
        "state_size": state_size,
        "n_embd_state": n_embd_state,
        "ns": ns,
        "n_layer": n_layer,
        "layers": layers,
        "end": c.pos,
    }


def _memory(c: _Cursor, plan: Plan) -> list[dict[str, Any]]:
    partial = bool(plan.flags & PARTIAL_ONLY)
    m = plan.memory
    parts: list[dict[str, Any]] = []

    def kv(role: str) -> None:
        parts.append(_kv_section(c, role, plan))

    if m == "llama_kv_cache":
        kv("kv")
    elif m == "llama_kv_cache_iswa":
        if not partial:
            kv("kv_base")
        kv("kv_swa")
    elif m == "llama_memory_recurrent":
        parts.append(_recurrent_section(c, plan))
    elif m == "llama_memory_hybrid":
        if not partial:
            kv("kv_attn")
        parts.append(_recurrent_section(c, plan))
    elif m == "llama_memory_hybrid_iswa":
        if not partial:
            kv("kv_base")
        kv("kv_swa")
        parts.append(_recurrent_section(c, plan))
    elif m == "llama_memory_hybrid_idx":
        if not partial:
            kv("kv_attn")
        parts.append(_recurrent_section(c, plan))
        if not partial and plan.has_idx:
            kv("kv_idx")
    elif m == "llama_kv_cache_dsa":
        kv("kv_mla")
        kv("kv_lid")
    elif m == "llama_kv_cache_dsa_iswa":
        if not partial:
            kv("kv_mla")
            kv("kv_lid")
        kv("kv_swa")
    elif m == "llama_kv_cache_msa":
        kv("kv_base")
        kv("kv_idx")
    elif m == "llama_kv_cache_dsv4":
        start = c.pos
        magic = c.u32("DSV4 magic")
        version = c.u32("DSV4 version")
        mode = c.u32("DSV4 mode")
        if magic != DSV4_MAGIC or version != 1 or mode not in (0, 1):
            raise WalkError(f"DSV4 header {magic:#x}/{version}/{mode} at offset {start}")
        if mode != (1 if partial else 0):
            raise WalkError(f"DSV4 mode {mode} does not match the flags {plan.flags}")
        parts.append({"name": "dsv4_header", "kind": "dsv4_header", "offset": start, "magic": hex(magic),
                      "version": version, "mode": mode, "end": c.pos})
        if not partial:
            kv("kv_base")
        kv("kv_swa")
        if not partial:
            for role in ("kv_csa", "kv_hca", "kv_lid"):
                parts.append(_dsv4_k_cache(c, role))
        for role in ("csa_state", "hca_state", "lid_state"):
            parts.append(_dsv4_comp_state(c, role))
    else:
        raise WalkError(f"unknown memory class {m!r}")
    return parts


def walk(data: bytes, kind: str, plan: Plan) -> dict[str, Any]:
    """The layout of ``data``, a state of ``kind`` (``session``, ``ctx_blob``, ``seq_file`` or
    ``seq_blob``): header fields, memory sections, and ``fully_consumed`` (always true: a
    walk that does not end exactly at the last byte raises ``WalkError``)."""
    c = _Cursor(data)
    header: dict[str, Any] = {}
    if kind in ("session", "seq_file"):
        magic = c.u32("magic")
        want = SESSION_MAGIC if kind == "session" else SEQ_MAGIC
        if magic != want:
            raise WalkError(f"magic {magic:#x}, expected {want:#x}")
        header["magic"] = hex(magic)
        header["version"] = c.u32("version")
        n = c.u32("n_token_count")
        header["n_token_count"] = n
        header["tokens_offset"] = c.pos
        c.take(4 * n, "tokens")
    if kind in ("session", "ctx_blob"):
        header["arch_string_offset"] = c.pos
        n_arch = c.u32("arch string length")
        if n_arch > 64:
            raise WalkError(f"implausible arch string length {n_arch}")
        header["arch_string"] = c.take(n_arch, "arch string").decode("ascii", "replace")
    if kind == "seq_blob":
        magic = c.u32("io magic")
        if magic != IO_MAGIC:
            raise WalkError(f"io magic {magic:#x}, expected {IO_MAGIC:#x}")
        header["io_magic"] = hex(magic)
        header["seq_id"] = c.i32("seq_id")
    if kind not in ("session", "ctx_blob", "seq_file", "seq_blob"):
        raise WalkError(f"unknown state kind {kind!r}")
    header["memory_offset"] = c.pos
    parts = _memory(c, plan)
    if c.pos != len(data):
        raise WalkError(f"{len(data) - c.pos} bytes left after the memory state (offset {c.pos} of {len(data)})")
    return {"header": header, "fully_consumed": True, "parts": parts}


def tokens_of(data: bytes, layout: dict[str, Any]) -> list[int]:
    """The token payload of a session or seq file (empty for blobs)."""
    hdr = layout["header"]
    if "tokens_offset" not in hdr:
        return []
    off, n = hdr["tokens_offset"], hdr["n_token_count"]
    return list(struct.unpack(f"<{n}i", data[off : off + 4 * n]))
