"""The corruption catalog: named, parameterised mutations of a state, addressed by its structure.

Every mutation parses the input with the reader and finds its target through the structure
(sections, streams, cells, layer records), never through hand-computed offsets. A mutation is
planned as a few :class:`Edit` s of the input (:meth:`Corruption.plan`: write these bytes here, fill
that range with a pattern, swap two ranges, delete ranges, cut, append), so it can be made in memory
(:meth:`Corruption.apply` returns new bytes and a one-line description; the input bytes are never
modified) or in place in a copy on disk (:func:`apply_edits_fd`, ``kvscope corrupt``: memory about
what the edits touch, not the file's size).

Spec syntax (``kvscope lab --corrupt SPEC``, ``kvscope corrupt --corrupt SPEC``): a catalog name
(``truncated_half``) or ``KIND:key=value,...``, e.g. ``truncate:at=half``, ``set:field=cell_count,value=+1``,
``fill:value=nan,role=k,index=0,cells=0-3``, ``drop:role=k,il=1``, ``swap:role=k,a=0,b=1``,
``dup-cell:cell=2``, ``trailer:bytes=16``. The parse is strict (:data:`KEYS`): a key the kind does not
take, a key given twice, an empty or malformed value, a value out of range (``byte=0x1ff``), a selector
that selects nothing in the file (``index=9`` of 3 records, ``kv_layer=`` past the model's KV layers)
is refused in one line naming the key, never ignored: the copy is the damage asked for or none.
"""

from __future__ import annotations

import difflib
import os
import re
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvscope.core import ggml_types as gt
from kvscope.core.errors import UsageError
from kvscope.core.model.profile import ModelProfile
from kvscope.core.reader.parse import read_state
from kvscope.core.reader.records import KvStream, LayerRecord, ParseResult, Section
from kvscope.core.reader.source import ByteSource
from kvscope.core.textsafe import plural

MAX_TRAILER = 1 << 30  # trailer:bytes= above this is a mistake, not a test; also the total of a chain's trailers
MAX_VALUE = 64  # characters of one parameter value (a 100,000-digit number is not an offset)
KINDS = ("truncate", "set", "fill", "drop", "swap", "dup-cell", "trailer")

SELECT_KEYS = ("section", "stream", "role", "index", "il", "kv_layer")  # which layer records
KEYS: dict[str, tuple[str, ...]] = {  # every key each kind takes; any other is refused
    "truncate": ("at", "node", "section"),
    "set": ("field", "value", "cell", *SELECT_KEYS),
    "fill": ("value", "cells", "then_fail", *SELECT_KEYS),
    "drop": SELECT_KEYS,
    "swap": ("a", "b", "section", "stream", "role"),
    "dup-cell": ("cell", "into", "section", "stream"),
    "trailer": ("bytes", "byte"),
}
HEADER_FIELDS = ("magic", "version", "n_token_count", "io_magic", "seq_id_header")
CELL_FIELDS = ("pos", "n_seq_id", "seq_id")
SECTION_FIELDS = ("v_trans", "s_trans", "n_layer")
RECORD_FIELDS = ("type", "row_size", "el_size", "n_embd_v_gqa")
FIELD_KEYS: dict[str, tuple[str, ...]] = {  # set: the keys besides field= and value= each field takes
    **{f: () for f in HEADER_FIELDS},
    "n_stream": ("section",),
    "cell_count": ("section", "stream"),
    **{f: ("section", "stream", "cell") for f in CELL_FIELDS},
    **{f: ("section", "stream") for f in SECTION_FIELDS},
    **{f: SELECT_KEYS for f in RECORD_FIELDS},
}
ROLES = ("k", "v", "r", "s", "kv")
FILL_VALUES = ("nan", "inf", "zeros", "zero", "0", "0xff", "ff")
AT_WORDS = ("half", "middle", "start", "end")
_INT = re.compile(r"[+-]?(?:0[xX][0-9a-fA-F]+|0[oO][0-7]+|0[bB][01]+|[0-9]+)", re.ASCII)
_RELATIVE = re.compile(r"[+-][0-9]+", re.ASCII)
_CHUNK = 4 << 20  # bytes per step of the on-disk edits


class CorruptionError(UsageError, ValueError):
    """The mutation does not apply to this state (no such section, layer, cell...), or the spec is malformed."""


