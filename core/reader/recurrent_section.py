"""``llama_memory_recurrent`` state: cells, s_trans, n_layer (all model layers), r and s records.

With a model the records map to its recurrent layers; without one they are read while they
look like records and split into r and s halves whose row sizes must each be uniform.
"""

from __future__ import annotations

from kvscope.core.reader.context import ParseCtx, Stop, mark_bad
from kvscope.core.reader.meta import (
    MAX_LAYERS,
    PlanItem,
    check_cells,
    give_up,
    infer_cell_count,
    read_cells,
    truncated_cells,
)
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
        raise give_up(ctx, sec, stop, limit) from None
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
    sec.r_layers = recs[:half]
    sec.s_layers = recs[half:]
    return cur
