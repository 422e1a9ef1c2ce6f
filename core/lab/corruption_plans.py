"""How each kind of corruption finds its target in a parsed state (sections, streams, cells, layer records,
never hand-computed offsets) and plans the edits that make it (:data:`PLAN`; a part of
:mod:`kvscope.core.lab.corruptions`)."""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from kvscope.core import ggml_types as gt
from kvscope.core.lab.corruption_specs import (
    _INT,
    _RELATIVE,
    CELL_FIELDS,
    HEADER_FIELDS,
    RECORD_FIELDS,
    SELECT_KEYS,
    CorruptionError,
    _cells_of,
    _int,
    _show,
    cells_text,
)
from kvscope.core.lab.state_edits import Damage, Edit
from kvscope.core.model.profile import ModelProfile
from kvscope.core.reader.records import KvStream, LayerRecord, ParseResult, Section
from kvscope.core.reader.source import ByteSource
from kvscope.core.textsafe import plural

# ---------------------------------------------------------------------------------------------
# targeting


def _section(res: ParseResult, p: Mapping[str, str]) -> Section:
    if not res.sections:
        raise CorruptionError("the state has no memory section")
    want = p.get("section", "0")
    if want.lstrip("-").isdigit():
        i = _int("section", want)
        if not -len(res.sections) <= i < len(res.sections):
            raise CorruptionError(f"section={want}: no such section (the state has {len(res.sections)}: "
                                  f"{', '.join(s.role for s in res.sections)})")
        return res.sections[i]
    for sec in res.sections:
        if sec.role == want or sec.kind == want:
            return sec
    raise CorruptionError(f"section={_show(want)}: no such section (sections: "
                          f"{', '.join(s.role for s in res.sections)})")


def _stream(sec: Section, p: Mapping[str, str]) -> KvStream | None:
    if sec.kind != "kv":
        if "stream" in p:
            raise CorruptionError(f"stream={p['stream']}: the {sec.role} section has no streams")
        return None
    want = p.get("stream", "first-nonempty")
    if want == "first-nonempty":
        return next((st for st in sec.streams if st.cell_count), sec.streams[0] if sec.streams else None)
    i = _int("stream", want)
    if not 0 <= i < len(sec.streams):
        raise CorruptionError(f"stream={want}: no such stream in {sec.role} (it has {len(sec.streams)})")
    return sec.streams[i]


def _records(res: ParseResult, p: Mapping[str, str], profile: ModelProfile | None = None) -> list[LayerRecord]:
    """Layer records selected by section/stream/role and index (position) or il (model layer) or kv_layer; a
    selector that selects nothing is refused."""
    roles = set(p.get("role", "k,v,r,s").replace("kv", "k,v").split(","))
    secs = [_section(res, p)] if "section" in p else [s for s in res.sections if s.kind == "kv" or "stream" not in p]
    recs: list[LayerRecord] = []
    for sec in secs:
        if sec.kind == "kv":
            streams = [st] if (st := _stream(sec, p)) is not None and "stream" in p else sec.streams
            for st in streams:
                recs += [r for r in (*st.k_layers, *st.v_layers) if r.role in roles]
        else:
            _stream(sec, p)  # stream= on a recurrent section: refused
            recs += [r for r in (*sec.r_layers, *sec.s_layers) if r.role in roles]
    if not recs:
        raise CorruptionError(f"no layer record matches {_where_of(p)}")
    if "kv_layer" in p:  # the N-th layer holding a KV cache, in model order (needs the model's layer map)
        n = _int("kv_layer", p["kv_layer"])
        if profile is not None and n >= len(profile.attn_layers):
            raise CorruptionError(f"kv_layer={n}: the model has {len(profile.attn_layers)} layers with a KV cache "
                                  f"(0 to {len(profile.attn_layers) - 1})")
        il = profile.attn_layers[n] if profile is not None else n
        recs = _by_il(recs, il, f"kv_layer={n} (model layer {il})" if profile is not None else f"kv_layer={n}")
    elif "il" in p:
        recs = _by_il(recs, _int("il", p["il"]), f"il={p['il']}")
    elif "index" in p:
        idx = _int("index", p["index"])
        by_role: dict[str, list[LayerRecord]] = {}
        for r in recs:
            by_role.setdefault(r.role, []).append(r)
        for role, lst in by_role.items():
            if not -len(lst) <= idx < len(lst):
                raise CorruptionError(f"index={idx}: no layer record matches (there are {len(lst)} {role.upper()} "
                                      f"records{'' if 'role' in p else '; role= picks a role'})")
        recs = [lst[idx] for lst in by_role.values()]
    return recs


