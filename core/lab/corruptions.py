"""The corruption catalog: named, parameterised mutations of a state, addressed by its structure.

Every mutation parses the input with the reader and finds its target through the structure
(sections, streams, cells, layer records), never through hand-computed offsets. ``apply``
returns new bytes and a one-line description; the input bytes are never modified.

Spec syntax (``kvscope lab --corrupt SPEC``): a catalog name (``truncated_half``) or
``KIND:key=value,...``, e.g. ``truncate:at=half``, ``set:field=cell_count,value=+1``,
``fill:value=nan,role=k,index=0,cells=0-3``, ``drop:role=k,il=1``, ``swap:role=k,a=0,b=1``,
``dup-cell:cell=2``, ``trailer:bytes=16``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvscope.core import ggml_types as gt
from kvscope.core.errors import UsageError
from kvscope.core.model.profile import ModelProfile
from kvscope.core.reader.parse import read_state
from kvscope.core.reader.records import KvStream, LayerRecord, ParseResult, Section

MAX_TRAILER = 1 << 30  # trailer:bytes= above this is a mistake, not a test (it would be held in memory)
KINDS = ("truncate", "set", "fill", "drop", "swap", "dup-cell", "trailer")


class CorruptionError(UsageError, ValueError):
    """The mutation does not apply to this state (no such section, layer, cell...)."""


@dataclass(frozen=True)
class Mutation:
    """The mutated bytes, what was done, and the byte ranges touched in the *input*."""

    data: bytes
    description: str
    ranges: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Corruption:
    """One parameterised mutation; ``name`` is its catalog name or its spec."""

    kind: str
    params: dict[str, str] = field(default_factory=dict)
    name: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise CorruptionError(f"unknown corruption kind {self.kind!r} (known: {', '.join(KINDS)})")

    @property
    def label(self) -> str:
        return self.name or spec_of(self)

    def apply(self, data: bytes, profile: ModelProfile | None = None) -> Mutation:
        res = read_state(data=data, profile=profile)
        if res.kind == "unknown":
            raise CorruptionError("the input is not a state file the reader understands")
        return _APPLY[self.kind](data, res, self.params, profile)


def spec_of(c: Corruption) -> str:
    return c.kind + (":" + ",".join(f"{k}={v}" for k, v in c.params.items()) if c.params else "")


def parse_spec(spec: str) -> Corruption:
    """A :class:`Corruption` from a catalog name or ``KIND:key=value,...``."""
    spec = spec.strip()
    if spec in CATALOG:
        return CATALOG[spec]
    kind, _, rest = spec.partition(":")
    params: dict[str, str] = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise CorruptionError(f"bad corruption parameter {item!r} in {spec!r} (expected key=value)")
        params[key.strip()] = value.strip()
    return Corruption(kind.strip(), params)


# ---------------------------------------------------------------------------------------------
# targeting


def _int(value: str) -> int:
    try:
        return int(value, 0)
    except ValueError:
        raise CorruptionError(f"not an integer: {value!r}") from None


def _section(res: ParseResult, p: dict[str, str]) -> Section:
    if not res.sections:
        raise CorruptionError("the state has no memory section")
    want = p.get("section", "0")
    if want.lstrip("-").isdigit():
        try:
            return res.sections[int(want)]
        except IndexError:
            raise CorruptionError(f"no section {want} (the state has {len(res.sections)})") from None
    for sec in res.sections:
        if sec.role == want or sec.kind == want:
            return sec
    raise CorruptionError(f"no {want} section (sections: {', '.join(s.role for s in res.sections)})")


def _stream(sec: Section, p: dict[str, str]) -> KvStream | None:
    if sec.kind != "kv":
        return None
    want = p.get("stream", "first-nonempty")
    if want == "first-nonempty":
        return next((st for st in sec.streams if st.cell_count), sec.streams[0] if sec.streams else None)
    try:
        return sec.streams[_int(want)]
    except IndexError:
        raise CorruptionError(f"no stream {want} in {sec.role}") from None


def _records(res: ParseResult, p: dict[str, str], profile: ModelProfile | None = None) -> list[LayerRecord]:
    """Layer records selected by section/stream/role and index (position) or il (model layer)."""
    roles = set(p.get("role", "k,v,r,s").replace("kv", "k,v").split(","))
    secs = [_section(res, p)] if "section" in p else res.sections
    recs: list[LayerRecord] = []
    for sec in secs:
        if sec.kind == "kv":
            streams = [st] if (st := _stream(sec, p)) is not None and "stream" in p else sec.streams
            for st in streams:
                recs += [r for r in (*st.k_layers, *st.v_layers) if r.role in roles]
        else:
            recs += [r for r in (*sec.r_layers, *sec.s_layers) if r.role in roles]
    if "kv_layer" in p:  # the N-th layer holding a KV cache, in model order (needs the model's layer map)
        n = _int(p["kv_layer"])
        il = profile.attn_layers[n] if profile is not None and n < len(profile.attn_layers) else n
        recs = [r for r in recs if r.il == il]
    elif "il" in p:
        il = _int(p["il"])
        recs = [r for r in recs if r.il == il]
    elif "index" in p:
        idx = _int(p["index"])
        by_role: dict[str, list[LayerRecord]] = {}
        for r in recs:
            by_role.setdefault(r.role, []).append(r)
        recs = []
        for lst in by_role.values():
            if -len(lst) <= idx < len(lst):
                recs.append(lst[idx])
    if not recs:
        raise CorruptionError(f"no layer record matches {p}")
    return recs


def _cell_range(p: dict[str, str], n: int) -> tuple[int, int]:
    if "cells" not in p:
        return 0, n
    lo, _, hi = p["cells"].partition("-")
    a = _int(lo)
    b = _int(hi) + 1 if hi else a + 1
    if not 0 <= a < b <= n:
        raise CorruptionError(f"cells {p['cells']} outside 0..{n - 1}")
    return a, b


# ---------------------------------------------------------------------------------------------
# mutations


def _truncate(data: bytes, res: ParseResult, p: dict[str, str], prof: ModelProfile | None) -> Mutation:
    lo, hi, what = 0, len(data), "the file"
    if "node" in p:
        node = res.root.find(p["node"])
        if node is None:
            raise CorruptionError(f"no node {p['node']}")
        lo, hi, what = node.offset, node.end, node.path
    elif "section" in p:
        sec = _section(res, p)
        lo, hi, what = sec.offset, sec.offset + sec.size, f"the {sec.role} section"
    at = p.get("at", "start" if "node" in p else "half")
    if at in ("half", "middle"):
        cut = lo + (hi - lo) // 2 if what != "the file" else len(data) // 2
    elif at == "start":
        cut = lo
    elif at == "end":
        cut = hi
    else:
        v = _int(at)
        cut = (hi + v) if v < 0 else lo + v
    if not 0 <= cut < len(data):
        raise CorruptionError(f"cut offset {cut} outside the file")
    return Mutation(data[:cut], f"cut at byte {cut} of {len(data)} ({at} of {what})", ((cut, len(data) - cut),))


def _field_offset(res: ParseResult, p: dict[str, str]) -> tuple[int, str, str]:
    """(offset, struct format, label) of the field named by ``field=``."""
    name = p.get("field", "")
    if name in ("magic", "version", "n_token_count", "io_magic", "seq_id_header"):
        node = res.root.find("/" + ("seq_id" if name == "seq_id_header" else name))
        if node is None:
            raise CorruptionError(f"this {res.kind} has no {name} field")
        return node.offset, "<i" if name == "seq_id_header" else "<I", name
    sec = _section(res, p)
    if name == "n_stream":
        if sec.kind != "kv" or sec.n_stream is None:
            raise CorruptionError(f"section {sec.role} has no n_stream field")
        return sec.offset, "<I", f"{sec.role} n_stream"
    st = _stream(sec, p)
    if name == "cell_count":
        off = st.offset if st is not None else sec.offset
        return off, "<I", f"{sec.role} cell_count" + (f" (stream {st.index})" if st is not None else "")
    table = st.cells if st is not None else sec.cells
    if name in ("pos", "n_seq_id", "seq_id"):
        if table is None or not table.count:
            raise CorruptionError(f"section {sec.role} has no cells")
        i = _int(p.get("cell", "0"))
        if not 0 <= i < table.count:
            raise CorruptionError(f"no cell {i} (the table has {table.count})")
        off = table.record_offset(i) + {"pos": 0, "n_seq_id": 4, "seq_id": 8 + table.ext_bytes}[name]
        if name == "seq_id" and int(table.n_seq[i]) == 0:
            raise CorruptionError(f"cell {i} lists no sequence id")
        return off, "<i" if name != "n_seq_id" else "<I", f"{sec.role} cell {i} {name}"
    if name in ("v_trans", "s_trans", "n_layer"):
        node = sec.node.find(f"stream{st.index}/{name}") if (st is not None and sec.node) else (
            sec.node.find(name) if sec.node else None)
        if node is None:
            raise CorruptionError(f"section {sec.role} has no {name} field")
        return node.offset, "<I", f"{sec.role} {name}"
    if name in ("type", "row_size", "el_size", "n_embd_v_gqa"):
        rec = _records(res, p)[0]
        if name == "type":
            return rec.header_offset, "<i", f"{rec.role.upper()} layer {rec.il} type"
        if name == "row_size" and not rec.transposed:
            return rec.header_offset + 4, "<Q", f"{rec.role.upper()} layer {rec.il} row size"
        if name in ("el_size", "n_embd_v_gqa") and rec.transposed:
            return rec.header_offset + (4 if name == "el_size" else 8), "<I", f"V layer {rec.il} {name}"
        raise CorruptionError(f"{name} does not apply to this {rec.role.upper()} record")
    raise CorruptionError(f"unknown field {name!r}")


def _set(data: bytes, res: ParseResult, p: dict[str, str], prof: ModelProfile | None) -> Mutation:
    off, fmt, label = _field_offset(res, p)
    size = struct.calcsize(fmt)
    old = struct.unpack_from(fmt, data, off)[0]
    raw = p.get("value", "")
    if raw == "other":  # another valid value: a different ggml type, the other v_trans
        new = 0 if old != 0 else 1
    elif p.get("field") == "type" and not raw.lstrip("-+").isdigit() and not raw.startswith("0x"):
        try:
            new = gt.type_id_from_name(raw)
        except KeyError:
            raise CorruptionError(f"unknown ggml type {raw!r}") from None
    elif raw.startswith(("+", "-")) and raw[1:].isdigit():
        new = old + int(raw)
    else:
        new = _int(raw)
    lo, hi = (-(2 ** (8 * size - 1)), 2 ** (8 * size - 1) - 1) if fmt[-1].islower() else (0, 2 ** (8 * size) - 1)
    if not lo <= new <= hi:
        raise CorruptionError(f"value {new} does not fit {label}")
    out = bytearray(data)
    struct.pack_into(fmt, out, off, new)
    return Mutation(bytes(out), f"{label} at byte {off}: {old} -> {new}", ((off, size),))


_FILL_BYTES: dict[str, dict[str, bytes]] = {
    "nan": {"f32": struct.pack("<I", 0x7FC00000), "f16": struct.pack("<H", 0x7E00), "bf16": struct.pack("<H", 0x7FC0)},
    "inf": {"f32": struct.pack("<I", 0x7F800000), "f16": struct.pack("<H", 0x7C00), "bf16": struct.pack("<H", 0x7F80)},
}


def _fill_pattern(value: str, rec: LayerRecord) -> bytes:
    if value in ("0xff", "ff"):
        return b"\xff"
    if value in ("zeros", "zero", "0"):
        return b"\0"
    if value in _FILL_BYTES:
        pat = _FILL_BYTES[value].get(rec.type)
        if pat is None:  # quantized: 0xFF makes every block's f16 scale NaN
            if value == "nan":
                return b"\xff"
            raise CorruptionError(f"cannot write {value} into a {rec.type} record (only f32/f16/bf16)")
        return pat
    raise CorruptionError(f"unknown fill value {value!r} (nan, inf, 0xff, zeros)")


def _fill(data: bytes, res: ParseResult, p: dict[str, str], prof: ModelProfile | None) -> Mutation:
    value = p.get("value", "nan")
    recs = _records(res, p, prof) if any(k in p for k in ("role", "index", "il", "section", "stream")) else [
        r for _, r in res.layer_records()]
    arr = np.frombuffer(data, dtype=np.uint8).copy()
    ranges: list[tuple[int, int]] = []
    for rec in recs:
        if not rec.data_size:
            continue
        pat = np.frombuffer(_fill_pattern(value, rec), dtype=np.uint8)
        a, b = _cell_range(p, rec.n_rows)
        payload = arr[rec.data_offset : rec.data_offset + rec.data_size]
        if rec.transposed:  # n_embd columns, each holding the n_rows cells of one element
            cols = payload.reshape(rec.n_embd_v_gqa, rec.n_rows * rec.el_bytes)
            sel = cols[:, a * rec.el_bytes : b * rec.el_bytes]
            sel[:] = np.resize(pat, sel.shape[1])
            ranges += [(rec.data_offset + j * cols.shape[1] + a * rec.el_bytes, (b - a) * rec.el_bytes)
                       for j in range(rec.n_embd_v_gqa)]
        else:
            rows = payload.reshape(rec.n_rows, rec.row_bytes)
            rows[a:b] = np.resize(pat, rec.row_bytes)
            ranges.append((rec.data_offset + a * rec.row_bytes, (b - a) * rec.row_bytes))
    if not ranges:
        raise CorruptionError("no payload bytes to fill")
    cells = f", {'cells' if '-' in p['cells'] else 'cell'} {p['cells']}" if "cells" in p else ""
    which = "every tensor payload" if len(recs) == len(res.layer_records()) and "cells" not in p else (
        f"{len(recs)} record(s)" + cells)
    desc = f"filled {which} with {value} ({sum(n for _, n in ranges)} bytes)"
    fail = p.get("then_fail")
    if fail:  # make the restore fail late: after every earlier row was handed over
        last = _last_record(res, fail)
        old = int(struct.unpack_from("<i", arr.data, last.header_offset)[0])
        struct.pack_into("<i", arr.data, last.header_offset, 0 if old != 0 else 1)
        desc += (f"; then the type of the last {last.role.upper()} record (layer {last.il}) "
                 f"{gt.type_name(old)} -> {gt.type_name(0 if old != 0 else 1)}")
        ranges.append((last.header_offset, 4))
    return Mutation(arr.tobytes(), desc, tuple(ranges))


def _last_record(res: ParseResult, which: str) -> LayerRecord:
    """``v``: the last V record of the blob (recurrent-only: the last s record); ``s``: the last s record."""
    recs = [r for _, r in res.layer_records()]
    if which == "v":
        vs = [r for r in recs if r.role == "v"]
        if vs:
            return max(vs, key=lambda r: r.header_offset)
    ss = [r for r in recs if r.role == "s"]
    if not ss:
        raise CorruptionError("the state has no V or s record to make fail")
    return max(ss, key=lambda r: r.header_offset)


def _drop(data: bytes, res: ParseResult, p: dict[str, str], prof: ModelProfile | None) -> Mutation:
    recs = _records(res, p, prof)
    out = bytearray(data)
    for rec in sorted(recs, key=lambda r: -r.header_offset):
        del out[rec.header_offset : rec.data_offset + rec.data_size]
    what = ", ".join(f"{r.role.upper()} layer {r.il if r.il is not None else r.index}" for r in recs)
    return Mutation(bytes(out), f"removed the {what} record(s) ({len(data) - len(out)} bytes); n_layer unchanged",
                    tuple((r.header_offset, r.size) for r in recs))


def _swap(data: bytes, res: ParseResult, p: dict[str, str], prof: ModelProfile | None) -> Mutation:
    base = {k: v for k, v in p.items() if k not in ("a", "b")}
    ra = _records(res, {**base, "index": p.get("a", "0")})
    rb = _records(res, {**base, "index": p.get("b", "1")})
    out = bytearray(data)
    touched: list[tuple[int, int]] = []
    for x, y in zip(ra, rb, strict=False):
        if x.size != y.size:
            raise CorruptionError(f"records {x.index} and {y.index} differ in size ({x.size} vs {y.size})")
        ax, ay = slice(x.data_offset, x.data_offset + x.data_size), slice(y.data_offset, y.data_offset + y.data_size)
        out[ax], out[ay] = data[ay], data[ax]
        touched += [(x.data_offset, x.data_size), (y.data_offset, y.data_size)]
    return Mutation(bytes(out), f"swapped the payloads of records {p.get('a', '0')} and {p.get('b', '1')} "
                    f"({', '.join(sorted({r.role.upper() for r in ra}))})", tuple(touched))


def _dup_cell(data: bytes, res: ParseResult, p: dict[str, str], prof: ModelProfile | None) -> Mutation:
    sec = _section(res, p)
    st = _stream(sec, p)
    table = st.cells if st is not None else sec.cells
    if table is None or table.count < 2:
        raise CorruptionError("need a cell table of at least two cells")
    i = _int(p.get("cell", "0"))
    j = _int(p.get("into", str(i + 1 if i + 1 < table.count else i - 1)))
    ri, rj = table.record_offset(i), table.record_offset(j)
    size_i = table.record_offset(i + 1) - ri if i + 1 < table.count else table.offset + table.size - ri
    size_j = table.record_offset(j + 1) - rj if j + 1 < table.count else table.offset + table.size - rj
    if size_i != size_j:
        raise CorruptionError("cells of different record sizes cannot be duplicated in place")
    out = bytearray(data)
    out[rj : rj + size_j] = data[ri : ri + size_i]
    return Mutation(bytes(out), f"cell {j}'s meta record overwritten with cell {i}'s (same pos and sequences)",
                    ((rj, size_j),))


def _trailer(data: bytes, res: ParseResult, p: dict[str, str], prof: ModelProfile | None) -> Mutation:
    n = _int(p.get("bytes", "16"))
    if not 0 < n <= MAX_TRAILER:
        raise CorruptionError(f"trailer bytes={n}: between 1 and {MAX_TRAILER:,}")
    byte = _int(p.get("byte", "0x41")) & 0xFF
    return Mutation(data + bytes([byte]) * n, f"appended {n} bytes of 0x{byte:02x}", ((len(data), n),))


_APPLY: dict[str, Callable[[bytes, ParseResult, dict[str, str], ModelProfile | None], Mutation]] = {
    "truncate": _truncate,
    "set": _set,
    "fill": _fill,
    "drop": _drop,
    "swap": _swap,
    "dup-cell": _dup_cell,
    "trailer": _trailer,
}


# ---------------------------------------------------------------------------------------------
# the standard catalog (names as in the real llama.cpp failed-restore fixtures, plus more)


def _c(name: str, kind: str, **params: Any) -> Corruption:
    return Corruption(kind, {k: str(v) for k, v in params.items()}, name)


CATALOG: dict[str, Corruption] = {c.name: c for c in (
    _c("truncated_after_seq_header", "truncate", node="/memory", at="start"),
    _c("truncated_half", "truncate", at="half"),
    _c("truncated_last_byte", "truncate", at="-1"),
    _c("cell_count_huge", "set", field="cell_count", value="0x7fffffff"),
    _c("cell_count_plus1", "set", field="cell_count", value="+1"),
    _c("cell_count_minus1", "set", field="cell_count", value="-1"),
    _c("cell_count_zero", "set", field="cell_count", value="0"),
    _c("nan_rows_valid", "fill", value="0xff"),
    _c("nan_rows_late_fail", "fill", value="0xff", then_fail="v"),
    _c("drop_k_layer_1", "drop", role="k", kv_layer="1"),
    _c("swa_cell_count_huge", "set", field="cell_count", section="kv_swa", value="0x7fffffff"),
    _c("swa_truncated_in_data", "truncate", section="kv_swa", at="middle"),
    _c("recr_cell_count_huge", "set", field="cell_count", section="recurrent", value="0x7fffffff"),
    _c("recr_truncated_in_data", "truncate", section="recurrent", at="middle"),
    _c("nan_rows_late_fail_recr", "fill", value="0xff", then_fail="s"),
    _c("trailer_16", "trailer", bytes="16"),
    _c("n_stream_plus1", "set", field="n_stream", value="+1"),
    _c("v_trans_flipped", "set", field="v_trans", value="other"),
    _c("n_layer_minus1", "set", field="n_layer", value="-1"),
    _c("k_type_layer0_other", "set", field="type", role="k", index="0", value="other"),
    _c("nan_rows_k_layer0", "fill", value="nan", role="k", index="0"),
    _c("inf_rows_v_last", "fill", value="inf", role="v", index="-1"),
    _c("zero_rows_all", "fill", value="zeros"),
    _c("swap_k_layers_0_1", "swap", role="k", a="0", b="1"),
    _c("dup_cell_0", "dup-cell", cell="0"),
)}
