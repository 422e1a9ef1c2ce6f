"""``llama_memory_recurrent`` state: cells, s_trans, n_layer (all model layers), r and s records.

With a model the records map to its recurrent layers; without one they are read while they
look like records and split into r and s halves whose row sizes must each be uniform.
"""

from __future__ import annotations

from kvscope.core import ggml_types as gt
from kvscope.core.reader.context import ParseCtx, Stop, mark_bad
from kvscope.core.reader.layouts import recurrent_n_layers
from kvscope.core.reader.meta import (
    MAX_LAYERS,
    PlanItem,
    check_cells,
    give_up,
    infer_cell_count,
    read_cells,
    truncated_cells,
)
from kvscope.core.reader.record_names import finding_name, record_node_name, section_of_path
from kvscope.core.reader.records import KvStream, LayerRecord, Section
from kvscope.core.reader.tensor_records import Expect, read_record
from kvscope.core.reader.tree import Node

F32 = 0

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
        sec.cell_count = cell_count
        if cell_count * 8 > src.remaining(cur):
            with ctx.cell_ext(0):
                truncated_cells(ctx, sec_node, cur, cell_count, limit, sec)
                inferred = infer_cell_count(ctx, cur, limit, data_header=8)
            ctx.find("error", "cell_count_invalid", off, 4,
                     f"cell_count {cell_count} needs at least {cell_count * 8} bytes, {src.remaining(cur)} remain"
                     + (f"; the meta table holds {inferred} records" if inferred else ""), sec_node,
                     inferred=inferred)
            if not inferred:
                mark_bad(sec_node.children[-1])
                raise Stop(cur)
            ctx.untrusted = True
            cell_count = inferred
        sec.cell_count = cell_count
        if cell_count:
            with ctx.cell_ext(0):
                cur = read_cells(ctx, sec_node, cur, cell_count, limit, sec)
            check_cells(ctx, sec_node, KvStream(0, off, cell_count, sec.cells), recurrent=True)
        s_trans = ctx.u32(sec_node, "s_trans", cur)
        sec.s_trans = s_trans
        if s_trans != 0:
            mark_bad(sec_node.children[-1])
            ctx.find("error", "value_invalid", cur, 4, f"s_trans {s_trans}: llama.cpp only reads 0", sec_node)
            raise Stop(cur + 4)
        n_layer = ctx.u32(sec_node, "n_layer", cur + 4)
        sec.n_layer_written = n_layer
        cur += 8
        wants = recurrent_n_layers(ctx.gen, p.n_layer, p.n_layer_nextn) if p is not None else ()
        if p is not None and n_layer not in wants:
            why = (f"the model's layer count {p.n_layer}" if wants == (p.n_layer,) else
                   f"the model's trunk layer count {wants[0]} (its {p.n_layer} blocks less "
                   f"{p.n_layer_nextn} MTP)" + (f" or, before b9544, {p.n_layer}" if len(wants) > 1 else ""))
            ctx.find("error", "layer_count_mismatch", cur - 4, 4, f"n_layer {n_layer}: llama.cpp writes {why}",
                     sec_node, expected=wants[0])
        elif p is None and (n_layer > MAX_LAYERS or n_layer == 0):
            mark_bad(sec_node.children[-1])
            ctx.find("error", "value_invalid", cur - 4, 4, f"n_layer {n_layer} is implausible", sec_node)
            raise Stop(cur)
        if p is not None and item.layers is not None:
            layers = list(item.layers)
            r_exp: list[Expect | None] = [Expect(il, p.n_embd_r, F32) for il in layers]
            s_exp: list[Expect | None] = [Expect(il, p.n_embd_s, F32) for il in layers]
            ple = {il: p.n_embd_p for il in p.ple_layers} if p.n_embd_p else {}
            cur = _read_rs(ctx, sec_node, cur, sec, "r", r_exp, cell_count, ple)
            cur = _read_rs(ctx, sec_node, cur, sec, "s", s_exp, cell_count)
        else:
            cur = _read_rs_structural(ctx, sec_node, cur, limit, sec, cell_count, n_layer)
    except Stop as stop:
        raise give_up(ctx, sec, stop, limit) from None
    sec_node.fit_to_children()
    sec.size = cur - off
    return sec, cur


