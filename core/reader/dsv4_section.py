"""DeepSeek-V4 state (``llama_kv_cache_dsv4``): its header, K-cache blocks and compressor blocks.

Layout (``docs/state-format-classes.md`` C8)::

    u32 0x34565344 ("DSV4") ; u32 version = 1 ; u32 mode (0 full, 1 partial)
    kv_raw: an iSWA pair of llama_kv_cache sections, [base] swa (K-only, one stream per sequence)
    if full: K-cache blocks csa, hca, lid:  u32 ver 2, n_rows, ns, n_layer; per layer u32 il + record
    compressor blocks csa, hca, lid (always): u32 ver 1, ratio, state_size, n_embd_state, ns, n_layer;
                                              per layer u32 il + kv record + score record
    record: i32 type ; u64 ne0 ; u64 rows ; u64 row_size ; ns x rows x row_size bytes

The iSWA sections are parsed by :mod:`kvscope.core.reader.kv_section`; this module parses the
rest, checks what llama.cpp's ``state_read`` checks (with its messages), and with a model also
the layer lists and row geometry the model plans (:mod:`kvscope.core.model.memory_plan`).
"""

from __future__ import annotations

from kvscope.core import ggml_types as gt
from kvscope.core.model.memory_plan import ExpectedSection
from kvscope.core.reader.context import ParseCtx, Stop, mark_bad
from kvscope.core.reader.dsv4_entries import RecordReader, read_entries
from kvscope.core.reader.meta import MAX_LAYERS, MAX_STREAMS, PlanItem, TailCheck, give_up
from kvscope.core.reader.records import LayerRecord, Section
from kvscope.core.reader.tree import Node

DSV4_MAGIC = 0x34565344  # "DSV4" (bytes 44 53 56 34)
DSV4_VERSION = 1
KCACHE_VERSIONS = (1, 2)
COMP_VERSION = 1
RECORD_HEADER = 28  # i32 type, u64 ne0, u64 rows, u64 row_size
MAX_ROWS = 1 << 28
F32 = 0

KCACHE_ROLES = ("kcache_csa", "kcache_hca", "kcache_lid")
COMP_ROLES = ("comp_csa", "comp_hca", "comp_lid")


def _k_only(role: str) -> ExpectedSection:
    return ExpectedSection(role, "kv", (), v_elems=(), cell_ext=False, partial_keep=role != "kv_raw_base")


def dsv4_structural_plan(ctx: ParseCtx, off: int) -> list[PlanItem]:
    """Sections of a DeepSeek-V4 state read without a model, from its own ``mode`` word."""
    mode = ctx.src.u32(off + 8)
    items = [PlanItem("dsv4", "dsv4_header", None, ExpectedSection("dsv4", "dsv4_header", ()))]
    if mode != 1:
        items.append(PlanItem("kv_raw_base", "kv", None, _k_only("kv_raw_base")))
    items.append(PlanItem("kv_raw_swa", "kv", None, _k_only("kv_raw_swa")))
    if mode != 1:
        items += [PlanItem(r, "dsv4_kcache", None) for r in KCACHE_ROLES]
    items += [PlanItem(r, "dsv4_comp", None) for r in COMP_ROLES]
    return items


def parse_dsv4_block(
    ctx: ParseCtx, parent: Node, off: int, limit: int, item: PlanItem, tail_ok: TailCheck | None = None
) -> tuple[Section, int]:
    """Parse the DSV4 header, a K-cache block or a compressor block at ``off``.

    ``tail_ok`` says whether the rest of the state parses cleanly from an offset: it tells layer
    entries (or one record of a compressor pair) that ``n_layer`` counts but the bytes lack.
    """
    kind = item.kind
    title = {"dsv4_header": "llama_kv_cache_dsv4", "dsv4_kcache": "DSV4 K-cache block",
             "dsv4_comp": "DSV4 compressor state"}[kind]
    node = parent.add(Node(item.role, "section", off, 0, title, ctx.status()))
    sec = Section(item.role, kind, off, node=node)
    try:
        if kind == "dsv4_header":
            cur = _header(ctx, node, off, sec, item)
        elif kind == "dsv4_kcache":
            cur = _kcache(ctx, node, off, sec, item, tail_ok)
        else:
            cur = _comp(ctx, node, off, sec, item, tail_ok)
    except Stop as stop:
        raise give_up(ctx, sec, stop, limit) from None
    node.fit_to_children()
    sec.size = cur - off
    sec.trusted = not ctx.untrusted and all(r.trusted for r in sec.records)
    return sec, cur


def _fail(ctx: ParseCtx, node: Node, off: int, code: str, msg: str) -> Stop:
    mark_bad(node.children[-1])
    ctx.find("error", code, off, 4, msg, node)
    return Stop(off + 4)


