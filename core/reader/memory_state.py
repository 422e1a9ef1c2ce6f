"""A whole memory state: its sections in order, planned from a model or found by structure.

``parse_memory`` walks the sections of one memory state. With a model it follows the model's
plan (which caches, which layers); without one it decides KV vs recurrent by structure and
names composite sections by their order (base/SWA, attention/recurrent), marking the roles
uncertain where the bytes cannot decide.
"""

from __future__ import annotations

from kvscope.core.reader.context import ParseCtx, Stop
from kvscope.core.reader.dsv4_section import DSV4_MAGIC, dsv4_structural_plan, parse_dsv4_block
from kvscope.core.reader.kv_section import parse_kv_section, parse_kv_stream
from kvscope.core.reader.meta import PlanItem, TailCheck
from kvscope.core.reader.record_names import forget_layers
from kvscope.core.reader.records import Section
from kvscope.core.reader.recurrent_section import parse_recurrent_section
from kvscope.core.reader.tree import Node

__all__ = ["PlanItem", "may_continue", "parse_bare_section", "parse_memory"]


def parse_bare_section(kind: str, ctx: ParseCtx, parent: Node, off: int, limit: int) -> Section:
    """A ``kind`` ("kv" or "recurrent") section with no plan at ``off``: the parsers' probes of
    what follows them go through here (:attr:`ParseCtx.bare_section`), so neither section
    parser imports the other."""
    if kind == "kv":
        return parse_kv_section(ctx, parent, off, limit, PlanItem("kv", "kv", None), None)[0]
    return parse_recurrent_section(ctx, parent, off, limit, PlanItem("recurrent", "recurrent", None))[0]


def _parse_section(
    ctx: ParseCtx, parent: Node, off: int, limit: int, item: PlanItem, tail_ok: TailCheck | None
) -> tuple[Section, int]:
    if item.kind == "kv":
        if item.sec is not None and item.sec.cell_ext is False:  # a sub-cache without the model's cell ext
            with ctx.cell_ext(0):
                return parse_kv_section(ctx, parent, off, limit, item, tail_ok)
        return parse_kv_section(ctx, parent, off, limit, item, tail_ok)
    if item.kind.startswith("dsv4"):
        return parse_dsv4_block(ctx, parent, off, limit, item, tail_ok)
    return parse_recurrent_section(ctx, parent, off, limit, item)


def _tail_check(ctx: ParseCtx, item: PlanItem, rest: list[PlanItem], limit: int) -> TailCheck:
    """Does the rest of the state parse cleanly from an offset (used to spot missing records)?"""

    def check(off: int, streams_after: int) -> bool:
        probe = ctx.fork()
        scratch = Node("scratch", "scratch", off, 0)
        try:
            for s in range(streams_after):
                _, off = parse_kv_stream(probe, scratch, off, limit, s, 0, item, None)
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
        if plan is None and ctx.src.u32(off) == DSV4_MAGIC:
            plan = dsv4_structural_plan(ctx, off)
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
    ("kv", "kv"): ["kv_base", "kv_swa"],  # iSWA (or MSA base + indexer: only the model tells)
    ("kv", "recurrent"): ["kv_attn", "recurrent"],
    ("kv", "kv", "recurrent"): ["kv_base", "kv_swa", "recurrent"],
    ("kv", "recurrent", "kv"): ["kv_attn", "recurrent", "kv_idx"],  # hybrid_idx
    ("kv", "kv", "kv"): ["kv_mla", "kv_lid", "kv_swa"],  # DSA-iSWA
}
# K-only (MLA-shaped) pairs are DSA's MLA and lightning-indexer caches
_K_ONLY_ROLES: dict[tuple[str, ...], list[str]] = {("kv", "kv"): ["kv_mla", "kv_lid"]}
MAX_STRUCTURAL_SECTIONS = 3


def _try(
    ctx: ParseCtx, off: int, limit: int, kind: str, ext: int | None = None, after: tuple[str, ...] = ()
) -> tuple[ParseCtx, Node, Section | None, int, bool]:
    """Parse a ``kind`` section at ``off`` in a probe (``ext``: its cell-extension size; ``after``:
    the kinds of the sections before it)."""
    probe = ctx.fork()
    if ext is not None:
        probe.ext_bytes = ext
    if kind == "kv" and after == ("kv", "recurrent"):
        # a KV cache after a hybrid's recurrent state is hybrid-idx's indexer, which llama.cpp
        # builds MLA-shaped: it holds K only (llama_memory_hybrid_idx's constructor)
        probe.k_only_seen = True
    scratch = Node("scratch", "scratch", off, 0)

    item = PlanItem(kind, kind, None)
    # without a plan, a tail is sure only when this section's remaining streams end the file
    at_end = _tail_check(ctx, item, [], limit)
    try:
        sec, end = _parse_section(probe, scratch, off, limit, item, at_end)
        return probe, scratch, sec, end, probe.n_errors == 0
    except Stop as stop:
        return probe, scratch, stop.section, limit, False


_Try = tuple[str, ParseCtx, Node, Section | None, int, bool]


