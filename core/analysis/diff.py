"""Structural and numeric diff of two parsed states (``kvscope diff A B``).

:func:`diff_states` compares header fields, token lists, memory sections (paired by role and
order), cells (paired by sequence and position, so file order does not matter) and, for every
pair of layer records, the dequantized values of the paired cells (max abs / max relative
difference, cells that differ, NaN counts; transposed V is read column-wise). It also finds the
first differing byte. :attr:`StateDiff.differences` lists what differs in an order to step through.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from kvscope.core import ggml_types as gt
from kvscope.core.analysis.record_values import Bytes, as_source, record_rows, record_shape, source_of
from kvscope.core.analysis.verdict import plural
from kvscope.core.reader.records import CellTable, LayerRecord, ParseResult, Section
from kvscope.core.reader.source import ByteSource
from kvscope.core.textsafe import safe_text

I64A = npt.NDArray[np.int64]
_CHUNK = 4 << 20  # float32 bytes per side per compare step
_BYTES_CHUNK = 16 << 20


def _safe(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_safe(x) for x in v]
    return v


@dataclass
class DiffItem:
    """One difference: ``kind`` is header, token, cell, layer or bytes; offsets are per file."""

    kind: str
    description: str
    offset_a: int | None = None
    offset_b: int | None = None
    layer: int | None = None

    def to_json(self) -> dict[str, Any]:
        """Plain dict."""
        return asdict(self)


@dataclass
class LayerDiff:
    """Values of one pair of layer records over the paired cells."""

    section: str
    stream_a: int | None
    stream_b: int | None
    role: str
    index: int
    il: int | None
    type_a: str
    type_b: str
    n_cells: int = 0  # paired cells compared
    cells_differ: int = 0
    max_abs: float = 0.0  # over values finite on both sides
    max_rel: float = 0.0  # |a - b| / max(|a|, |b|)
    nan_a: int = 0
    nan_b: int = 0
    nonfinite_mismatch: int = 0  # values where one side is NaN/Inf and the other differs
    first_cell_a: int | None = None
    first_cell_b: int | None = None
    offset_a: int | None = None  # byte of the first differing value (its block for quantized types)
    offset_b: int | None = None
    note: str = ""

    @property
    def differs(self) -> bool:
        """True when values, types or shapes differ."""
        return bool(self.cells_differ or self.type_a != self.type_b or self.note)


@dataclass
class SectionDiff:
    """One pair of memory sections: cells paired by key, and layer diffs."""

    role: str
    index: int  # among sections of this role
    in_a: bool = True
    in_b: bool = True
    matched_by: str = "seq,pos"
    cells_only_a: int = 0  # (seq, pos) entries
    cells_only_b: int = 0
    cells_both: int = 0
    streams: list[dict[str, Any]] = field(default_factory=list)  # per stream pair: paired cells, only-in counts
    layers: list[LayerDiff] = field(default_factory=list)


@dataclass
class StateDiff:
    """Everything :func:`diff_states` found; ``differences`` is the ordered list to step through."""

    path_a: str
    path_b: str
    size_a: int
    size_b: int
    first_byte: int | None = None  # first offset where the files' bytes differ (or the shorter size)
    header: list[tuple[str, Any, Any]] = field(default_factory=list)
    tokens: dict[str, Any] = field(default_factory=dict)
    sections: list[SectionDiff] = field(default_factory=list)
    differences: list[DiffItem] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        """True when nothing differs, bytes included."""
        return not self.differences

    def to_json(self) -> dict[str, Any]:
        """JSON-safe dict (non-finite floats become None)."""
        out: dict[str, Any] = _safe({
            "a": self.path_a, "b": self.path_b, "size_a": self.size_a, "size_b": self.size_b,
            "identical": self.identical, "first_byte": self.first_byte,
            "header": [{"field": k, "a": a, "b": b} for k, a, b in self.header], "tokens": self.tokens,
            "sections": [{**{k: v for k, v in asdict(s).items() if k != "layers"},
                          "layers": [{**asdict(ld), "differs": ld.differs} for ld in s.layers]} for s in self.sections],
            "differences": [d.to_json() for d in self.differences],
        })
        return out

    def to_text(self) -> str:
        """Human summary: sections, a table of layers that differ, then every difference."""
        lines = [f"A: {self.path_a}  ({self.size_a:,} bytes)", f"B: {self.path_b}  ({self.size_b:,} bytes)", ""]
        if self.identical:
            return "\n".join(safe_text(line) for line in [*lines, "identical"]) + "\n"
        lines.append(f"{len(self.differences)} differences; first differing byte @{self.first_byte}")
        for s in self.sections:
            where = "A only" if not s.in_b else "B only" if not s.in_a else (
                f"cells: {s.cells_both} paired (by {s.matched_by}), {s.cells_only_a} only in A, "
                f"{s.cells_only_b} only in B")
            lines.append(f"section {s.role}#{s.index}: {where}")
            pairs = [f"s{x['stream_a']}->s{x['stream_b']}: {x['paired']}" for x in s.streams
                     if x.get("paired") and x["stream_a"] is not None]
            if pairs:
                lines.append("  paired cells per stream: " + ", ".join(pairs))
            rows = [ld for ld in s.layers if ld.differs]
            if rows:
                lines.append("  stream  rec  layer  type       cells  differ  max abs     max rel     NaN A/B")
            for ld in rows:
                st = "" if ld.stream_a is None else f"s{ld.stream_a}" + (
                    f"/s{ld.stream_b}" if ld.stream_b != ld.stream_a else "")
                ty = ld.type_a if ld.type_a == ld.type_b else f"{ld.type_a}/{ld.type_b}"
                lines.append(f"  {st:6}  {ld.role.upper():3}  {'?' if ld.il is None else ld.il!s:5}  {ty:9}  "
                             f"{ld.n_cells:5}  {ld.cells_differ:6}  {ld.max_abs:<10.4g}  {ld.max_rel:<10.4g}  "
                             f"{ld.nan_a}/{ld.nan_b}" + (f"  {ld.note}" if ld.note else ""))
        lines += ["", "differences:"]
        for d in self.differences:
            off = f"@{'-' if d.offset_a is None else d.offset_a}/{'-' if d.offset_b is None else d.offset_b}"
            lines.append(f"  {d.kind:6} {off:>17}  {d.description}")
        return "\n".join(safe_text(line) for line in lines) + "\n"  # file-derived text escaped


# -- bytes, header, tokens ----------------------------------------------------------------------


def first_differing_byte(a: ByteSource | npt.NDArray[np.uint8], b: ByteSource | npt.NDArray[np.uint8]) -> int | None:
    """First offset where ``a`` and ``b`` differ (the shorter length when one is a prefix); None if equal.

    Both are read in pieces of ``_BYTES_CHUNK`` bytes into two reused buffers.
    """
    sa, sb = as_source(a), as_source(b)
    n = min(sa.size, sb.size)
    ba, bb = np.empty(min(n, _BYTES_CHUNK), np.uint8), np.empty(min(n, _BYTES_CHUNK), np.uint8)
    for lo in range(0, n, _BYTES_CHUNK):
        m = min(n, lo + _BYTES_CHUNK) - lo
        pa, pb = ba[:m], bb[:m]
        sa.readinto(lo, pa)
        sb.readinto(lo, pb)
        if not np.array_equal(pa, pb):
            return lo + int(np.argmax(pa != pb))
    return None if sa.size == sb.size else n


def _field_offset(res: ParseResult, name: str) -> int | None:
    node = next((c for c in res.root.children if c.name == name), None)
    return node.offset if node is not None else None


def _diff_tokens(a: ParseResult, b: ParseResult, d: StateDiff) -> None:
    ta, tb = np.asarray(a.tokens, np.int64), np.asarray(b.tokens, np.int64)
    m = min(ta.size, tb.size)
    neq = ta[:m] != tb[:m]
    n_differ = int(np.count_nonzero(neq)) + abs(ta.size - tb.size)
    first = int(np.argmax(neq)) if neq.any() else (m if ta.size != tb.size else None)
    d.tokens = {"len_a": int(ta.size), "len_b": int(tb.size), "first_diff": first, "n_differ": n_differ}
    if first is None:
        return

    def off(res: ParseResult) -> int | None:
        o = _field_offset(res, "tokens")
        return None if o is None or first is None or first >= len(res.tokens) else o + 4 * first

    va = a.tokens[first] if first < ta.size else "-"
    vb = b.tokens[first] if first < tb.size else "-"
    what = f"token {first}: {va} vs {vb}"
    d.differences.append(DiffItem("token", f"{what} ({n_differ} tokens differ; {ta.size} vs {tb.size} tokens)",
                                  off(a), off(b)))


# -- cells --------------------------------------------------------------------------------------

Unit = tuple[int | None, CellTable | None, list[LayerRecord]]


def _units(sec: Section) -> list[Unit]:
    if sec.kind == "kv":
        return [(st.index, st.cells, [*st.k_layers, *st.v_layers]) for st in sec.streams]
    return [(None, sec.cells, sec.all_layers())]


def _entries(units: list[Unit]) -> tuple[I64A, I64A, I64A, I64A]:
    """(unit, cell, seq, pos) per (cell, seq) entry; a cell without sequence ids gets seq -1."""
    out: list[list[I64A]] = [[], [], [], []]
    for u, (_, t, _) in enumerate(units):
        if t is None or not t.count:
            continue
        cnt = np.maximum(t.n_seq.astype(np.int64), 1)
        cell = np.repeat(np.arange(t.count, dtype=np.int64), cnt)
        seq = np.full(cell.size, -1, np.int64)
        has = np.flatnonzero(np.repeat(t.n_seq > 0, cnt))
        ids = t.seq_ids[: has.size]  # equal sizes unless the table was cut short
        seq[has[: ids.size]] = ids
        for lst, v in zip(out, (np.full(cell.size, u, np.int64), cell, seq, t.pos.astype(np.int64)[cell]), strict=True):
            lst.append(v)
    e = np.zeros(0, np.int64)
    return tuple(np.concatenate(x) if x else e for x in out)  # type: ignore[return-value]


def _cell_offset(t: CellTable, i: int) -> int:
    ext = t.ext_bytes if t.ext is not None else 0
    return int(t.offset + i * (8 + ext) + 4 * t.seq_start[i])


def _cell_items(sec: Section, units: list[Unit], side: str, mask: npt.NDArray[np.bool_],
                ent: tuple[I64A, I64A, I64A, I64A]) -> list[DiffItem]:
    """One item per sequence for the entries in ``mask`` (cells present on one side only)."""
    out = []
    u, cell, seq, pos = (x[mask] for x in ent)
    for s in np.unique(seq):
        k = seq == s
        t = units[int(u[k][0])][1]
        off = _cell_offset(t, int(cell[k][0])) if t is not None else None
        out.append(DiffItem("cell", f"section {sec.role}: seq {int(s)}: {plural(int(k.sum()), 'cell')} only in {side} "
                            f"(pos {int(pos[k].min())}..{int(pos[k].max())})",
                            off if side == "A" else None, off if side == "B" else None))
    return out


# -- layer values -------------------------------------------------------------------------------


def _value_offset(rec: LayerRecord, cell: int, dim: int) -> int:
    if rec.transposed:
        return int(rec.data_offset + (dim * rec.n_rows + cell) * rec.el_bytes)
    return int(rec.data_offset + cell * rec.row_bytes + dim // gt.block_size(rec.type_id) * gt.type_size(rec.type_id))


@np.errstate(all="ignore")  # Inf - Inf, NaN compares and overflowing scales are counted, not errors
def _compare(ld: LayerDiff, ba: ByteSource, ra: LayerRecord, ca: I64A,
             bb: ByteSource, rb: LayerRecord, cb: I64A) -> None:
    na, da = record_shape(ra, ba.size - ra.data_offset)
    nb, db = record_shape(rb, bb.size - rb.data_offset)
    if da != db:
        ld.note = f"values per cell differ ({da} vs {db}): not compared"
    if da != db or not da:  # empty records (recurrent s of some models) have nothing to compare
        return
    ok = (ca < na) & (cb < nb)  # truncated payloads: only cells present on both sides
    ca, cb = ca[ok], cb[ok]
    ld.n_cells = int(ca.size)
    step = max(1, _CHUNK // (4 * da))
    try:
        for lo in range(0, ca.size, step):
            xa, xb = ca[lo : lo + step], cb[lo : lo + step]
            a, b = record_rows(ba, ra, xa), record_rows(bb, rb, xb)
            nan_a, nan_b = np.isnan(a), np.isnan(b)
            ld.nan_a += int(np.count_nonzero(nan_a))
            ld.nan_b += int(np.count_nonzero(nan_b))
            neq = (a != b) & ~(nan_a & nan_b)
            if not neq.any():
                continue
            fin = np.isfinite(a) & np.isfinite(b)
            ld.nonfinite_mismatch += int(np.count_nonzero(neq & ~fin))
            diff = np.where(fin, np.abs(a - b), 0.0)
            den = np.maximum(np.abs(a), np.abs(b))
            rel = np.where(fin & (den > 0), diff / np.where(den > 0, den, 1.0), 0.0)
            ld.max_abs = max(ld.max_abs, float(diff.max()))
            ld.max_rel = max(ld.max_rel, float(rel.max()))
            rows = neq.any(axis=1)
            ld.cells_differ += int(np.count_nonzero(rows))
            if ld.first_cell_a is None:
                r = int(np.argmax(rows))
                j = int(np.argmax(neq[r]))
                ld.first_cell_a, ld.first_cell_b = int(xa[r]), int(xb[r])
                ld.offset_a, ld.offset_b = _value_offset(ra, int(xa[r]), j), _value_offset(rb, int(xb[r]), j)
    except NotImplementedError:
        ld.note = f"{ra.type} values cannot be decoded: not compared"


def _rec_keys(recs: list[LayerRecord]) -> list[tuple[str, int, int]]:
    """(role, index, repeat) per record: a damaged file can hold two records with one index."""
    seen: dict[tuple[str, int], int] = {}
    out = []
    for r in recs:
        n = seen[(r.role, r.index)] = seen.get((r.role, r.index), -1) + 1
        out.append((r.role, r.index, n))
    return out


def _diff_section(sa: Section, sb: Section, idx: int, ba: ByteSource, bb: ByteSource,
                  items: list[DiffItem]) -> SectionDiff:
    sd = SectionDiff(sa.role, idx)
    if sa.kind == "kv" and sa.n_stream != sb.n_stream:
        items.append(DiffItem("cell", f"section {sa.role}: {sa.n_stream} vs {sb.n_stream} streams",
                              sa.offset, sb.offset))
    ua, ub = _units(sa), _units(sb)
    ea, eb = _entries(ua), _entries(ub)
    seqs_a, seqs_b = np.unique(ea[2]), np.unique(eb[2])
    recurrent = sa.kind == "recurrent"
    single = seqs_a.size == 1 and seqs_b.size == 1 and seqs_a[0] != seqs_b[0]
    if single:
        sd.matched_by = f"{'cell' if recurrent else 'pos'} (only seq {int(seqs_a[0])} vs only seq {int(seqs_b[0])})"
    elif recurrent:
        sd.matched_by = "seq"

    def keys(e: tuple[I64A, I64A, I64A, I64A]) -> I64A:
        seq = np.zeros_like(e[2]) if single else e[2]
        pos = np.zeros_like(e[3]) if recurrent else e[3]
        return (seq << 32) | (pos & 0xFFFFFFFF)

    ka, kb = keys(ea), keys(eb)
    both, ia, ib = np.intersect1d(ka, kb, assume_unique=False, return_indices=True)
    only_a, only_b = ~np.isin(ka, both), ~np.isin(kb, both)
    sd.cells_both, sd.cells_only_a, sd.cells_only_b = int(both.size), int(only_a.sum()), int(only_b.sum())
    if only_a.any():
        items.extend(_cell_items(sa, ua, "A", only_a, ea))
    if only_b.any():
        items.extend(_cell_items(sb, ub, "B", only_b, eb))
    if recurrent:
        moved = ea[3][ia] != eb[3][ib]
        if moved.any():
            items.append(DiffItem("cell", f"section {sa.role}: {int(moved.sum())} paired cells at other positions "
                                  f"(first: pos {int(ea[3][ia][moved][0])} vs {int(eb[3][ib][moved][0])})",
                                  sa.offset, sb.offset))
    for side, units, ent, mask in (("a", ua, ea, only_a), ("b", ub, eb, only_b)):
        for u, c in zip(*np.unique(ent[0][mask], return_counts=True), strict=True):
            sd.streams.append({f"stream_{side}": units[int(u)][0], f"only_{side}": int(c)})
    # paired cells, grouped by (unit A, unit B); each cell pair once, in A's order
    pairs = np.unique(np.stack([ea[0][ia], eb[0][ib], ea[1][ia], eb[1][ib]], axis=1), axis=0) if ia.size \
        else np.zeros((0, 4), np.int64)
    groups = {(int(x), int(y)) for x, y in pairs[:, :2]} or {(i, i) for i in range(min(len(ua), len(ub)))}
    for ga, gb in sorted(groups):
        sel = (pairs[:, 0] == ga) & (pairs[:, 1] == gb)
        (sta, _, recs_a), (stb, _, recs_b) = ua[ga], ub[gb]
        sd.streams.append({"stream_a": sta, "stream_b": stb, "paired": int(sel.sum())})
        by_b = dict(zip(_rec_keys(recs_b), recs_b, strict=True))
        for key, ra in zip(_rec_keys(recs_a), recs_a, strict=True):
            rb = by_b.pop(key, None)
            if rb is None:
                items.append(DiffItem("layer", f"section {sa.role}: {ra.role.upper()} record {ra.index} only in A",
                                      ra.header_offset, None, ra.il))
                continue
            ld = LayerDiff(sa.role, sta, stb, ra.role, ra.index, ra.il, ra.type, rb.type)
            if ra.transposed != rb.transposed:
                ld.note = "transposed V vs plain V"
            _compare(ld, ba, ra, pairs[sel, 2], bb, rb, pairs[sel, 3])
            sd.layers.append(ld)
            if ld.differs:
                what = f"{ld.cells_differ} of {ld.n_cells} cells differ, max abs {ld.max_abs:.4g}, " \
                       f"max rel {ld.max_rel:.4g}" + (f", NaN {ld.nan_a}/{ld.nan_b}" if ld.nan_a or ld.nan_b else "")
                if ld.type_a != ld.type_b:
                    what = f"type {ld.type_a} vs {ld.type_b}; " + what
                stream = "" if sta is None else f" stream {sta}" + ("" if stb == sta else f"/{stb}")
                items.append(DiffItem("layer", f"section {sa.role}{stream}"
                                      + f" {ra.role.upper()} layer {'?' if ra.il is None else ra.il}: {what}"
                                      + (f" ({ld.note})" if ld.note else ""),
                                      ld.offset_a if ld.offset_a is not None else ra.data_offset,
                                      ld.offset_b if ld.offset_b is not None else rb.data_offset, ra.il))
        for rb in by_b.values():
            items.append(DiffItem("layer", f"section {sb.role}: {rb.role.upper()} record {rb.index} only in B",
                                  None, rb.header_offset, rb.il))
    return sd


def diff_states(a: ParseResult, b: ParseResult, data_a: Bytes = None, data_b: Bytes = None) -> StateDiff:
    """Compare two parsed states (bytes from ``data_a``/``data_b`` or the files at their paths).

    Payloads are read with bounded ``pread`` pieces; raises :class:`FileChangedError` when either
    file changed during the diff (or since its ``data`` source was opened).
    """
    with source_of(a, data_a) as ba, source_of(b, data_b) as bb:
        return _diff(a, b, ba, bb)


def _diff(a: ParseResult, b: ParseResult, ba: ByteSource, bb: ByteSource) -> StateDiff:
    d = StateDiff(a.path, b.path, int(ba.size), int(bb.size))
    d.first_byte = first_differing_byte(ba, bb)
    if d.first_byte is not None:
        d.differences.append(DiffItem("bytes", f"first differing byte @{d.first_byte} "
                                      f"(sizes {ba.size:,} vs {bb.size:,})", d.first_byte, d.first_byte))
    if a.kind != b.kind:
        d.header.append(("kind", a.kind, b.kind))
        d.differences.append(DiffItem("header", f"kind: {a.kind} vs {b.kind}", 0, 0))
    for k in [*a.header, *(k for k in b.header if k not in a.header)]:
        va, vb = a.header.get(k), b.header.get(k)
        if va != vb:
            d.header.append((k, va, vb))
            d.differences.append(DiffItem("header", f"{k}: {va} vs {vb}", _field_offset(a, k), _field_offset(b, k)))
    _diff_tokens(a, b, d)
    seen: dict[str, int] = {}
    for sec in a.sections:
        idx = seen[sec.role] = seen.get(sec.role, -1) + 1
        other = [s for s in b.sections if s.role == sec.role]
        if idx < len(other):
            d.sections.append(_diff_section(sec, other[idx], idx, ba, bb, d.differences))
        else:
            d.sections.append(SectionDiff(sec.role, idx, in_b=False))
            d.differences.append(DiffItem("cell", f"section {sec.role} only in A", sec.offset, None))
    for role in dict.fromkeys(s.role for s in b.sections):
        extra = [s for s in b.sections if s.role == role][seen.get(role, -1) + 1 :]
        for i, sec in enumerate(extra, start=seen.get(role, -1) + 1):
            d.sections.append(SectionDiff(role, i, in_a=False))
            d.differences.append(DiffItem("cell", f"section {role} only in B", None, sec.offset))
    return d
