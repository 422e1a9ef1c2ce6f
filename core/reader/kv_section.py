"""``llama_kv_cache`` state: n_stream, per-stream cells, v_trans, n_layer and K/V records.

Besides reading well-formed sections it recognises the damage patterns seen in the field: a
dropped K or V record while ``n_layer`` still counts it (llama.cpp PR #21576), more K records
than ``n_layer`` says, a wrong ``cell_count``, and a garbled record header (resync on the next
header shaped like its neighbours; what follows is marked untrusted).
"""

from __future__ import annotations

from kvscope.core import ggml_types as gt
from kvscope.core.reader.cells import min_record_bytes
from kvscope.core.reader.context import HeaderStop, ParseCtx, Stop, mark_bad
from kvscope.core.reader.meta import (
    MAX_LAYERS,
    MAX_STREAMS,
    PlanItem,
    TailCheck,
    check_cells,
    errors_before,
    give_up,
    infer_cell_count,
    read_cells,
    truncated_cells,
)
from kvscope.core.reader.records import KvStream, Section
from kvscope.core.reader.tensor_records import (
    Expect,
    find_resync,
    header_bytes,
    looks_like_vtrans_header,
    read_record,
)
from kvscope.core.reader.tree import Node
from kvscope.core.textsafe import plural


def _kv_expects(ctx: ParseCtx, item: PlanItem, v: bool) -> list[Expect] | None:
    """The records the model plans for this section (K, or V), with their row elements."""
    p, layers, sec = ctx.profile, item.layers, item.sec
    if p is None or layers is None:
        return None
    if v:
        if sec is not None and sec.v_elems is not None:
            return [Expect(il, n) for il, n in zip(layers, sec.v_elems, strict=False)]
        return [Expect(il, p.n_embd_v_gqa(il)) for il in layers if p.has_v(il)]
    if sec is not None and sec.k_elems is not None:
        return [Expect(il, n) for il, n in zip(layers, sec.k_elems, strict=True)]
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
            _, cur = parse_kv_stream(ctx, sec_node, cur, limit, s, n_stream - s - 1, item, tail_ok, sec.streams)
    except Stop as stop:
        raise give_up(ctx, sec, stop, limit) from None
    sec_node.fit_to_children()
    sec.size = cur - off
    sec.trusted = all(st.trusted for st in sec.streams)
    return sec, cur