def _by_il(recs: list[LayerRecord], il: int, what: str) -> list[LayerRecord]:
    out = [r for r in recs if r.il == il]
    if not out:
        have = sorted({r.il for r in recs if r.il is not None})
        raise CorruptionError(f"{what}: no such layer among the records selected" +
                              (f" (layers {_span(have)})" if have else " (the records' layers are unknown: --model)"))
    return out


def _span(ns: Sequence[int]) -> str:
    return ", ".join(map(str, ns)) if len(ns) <= 8 else f"{ns[0]}..{ns[-1]}"


def _where_of(p: Mapping[str, str]) -> str:
    sel = {k: v for k, v in p.items() if k in SELECT_KEYS}
    return ", ".join(f"{k}={v}" for k, v in sel.items()) if sel else "(every record)"


def _cell_range(p: Mapping[str, str], n: int) -> tuple[int, int]:
    if "cells" not in p:
        return 0, n
    a, b = _cells_of(p["cells"])
    if not 0 <= a < b <= n:
        raise CorruptionError(f"cells={p['cells']}: outside 0..{n - 1}" if n else f"cells={p['cells']}: the "
                              "record holds no cells")
    return a, b


def _payload_ok(rec: LayerRecord, size: int) -> bool:
    """The record's payload is whole in the file and as big as its rows say."""
    rows = rec.n_rows * (rec.n_embd_v_gqa * rec.el_bytes if rec.transposed else rec.row_bytes)
    return rec.data_size == rows and rec.data_offset >= 0 and rec.data_offset + rec.data_size <= size



# ---------------------------------------------------------------------------------------------
# mutations, as plans of edits


def _truncate(src: ByteSource, res: ParseResult, p: Mapping[str, str], prof: ModelProfile | None) -> Damage:
    size = src.size
    lo, hi, what = 0, size, "the file"
    if "node" in p:
        node = res.root.find(p["node"])
        if node is None:
            raise CorruptionError(f"node={_show(p['node'])}: no such node in this {res.kind}")
        lo, hi, what = node.offset, node.end, node.path
    elif "section" in p:
        sec = _section(res, p)
        lo, hi, what = sec.offset, sec.offset + sec.size, f"the {sec.role} section"
    at = p.get("at", "start" if "node" in p else "half")
    if at in ("half", "middle"):
        cut = lo + (hi - lo) // 2 if what != "the file" else size // 2
    elif at == "start":
        cut = lo
    elif at == "end":
        cut = hi
    else:
        v = _int("at", at)
        cut = (hi + v) if v < 0 else lo + v
    if not 0 <= cut < size:
        raise CorruptionError(f"at={at}: cut offset {cut} outside the file (0 to {size - 1})")
    return Damage((Edit("cut", cut),), f"cut at byte {cut} of {size} ({at} of {what})", ((cut, size - cut),), cut)


