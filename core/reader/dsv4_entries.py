"""The layer entries of a DeepSeek-V4 K-cache or compressor block, and the entries the bytes lack.

A block writes ``n_layer`` entries, each ``u32 il`` and its tensor-stream record(s): one K record
in a K-cache block, a compressor kv and a compressor score record in a compressor block
(``llama-kv-cache-dsv4.cpp``: ``dsv4_state_write_k_cache``, ``llama_dsv4_comp_state::state_write``).
When entries or records are gone while ``n_layer`` still counts them, reading on would take the
next block's words for a record and blame that one; instead the missing ones are named:

- with the model's layer list, an entry whose id is a later planned layer's shows the layers
  between missing (exact);
- where an entry cannot be read but the rest of the state parses cleanly from its first byte,
  the block's remaining entries are missing (with the model: exactly which layers);
- where the second record of a compressor pair cannot be read but the rest parses cleanly from
  there, one of the pair is missing; the two records are alike (f32, the same shape), so the
  bytes cannot tell which.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvscope.core.reader.context import ParseCtx, Stop
from kvscope.core.reader.meta import TailCheck
from kvscope.core.reader.records import LayerRecord, Section
from kvscope.core.reader.tree import Node

# reads one record of an entry: (ctx, parent node, offset, entry index, layer id) -> (record, end)
RecordReader = Callable[[ParseCtx, Node, int, int, int], tuple[LayerRecord, int]]

PAIR_LABELS = ("compressor kv", "compressor score")


def layer_id(ctx: ParseCtx, node: Node, off: int, want: list[int] | None, j: int, what: str) -> tuple[int, int]:
    """The ``u32 il`` before a layer's records: (layer id as written, offset after it)."""
    il = ctx.u32(node, f"il{j}", off, kind="field")
    if want is not None and j < len(want) and il != want[j]:
        ctx.find("error", "layer_count_mismatch", off, 4, f"layer id {il}, the model's next {what} layer is "
                 f"{want[j]}: llama.cpp answers 'DSV4 {what} layer id mismatch'", node, expected=want[j])
    return il, off + 4


def read_entries(
    ctx: ParseCtx, node: Node, off: int, sec: Section, n_layer: int, want: list[int] | None,
    readers: Sequence[RecordReader], tail_ok: TailCheck | None, what: str,
) -> int:
    """Read a block's entries from ``off`` into ``sec.records``; returns where they end."""
    cur, slot = off, 0
    while slot < n_layer:
        il_word = ctx.src.u32(cur)
        if want is not None and il_word is not None and slot < len(want) and il_word != want[slot] \
                and il_word in want[slot + 1:]:
            later = want.index(il_word, slot + 1)
            _missing_entries(ctx, node, cur, sec, want[slot:later], n_layer, n_layer - (later - slot), what)
            slot = later
        start = cur
        f_mark, n_mark = len(ctx.findings), len(node.children)
        got: list[LayerRecord] = []
        keep = n_mark
        try:
            il, cur = layer_id(ctx, node, cur, want, slot, what)
            for read in readers:
                rec, cur = read(ctx, node, cur, slot, il)
                got.append(rec)
                keep = len(node.children)
        except Stop:
            if tail_ok is None:
                raise
            if not got and tail_ok(start, 0):
                del ctx.findings[f_mark:]
                del node.children[n_mark:]
                gone = want[slot:] if want is not None else None
                _missing_entries(ctx, node, start, sec, gone, n_layer, slot, what)
                return start
            after = got[-1].data_offset + got[-1].data_size if got else start
            if len(readers) == 2 and len(got) == 1 and _rest_parses(ctx, after, slot + 1, n_layer, want, readers,
                                                                     tail_ok, what):
                del ctx.findings[f_mark:]
                del node.children[keep:]
                sec.records.extend(got)
                _missing_of_pair(ctx, node, after, sec, got[0])
                cur, slot = after, slot + 1
                continue
            sec.records.extend(got)  # what was read before the damage stays in the section
            raise
        sec.records.extend(got)
        slot += 1
    return cur


def _rest_parses(
    ctx: ParseCtx, off: int, first: int, n_layer: int, want: list[int] | None, readers: Sequence[RecordReader],
    tail_ok: TailCheck, what: str,
) -> bool:
    """Do entries ``first..n_layer-1`` and then the rest of the state parse cleanly from ``off``?"""
    probe = ctx.fork()
    scratch = Node("probe", "probe", off, 0)
    cur = off
    try:
        for slot in range(first, n_layer):
            il, cur = layer_id(probe, scratch, cur, want, slot, what)
            for read in readers:
                _, cur = read(probe, scratch, cur, slot, il)
    except Stop:
        return False
    return probe.n_errors == 0 and tail_ok(cur, 0)


# what llama.cpp does with such a block (core/analysis/consumers.py answers which, per build)
NOT_RESTORED = "llama.cpp does not restore this block (it refuses it, or aborts where the file ends here)"


def _missing_entries(
    ctx: ParseCtx, node: Node, off: int, sec: Section, layers: list[int] | None, n_layer: int, present: int,
    what: str,
) -> None:
    """``n_layer`` counts entries the block lacks; ``layers``: which (None: only the model could tell)."""
    count = n_layer - present if layers is None else len(layers)
    seen = sorted({r.il for r in sec.records if r.il is not None})
    entries = f"{n_layer} layer entr{'y' if n_layer == 1 else 'ies'}"
    msg = (f"{sec.role}: n_layer counts {entries}, {count} of them {'is' if count == 1 else 'are'} not in the "
           f"file (the bytes there are what follows): ")
    if layers is not None:
        msg += f"the entr{'y' if count == 1 else 'ies'} of layer{'s' if count > 1 else ''} " \
               f"{', '.join(map(str, layers))} (the model's {what} layers)"
    else:
        msg += (f"which layer{'s' if count > 1 else ''} only the model can tell (present: "
                + (f"layers {', '.join(map(str, seen))}" if seen else "no entry") + ")")
    msg += "; " + NOT_RESTORED
    ctx.find("error", "missing_layer", off, 0, msg, node, layers[0] if layers else None, missing=count,
             role="entry", candidates=list(layers or []))
    sec.trusted = False


def _missing_of_pair(ctx: ParseCtx, node: Node, off: int, sec: Section, first: LayerRecord) -> None:
    """One record of a compressor pair is gone: the one read may be either (they are alike)."""
    il = first.il
    ctx.find("error", "missing_layer", off, 0,
             f"{sec.role}: layer {il}'s entry holds one record where llama.cpp writes a {PAIR_LABELS[0]} and a "
             f"{PAIR_LABELS[1]} record; the two are alike (f32 rows of the same shape), so the bytes cannot tell "
             "which is missing (the record present is shown as the first); " + NOT_RESTORED,
             node, il, missing=1, role="ckv or csc", candidates=[il] if il is not None else [])
    first.trusted = False
    sec.trusted = False