@dataclass(frozen=True)
class Mutation:
    """The mutated bytes, what was done, and the byte ranges touched in the *input*."""

    data: bytes
    description: str
    ranges: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Edit:
    """One change, in offsets of the bytes it was planned on.

    ``write``: ``data`` at ``off``; ``fill``: the ``n`` bytes from ``off`` become ``data`` repeated (``n`` is a
    multiple of its length); ``swap``: the ``n`` bytes at ``off`` and those at ``other`` trade places;
    ``delete``: the ``n`` bytes at ``off`` go, what follows moves up; ``cut``: everything from ``off`` goes;
    ``append``: ``n`` bytes of ``data`` (one byte) at the end. A plan's writes, fills and swaps never overlap;
    the deletes, cut and append are made after them.
    """

    op: str
    off: int = 0
    n: int = 0
    data: bytes = b""
    other: int = 0


@dataclass(frozen=True)
class Damage:
    """A planned mutation: its edits, what it does in words, the input byte ranges it touches, the size after."""

    edits: tuple[Edit, ...]
    description: str
    ranges: tuple[tuple[int, int], ...]
    size: int


@dataclass(frozen=True)
class Corruption:
    """One parameterised mutation; ``name`` is its catalog name or its spec. The parameters are checked when
    it is made (:class:`CorruptionError`: a key the kind does not take, a malformed or out-of-range value)."""

    kind: str
    params: dict[str, str] = field(default_factory=dict)
    name: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise CorruptionError(f"unknown corruption kind {_show(self.kind)} (known: {', '.join(KINDS)})")
        check_params(self.kind, self.params)

    @property
    def label(self) -> str:
        return self.name or spec_of(self)

    @property
    def appends(self) -> int:
        """Bytes this mutation adds at the end (a trailer's), known before any file is read."""
        return _int("bytes", self.params.get("bytes", "16")) if self.kind == "trailer" else 0

    def plan(self, src: ByteSource, profile: ModelProfile | None = None) -> Damage:
        """The edits that make this mutation of ``src`` (read, never written)."""
        res = read_state(src, profile=profile)
        if res.kind == "unknown":
            raise CorruptionError("the input is not a state file the reader understands")
        return _PLAN[self.kind](src, res, self.params, profile)

    def apply(self, data: bytes, profile: ModelProfile | None = None) -> Mutation:
        """The mutated copy of ``data`` in memory (``data`` itself is never modified)."""
        d = self.plan(ByteSource(data, "<bytes>"), profile)
        return Mutation(apply_edits(data, d.edits), d.description, d.ranges)


def spec_of(c: Corruption) -> str:
    return c.kind + (":" + ",".join(f"{k}={v}" for k, v in c.params.items()) if c.params else "")


def parse_spec(spec: str) -> Corruption:
    """A :class:`Corruption` from a catalog name or ``KIND:key=value,...`` (strict: :func:`check_params`)."""
    spec = spec.strip()
    if spec in CATALOG:
        return CATALOG[spec]
    kind, _, rest = spec.partition(":")
    if not kind.strip():
        raise CorruptionError("no corruption kind (a catalog name or KIND:key=value,...)")
    params: dict[str, str] = {}
    for item in rest.split(",") if rest.strip() else []:
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise CorruptionError(f"bad corruption parameter {_show(item)} (expected key=value)")
        if key in params:
            raise CorruptionError(f"{_show(key)} given twice")
        params[key] = value.strip()
    return Corruption(kind.strip(), params)


def _show(text: str) -> str:
    """``text`` quoted for a message, cut when long (a spec can be as long as a command line allows)."""
    return repr(text if len(text) <= MAX_VALUE else text[:MAX_VALUE] + "…")


# ---------------------------------------------------------------------------------------------
# the strict parameter check (no file needed)


def _int(key: str, value: str) -> int:
    """An integer (decimal, 0x, 0o, 0b; ASCII digits only) of at most :data:`MAX_VALUE` characters."""
    if len(value) > MAX_VALUE:
        raise CorruptionError(f"{key}=: a value of {len(value):,} characters (at most {MAX_VALUE})")
    if _INT.fullmatch(value):
        try:
            return int(value, 0)
        except ValueError:
            pass  # 010: a leading zero
    raise CorruptionError(f"{key}={_show(value)}: not an integer")


def _at_least(key: str, value: str, low: int) -> int:
    n = _int(key, value)
    if n < low:
        raise CorruptionError(f"{key}={n}: must be {low} or more")
    return n


