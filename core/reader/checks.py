"""Consistency checks on a parsed state: model agreement, tokens, positions, record types.

The structural parser already flags what breaks the byte layout; these checks look at what
parsed and flag what llama.cpp would reject or what cannot belong to the given model.
"""

from __future__ import annotations

import numpy as np

from kvscope.core.findings import Severity
from kvscope.core.model.profile import ModelProfile
from kvscope.core.reader.context import ParseCtx
from kvscope.core.reader.record_names import finding_name
from kvscope.core.reader.records import CellTable, LayerRecord, ParseResult, Section
from kvscope.core.reader.token_cells import CODE as TOKEN_CELL_CODE
from kvscope.core.reader.token_cells import agreement, memory_pos_max_before

POSITION_JUMP = 1 << 24  # a position this far from its neighbours is almost surely garbage


def check_result(res: ParseResult, ctx: ParseCtx, profile: ModelProfile | None) -> None:
    if profile is not None:
        check_model_only(res, ctx, profile)
    for sec in res.sections:
        _check_types(ctx, sec)
        tables = [(st.cells, f"stream {st.index}") for st in sec.streams] if sec.kind == "kv" else [
            (sec.cells, "recurrent")]
        for table, where in tables:
            if table is not None and table.count:
                _check_positions(ctx, sec, table, where)
    if not ctx.n_errors:  # a damaged structure's cells say nothing of its tokens
        _check_token_cells(res, ctx, profile)


def check_model_only(res: ParseResult, ctx: ParseCtx, p: ModelProfile) -> None:
    """Checks that need the model but not its layout plan: arch string, vocabulary, logits size."""
    arch = res.header.get("arch")
    if arch is not None and arch != p.arch:
        node = res.root.find("/arch")
        ctx.find("error", "model_mismatch", node.offset if node else 0, node.size if node else 0,
                 f"state was written by a {arch!r} model, the model given is {p.arch!r} "
                 "(llama.cpp refuses: wrong model arch)", node)
    if res.tokens and p.n_vocab:
        toks = np.asarray(res.tokens, dtype=np.int64)
        bad = np.flatnonzero((toks < 0) | (toks >= p.n_vocab))
        if bad.size:
            _token_findings(res, ctx, toks, bad, p.n_vocab)
    if res.outputs is not None and p.n_vocab and res.outputs.get("logits_size", 0) % p.n_vocab:
        node = res.root.find("/outputs")
        ctx.find("warning", "model_mismatch", node.offset if node else 0, 8,
                 f"logits_size {res.outputs['logits_size']} is not a multiple of the vocabulary size {p.n_vocab}",
                 node)


MAX_TOKEN_FINDINGS = 16


def _token_findings(res: ParseResult, ctx: ParseCtx, toks: np.ndarray, bad: np.ndarray, n_vocab: int) -> None:
    """One finding per bad token id, on its own 4 bytes (the first few; then one for the rest)."""
    node = res.root.find("/tokens")
    ids = node.find("token_ids") if node is not None else None  # llama-server packed payload
    holder = ids or node
    base = holder.offset if holder is not None else 0
    for i in bad[:MAX_TOKEN_FINDINGS]:
        ctx.find("error", "token_out_of_vocab", base + 4 * int(i), 4,
                 f"token {int(i)}: id {int(toks[i])} is outside the model's vocabulary of {n_vocab}", holder,
                 index=int(i), token=int(toks[i]))
    rest = bad[MAX_TOKEN_FINDINGS:]
    if rest.size:
        first = int(rest[0])
        ctx.find("error", "token_out_of_vocab", base + 4 * first, 4 * (int(rest[-1]) - first + 1),
                 f"{rest.size} more token id(s) outside the vocabulary of {n_vocab} (tokens {first}..{int(rest[-1])})",
                 holder, indices=[int(i) for i in rest[:32]])


def _check_types(ctx: ParseCtx, sec: Section) -> None:
    groups: list[list[LayerRecord]] = []
    if sec.kind == "kv":
        for st in sec.streams:
            groups += [st.k_layers, st.v_layers]
    else:
        groups += [sec.r_layers, sec.s_layers]
    for recs in groups:
        if len(recs) < 2:
            continue
        types = [r.type_id for r in recs]
        common = max(set(types), key=types.count)
        for r in recs:
            if r.type_id != common:
                ctx.find("error", "type_mismatch", r.header_offset, 4,
                         f"{finding_name(sec.role, r.role, r.index, r.il, True)} is {r.type}, "
                         f"the other {r.role.upper()} records are {recs[types.index(common)].type}",
                         r.node, r.il)