def _field_offset(res: ParseResult, p: Mapping[str, str], prof: ModelProfile | None) -> tuple[int, str, str]:
    """(offset, struct format, label) of the field named by ``field=``."""
    name = p["field"]
    if name in HEADER_FIELDS:
        node = res.root.find("/" + ("seq_id" if name == "seq_id_header" else name))
        if node is None:
            raise CorruptionError(f"field={name}: this {res.kind} has no {name} field")
        return node.offset, "<i" if name == "seq_id_header" else "<I", name
    sec = _section(res, p)
    if name == "n_stream":
        if sec.kind != "kv" or sec.n_stream is None:
            raise CorruptionError(f"field=n_stream: section {sec.role} has no n_stream field")
        return sec.offset, "<I", f"{sec.role} n_stream"
    if name in RECORD_FIELDS:
        rec = _records(res, p, prof)[0]
        if name == "type":
            return rec.header_offset, "<i", f"{rec.role.upper()} layer {rec.il} type"
        if name == "row_size" and not rec.transposed:
            return rec.header_offset + 4, "<Q", f"{rec.role.upper()} layer {rec.il} row size"
        if name in ("el_size", "n_embd_v_gqa") and rec.transposed:
            return rec.header_offset + (4 if name == "el_size" else 8), "<I", f"V layer {rec.il} {name}"
        raise CorruptionError(f"field={name}: does not apply to this {rec.role.upper()} record"
                              + (" (transposed V)" if rec.transposed else ""))
    st = _stream(sec, p)
    if name == "cell_count":
        off = st.offset if st is not None else sec.offset
        return off, "<I", f"{sec.role} cell_count" + (f" (stream {st.index})" if st is not None else "")
    table = st.cells if st is not None else sec.cells
    if name in CELL_FIELDS:
        if table is None or not table.count:
            raise CorruptionError(f"field={name}: section {sec.role} has no cells")
        i = _int("cell", p.get("cell", "0"))
        if not 0 <= i < table.count:
            raise CorruptionError(f"cell={i}: no such cell (the table has {table.count}: 0 to {table.count - 1})")
        off = table.record_offset(i) + {"pos": 0, "n_seq_id": 4, "seq_id": 8 + table.ext_bytes}[name]
        if name == "seq_id" and int(table.n_seq[i]) == 0:
            raise CorruptionError(f"cell={i}: the cell lists no sequence id")
        return off, "<i" if name != "n_seq_id" else "<I", f"{sec.role} cell {i} {name}"
    node = sec.node.find(f"stream{st.index}/{name}") if (st is not None and sec.node) else (
        sec.node.find(name) if sec.node else None)
    if node is None:
        raise CorruptionError(f"field={name}: section {sec.role} has no {name} field")
    return node.offset, "<I", f"{sec.role} {name}"


def _set(src: ByteSource, res: ParseResult, p: Mapping[str, str], prof: ModelProfile | None) -> Damage:
    off, fmt, label = _field_offset(res, p, prof)
    size = struct.calcsize(fmt)
    raw_old = src.raw(off, size)
    if raw_old is None:
        raise CorruptionError(f"field={p['field']}: {label} lies past the end of the file")
    old = int(struct.unpack(fmt, raw_old)[0])
    raw = p["value"]
    if raw == "other":  # another valid value: a different ggml type, the other v_trans
        new = 0 if old != 0 else 1
    elif p["field"] == "type" and not _INT.fullmatch(raw):
        new = gt.type_id_from_name(raw)  # checked when the spec was parsed
    elif _RELATIVE.fullmatch(raw):
        new = old + _int("value", raw)
    else:
        new = _int("value", raw)
    lo, hi = (-(2 ** (8 * size - 1)), 2 ** (8 * size - 1) - 1) if fmt[-1].islower() else (0, 2 ** (8 * size) - 1)
    if not lo <= new <= hi:
        raise CorruptionError(f"value={raw}: {new} does not fit {label} ({lo} to {hi})")
    return Damage((Edit("write", off, size, struct.pack(fmt, new)),), f"{label} at byte {off}: {old} -> {new}",
                  ((off, size),), src.size)


_FILL_BYTES: dict[str, dict[str, bytes]] = {
    "nan": {"f32": struct.pack("<I", 0x7FC00000), "f16": struct.pack("<H", 0x7E00), "bf16": struct.pack("<H", 0x7FC0)},
    "inf": {"f32": struct.pack("<I", 0x7F800000), "f16": struct.pack("<H", 0x7C00), "bf16": struct.pack("<H", 0x7F80)},
}


def _fill_pattern(value: str, rec: LayerRecord) -> bytes:
    if value in ("0xff", "ff"):
        return b"\xff"
    if value in ("zeros", "zero", "0"):
        return b"\0"
    pat = _FILL_BYTES[value].get(rec.type)
    if pat is None:  # quantized: 0xFF makes every block's f16 scale NaN
        if value == "nan":
            return b"\xff"
        raise CorruptionError(f"value={value}: cannot write {value} into a {rec.type} record (only f32/f16/bf16)")
    return pat