def parse_kv_stream(
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
            truncated_cells(ctx, node, cur, cell_count, limit, stream)
            inferred = infer_cell_count(ctx, cur, limit)
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
        inferred = None
        try:
            if cell_count:
                cur = read_cells(ctx, node, cur, cell_count, limit, stream)
                check_cells(ctx, node, stream, recurrent=False)
            meta_bad = ctx.n_errors > errors_before(ctx, f_mark)
            if meta_bad:
                raise Stop(cur)
            cur = _parse_kv_data(ctx, node, cur, limit, stream, item, streams_after, tail_ok)
        except Stop:
            # A wrong cell_count shows up as bad meta or a bad data header: if the meta table
            # really holds another number of records, say so at the count and carry on.
            header_end = ((stream.cells.offset + stream.cells.size if stream.cells is not None else cells_off)
                          + ctx.gen.kv_data_header)
            new = ctx.findings[f_mark:]
            if not new or min(f.offset for f in new) >= header_end:
                raise
            inferred = infer_cell_count(ctx, cells_off, limit)
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
                cur = read_cells(ctx, node, cur, inferred, limit, stream)
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
    stream.data_offset = off
    v_trans = ctx.u32(node, "v_trans", off)
    if v_trans not in (0, 1):
        mark_bad(node.children[-1])
        ctx.find("error", "value_invalid", off, 4, f"v_trans {v_trans} is neither 0 nor 1", node)
        raise Stop(off + 4)
    n_layer = ctx.u32(node, "n_layer", off + 4)
    stream.v_trans, stream.n_layer = v_trans, n_layer
    cur = off + 8
    want_layers = _expected_kv_n_layer(ctx, item.layers)
    if n_layer > MAX_LAYERS and want_layers is None:
        mark_bad(node.children[-1])
        ctx.find("error", "value_invalid", off + 4, 4, f"n_layer {n_layer} is implausible", node)
        raise Stop(off + 8)
    if ctx.gen.kv_rot:
        cur = _read_rot(ctx, node, cur, stream)
    n_k = n_layer
    if want_layers is not None and n_layer != want_layers:
        ctx.find("error", "layer_count_mismatch", off + 4, 4,
                 f"n_layer {n_layer}, the model's {item.role} cache has {want_layers} layers", node,
                 expected=want_layers)
        n_k = want_layers
    elif n_layer * 12 > ctx.src.remaining(cur):
        raise ctx.truncated(node, f"the records of {n_layer} layers", cur, 12 * n_layer)
    k_exp = _kv_expects(ctx, item, v=False)
    v_exp = _kv_expects(ctx, item, v=True)
    n_v = len(v_exp) if v_exp is not None else n_k
    if item.sec is not None and item.sec.k_only:
        n_v = 0
    rows = stream.cell_count
    plain_kv = item.role == "kv"

    def expect(lst: list[Expect] | None, j: int) -> Expect | None:
        if lst is not None:
            return lst[j] if j < len(lst) else None
        return Expect(j, None) if plain_kv else None

    _prefetch_headers(ctx, cur, rows, n_k + n_v)
    k_only = n_v == 0 or (item.sec is not None and item.sec.k_only)
    j = 0
    while j < n_k:
        if v_trans and stream.k_layers and looks_like_vtrans_header(ctx, cur, rows, expect(v_exp, 0)):
            _missing(ctx, node, cur, "K", j, n_k, k_exp, stream)
            break
        f_mark, n_mark = len(ctx.findings), len(node.children)
        try:
            rec, cur = read_record(ctx, node, cur, "k", j, rows, False, expect(k_exp, j))
            stream.k_layers.append(rec)
            j += 1
        except Stop as stop:
            if stream.k_layers and (k_only or v_exp is None):
                planned = item.sec is not None or item.layers is not None
                ends = _k_records_end(ctx, cur, limit, streams_after, tail_ok, k_only, planned)
                if ends is not None:
                    # a K-only cache whose next structure starts where a K record should: n_layer
                    # counts records that are not there (the PR #21576 pattern in an MLA-shaped cache)
                    del ctx.findings[f_mark:]
                    del node.children[n_mark:]
                    _missing(ctx, node, cur, "K", j, n_k, k_exp, stream, at_eof=ends == "eof")
                    ctx.k_only_seen = True
                    return cur
            if not isinstance(stop, HeaderStop):
                raise
            cur, j = _resync(ctx, node, cur, limit, stream, "k", j)
    if (v_exp is None and n_v and stream.k_layers and not _v_header_like_k(ctx, cur, stream, bool(v_trans))
            and _k_only(ctx, cur, limit, streams_after)
            and not _v_reading_continues(ctx, cur, limit, rows, bool(v_trans), n_v, streams_after)):
        # what follows the K records reads as V records only by accident (the next section's
        # first words can look like a record header): this is a K-only (MLA-shaped) cache
        ctx.k_only_seen = True
        return cur
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
            if j == 0 and v_exp is None and stream.k_layers and _k_only(ctx, cur, limit, streams_after):
                # no V record at all, and what follows is the next structure: a K-only (MLA) cache
                del ctx.findings[f_mark:]
                del node.children[n_mark:]
                ctx.k_only_seen = True
                return cur
            if (j == 0 and v_exp is None and len(stream.k_layers) == n_k and not streams_after
                    and cur >= ctx.src.size):
                # the file ends right after a complete set of K records: a K-only cache, or one cut
                # before its V records -- only the model can tell
                del ctx.findings[f_mark:]
                del node.children[n_mark:]
                ctx.find("info", "unconfirmed_end", cur, 0,
                         "the last cache holds K records only and ends the file: an MLA-shaped (K-only) cache, "
                         "or one cut right before its V records; give the model (--model) to check", node)
                ctx.k_only_seen = True
                return cur
            if tail_ok is not None and tail_ok(cur, streams_after):
                # the "bad header" is the next structure (or the end of the file): records are missing
                at_eof = cur >= ctx.src.size
                if not at_eof:  # at the very end, the truncation finding stays: both readings are possible
                    del ctx.findings[f_mark:]
                    del node.children[n_mark:]
                _missing(ctx, node, cur, "V", j, n_v, v_exp, stream, or_k=not v_trans, at_eof=at_eof)
                return cur
            if not isinstance(stop, HeaderStop):
                raise
            cur, j = _resync(ctx, node, cur, limit, stream, "v", j)
    return cur


MAX_N_ROT = 1 << 16


def _v_header_like_k(ctx: ParseCtx, off: int, stream: KvStream, v_trans: bool) -> bool:
    """Is a V record header of the K records' type and width at ``off`` (the common K+V cache)?"""
    k = stream.k_layers[0]
    t = ctx.src.i32(off)
    if t != k.type_id or not gt.is_known_type(t):
        return False
    if v_trans:
        return ctx.src.u32(off + 4) == gt.type_size(t)
    return ctx.src.u64(off + 4) == k.row_bytes


def _k_records_end(
    ctx: ParseCtx, off: int, limit: int, streams_after: int, tail_ok: TailCheck | None, k_only: bool,
    planned: bool,
) -> str | None:
    """Does this (K-only) stream's data end at ``off`` although n_layer counts more K records?

    "next" when the rest of the state (the plan's; without a plan, the next stream or section)
    parses cleanly from there, "eof" when the file ends there; None otherwise. A cache no model
    says is K-only ends there only if what follows is no V record either.
    """
    if off >= ctx.src.size and not streams_after:
        return "eof" if k_only or ctx.k_only_seen else None
    if tail_ok is not None and tail_ok(off, streams_after):
        return "next"
    if not planned and _next_structure(ctx, off, limit, streams_after, k_only=True):
        return "next"
    return None


def _k_only(ctx: ParseCtx, off: int, limit: int, streams_after: int) -> bool:
    """Without a model: does a K-only cache end at ``off`` (the next stream or section starts there)?

    At the very end of the file a K-only cache and a cache cut before its V records look alike;
    it is taken as K-only only when another section of this state was K-only already (an MLA
    model's caches all are).
    """
    if off >= limit:
        return off >= ctx.src.size and ctx.k_only_seen
    return _next_structure(ctx, off, limit, streams_after, k_only=True)


def _next_structure(ctx: ParseCtx, off: int, limit: int, streams_after: int, k_only: bool) -> bool:
    """Does the next stream of this section (or, after the last, another section) parse cleanly at ``off``?"""
    if off >= limit:
        return off >= ctx.src.size and not streams_after
    attempts = ["stream"] if streams_after else ["kv", "recurrent"]
    for attempt in attempts:
        probe = ctx.fork()
        probe.k_only_seen = probe.k_only_seen or k_only  # supposing this cache is K-only, later ones may be
        scratch = Node("probe", "probe", off, 0)
        try:
            if attempt == "stream":
                parse_kv_stream(probe, scratch, off, limit, 0, streams_after - 1, PlanItem("kv", "kv", None), None)
            elif attempt == "kv":
                parse_kv_section(probe, scratch, off, limit, PlanItem("kv", "kv", None), None)
            else:
                probe.parse_bare("recurrent", scratch, off, limit)
        except Stop:
            # a next structure cut short by the end of the file still is one
            errors = [f for f in probe.findings if f.severity == "error"]
            if errors and all(f.code == "truncated" for f in errors) and limit >= ctx.src.size:
                return True
            continue
        # a next stream that lacks records of its own (named by the same rule) still is one
        if all(f.code == "missing_layer" for f in probe.findings if f.severity == "error"):
            return True
    return False


def _v_reading_continues(
    ctx: ParseCtx, off: int, limit: int, rows: int, v_trans: bool, n_v: int, streams_after: int
) -> bool:
    """Without a model: read as ``n_v`` V records, is what follows them a proper continuation?"""
    probe = ctx.fork()
    scratch = Node("probe", "probe", off, 0)
    cur = off
    try:
        for j in range(n_v):
            _, cur = read_record(probe, scratch, cur, "v", j, rows, v_trans, None)
    except Stop:
        return False
    return probe.n_errors == 0 and _next_structure(ctx, cur, limit, streams_after, k_only=False)


def _read_rot(ctx: ParseCtx, node: Node, off: int, stream: KvStream) -> int:
    """``u32 n_rot_k, u32 n_rot_v`` (v11/v4): 0, or the Hadamard block size (a power of two >= 64)."""
    for name, o in (("n_rot_k", off), ("n_rot_v", off + 4)):
        v = ctx.u32(node, name, o)
        if v and (v < 64 or v & (v - 1) or v > MAX_N_ROT):
            mark_bad(node.children[-1])
            ctx.find("error", "value_invalid", o, 4, f"{name} {v} is neither 0 nor a power of two >= 64 "
                     "(the Hadamard rotation block size)", node, layout_field=True)
            raise Stop(o + 4)
        setattr(stream, name, v)
    return off + 8


def _prefetch_headers(ctx: ParseCtx, off: int, rows: int, n_records: int) -> None:
    """Predict where the record headers lie (records alike in size) and prefetch those pages."""
    t = ctx.src.i32(off)
    row = ctx.src.u64(off + 4)
    if t is None or row is None or not rows or n_records < 4 or row * rows < (1 << 20):
        return
    size = 12 + row * rows
    ctx.src.prefetch([off + i * size for i in range(n_records)])


def _extra_k_records(ctx: ParseCtx, node: Node, off: int, stream: KvStream, rows: int, n_layer_off: int) -> int:
    """More K records follow than ``n_layer`` says: read them and flag the count."""
    n_before = len(stream.k_layers)
    pat = header_bytes(stream.k_layers[-1])
    while ctx.src.raw(off, 12) == pat:
        rec, off = read_record(ctx, node, off, "k", len(stream.k_layers), rows, False, None)
        stream.k_layers.append(rec)
    found = len(stream.k_layers)
    earlier = next((f for f in ctx.findings if f.code == "layer_count_mismatch" and f.offset == n_layer_off), None)
    if earlier is not None:  # n_layer disagreed with the model already: say what the records show
        earlier.message += f"; the file holds {found} K records, as its n_layer says"
        earlier.extra["found"] = found
    else:
        ctx.find("error", "layer_count_mismatch", n_layer_off, 4,
                 f"n_layer says {n_before}, but {found} K records follow", node, found=found)
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
    msg = (f"n_layer counts {n} {what} records but only {j} are present: {plural(count, role + ' record')} missing"
           " (the PR #21576 pattern)")
    if ils:
        msg += (f". The records are alike, so the bytes cannot tell which layer's record was dropped: "
                f"the first empty slot is layer {layer} (candidates: layers {ils[0]}..{ils[-1]})")
    if at_eof:
        msg = ("the file ends exactly where a record would start: it was cut at a record boundary, or "
               + msg[0].lower() + msg[1:])
    ctx.find("warning" if at_eof else "error", "missing_layer", off, 0, msg, node, layer, missing=count,
             role=what.lower(), candidates=ils)
    stream.trusted = False


def _next_by_own_row(ctx: ParseCtx, off: int, limit: int, stream: KvStream, role: str) -> int:
    """The first record of its kind has a bad header and no record before it gives a pattern: where its own
    row size puts the next header, when a header of a known type and that same row size stands there (one
    field of the header is damaged, its row size is not); -1 otherwise. Not for transposed V records."""
    if role != "k" and stream.v_trans:
        return -1
    row, rows = ctx.src.u64(off + 4), stream.cell_count
    if not row or not rows or row * rows > limit - off - 24:
        return -1
    nxt = off + 12 + row * rows
    t = ctx.src.i32(nxt)
    if t is None or not gt.is_known_type(t) or ctx.src.u64(nxt + 4) != row:
        return -1
    ts = gt.type_size(t)
    return nxt if ts and row % ts == 0 else -1


def _resync(ctx: ParseCtx, node: Node, off: int, limit: int, stream: KvStream, role: str, j: int) -> tuple[int, int]:
    """After a bad record header at ``off``: resume at the next header shaped like its neighbours."""
    done = stream.k_layers if role == "k" else stream.v_layers
    patterns = [header_bytes(done[-1])] if done else []
    if role == "k" and stream.k_layers:
        patterns.append(header_bytes(stream.k_layers[0]))
    # the next header sits one record further; look a few records ahead, never the whole file
    rec_size = max((r.size for r in done), default=12)
    hit = find_resync(ctx, off + 1, min(limit, off + 4 * rec_size + 64), patterns) if patterns else -1
    if hit < 0 and not done:
        hit = _next_by_own_row(ctx, off, limit, stream, role)
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