def _cells_of(value: str) -> tuple[int, int]:
    """``cells=A`` or ``A-B`` (whole cells, ``A <= B``) as the half-open ``(A, B + 1)``."""
    lo, dash, hi = value.partition("-")
    a = _at_least("cells", lo, 0) if lo else _int("cells", value)  # "-3": refused as not an integer
    b = _at_least("cells", hi, 0) if dash else a
    if b < a:
        raise CorruptionError(f"cells={value}: the last cell comes before the first")
    return a, b + 1


def cells_text(a: int, b: int) -> str:
    """The half-open cell range ``[a, b)`` in words: ``cell 3`` for one cell, ``cells 3-5`` for more."""
    return f"cell {a}" if b - a == 1 else f"cells {a}-{b - 1}"


def check_params(kind: str, p: Mapping[str, str]) -> None:
    """Refuse (:class:`CorruptionError`, one line naming the key) what ``kind`` does not take or cannot mean,
    before any file is read; what needs the file (does cell 9 exist?) is checked when it is planned."""
    known = KEYS[kind]
    for key, value in p.items():
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise CorruptionError(f"unknown key {_show(key)} for {kind}{hint}; it takes {', '.join(known)}")
        if not value:
            raise CorruptionError(f"{key}= has no value")
        if len(value) > MAX_VALUE:
            raise CorruptionError(f"{key}=: a value of {len(value):,} characters (at most {MAX_VALUE})")
    chosen = [k for k in ("index", "il", "kv_layer") if k in p]
    if len(chosen) > 1:
        raise CorruptionError(f"{' and '.join(k + '=' for k in chosen)} both select records: give one of them")
    for key in ("il", "kv_layer", "cell", "into"):
        if key in p:
            _at_least(key, p[key], 0)
    for key in ("index", "a", "b"):
        if key in p:
            _int(key, p[key])
    if "role" in p and p["role"] not in ROLES:
        raise CorruptionError(f"role={_show(p['role'])}: one of {', '.join(ROLES)}")
    if "stream" in p and p["stream"] != "first-nonempty":
        _at_least("stream", p["stream"], 0)
    if "section" in p and p["section"].lstrip("-").isdigit():
        _int("section", p["section"])
    if "cells" in p:
        _cells_of(p["cells"])
    check = _CHECK.get(kind)
    if check is not None:
        check(p)


def _check_truncate(p: Mapping[str, str]) -> None:
    if "node" in p and "section" in p:
        raise CorruptionError("node= and section= both say what to cut: give one of them")
    if "node" in p and not p["node"].startswith("/"):
        raise CorruptionError(f"node={_show(p['node'])}: a structure path such as /memory")
    at = p.get("at")
    if at is not None and at not in AT_WORDS:
        _int("at", at)


def _check_set(p: Mapping[str, str]) -> None:
    name = p.get("field")
    if name is None:
        raise CorruptionError("set needs field= (one of " + ", ".join(FIELD_KEYS) + ")")
    if name not in FIELD_KEYS:
        close = difflib.get_close_matches(name, FIELD_KEYS, n=1)
        raise CorruptionError(f"field={_show(name)}: unknown field" + (f" (did you mean {close[0]}?)" if close else "")
                              + "; known: " + ", ".join(FIELD_KEYS))
    extra = [k for k in p if k not in ("field", "value", *FIELD_KEYS[name])]
    if extra:
        takes = ", ".join(FIELD_KEYS[name]) or "no other key"
        raise CorruptionError(f"{extra[0]}= does not apply to field={name} (it takes {takes})")
    raw = p.get("value")
    if raw is None:
        raise CorruptionError("set needs value= (N, +N, -N, 0x.., other" + (", a ggml type name)" if name == "type"
                                                                             else ")"))
    if raw == "other" or _RELATIVE.fullmatch(raw):
        return
    if name == "type" and not _INT.fullmatch(raw):
        try:
            gt.type_id_from_name(raw)
        except KeyError:
            raise CorruptionError(f"value={_show(raw)}: unknown ggml type") from None
        return
    _int("value", raw)


def _check_fill(p: Mapping[str, str]) -> None:
    if p.get("value", "nan") not in FILL_VALUES:
        raise CorruptionError(f"value={_show(p['value'])}: one of nan, inf, zeros, 0xff")
    if "then_fail" in p and p["then_fail"] not in ("k", "v", "r", "s"):
        raise CorruptionError(f"then_fail={_show(p['then_fail'])}: one of k, v, r, s (the role whose last record "
                              "fails)")