def _unit(pat: bytes, n: int) -> bytes:
    """What fills ``n`` bytes as ``pat`` repeated from their start (cut at the end): ``pat`` itself when it
    divides ``n``, else the whole ``n`` bytes."""
    return pat if n % len(pat) == 0 else np.resize(np.frombuffer(pat, np.uint8), n).tobytes()


def _fill(src: ByteSource, res: ParseResult, p: Mapping[str, str], prof: ModelProfile | None) -> Damage:
    value = p.get("value", "nan")
    every = [r for _, r in res.layer_records()]
    recs = _records(res, p, prof) if any(k in p for k in SELECT_KEYS) else every
    edits: list[Edit] = []
    ranges: list[tuple[int, int]] = []
    for rec in recs:
        if not rec.data_size:
            continue
        if not _payload_ok(rec, src.size):
            raise CorruptionError(f"the {rec.role.upper()} record {rec.index}'s payload is not whole in the file")
        pat = _fill_pattern(value, rec)
        a, b = _cell_range(p, rec.n_rows)
        if rec.transposed:  # n_embd columns, each holding the n_rows cells of one element
            col, n = rec.n_rows * rec.el_bytes, (b - a) * rec.el_bytes
            spans = [(rec.data_offset + j * col + a * rec.el_bytes, n) for j in range(rec.n_embd_v_gqa)]
            unit = _unit(pat, n)
            if n == col and len(unit) == len(pat):  # every cell: the columns are one run of the pattern
                edits.append(Edit("fill", rec.data_offset, rec.data_size, unit))
            else:
                edits += [Edit("fill", off, n, unit) for off, n in spans]
            ranges += spans
        else:
            span = (rec.data_offset + a * rec.row_bytes, (b - a) * rec.row_bytes)
            edits.append(Edit("fill", span[0], span[1], _unit(pat, rec.row_bytes)))
            ranges.append(span)
    if not ranges:
        raise CorruptionError("no payload bytes to fill")
    cells = f", {cells_text(*_cells_of(p['cells']))}" if "cells" in p else ""
    which = "every tensor payload" if len(recs) == len(every) and "cells" not in p else (
        plural(len(recs), "record") + cells)
    desc = f"filled {which} with {value} ({sum(n for _, n in ranges)} bytes)"
    fail = p.get("then_fail")
    if fail:  # make the restore fail late: after every earlier row was handed over
        last = _last_record(res, fail)
        old = src.i32(last.header_offset)
        if old is None:
            raise CorruptionError(f"then_fail={fail}: the record's header lies past the end of the file")
        new = 0 if old != 0 else 1
        edits.append(Edit("write", last.header_offset, 4, struct.pack("<i", new)))
        desc += (f"; then the type of the last {last.role.upper()} record (layer {last.il}) "
                 f"{gt.type_name(old)} -> {gt.type_name(new)}")
        ranges.append((last.header_offset, 4))
    return Damage(tuple(edits), desc, tuple(ranges), src.size)


def _last_record(res: ParseResult, which: str) -> LayerRecord:
    """The last record of role ``which`` (``v`` on a recurrent-only state: the last s record)."""
    recs = [r for _, r in res.layer_records()]
    mine = [r for r in recs if r.role == which]
    if not mine and which == "v":
        mine = [r for r in recs if r.role == "s"]
    if not mine:
        raise CorruptionError(f"then_fail={which}: the state has no {which.upper()} record to make fail"
                              + (" (nor an s record)" if which == "v" else ""))
    return max(mine, key=lambda r: r.header_offset)


def _drop(src: ByteSource, res: ParseResult, p: Mapping[str, str], prof: ModelProfile | None) -> Damage:
    recs = _records(res, p, prof)
    for r in recs:
        if not 0 <= r.header_offset <= r.header_offset + r.size <= src.size:
            raise CorruptionError(f"the {r.role.upper()} record {r.index} is not whole in the file")
    gone = sum(r.size for r in recs)
    what = ", ".join(f"{r.role.upper()} layer {r.il if r.il is not None else r.index}" for r in recs)
    return Damage(tuple(Edit("delete", r.header_offset, r.size) for r in recs),
                  f"removed the {what} record{'' if len(recs) == 1 else 's'} ({gone} bytes); n_layer unchanged",
                  tuple((r.header_offset, r.size) for r in recs), src.size - gone)