def _read_rs(
    ctx: ParseCtx, node: Node, off: int, sec: Section, role: str, exps: list[Expect | None], rows: int,
    ple: dict[int, int] | None = None,
) -> int:
    out = sec.r_layers if role == "r" else sec.s_layers
    for j, e in enumerate(exps):
        rec, off = read_record(ctx, node, off, role, j, rows, False, e, allow_zero_row=True)
        out.append(rec)
        if ple and e is not None and e.il in ple:  # the layer's PLE conv history follows its r rows
            prec, off = read_p_record(ctx, node, off, len(sec.p_layers), rows, e.il, ple[e.il])
            sec.p_layers.append(prec)
    return off


def read_p_record(
    ctx: ParseCtx, parent: Node, off: int, index: int, rows: int, il: int | None, n_elements: int | None
) -> tuple[LayerRecord, int]:
    """A PLE ``p`` record: ``u64 p_size_row`` (no type field: the rows are F32, type_r) and its rows."""
    src = ctx.src
    what = finding_name(section_of_path(parent.path), "p", index, il, ctx.profile is not None)
    if not src.has(off, 8):
        raise ctx.truncated(parent, f"the {what} header", off, 8, il)
    row = src.u64(off) or 0
    node = parent.add(Node(record_node_name("p", index), "layer", off, 8, None, ctx.status()))
    hdr = node.add(Node("header", "layer_header", off, 8, f"f32 row={row} (no type field)", ctx.status()))
    want = 4 * n_elements if n_elements is not None else None
    if row % 4 or (want is not None and row != want) or row > src.size:
        hdr.status = hdr.kind = "unparsed"
        ctx.find("error", "row_size_mismatch", off, 8, f"{what}: row size {row}"
                 + (f", model expects {want} ({n_elements} x f32)" if want is not None else " is not whole f32 values"),
                 hdr, il, row_bytes=row)
        raise Stop(off + 8)
    data_size = row * rows
    rec = LayerRecord("p", index, il, F32, off, off + 8, data_size, rows, row)
    rec.trusted = not ctx.untrusted
    rec.node = node
    have = src.remaining(off + 8)
    if data_size > have:
        if have:
            node.add(Node("rows", "p_rows", off + 8, have, None, ctx.status(), note="truncated"))
        node.fit_to_children()
        ctx.find("error", "truncated", off + 8, have, f"file ends inside the {what} payload: {data_size} bytes "
                 f"needed, {have} present", node, il, needed=data_size, file_end=src.size)
        rec.data_size = have
        raise Stop(off + 8 + have)
    if data_size:
        node.add(Node("rows", "p_rows", off + 8, data_size, None, ctx.status()))
    node.fit_to_children()
    return rec, off + 8 + data_size


def _pairs_that_fit(ctx: ParseCtx, recs: list[LayerRecord], p_after: dict[int, LayerRecord],
                    limit: int, followed: bool = False) -> int | None:
    """Without a model: how many of the records read are this section's (r then s, in two uniform halves)?

    The longest such prefix after which the file ends or another section starts (all the records,
    unless ``followed``: then something must be seen to follow them); None if none.
    """
    for k in range(len(recs) - len(recs) % 2, 0, -2):
        half = k // 2
        if len({r.row_bytes for r in recs[:half]}) != 1 or len({r.row_bytes for r in recs[half:k]}) != 1:
            continue
        ends = [recs[k - 1].data_offset + recs[k - 1].data_size,
                *(p.data_offset + p.data_size for i, p in p_after.items() if i < k)]
        end = max(ends)
        if (k == len(recs) and not followed) or end >= limit or _section_at(ctx, end, limit):
            return k
    return None


def _section_at(ctx: ParseCtx, off: int, limit: int) -> bool:
    """Does a KV section (an indexer cache after a hybrid's recurrent state) parse cleanly at ``off``?

    The indexer cache may carry another cell-extension size than the attention cache before it
    (qwen4exp without PLE: none beside M-RoPE's), so both sizes are tried.
    """
    for ext in dict.fromkeys((ctx.ext_bytes, 0, ctx.gen.cell_ext)):
        probe = ctx.fork()
        probe.ext_bytes = ext
        try:
            probe.parse_bare("kv", Node("probe", "probe", off, 0), off, limit)
        except Stop:
            continue
        if probe.n_errors == 0:
            return True
    return False