def _check_trailer(p: Mapping[str, str]) -> None:
    n = _int("bytes", p.get("bytes", "16"))
    if not 0 < n <= MAX_TRAILER:
        raise CorruptionError(f"bytes={n}: between 1 and {MAX_TRAILER:,}")
    b = _int("byte", p.get("byte", "0x41"))
    if not 0 <= b <= 0xFF:
        raise CorruptionError(f"byte={p['byte']}: a byte is 0 to 255 (0x00 to 0xff)")


_CHECK: dict[str, Callable[[Mapping[str, str]], None]] = {
    "truncate": _check_truncate, "set": _check_set, "fill": _check_fill, "trailer": _check_trailer,
}


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


_PLAN: dict[str, Callable[[ByteSource, ParseResult, Mapping[str, str], ModelProfile | None], Damage]] = {
    "truncate": _truncate,
    "set": _set,
    "fill": _fill,
    "drop": _drop,
    "swap": _swap,
    "dup-cell": _dup_cell,
    "trailer": _trailer,
}


# ---------------------------------------------------------------------------------------------
# making the edits: in memory, or in place in a file


def _in_place(edits: Sequence[Edit]) -> tuple[list[Edit], list[Edit], Edit | None, Edit | None]:
    """(writes, fills and swaps in order; deletes by offset; the cut; the append)."""
    fixed = [e for e in edits if e.op in ("write", "fill", "swap")]
    deletes = sorted((e for e in edits if e.op == "delete"), key=lambda e: e.off)
    cut = next((e for e in edits if e.op == "cut"), None)
    append = next((e for e in edits if e.op == "append"), None)
    return fixed, deletes, cut, append


def apply_edits(data: bytes, edits: Sequence[Edit]) -> bytes:
    """``data`` with ``edits`` made, as new bytes."""
    out = bytearray(data)
    fixed, deletes, cut, append = _in_place(edits)
    for e in fixed:
        if e.op == "write":
            out[e.off : e.off + len(e.data)] = e.data
        elif e.op == "fill":
            out[e.off : e.off + e.n] = e.data * (e.n // len(e.data))
        else:
            x = bytes(out[e.off : e.off + e.n])
            out[e.off : e.off + e.n] = out[e.other : e.other + e.n]
            out[e.other : e.other + e.n] = x
    for e in reversed(deletes):
        del out[e.off : e.off + e.n]
    if cut is not None:
        del out[cut.off :]
    if append is not None:
        out += append.data * append.n
    return bytes(out)


def _pwrite(fd: int, data: bytes | memoryview, off: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, off)
        view, off = view[n:], off + n


def _pread(fd: int, n: int, off: int) -> bytes:
    out = os.pread(fd, n, off)
    while len(out) < n:
        more = os.pread(fd, n - len(out), off + len(out))
        if not more:
            raise OSError(f"short read at byte {off + len(out)}")
        out += more
    return out


def _fill_fd(fd: int, off: int, n: int, unit: bytes) -> None:
    piece = unit * max(1, _CHUNK // len(unit))
    done = 0
    while done < n:
        m = min(n - done, len(piece))
        _pwrite(fd, memoryview(piece)[:m], off + done)
        done += m


def apply_edits_fd(fd: int, size: int, edits: Sequence[Edit]) -> int:
    """Make ``edits`` in place in the file open read-write as ``fd`` (``size`` bytes); its new size. Memory: a
    few pieces of :data:`_CHUNK` bytes, whatever the file's size (a swap and a delete move data piece by piece)."""
    fixed, deletes, cut, append = _in_place(edits)
    for e in fixed:
        if e.op == "write":
            _pwrite(fd, e.data, e.off)
        elif e.op == "fill":
            _fill_fd(fd, e.off, e.n, e.data)
        else:
            for k in range(0, e.n, _CHUNK):
                m = min(_CHUNK, e.n - k)
                x, y = _pread(fd, m, e.off + k), _pread(fd, m, e.other + k)
                _pwrite(fd, y, e.off + k)
                _pwrite(fd, x, e.other + k)
    if deletes:  # one pass: every kept run moves up to where the bytes before it end
        dst = deletes[0].off
        for i, e in enumerate(deletes):
            lo, hi = e.off + e.n, deletes[i + 1].off if i + 1 < len(deletes) else size
            for k in range(lo, hi, _CHUNK):
                m = min(_CHUNK, hi - k)
                _pwrite(fd, _pread(fd, m, k), dst)
                dst += m
        size = dst
        os.ftruncate(fd, size)
    if cut is not None:
        size = cut.off
        os.ftruncate(fd, size)
    if append is not None:
        _fill_fd(fd, size, append.n, append.data)
        size += append.n
    return size


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
