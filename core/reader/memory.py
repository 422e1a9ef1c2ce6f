"""Memory sections: ``llama_kv_cache`` (streams, cells, K/V) and ``llama_memory_recurrent``.

``parse_memory`` walks the sections of one memory state in order. With a model it follows the
model's plan (which caches, which layers); without one it decides kv vs recurrent by structure
and names composite sections by their order. Bad records are findings; the parser resyncs on
the next plausible layer header and marks what follows untrusted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kvscope.core.reader.cells import min_record_bytes, scan_cells
from kvscope.core.reader.context import HeaderStop, ParseCtx, Stop, mark_bad
from kvscope.core.reader.records import KvStream, LayerRecord, Section
from kvscope.core.reader.tensor_records import (
    Expect,
    find_resync,
    header_bytes,
    looks_like_vtrans_header,
    read_record,
)
from kvscope.core.reader.tree import Node

MAX_STREAMS = 256  # LLAMA_MAX_SEQ
MAX_LAYERS = 4096
F32 = 0


@dataclass(frozen=True)
class PlanItem:
    role: str  # kv | kv_base | kv_swa | kv_attn | recurrent
    kind: str  # kv | recurrent
    layers: tuple[int, ...] | None  # model layer indices; None without a model


TailCheck = Callable[[int, int], bool]  # (offset, streams still to come in this section) -> parses?


# ---------------------------------------------------------------------------------------------
# cells


def _read_cells(ctx: ParseCtx, parent: Node, off: int, count: int, limit: int) -> tuple[KvStream | None, int]:
    """Cell table of ``count`` records; returns a stream stub holding it, and the end offset."""
    scan = scan_cells(ctx.src, off, count, ctx.ext_bytes, limit)
    table = scan.table
    assert table is not None
    if table.size:
        ctx.leaf(parent, "cells", "cell_meta", off, table.size, f"{table.count} cells")
    if not scan.ok:
        bad = scan.end
        if scan.reason == "truncated":
            raise ctx.truncated(parent, f"cell meta (record {table.count} of {count})", bad, 8 + ctx.ext_bytes)
        node = ctx.unparsed(parent, bad, limit, note="bad cell record")
        ctx.find("error", "seq_meta_invalid", bad, 8, f"cell {table.count}: implausible n_seq_id "
                 f"{ctx.src.i32(bad + 4)} at offset {bad + 4}", node or parent)
        raise Stop(limit)
    stub = KvStream(0, off, count, table)
    return stub, scan.end


def _check_cells(ctx: ParseCtx, node: Node, stream: KvStream, recurrent: bool) -> None:
    """Per-seq meta rules of the generation (llama.cpp rejects what is flagged as error here)."""
    t = stream.cells
    if t is None or t.count == 0:
        return
    if ctx.per_seq:
        want = 0 if (recurrent or not ctx.gen.n_stream) else 1
        bad = (t.n_seq != want).nonzero()[0]
        if bad.size:
            i = int(bad[0])
            rec = 8 + ctx.ext_bytes + 4 * want
            ctx.find("error", "seq_meta_invalid", t.offset + i * rec + 4, 4,
                     f"cell {i}: n_seq_id {int(t.n_seq[i])} in a per-sequence state (llama.cpp requires {want})",
                     node, count=int(bad.size))
        ids = set(t.seq_set())
        if len(ids) > 1:
            ctx.find("warning", "seq_meta_invalid", t.offset, t.size,
                     f"per-sequence state names several sequences {sorted(ids)}", node)
    if recurrent and ((ctx.per_seq and t.count > 1) or (t.seq_ids.size and np.unique(t.seq_ids).size < t.seq_ids.size)):
        ctx.find("warning", "seq_meta_invalid", t.offset, t.size,
                 "recurrent memory keeps one cell per sequence, but a sequence has several cells here", node)
    if t.seq_ids.size and (int(t.seq_ids.min()) < 0 or int(t.seq_ids.max()) >= MAX_STREAMS):
        ctx.find("error", "seq_meta_invalid", t.offset, t.size,
                 f"sequence id out of range [0, {MAX_STREAMS}): min {int(t.seq_ids.min())}, "
                 f"max {int(t.seq_ids.max())}", node)


MAX_PLAUSIBLE_CELLS = 1 << 24


def _truncated_cells(ctx: ParseCtx, node: Node, off: int, count: int, limit: int, stream: KvStream) -> None:
    """A plausible ``cell_count`` whose records run clean up to the end of the file: truncation."""
    if count > MAX_PLAUSIBLE_CELLS:
        return
    scan = scan_cells(ctx.src, off, None, ctx.ext_bytes, limit)
    if scan.table is None or scan.table.count >= count:
        return
    if scan.reason != "truncated" and scan.end + min_record_bytes(ctx.ext_bytes) <= ctx.src.size:
        return
    if scan.table.size:
        ctx.leaf(node, "cells", "cell_meta", off, scan.table.size, f"{scan.table.count} of {count} cells")
    stream.cells = scan.table
    raise ctx.truncated(node, f"cell meta ({scan.table.count} of {count} records present)", scan.end,
                        min_record_bytes(ctx.ext_bytes))


def _errors_before(ctx: ParseCtx, mark: int) -> int:
    return sum(1 for f in ctx.findings[:mark] if f.severity == "error")


def _infer_cell_count(ctx: ParseCtx, off: int, limit: int) -> int | None:
    """Records that really follow a bad ``cell_count``: a data header and a K record confirm it."""
    scan = scan_cells(ctx.src, off, None, ctx.ext_bytes, limit)
    if scan.table is None:
        return None
    n = scan.table.count
    while n > 0:
        end = off + _table_bytes(scan, n)
        v_trans, n_layer = ctx.src.u32(end), ctx.src.u32(end + 4)
        if v_trans in (0, 1) and n_layer is not None and 0 < n_layer <= MAX_LAYERS:
            probe = ctx.fork()
            try:
                read_record(probe, Node("probe", "probe", end + 8, 0), end + 8, "k", 0, n, False, None)
                return n
            except Stop:
                pass
        n -= 1
    return None


def _table_bytes(scan: object, n: int) -> int:
    from kvscope.core.reader.cells import CellScan

    assert isinstance(scan, CellScan) and scan.table is not None
    t = scan.table
    return int(8 * n + t.ext_bytes * n + 4 * int(t.n_seq[:n].sum()))


# ---------------------------------------------------------------------------------------------
# KV cache


def _kv_expects(ctx: ParseCtx, layers: tuple[int, ...] | None, v: bool) -> list[Expect] | None:
    p = ctx.profile
    if p is None or layers is None:
        return None
    if v:
        return [Expect(il, p.n_embd_v_gqa(il)) for il in layers if p.has_v(il)]
    return [Expect(il, p.n_embd_k_gqa(il)) for il in layers]


def _expected_kv_n_layer(ctx: ParseCtx, layers: tuple[int, ...] | None) -> int | None:
    if ctx.profile is None or layers is None:
        return None
    return len(layers)


def parse_kv_section(
    ctx: ParseCtx, parent: Node, off: int, limit: int, item: PlanItem, tail_ok: TailCheck | None
) -> tuple[Section, int]:
    sec_node = parent.add(Node(item.role, "section", off, 0, "llama_kv_cache", ctx.status()))
    sec = Section(item.role, "kv", off, node=sec_node)
    try:
        if ctx.gen.n_stream:
            n_stream = ctx.u32(sec_node, "n_stream", off)
            cur = off + 4
            if 1 <= n_stream <= MAX_STREAMS and n_stream * 4 > ctx.src.remaining(cur):
                raise ctx.truncated(sec_node, f"the cell counts of {n_stream} streams", cur, 4 * n_stream)
            if not 1 <= n_stream <= MAX_STREAMS:
                mark_bad(sec_node.children[-1])
                ctx.find("error", "stream_count_invalid", off, 4,
                         f"n_stream {n_stream} is not a plausible stream count (1..{MAX_STREAMS})", sec_node)
                raise Stop(off + 4)
        else:
            n_stream, cur = 1, off
        sec.n_stream = n_stream if ctx.gen.n_stream else None
        for s in range(n_stream):
            _, cur = _parse_kv_stream(ctx, sec_node, cur, limit, s, n_stream - s - 1, item, tail_ok, sec.streams)
    except Stop as stop:
        sec.trusted = False
        ctx.unparsed(sec_node, stop.offset, limit, note="after an unrecoverable error")
        sec_node.fit_to_children()
        sec.size = sec_node.size
        raise Stop(limit, sec) from None
    sec_node.fit_to_children()
    sec.size = cur - off
    sec.trusted = all(st.trusted for st in sec.streams)
    return sec, cur


def _parse_kv_stream(
    ctx: ParseCtx,
    sec_node: Node,
    off: int,
    limit: int,
    s: int,
    streams_after: int,
    item: PlanItem,
    tail_ok: TailCheck | None,
    sink: list[KvStream] | None = None,
) -> tuple[KvStream, int]:
    src = ctx.src
    node = sec_node.add(Node(f"stream{s}", "stream", off, 0, None, ctx.status()))
    stream = KvStream(s, off, 0)
    if sink is not None:  # attached first, so a stream cut short still reports what it parsed
        sink.append(stream)
    try:
        cell_count = ctx.u32(node, "cell_count", off)
        cur = off + 4
        stream.cell_count = cell_count
        if cell_count * min_record_bytes(ctx.ext_bytes) > src.remaining(cur) or cell_count > (1 << 31):
            _truncated_cells(ctx, node, cur, cell_count, limit, stream)
            inferred = _infer_cell_count(ctx, cur, limit)
            ctx.find("error", "cell_count_invalid", off, 4,
                     f"cell_count {cell_count} needs at least {cell_count * min_record_bytes(ctx.ext_bytes)} "
                     f"bytes, {src.remaining(cur)} remain"
                     + (f"; the meta table holds {inferred} records" if inferred else ""),
                     node, inferred=inferred)
            if not inferred:
                mark_bad(node.children[-1])
                raise Stop(cur)
            ctx.untrusted = True
            cell_count = inferred
            stream.cell_count = inferred
        if cell_count == 0 and ctx.gen.n_stream:
            node.fit_to_children()
            stream.end = cur
            return stream, cur
        cells_off = cur
        f_mark, n_mark = len(ctx.findings), len(node.children)
        meta_bad = False
        inferred: int | None = None
        try:
            if cell_count:
                stub, cur = _read_cells(ctx, node, cur, cell_count, limit)
                stream.cells = stub.cells if stub else None
                _check_cells(ctx, node, stream, recurrent=False)
            meta_bad = ctx.n_errors > _errors_before(ctx, f_mark)
            if meta_bad:
                raise Stop(cur)
            cur = _parse_kv_data(ctx, node, cur, limit, stream, item, streams_after, tail_ok)
        except Stop:
            # A wrong cell_count shows up as bad meta or a bad data header: if the meta table
            # really holds another number of records, say so at the count and carry on.
            header_end = (stream.cells.offset + stream.cells.size if stream.cells is not None else cells_off) + 8
            new = ctx.findings[f_mark:]
            if not new or min(f.offset for f in new) >= header_end:
                raise
            inferred = _infer_cell_count(ctx, cells_off, limit)
            if inferred is None or inferred == cell_count:
                if not (meta_bad and stream.n_layer is None):
                    raise
                # the meta table is complete but says something wrong: the data still parses
                cur = _parse_kv_data(ctx, node, cur, limit, stream, item, streams_after, tail_ok)
                inferred = None
        if inferred is not None:
            del ctx.findings[f_mark:]
            del node.children[n_mark:]
            ctx.find("error", "cell_count_invalid", off, 4,
                     f"cell_count {cell_count}, but the meta table holds {inferred} records "
                     "(the data header follows them)", node, inferred=inferred)
            ctx.untrusted = True
            stream.cell_count = inferred
            stream.k_layers, stream.v_layers = [], []
            cur = cells_off
            if inferred:
                stub, cur = _read_cells(ctx, node, cur, inferred, limit)
                stream.cells = stub.cells if stub else None
            cur = _parse_kv_data(ctx, node, cur, limit, stream, item, streams_after, tail_ok)
    except Stop:
        stream.trusted = False
        node.fit_to_children()
        raise
    stream.trusted = stream.trusted and not ctx.untrusted
    node.fit_to_children()
    stream.end = cur
    return stream, cur


def _parse_kv_data(
    ctx: ParseCtx,
    node: Node,
    off: int,
    limit: int,
    stream: KvStream,
    item: PlanItem,
    streams_after: int,
    tail_ok: TailCheck | None,
) -> int:
    v_trans = ctx.u32(node, "v_trans", off)
    if v_trans not in (0, 1):
        mark_bad(node.children[-1])
        ctx.find("error", "value_invalid", off, 4, f"v_trans {v_trans} is neither 0 nor 1", node)
        raise Stop(off + 4)
    n_layer = ctx.u32(node, "n_layer", off + 4)
    stream.v_trans, stream.n_layer = v_trans, n_layer
    cur = off + 8
    want_layers = _expected_kv_n_layer(ctx, item.layers)
    n_k = n_layer
    if want_layers is not None and n_layer != want_layers:
        ctx.find("error", "layer_count_mismatch", off + 4, 4,
                 f"n_layer {n_layer}, the model's {item.role} cache has {want_layers} layers", node,
                 expected=want_layers)
        n_k = want_layers
    elif n_layer <= MAX_LAYERS and n_layer * 12 > ctx.src.remaining(cur):
        raise ctx.truncated(node, f"the records of {n_layer} layers", cur, 12 * n_layer)
    elif n_layer > MAX_LAYERS:
        mark_bad(node.children[-1])
        ctx.find("error", "value_invalid", off + 4, 4, f"n_layer {n_layer} is implausible", node)
        raise Stop(off + 8)
    k_exp = _kv_expects(ctx, item.layers, v=False)
    v_exp = _kv_expects(ctx, item.layers, v=True)
    n_v = len(v_exp) if v_exp is not None else n_k
    rows = stream.cell_count
    plain_kv = item.role == "kv"

    def expect(lst: list[Expect] | None, j: int) -> Expect | None:
        if lst is not None:
            return lst[j] if j < len(lst) else None
        return Expect(j, None) if plain_kv else None

    j = 0
    while j < n_k:
        if v_trans and stream.k_layers and looks_like_vtrans_header(ctx, cur, rows, expect(v_exp, 0)):
            _missing(ctx, node, cur, "K", j, n_k, k_exp, stream)
            break
        try:
            rec, cur = read_record(ctx, node, cur, "k", j, rows, False, expect(k_exp, j))
            stream.k_layers.append(rec)
            j += 1
        except HeaderStop:
            cur, j = _resync(ctx, node, cur, limit, stream, "k", j)
    j = 0
    while j < n_v:
        f_mark, n_mark = len(ctx.findings), len(node.children)
        try:
            rec, cur = read_record(ctx, node, cur, "v", j, rows, bool(v_trans), expect(v_exp, j))
            stream.v_layers.append(rec)
            j += 1
        except Stop as stop:
            if (j == 0 and v_trans and isinstance(stop, HeaderStop) and stream.k_layers
                    and ctx.src.raw(cur, 12) == header_bytes(stream.k_layers[-1])):
                del ctx.findings[f_mark:]
                del node.children[n_mark:]
                cur = _extra_k_records(ctx, node, cur, stream, rows, off + 4)
                n_v = len(stream.k_layers)
                continue
            header_bad = isinstance(stop, HeaderStop) or not ctx.src.has(cur, 12)
            if not header_bad:
                raise
            if tail_ok is not None and tail_ok(cur, streams_after):
                # the "bad header" is the next structure (or the end of the file): records are missing
                at_eof = cur >= ctx.src.size
                del ctx.findings[f_mark:]
                del node.children[n_mark:]
                _missing(ctx, node, cur, "V", j, n_v, v_exp, stream, or_k=not v_trans, at_eof=at_eof)
                return cur
            if not isinstance(stop, HeaderStop):
                raise
            cur, j = _resync(ctx, node, cur, limit, stream, "v", j)
    return cur


def _extra_k_records(ctx: ParseCtx, node: Node, off: int, stream: KvStream, rows: int, n_layer_off: int) -> int:
    """More K records follow than ``n_layer`` says: read them and flag the count."""
    n_before = len(stream.k_layers)
    pat = header_bytes(stream.k_layers[-1])
    while ctx.src.raw(off, 12) == pat:
        rec, off = read_record(ctx, node, off, "k", len(stream.k_layers), rows, False, None)
        stream.k_layers.append(rec)
    ctx.find("error", "layer_count_mismatch", n_layer_off, 4,
             f"n_layer says {n_before}, but {len(stream.k_layers)} K records follow", node,
             found=len(stream.k_layers))
    stream.trusted = False
    return off


def _missing(
    ctx: ParseCtx,
    node: Node,
    off: int,
    what: str,
    j: int,
    n: int,
    exps: list[Expect] | None,
    stream: KvStream,
    or_k: bool = False,
    at_eof: bool = False,
) -> None:
    count = n - j
    ils = [e.il for e in exps if e.il is not None] if exps is not None else list(range(n))
    layer = ils[j] if j < len(ils) else None
    role = "K or V" if or_k else what
    msg = (f"n_layer counts {n} {what} records but only {j} are present: {count} {role} record(s) missing"
           " (the PR #21576 pattern)")
    if ils:
        msg += (f". The records are alike, so the bytes cannot tell which layer's record was dropped: "
                f"the first empty slot is layer {layer} (candidates: layers {ils[0]}..{ils[-1]})")
    if at_eof:
        msg += "; or the file was cut exactly at a record boundary"
    ctx.find("error", "missing_layer", off, 0, msg, node, layer, missing=count, role=what.lower(),
             candidates=ils)
    stream.trusted = False


def _resync(ctx: ParseCtx, node: Node, off: int, limit: int, stream: KvStream, role: str, j: int) -> tuple[int, int]:
    """After a bad record header at ``off``: resume at the next header shaped like its neighbours."""
    done = stream.k_layers if role == "k" else stream.v_layers
    patterns = [header_bytes(done[-1])] if done else []
    if role == "k" and stream.k_layers:
        patterns.append(header_bytes(stream.k_layers[0]))
    hit = find_resync(ctx, off + 1, limit, patterns) if patterns else -1
    if hit < 0:
        raise Stop(off + 12)
    node.children.pop()  # the layer node holding only the bad header becomes part of the gap
    ctx.unparsed(node, off, hit, note=f"bad {role.upper()} record; resynced at {hit}")
    ctx.find("warning", "resynced", off, hit - off,
             f"skipped {hit - off} bytes after a bad {role.upper()} record; parsing resumes at offset {hit} "
             "(untrusted)", node)
    ctx.untrusted = True
    stream.trusted = False
    return hit, j + 1


# ---------------------------------------------------------------------------------------------
# recurrent


def parse_recurrent_section(
    ctx: ParseCtx, parent: Node, off: int, limit: int, item: PlanItem
) -> tuple[Section, int]:
    sec_node = parent.add(Node(item.role, "section", off, 0, "llama_memory_recurrent", ctx.status()))
    sec = Section(item.role, "recurrent", off, node=sec_node)
    src = ctx.src
    p = ctx.profile
    try:
        cell_count = ctx.u32(sec_node, "cell_count", off)
        cur = off + 4
        if cell_count * 8 > src.remaining(cur):
            saved_ext, ctx.ext_bytes = ctx.ext_bytes, 0
            try:
                stub = KvStream(0, off, cell_count)
                _truncated_cells(ctx, sec_node, cur, cell_count, limit, stub)
            finally:
                ctx.ext_bytes = saved_ext
            ctx.find("error", "cell_count_invalid", off, 4,
                     f"cell_count {cell_count} needs at least {cell_count * 8} bytes, {src.remaining(cur)} remain",
                     sec_node)
            mark_bad(sec_node.children[-1])
            raise Stop(cur)
        sec.cell_count = cell_count
        if cell_count:
            saved_ext, ctx.ext_bytes = ctx.ext_bytes, 0
            try:
                stub, cur = _read_cells(ctx, sec_node, cur, cell_count, limit)
            finally:
                ctx.ext_bytes = saved_ext
            sec.cells = stub.cells if stub else None
            _check_cells(ctx, sec_node, KvStream(0, off, cell_count, sec.cells), recurrent=True)
        s_trans = ctx.u32(sec_node, "s_trans", cur)
        sec.s_trans = s_trans
        if s_trans != 0:
            mark_bad(sec_node.children[-1])
            ctx.find("error", "value_invalid", cur, 4, f"s_trans {s_trans}: llama.cpp only reads 0", sec_node)
            raise Stop(cur + 4)
        n_layer = ctx.u32(sec_node, "n_layer", cur + 4)
        sec.n_layer_written = n_layer
        cur += 8
        if p is not None and n_layer != p.n_layer:
            ctx.find("error", "layer_count_mismatch", cur - 4, 4,
                     f"n_layer {n_layer}: llama.cpp writes the model's layer count {p.n_layer}", sec_node,
                     expected=p.n_layer)
        elif p is None and (n_layer > MAX_LAYERS or n_layer == 0):
            mark_bad(sec_node.children[-1])
            ctx.find("error", "value_invalid", cur - 4, 4, f"n_layer {n_layer} is implausible", sec_node)
            raise Stop(cur)
        if p is not None and item.layers is not None:
            layers = list(item.layers)
            r_exp: list[Expect | None] = [Expect(il, p.n_embd_r, F32) for il in layers]
            s_exp: list[Expect | None] = [Expect(il, p.n_embd_s, F32) for il in layers]
            cur = _read_rs(ctx, sec_node, cur, sec, "r", r_exp, cell_count)
            cur = _read_rs(ctx, sec_node, cur, sec, "s", s_exp, cell_count)
        else:
            cur = _read_rs_structural(ctx, sec_node, cur, limit, sec, cell_count, n_layer)
    except Stop as stop:
        sec.trusted = False
        ctx.unparsed(sec_node, stop.offset, limit, note="after an unrecoverable error")
        sec_node.fit_to_children()
        sec.size = sec_node.size
        raise Stop(limit, sec) from None
    sec_node.fit_to_children()
    sec.size = cur - off
    return sec, cur


def _read_rs(
    ctx: ParseCtx, node: Node, off: int, sec: Section, role: str, exps: list[Expect | None], rows: int
) -> int:
    out = sec.r_layers if role == "r" else sec.s_layers
    for j, e in enumerate(exps):
        rec, off = read_record(ctx, node, off, role, j, rows, False, e, allow_zero_row=True)
        out.append(rec)
    return off


def _read_rs_structural(
    ctx: ParseCtx, node: Node, off: int, limit: int, sec: Section, rows: int, n_layer: int
) -> int:
    """Without a model: read record-shaped headers up to the end, then split them r | s."""
    recs: list[LayerRecord] = []
    cur = off
    while len(recs) < 2 * n_layer and cur < limit:
        probe = ctx.fork()
        scratch = Node("scratch", "scratch", cur, 0)
        try:
            read_record(probe, scratch, cur, "r", len(recs), rows, False, None, allow_zero_row=True)
        except Stop:
            if any(f.code == "truncated" for f in probe.findings):  # cut inside a record: say so
                read_record(ctx, node, cur, "r", len(recs), rows, False, None, allow_zero_row=True)
            break
        rec, cur = read_record(ctx, node, cur, "r", len(recs), rows, False, None, allow_zero_row=True)
        recs.append(rec)
    half = len(recs) // 2
    consistent = (
        bool(recs)
        and len(recs) % 2 == 0
        and len({r.row_bytes for r in recs[:half]}) == 1
        and len({r.row_bytes for r in recs[half:]}) == 1
    )
    if not consistent:
        if cur < limit:  # the next record is bad or cut: let the real read say how
            read_record(ctx, node, cur, "r", len(recs), rows, False, None, allow_zero_row=True)
        ctx.find("error", "unparsed", cur, ctx.src.remaining(cur),
                 f"recurrent section: {len(recs)} state records found, expected r and s records in pairs", node)
        raise Stop(cur)
    half = len(recs) // 2
    for i, rec in enumerate(recs):
        if i >= half:
            rec.role, rec.index = "s", i - half
            if rec.node is not None:
                rec.node.name = f"s{i - half}"
                for c in rec.node.children:
                    if c.kind == "r_rows":
                        c.kind = "s_rows"
        else:
            rec.index = i
    sec.r_layers = recs[:half]
    sec.s_layers = recs[half:]
    return cur


# ---------------------------------------------------------------------------------------------
# a whole memory state: planned (model) or structural (no model)


def _parse_section(
    ctx: ParseCtx, parent: Node, off: int, limit: int, item: PlanItem, tail_ok: TailCheck | None
) -> tuple[Section, int]:
    if item.kind == "kv":
        return parse_kv_section(ctx, parent, off, limit, item, tail_ok)
    return parse_recurrent_section(ctx, parent, off, limit, item)


def _tail_check(ctx: ParseCtx, item: PlanItem, rest: list[PlanItem], limit: int) -> TailCheck:
    """Does the rest of the state parse cleanly from an offset (used to spot missing records)?"""

    def check(off: int, streams_after: int) -> bool:
        probe = ctx.fork()
        scratch = Node("scratch", "scratch", off, 0)
        try:
            for s in range(streams_after):
                _, off = _parse_kv_stream(probe, scratch, off, limit, s, 0, item, None)
            for it in rest:
                _, off = _parse_section(probe, scratch, off, limit, it, None)
        except Stop:
            return False
        return probe.n_errors == 0 and (off == limit or not rest and streams_after == 0 and off == ctx.src.size)

    return check


def parse_memory(
    ctx: ParseCtx, parent: Node, off: int, limit: int, plan: list[PlanItem] | None
) -> tuple[list[Section], int]:
    """Parse the memory sections at ``off``; returns them and the offset where they end."""
    mem = parent.add(Node("memory", "memory", off, 0, None, ctx.status()))
    sections: list[Section] = []
    cur = off
    try:
        if plan is not None:
            for i, item in enumerate(plan):
                tail = _tail_check(ctx, item, plan[i + 1 :], limit)
                sec, cur = _parse_section(ctx, mem, cur, limit, item, tail)
                sections.append(sec)
        else:
            cur = _parse_structural(ctx, mem, cur, limit, sections)
    except Stop as stop:
        cur = limit
        if stop.section is not None and stop.section not in sections:
            sections.append(stop.section)
    if mem.children:
        mem.fit_to_children()
    else:
        parent.children.remove(mem)
    return sections, cur


_STRUCTURAL_ROLES = {
    ("kv",): ["kv"],
    ("recurrent",): ["recurrent"],
    ("kv", "kv"): ["kv_base", "kv_swa"],
    ("kv", "recurrent"): ["kv_attn", "recurrent"],
    ("kv", "kv", "recurrent"): ["kv_base", "kv_swa", "recurrent"],
}


def _try(ctx: ParseCtx, off: int, limit: int, kind: str) -> tuple[ParseCtx, Node, Section | None, int, bool]:
    probe = ctx.fork()
    scratch = Node("scratch", "scratch", off, 0)

    def at_end(o: int, streams_after: int) -> bool:  # without a plan, only the end of the file is sure
        return streams_after == 0 and o == limit

    try:
        sec, end = _parse_section(probe, scratch, off, limit, PlanItem(kind, kind, None), at_end)
        return probe, scratch, sec, end, probe.n_errors == 0
    except Stop as stop:
        return probe, scratch, stop.section, limit, False


def _explained(scratch: Node) -> int:
    return sum(leaf.size for leaf in scratch.leaves() if leaf.status in ("parsed", "untrusted") and leaf is not scratch)


def _prefer_kv(sec_kv: Section) -> bool:
    """Old layouts write recurrent state as a KV cache: tell them apart by record shapes."""
    for st in sec_kv.streams:
        if st.v_trans:
            return True
        if st.k_layers and st.v_layers and st.k_layers[0].row_bytes == st.v_layers[0].row_bytes:
            return True
    return False


def _parse_structural(ctx: ParseCtx, mem: Node, off: int, limit: int, sections: list[Section]) -> int:
    kinds: list[str] = []
    cur = off
    while cur < limit and len(kinds) < 3:
        options = ["kv", "recurrent"] if (not kinds or kinds[-1] == "kv") else []
        if len(kinds) == 2:
            options = ["recurrent"]
        tries = [(k, *_try(ctx, cur, limit, k)) for k in options]
        good = [t for t in tries if t[5]]
        if not good and kinds:  # a following section cut short by the end of the file is still one
            good = [t for t in tries if t[2] is not None and t[4] == limit
                    and all(f.code == "truncated" for f in t[1].findings if f.severity == "error")
                    and _explained(t[2]) > 0]
            if good:
                good = [max(good, key=lambda t: _explained(t[2]))]
        if len(good) == 2:
            kv_try = next(t for t in good if t[0] == "kv")
            assert kv_try[3] is not None
            good = [kv_try] if _prefer_kv(kv_try[3]) else [t for t in good if t[0] == "recurrent"]
        if good:
            pick = max(good, key=lambda t: (t[4], _explained(t[2])))
        elif not kinds and tries:
            pick = max(tries, key=lambda t: (_explained(t[2]) * 4 // max(1, limit - cur), -t[1].n_errors,
                                             _explained(t[2])))
        else:
            break
        kind, probe, scratch, sec, end, ok = pick
        for child in scratch.children:
            mem.add(child)
        ctx.findings.extend(probe.findings)
        ctx.untrusted = ctx.untrusted or probe.untrusted
        if sec is None:
            raise Stop(limit)
        sections.append(sec)
        kinds.append(kind)
        cur = end
        if not ok and end >= limit:
            break
    roles = _STRUCTURAL_ROLES.get(tuple(kinds), kinds)
    for sec, role in zip(sections, roles, strict=False):
        sec.role = role
        sec.role_certain = len(sections) > 1 or not ctx.per_seq
        if sec.node is not None:
            sec.node.name = role
    if sections and not sections[-1].trusted and cur < limit:
        raise Stop(limit)
    return cur