def _header(ctx: ParseCtx, node: Node, off: int, sec: Section, item: PlanItem) -> int:
    magic = ctx.u32(node, "magic", off)
    if magic != DSV4_MAGIC:
        raise _fail(ctx, node, off, "unknown_format", f"magic 0x{magic:08x}: llama.cpp answers "
                    f"'DSV4 state magic mismatch' (expected 0x{DSV4_MAGIC:08x})")
    version = ctx.u32(node, "version", off + 4)
    if version != DSV4_VERSION:
        raise _fail(ctx, node, off + 4, "value_invalid", f"DSV4 state version {version}: llama.cpp answers "
                    "'DSV4 state version mismatch'")
    mode = ctx.u32(node, "mode", off + 8)
    if mode not in (0, 1):
        raise _fail(ctx, node, off + 8, "value_invalid", f"DSV4 state mode {mode}: llama.cpp answers "
                    "'DSV4 state mode mismatch'")
    sec.fields = {"version": version, "mode": mode}
    want = item.sec.param("mode") if item.sec is not None else None
    if want is not None and want != mode:
        what = "partial (PARTIAL_ONLY)" if mode else "full"
        ctx.find("error", "value_invalid", off + 8, 4, f"a {what} DSV4 state where this reading expects "
                 f"mode {want}: llama.cpp answers 'DSV4 state flags mismatch'", node, layout_field=True)
    return off + 12


def _u32s(ctx: ParseCtx, node: Node, off: int, names: tuple[str, ...]) -> list[int]:
    return [ctx.u32(node, name, off + 4 * i) for i, name in enumerate(names)]


def _check_counts(ctx: ParseCtx, node: Node, off: int, ns: int, n_layer: int) -> None:
    if not 1 <= ns <= MAX_STREAMS:
        raise _fail_at(ctx, node, off, "stream_count_invalid", f"ns {ns} is not a plausible stream count")
    if ctx.per_seq and ns != 1:
        ctx.find("error", "stream_count_invalid", off, 4, f"ns {ns} in a per-sequence state: llama.cpp answers "
                 "'DSV4 sequence state stream count mismatch'", node)
    if n_layer > MAX_LAYERS:
        raise _fail_at(ctx, node, off + 4, "value_invalid", f"n_layer {n_layer} is implausible")


def _fail_at(ctx: ParseCtx, node: Node, off: int, code: str, msg: str) -> Stop:
    """The field at ``off`` (already read with the block's other header words) is bad: stop after them."""
    leaf = next((c for c in node.children if c.offset == off), None)
    if leaf is not None:
        mark_bad(leaf)
    ctx.find("error", code, off, 4, msg, node)
    return Stop(max([off + 4, *(c.offset + c.size for c in node.children)]))


def _layers(ctx: ParseCtx, node: Node, item: PlanItem, n_layer: int, off: int) -> list[int] | None:
    """The planned layers; a count that disagrees is llama.cpp's 'layer count mismatch'."""
    if item.sec is None or ctx.profile is None:
        return None
    want = list(item.sec.layers)
    if n_layer != len(want):
        what = "K-cache" if item.kind == "dsv4_kcache" else "compressor state"
        ctx.find("error", "layer_count_mismatch", off, 4, f"n_layer {n_layer}, the model's {item.role} holds "
                 f"{len(want)} layers: llama.cpp answers 'DSV4 {what} layer count mismatch'", node,
                 expected=len(want))
    return want


def _kcache(ctx: ParseCtx, node: Node, off: int, sec: Section, item: PlanItem, tail_ok: TailCheck | None) -> int:
    version, n_rows, ns, n_layer = _u32s(ctx, node, off, ("version", "n_rows", "ns", "n_layer"))
    if version not in KCACHE_VERSIONS:
        raise _fail_at(ctx, node, off, "value_invalid", f"K-cache block version {version}: llama.cpp answers "
                       "'DSV4 K-cache state version mismatch'")
    if n_rows > MAX_ROWS:
        raise _fail_at(ctx, node, off + 4, "value_invalid", f"n_rows {n_rows} is implausible")
    _check_counts(ctx, node, off + 8, ns, n_layer)
    sec.fields = {"version": version, "n_rows": n_rows, "ns": ns, "n_layer": n_layer}
    want = _layers(ctx, node, item, n_layer, off + 12)
    ne0 = item.sec.param("ne0") if item.sec is not None and ctx.profile is not None else None

    def k(c: ParseCtx, parent: Node, at: int, j: int, il: int) -> tuple[LayerRecord, int]:
        return _record(c, parent, at, "k", j, ns, n_rows, ne0, None, il)

    return read_entries(ctx, node, off + 16, sec, n_layer, want, (k,), tail_ok, "K-cache")