def _own_cell_ext(ctx: ParseCtx, off: int, limit: int, t: _Try, after: tuple[str, ...]) -> _Try:
    """A later KV section read with the other cell-extension size, where only that reads cleanly.

    The caches of one memory need not agree: qwen4exp's QSA indexer cache carries no extension
    unless the model has PLE layers while its attention cache carries M-RoPE's, and MSA's indexer
    never carries one (llama_kv_cache::has_cell_ext() over each cache's own hparams). The first
    section's size is the reading's (``read_state`` tries both); a later one keeps it unless it
    fails and the other size explains the section without an error.
    """
    if t[0] != "kv" or t[5] or not ctx.gen.cell_ext:
        return t
    other = 0 if ctx.ext_bytes else ctx.gen.cell_ext
    alt: _Try = ("kv", *_try(ctx, off, limit, "kv", other, after))
    return alt if alt[5] and (alt[4] == limit or _has_cells(alt[3])) else t


def _has_cells(sec: Section | None) -> bool:
    """A section cut short counts only once it has announced at least one cell (else: junk)."""
    if sec is None:
        return False
    if sec.kind == "kv":
        return any(st.cell_count > 0 for st in sec.streams)
    return sec.cell_count > 0


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


def _next_kinds(kinds: list[str]) -> list[str]:
    """Section kinds that may follow ``kinds`` in some memory class (write orders of C0)."""
    if not kinds:
        return ["kv", "recurrent"]
    if kinds[-1] == "recurrent":
        return ["kv"] if kinds == ["kv", "recurrent"] else []  # hybrid_idx: the indexer follows
    if kinds == ["kv", "kv"]:
        return ["kv", "recurrent"]
    if kinds == ["kv"]:
        return ["kv", "recurrent"]
    return []


def may_continue(kinds: list[str]) -> bool:
    """Can another section follow sections of these kinds in some memory class's write order?

    A hybrid-idx state (KV, recurrent, KV) or a DSA-iSWA one (three KV caches) is complete, and so
    is a recurrent state with nothing before it; a lone KV cache may be an iSWA's first half.
    """
    return bool(_next_kinds(kinds)) and len(kinds) < MAX_STRUCTURAL_SECTIONS


def _roles_certain(kinds: tuple[str, ...], roles: list[str], ctx: ParseCtx) -> bool:
    """Can the structure alone name these sections?

    Two KV caches are an iSWA pair, or MSA's base and indexer caches (only the model tells); and
    a buffer blob may be PARTIAL_ONLY, which drops leading sections: a lone KV cache may be an
    iSWA's SWA half, a KV + recurrent pair a hybrid-iSWA's partial state, a lone recurrent
    section a hybrid's.
    """
    if kinds == ("kv", "kv") and roles != _K_ONLY_ROLES[kinds]:
        return False
    if ctx.per_seq and ctx.seq_blob and len(kinds) <= 2:
        return False
    return len(kinds) > 1 or not ctx.per_seq


def _is_k_only(sec: Section) -> bool:
    streams = [st for st in sec.streams if st.k_layers]
    return bool(streams) and all(not st.v_layers for st in streams)


def _parse_structural(ctx: ParseCtx, mem: Node, off: int, limit: int, sections: list[Section]) -> int:
    kinds: list[str] = []
    cur = off
    while cur < limit and len(kinds) < MAX_STRUCTURAL_SECTIONS:
        options = _next_kinds(kinds)
        if not options:
            break
        tries = [(k, *_try(ctx, cur, limit, k, after=tuple(kinds))) for k in options]
        if kinds:
            tries = [_own_cell_ext(ctx, cur, limit, t, tuple(kinds)) for t in tries]
        good = [t for t in tries if t[5]]
        if kinds:  # a further section holding no cell at all is believed only when it ends the file
            good = [t for t in good if t[4] == limit or _has_cells(t[3])]
        if not good and kinds:  # a following section cut short by the end of the file is still one
            good = [t for t in tries if t[2] is not None and t[4] == limit
                    and all(f.code == "truncated" for f in t[1].findings if f.severity == "error")
                    and _has_cells(t[3])]
            if good:
                good = [max(good, key=lambda t: _explained(t[2]))]
        if not good and kinds:  # a damaged section that still explains most of what is left: show it as one
            damaged = [t for t in tries if t[3] is not None and _has_cells(t[3])
                       and 2 * _explained(t[2]) >= limit - cur]
            if damaged:
                good = [max(damaged, key=lambda t: (-t[1].n_errors, _explained(t[2])))]
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
        ctx.k_only_seen = ctx.k_only_seen or probe.k_only_seen
        if sec is None:
            raise Stop(limit)
        sections.append(sec)
        kinds.append(kind)
        cur = end
        if not ok and end >= limit:
            break
    roles = _STRUCTURAL_ROLES.get(tuple(kinds), kinds)
    if all(sec.kind == "kv" and _is_k_only(sec) for sec in sections) and tuple(kinds) in _K_ONLY_ROLES:
        roles = _K_ONLY_ROLES[tuple(kinds)]
    certain = _roles_certain(tuple(kinds), roles, ctx)
    for sec, role in zip(sections, roles, strict=False):
        sec.role = role
        sec.role_certain = certain
        if sec.node is not None:
            sec.node.name = role
        forget_layers(sec, ctx.findings)
    if sections and not sections[-1].trusted and cur < limit:
        ctx.unparsed(mem, cur, limit, note="after an untrusted section")
        raise Stop(limit)
    return cur
