"""Cell meta tables of a memory section, and what a wrong ``cell_count`` looks like.

Shared by the KV-cache and recurrent section parsers: reading a stream's cell records into the
tree, the per-sequence meta rules of each layout generation, and the inference of the real
record count when ``cell_count`` is damaged (confirmed by the data header that follows).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kvscope.core.model.memory_plan import ExpectedSection
from kvscope.core.reader.cells import MAX_RECORDS, min_record_bytes, scan_cells, scan_extent
from kvscope.core.reader.context import ParseCtx, Stop
from kvscope.core.reader.records import KvStream, Section
from kvscope.core.reader.tensor_records import read_record
from kvscope.core.reader.tree import Node

MAX_STREAMS = 256  # LLAMA_MAX_SEQ
MAX_LAYERS = 4096


@dataclass(frozen=True)
class PlanItem:
    role: str  # kv | kv_base | kv_swa | kv_attn | recurrent | kv_mla | kv_lid | kv_idx | dsv4 parts
    kind: str  # kv | recurrent | dsv4_header | dsv4_kcache | dsv4_comp
    layers: tuple[int, ...] | None  # model layer indices; None without a model
    sec: ExpectedSection | None = None  # the model's plan of this section (geometry, rotation, ext)


TailCheck = Callable[[int, int], bool]  # (offset, streams still to come in this section) -> parses?


# ---------------------------------------------------------------------------------------------
# cells


def read_cells(ctx: ParseCtx, parent: Node, off: int, count: int, limit: int, owner: KvStream | Section) -> int:
    """Read ``count`` cell records into ``owner.cells`` (also when cut short); returns the end offset."""
    if count > MAX_RECORDS:  # more than any table kvscope builds: refused before reading a record
        node = ctx.unparsed(parent, off, limit, note="cells past the reader's budget")
        ctx.find("error", "cell_count_invalid", max(0, off - 4), 4, f"cell_count {count:,} is more than kvscope "
                 f"reads ({MAX_RECORDS:,} cells); what follows is not parsed", node or parent)
        raise Stop(limit)
    scan = scan_cells(ctx.src, off, count, ctx.ext_bytes, limit)
    table = scan.table
    assert table is not None
    owner.cells = table
    if table.size:
        ctx.leaf(parent, "cells", "cell_meta", off, table.size, f"{table.count} cell{'' if table.count == 1 else 's'}")
    if not scan.ok:
        bad = scan.end
        if scan.reason == "truncated":
            raise ctx.truncated(parent, f"cell meta (record {table.count} of {count})", bad, 8 + ctx.ext_bytes)
        if scan.reason == "budget":  # a count the bytes could hold (a hole reads as empty records)
            node = ctx.unparsed(parent, bad, limit, note="cells past the reader's budget")
            ctx.find("error", "cell_count_invalid", bad, 0, f"cell_count {count:,} is more than kvscope reads "
                     f"({MAX_RECORDS:,} cells); what follows is not parsed", node or parent)
            raise Stop(limit)
        node = ctx.unparsed(parent, bad, limit, note="bad cell record")
        ctx.find("error", "seq_meta_invalid", bad, 8, f"cell {table.count}: implausible n_seq_id "
                 f"{ctx.src.i32(bad + 4)} at offset {bad + 4}", node or parent)
        raise Stop(limit)
    return scan.end


def check_cells(ctx: ParseCtx, node: Node, stream: KvStream, recurrent: bool) -> None:
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


def truncated_cells(ctx: ParseCtx, node: Node, off: int, count: int, limit: int, owner: KvStream | Section) -> None:
    """A plausible ``cell_count`` whose records run clean up to the end of the file: truncation."""
    if count > MAX_PLAUSIBLE_CELLS:
        return
    # how far plausible records run, looking at no more than ``count`` of them (no table built)
    extent = scan_extent(ctx.src, off, ctx.ext_bytes, limit, count)
    if extent.count >= count:
        return
    if extent.reason != "truncated" and extent.end + min_record_bytes(ctx.ext_bytes) <= ctx.src.size:
        return
    scan = scan_cells(ctx.src, off, extent.count, ctx.ext_bytes, limit)  # the records present, < count
    assert scan.table is not None
    if scan.table.size:
        ctx.leaf(node, "cells", "cell_meta", off, scan.table.size, f"{scan.table.count} of {count} cells")
    owner.cells = scan.table
    raise ctx.truncated(node, f"cell meta ({scan.table.count} of {count} records present)", scan.end,
                        min_record_bytes(ctx.ext_bytes))


def give_up(ctx: ParseCtx, sec: Section, stop: Stop, limit: int) -> Stop:
    """A section that cannot go on: the rest of the range is unparsed; the partial section rides on the Stop."""
    sec.trusted = False
    assert sec.node is not None
    ctx.unparsed(sec.node, stop.offset, limit, note="after an unrecoverable error")
    sec.node.fit_to_children()
    sec.size = sec.node.size
    return Stop(limit, sec)


def errors_before(ctx: ParseCtx, mark: int) -> int:
    return sum(1 for f in ctx.findings[:mark] if f.severity == "error")


def infer_cell_count(ctx: ParseCtx, off: int, limit: int, data_header: int | None = None) -> int | None:
    """Records that really follow a bad ``cell_count``: a data header and a K record confirm it.

    ``data_header`` is the size of the header between the cell table and the first record (a
    KV stream's, from the generation, by default; 8 for a recurrent section).
    """
    hdr = ctx.gen.kv_data_header if data_header is None else data_header
    # KV caches of the n_stream layouts write only cells that hold a sequence (n_seq_id >= 1)
    kv_cells = data_header is None and ctx.gen.n_stream
    # Where plausible records stop, looking at no more than MAX_PLAUSIBLE_CELLS of them and
    # building no table: a sparse tail of zeros reads as endless empty records.
    extent = scan_extent(ctx.src, off, ctx.ext_bytes, limit, MAX_PLAUSIBLE_CELLS, 1 if kv_cells else 0)
    n = extent.count
    # The scan may run a few records into the data header before it stops: walk back, but only
    # a bounded number of probes (a garbage table must not cost one probe per record).
    for _ in range(min(n, MAX_WALK_BACK)):
        end = extent.end_after(n)
        if end is None:
            break
        v_trans, n_layer = ctx.src.u32(end), ctx.src.u32(end + 4)
        if v_trans in (0, 1) and n_layer is not None and 0 < n_layer <= MAX_LAYERS:
            probe = ctx.fork()
            try:
                read_record(probe, Node("probe", "probe", end + hdr, 0), end + hdr, "k", 0, n, False, None)
                return n
            except Stop:
                pass
        n -= 1
    return None


MAX_WALK_BACK = 64