def _comp(ctx: ParseCtx, node: Node, off: int, sec: Section, item: PlanItem, tail_ok: TailCheck | None) -> int:
    names = ("version", "ratio", "state_size", "n_embd_state", "ns", "n_layer")
    version, ratio, state_size, n_embd_state, ns, n_layer = _u32s(ctx, node, off, names)
    if version != COMP_VERSION:
        raise _fail_at(ctx, node, off, "value_invalid", f"compressor block version {version}: llama.cpp answers "
                       "'DSV4 compressor state version mismatch'")
    if state_size > MAX_ROWS or n_embd_state > MAX_ROWS:
        raise _fail_at(ctx, node, off + 8, "value_invalid", f"state_size {state_size} x n_embd_state "
                       f"{n_embd_state} is implausible")
    _check_counts(ctx, node, off + 16, ns, n_layer)
    sec.fields = dict(zip(names, (version, ratio, state_size, n_embd_state, ns, n_layer), strict=True))
    if item.sec is not None and ctx.profile is not None:
        for name, got, o in (("ratio", ratio, off + 4), ("state_size", state_size, off + 8),
                             ("n_embd_state", n_embd_state, off + 12)):
            exp = item.sec.param(name)
            if exp is not None and exp != got:
                ctx.find("error", "row_size_mismatch", o, 4, f"{name} {got}, the model's {item.role} has {exp}: "
                         "llama.cpp answers 'DSV4 compressor state metadata mismatch'", node, expected=exp)
    want = _layers(ctx, node, item, n_layer, off + 20)

    def reader(role: str) -> RecordReader:
        def read(c: ParseCtx, parent: Node, at: int, j: int, il: int) -> tuple[LayerRecord, int]:
            return _record(c, parent, at, role, j, ns, state_size, n_embd_state, F32, il)
        return read

    return read_entries(ctx, node, off + 24, sec, n_layer, want, (reader("ckv"), reader("csc")), tail_ok,
                        "compressor state")


def _record(
    ctx: ParseCtx, parent: Node, off: int, role: str, j: int, ns: int, rows: int, ne0_want: int | None,
    type_want: int | None, il: int | None,
) -> tuple[LayerRecord, int]:
    """One tensor-stream record: a 28-byte header and ``ns`` streams of ``rows`` rows."""
    src = ctx.src
    label = {"k": "K", "ckv": "compressor kv", "csc": "compressor score"}[role]
    name = f"{label.replace(' ', '_')}{il if il is not None else j}"
    if not src.has(off, RECORD_HEADER):
        raise ctx.truncated(parent, f"the {label} record header", off, RECORD_HEADER, il)
    node = parent.add(Node(name, "layer", off, RECORD_HEADER, None, ctx.status()))
    hdr = node.add(Node("header", "layer_header", off, RECORD_HEADER, None, ctx.status()))
    type_id = src.i32(off) or 0
    ne0, n, row = src.u64(off + 4) or 0, src.u64(off + 12) or 0, src.u64(off + 20) or 0
    hdr.value = f"{gt.type_name(type_id)} ne0={ne0} rows={n} row={row}"

    def fail(msg: str) -> Stop:
        hdr.status = hdr.kind = "unparsed"
        ctx.find("error", "row_size_mismatch" if "type" not in msg else "type_mismatch", off, RECORD_HEADER,
                 f"{label} record of layer {il if il is not None else j}: {msg}: llama.cpp answers "
                 "'DSV4 state tensor metadata mismatch'", hdr, il)
        return Stop(off + RECORD_HEADER)

    if not gt.is_known_type(type_id):
        raise fail(f"unknown ggml type id {type_id}")
    if type_want is not None and type_id != type_want:
        raise fail(f"type {gt.type_name(type_id)}, expected {gt.type_name(type_want)}")
    if ne0 % gt.block_size(type_id) or ne0 > MAX_ROWS or row != gt.row_size(type_id, ne0):
        raise fail(f"row size {row} is not ggml_row_size({gt.type_name(type_id)}, {ne0})")
    if ne0_want is not None and ne0 != ne0_want:
        raise fail(f"ne0 {ne0}, the model's is {ne0_want}")
    if n != rows:
        raise fail(f"{n} rows, the block says {rows}")
    data_size = ns * n * row
    rec = LayerRecord(role, j, il, type_id, off, off + RECORD_HEADER, data_size, ns * n, row)
    rec.trusted = not ctx.untrusted
    rec.node = node
    data_off = off + RECORD_HEADER
    have = src.remaining(data_off)
    if data_size > have:
        if have:
            node.add(Node("rows", "k_rows", data_off, have, None, ctx.status(), note="truncated"))
        node.fit_to_children()
        ctx.find("error", "truncated", data_off, have, f"file ends inside the {label} payload of layer "
                 f"{il if il is not None else j}: {data_size} bytes needed, {have} present", node, il,
                 needed=data_size, file_end=src.size)
        rec.data_size = have
        raise Stop(data_off + have)
    if data_size:
        node.add(Node("rows", "k_rows" if role == "k" else "r_rows", data_off, data_size, None, ctx.status()))
    node.fit_to_children()
    return rec, data_off + data_size