def _swap(src: ByteSource, res: ParseResult, p: Mapping[str, str], prof: ModelProfile | None) -> Damage:
    base = {k: v for k, v in p.items() if k not in ("a", "b")}
    a, b = p.get("a", "0"), p.get("b", "1")
    if a == b:  # (checked here, not when the spec is made: a drawn pair may be one)
        raise CorruptionError(f"a={a} and b={b}: a swap needs two records")
    ra = {r.role: r for r in _records(res, {**base, "index": a})}
    rb = {r.role: r for r in _records(res, {**base, "index": b})}
    edits: list[Edit] = []
    touched: list[tuple[int, int]] = []
    for role, x in ra.items():
        y = rb[role]  # both selections hold every role (index= is refused where a role lacks it)
        if x is y:
            raise CorruptionError(f"a={a} and b={b} name the same {role.upper()} record")
        if x.size != y.size:
            raise CorruptionError(f"records {x.index} and {y.index} differ in size ({x.size} vs {y.size})")
        for r in (x, y):
            if not 0 <= r.data_offset <= r.data_offset + r.data_size <= src.size:
                raise CorruptionError(f"the {role.upper()} record {r.index}'s payload is not whole in the file")
        edits.append(Edit("swap", x.data_offset, x.data_size, other=y.data_offset))
        touched += [(x.data_offset, x.data_size), (y.data_offset, y.data_size)]
    return Damage(tuple(edits), f"swapped the payloads of records {a} and {b} "
                  f"({', '.join(sorted({r.role.upper() for r in ra.values()}))})", tuple(touched), src.size)


def _dup_cell(src: ByteSource, res: ParseResult, p: Mapping[str, str], prof: ModelProfile | None) -> Damage:
    sec = _section(res, p)
    st = _stream(sec, p)
    table = st.cells if st is not None else sec.cells
    if table is None or table.count < 2:
        raise CorruptionError("need a cell table of at least two cells")
    i = _int("cell", p.get("cell", "0"))
    j = _int("into", p.get("into", str(i + 1 if i + 1 < table.count else i - 1)))
    if i == j:
        raise CorruptionError(f"cell={i} and into={j}: a cell copied onto itself changes nothing")
    for key, c in (("cell", i), ("into", j)):
        if not 0 <= c < table.count:
            raise CorruptionError(f"{key}={c}: no such cell (the table has {table.count}: 0 to {table.count - 1})")
    ri, rj = table.record_offset(i), table.record_offset(j)
    size_i = table.record_offset(i + 1) - ri if i + 1 < table.count else table.offset + table.size - ri
    size_j = table.record_offset(j + 1) - rj if j + 1 < table.count else table.offset + table.size - rj
    if size_i != size_j:
        raise CorruptionError("cells of different record sizes cannot be duplicated in place")
    record = src.raw(ri, size_i)
    if record is None or rj + size_j > src.size:
        raise CorruptionError("the cell table is not whole in the file")
    return Damage((Edit("write", rj, size_j, record),),
                  f"cell {j}'s meta record overwritten with cell {i}'s (same pos and sequences)", ((rj, size_j),),
                  src.size)


def _trailer(src: ByteSource, res: ParseResult, p: Mapping[str, str], prof: ModelProfile | None) -> Damage:
    n = _int("bytes", p.get("bytes", "16"))  # both checked when the spec was parsed
    byte = _int("byte", p.get("byte", "0x41"))
    return Damage((Edit("append", src.size, n, bytes([byte])),), f"appended {n} bytes of 0x{byte:02x}",
                  ((src.size, n),), src.size + n)


PLAN: dict[str, Callable[[ByteSource, ParseResult, Mapping[str, str], ModelProfile | None], Damage]] = {
    "truncate": _truncate,
    "set": _set,
    "fill": _fill,
    "drop": _drop,
    "swap": _swap,
    "dup-cell": _dup_cell,
    "trailer": _trailer,
}