def _check_positions(ctx: ParseCtx, sec: Section, t: CellTable, where: str) -> None:
    node = sec.node.find(where.replace(" ", "")) if sec.node is not None else None
    node = node.find("cells") if node is not None else (sec.node.find("cells") if sec.node else None)
    neg = np.flatnonzero(t.pos < 0)
    if neg.size:
        i = int(neg[0])
        ctx.find("warning", "position_anomaly", t.record_offset(i), 4,
                 f"{sec.role} {where}: {neg.size} negative position(s), first at cell {i} (pos {int(t.pos[i])})", node)
    if t.count > 1:
        jumps = np.flatnonzero(np.abs(np.diff(t.pos.astype(np.int64))) > POSITION_JUMP)
        if jumps.size:
            i = int(jumps[0]) + 1
            ctx.find("warning", "position_anomaly", t.record_offset(i), 4,
                     f"{sec.role} {where}: cell {i} jumps to position {int(t.pos[i])}", node)
    if t.seq_ids.size and len(t.seq_set()) == 1 and t.seq_ids.size == t.count:
        dup_free = bool(np.all(np.diff(t.pos) > 0)) or np.unique(t.pos).size == t.count
        if not dup_free and sec.kind == "kv":
            ctx.find("warning", "position_anomaly", t.offset, t.size,
                     f"{sec.role} {where}: a position is held by more than one cell of sequence {t.seq_set()[0]}",
                     node)
    elif t.seq_ids.size and t.seq_ids.size < 5_000_000:
        cell_idx = np.repeat(np.arange(t.count), t.n_seq)
        pairs = t.seq_ids.astype(np.int64) << 32 | (t.pos[cell_idx].astype(np.int64) & 0xFFFFFFFF)
        uniq, counts = np.unique(pairs, return_counts=True)
        dup = uniq[counts > 1]
        if dup.size and sec.kind == "kv":
            seq, pos = int(dup[0] >> 32), int(np.int32(dup[0] & 0xFFFFFFFF))
            ctx.find("warning", "position_anomaly", t.offset, t.size,
                     f"{sec.role} {where}: {dup.size} (sequence, position) pair(s) held by more than one cell, "
                     f"e.g. seq {seq} pos {pos}", node)


def _check_token_cells(res: ParseResult, ctx: ParseCtx, profile: ModelProfile | None) -> None:
    """A sequence file's token list against its cells (:mod:`kvscope.core.reader.token_cells`): an error in a
    llama-server slot (its packed token payload), else a warning for a count that differs and an info for
    positions alone (a libllama application's ``seq_rm``/``seq_add`` writes those)."""
    window = None if profile is None else (profile.n_swa > 0 and bool(profile.swa_layers))
    found = agreement(res, window)
    if found is None or found.agrees:
        return
    n = found.n_tokens
    part, _ = found.problems[0]
    what = "; ".join(f"{p.section.role}: {why}" for p, why in found.problems)
    end = memory_pos_max_before(res, n)
    if 0 <= end != n - 1:
        then = (f"a llama-server that reuses the slot (no sliding window, or --swa-full) continues it at position "
                f"{n} while the memory ends at {end}: llama_decode rejects the batch (\"inconsistent sequence "
                f"positions\") and the request fails with HTTP 500 \"Invalid input batch.\"")
    else:
        then = (f"llama-server keeps these cells and continues the slot at position {n} without an error, from a "
                "cache that does not hold the slot's tokens at their positions")
    counts = any(p.section.kind == "recurrent" or p.pos.size != n for p, _ in found.problems)
    sev: Severity
    if found.server_tokens:
        sev = "error"
    else:
        sev = "warning" if counts else "info"
        then += ("; a libllama application that removed or shifted positions (llama_memory_seq_rm/seq_add) "
                 "writes such files legitimately, a llama-server slot never")
    node = part.section.node
    ctx.find(sev, TOKEN_CELL_CODE, part.offset, part.size,
             f"the token list ({n} tokens) and the cells disagree: {what}; {then}", node,
             n_tokens=n, memory_pos_max=end, server_tokens=found.server_tokens,
             parts={p.section.role: why for p, why in found.problems})