def _looks_like_p(ctx: ParseCtx, off: int, limit: int, rows: int) -> bool:
    """Without a model: is a PLE ``p`` header (u64 row size, no type) at ``off``?

    Its low word is a row size of whole f32 values far above every ggml type id, so it never
    reads as a record header; what follows its rows must be the next record (or the end).
    """
    row = ctx.src.u64(off)
    if row is None or row == 0 or row % 4 or row > (1 << 31) or gt.is_known_type(int(row & 0x7FFFFFFF)):
        return False
    end = off + 8 + row * rows
    if end >= limit:  # ends the file, or is cut by its end (read_p_record says so)
        return limit >= ctx.src.size or end == limit
    probe = ctx.fork()
    try:
        read_record(probe, Node("probe", "probe", end, 0), end, "s", 0, rows, False, None, allow_zero_row=True)
    except Stop:  # a next record cut by the end of the file still is one
        return any(f.code == "truncated" for f in probe.findings)
    return True


def _read_rs_structural(
    ctx: ParseCtx, node: Node, off: int, limit: int, sec: Section, rows: int, n_layer: int
) -> int:
    """Without a model: read record-shaped headers up to the end, then split them r | s."""
    recs: list[LayerRecord] = []
    p_after: dict[int, LayerRecord] = {}  # PLE p record following the record at this index
    cur = off
    while len(recs) < 2 * n_layer and cur < limit:
        probe = ctx.fork()
        scratch = Node("scratch", "scratch", cur, 0)
        try:
            read_record(probe, scratch, cur, "r", len(recs), rows, False, None, allow_zero_row=True)
        except Stop:
            if recs and len(recs) - 1 not in p_after and _looks_like_p(ctx, cur, limit, rows):
                prec, cur = read_p_record(ctx, node, cur, len(p_after), rows, None, None)
                p_after[len(recs) - 1] = prec
                continue
            cut = any(f.code == "truncated" for f in probe.findings)
            if cut and _pairs_that_fit(ctx, recs, p_after, limit, followed=True) is None:
                read_record(ctx, node, cur, "r", len(recs), rows, False, None, allow_zero_row=True)  # say so
            break
        rec, cur = read_record(ctx, node, cur, "r", len(recs), rows, False, None, allow_zero_row=True)
        recs.append(rec)
    keep = _pairs_that_fit(ctx, recs, p_after, limit)
    if keep is not None and keep < len(recs):
        # the words after the section's last s record happened to look like one more record:
        # the next section starts there
        dropped = {id(r.node) for r in recs[keep:]} | {id(p.node) for i, p in p_after.items() if i >= keep}
        node.children = [c for c in node.children if id(c) not in dropped]
        p_after = {i: p for i, p in p_after.items() if i < keep}
        recs = recs[:keep]
        last = recs[-1]
        cur = max([last.data_offset + last.data_size, *(p.data_offset + p.data_size for p in p_after.values())])
    half = len(recs) // 2
    consistent = (
        bool(recs)
        and len(recs) % 2 == 0
        and len({r.row_bytes for r in recs[:half]}) == 1
        and len({r.row_bytes for r in recs[half:]}) == 1
    )
    if not consistent:
        if cur < limit:  # the next record is bad or cut: let the real read say how
            probe = ctx.fork()
            try:
                read_record(probe, Node("probe", "probe", cur, 0), cur, "r", len(recs), rows, False, None,
                            allow_zero_row=True)
            except Stop:
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
    if any(i >= half for i in p_after):
        ctx.find("error", "unparsed", cur, 0, "recurrent section: a PLE p record follows an s record "
                 "(llama.cpp writes it right after its layer's r record)", node)
        raise Stop(cur)
    sec.r_layers = recs[:half]
    sec.s_layers = recs[half:]
    sec.p_layers = [p_after[i] for i in sorted(p_after)]
    for prec, i in zip(sec.p_layers, sorted(p_after), strict=True):
        prec.index = i
        if prec.node is not None:
            prec.node.name = f"p{i}"
    return cur
