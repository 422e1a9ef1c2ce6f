"""Reading a state file: detect its kind, parse it under each plausible layout, keep the best.

``read_state`` is the reader's entry point. It never raises on bad input: an unreadable or
unrecognised file comes back as ``kind == "unknown"`` with an ``unknown_format`` finding.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from kvscope.core.errors import InputError
from kvscope.core.findings import Finding, Severity
from kvscope.core.model.architectures import MROPE_ARCHES
from kvscope.core.model.profile import ModelProfile
from kvscope.core.pinned_builds import build_writing
from kvscope.core.reader.checks import check_model_only, check_result
from kvscope.core.reader.containers import MAX_ARCH_LEN, Container, arch_string, parse_container
from kvscope.core.reader.context import ParseCtx
from kvscope.core.reader.layouts import (
    BLOB_IO_MAGIC,
    GENERATION_BY_NAME,
    KINDS,
    SEQ_MAGIC,
    SESSION_MAGIC,
    Generation,
    candidate_generations,
    ext_choices,
    file_version,
    generation_named,
    generation_rank,
    is_newer_version,
    newest_generation,
    version_word,
)
from kvscope.core.reader.memory_state import PlanItem, may_continue, parse_bare_section
from kvscope.core.reader.meta import infer_cell_count
from kvscope.core.reader.records import LayoutChoice, ParseResult
from kvscope.core.reader.source import ByteSource
from kvscope.core.reader.state_kinds import FILE_KINDS, PER_SEQUENCE_KINDS
from kvscope.core.reader.tree import Node, check_tiling, coverage
from kvscope.core.textsafe import plural


class ReadError(InputError):
    """The file could not be opened at all (missing, a directory, no permission)."""


GGUF_MAGIC = 0x46554747  # 'GGUF'


def detect_kind(src: ByteSource) -> str | None:
    """Kind from the first bytes; None when nothing matches, "gguf" for a model file."""
    m = src.u32(0)
    if m is None:
        return None
    if m == GGUF_MAGIC:
        return "gguf"
    if m == SESSION_MAGIC:
        return "session_file"
    if m == SEQ_MAGIC:
        return "seq_file"
    if m == BLOB_IO_MAGIC:
        return "seq_blob"
    if 0 < m <= MAX_ARCH_LEN and src.has(4, m):
        raw = src.raw(4, m) or b""
        if all(48 <= c <= 57 or 97 <= c <= 122 or c in b"_-." for c in raw) and any(97 <= c <= 122 for c in raw):
            return "context_blob"
    return "seq_blob"  # older blobs have no header: the memory state starts at byte 0


def _plans(profile: ModelProfile | None, gen: Generation, kind: str) -> list[tuple[bool, list[PlanItem] | None]]:
    """(partial, plan) pairs to try; plan None means decide sections by structure.

    Only a buffer-API blob can be PARTIAL_ONLY: ``llama_state_seq_save_file`` (and so every
    llama-server slot file) always writes flags 0.
    """
    if profile is None:
        return [(False, None)]

    def plan_of(partial: bool) -> list[PlanItem]:
        secs = profile.expected_sections(partial, gen.kv_rot)
        if not gen.n_stream:  # one unified cache over every layer; n_layer counted all layers
            out: list[PlanItem] = []
            if profile.attn_layers:
                out.append(PlanItem("kv", "kv", tuple(range(profile.n_layer))))
            if profile.recurrent_layers:
                out.append(PlanItem("recurrent", "recurrent", tuple(range(profile.n_layer))))
            return out
        # DeepSeek-V4 records its PARTIAL_ONLY flag in its header's mode word
        return [PlanItem(s.role, s.kind, s.layers, replace(s, params=(("mode", int(partial)),))
                         if s.kind == "dsv4_header" else s) for s in secs]

    full = plan_of(False)
    plans: list[tuple[bool, list[PlanItem] | None]] = [(False, full)]
    if kind == "seq_blob" and gen.n_stream and _has_partial(profile, gen):
        part = plan_of(True)
        if part != full:
            plans.append((True, part))
    return plans


class _Key(NamedTuple):
    """How good a reading is; readings compare field by field, the first difference decides."""

    version_ok: bool  # the header's version is the generation's
    ext_ok: bool  # a cell extension read without a model explains the file cleanly
    coarse_lost: int  # minus quarters of the file no reading could place
    evidence: bool  # the first memory section reads cleanly (see _first_section_clean)
    layout_errors: int  # minus errors in fields only this generation has
    errors: int  # minus errors other than running out of bytes
    truncations: int
    unexplained: int  # minus bytes unparsed, untrusted or trailing
    warnings: int
    swa_masking: bool


def _has_partial(profile: ModelProfile, gen: Generation) -> bool:
    """Can a PARTIAL_ONLY blob of this model's memory differ from a full one in this generation?

    The iSWA / hybrid classes gained the flag in 2025-08 / 2025-10 (``Generation.partial_kinds``);
    the classes that came later (hybrid_idx, DSA-iSWA, DSV4) always had it.
    """
    if profile.memory_class in gen.partial_kinds:
        return True
    return gen.cell_ext >= 12 and profile.memory_class in ("hybrid_idx", "dsa_iswa", "dsv4")


@dataclass
class _Attempt:
    result: ParseResult | None  # dropped once another reading is better (a big file's tables are big)
    gen: Generation
    ext: int
    partial: bool
    key: _Key
    n_errors: int = 0
    clean: bool = False  # no finding above info and every byte explained

    @property
    def rank(self) -> tuple[Any, ...]:
        return (self.key, generation_rank(self.gen), -self.ext)


def _add(attempts: list[_Attempt], a: _Attempt) -> None:
    """Add a reading; only the best one so far keeps its result (memory stays one reading's)."""
    best = max(attempts, key=lambda x: x.rank, default=None)
    attempts.append(a)
    if best is None:
        return
    if a.rank > best.rank:
        best.result = None
    else:
        a.result = None


def _result(a: _Attempt) -> ParseResult:
    assert a.result is not None, "only the best reading keeps its result"
    return a.result


def _attempt(
    src: ByteSource,
    kind: str,
    gen: Generation,
    ext: int,
    partial: bool,
    plan: list[PlanItem] | None,
    profile: ModelProfile | None,
) -> _Attempt:
    per_seq = kind in PER_SEQUENCE_KINDS
    ctx = ParseCtx(src, gen, ext, per_seq, profile, seq_blob=kind == "seq_blob", bare_section=parse_bare_section)
    root = Node(os.path.basename(src.path) or "<bytes>", "file", 0, src.size)
    cont: Container = parse_container(ctx, root, kind, plan)
    end = cont.memory_end if cont.memory_end is not None else src.size
    leaves_end = max((leaf.end for leaf in root.leaves() if leaf is not root), default=0)
    end = max(end, leaves_end)
    if end < src.size:
        node = root.add(Node("trailing", "trailing", end, src.size - end, None, "trailing"))
        sev: Severity = "error" if kind == "session_file" else "warning"
        why = ("llama_state_load_file returns false (after restoring the state)" if kind == "session_file"
               else "llama.cpp ignores them")
        looks = infer_cell_count(ctx, end, src.size)
        if looks:
            sev = "error"  # real cache data that llama.cpp will silently skip
        hint = (f"; they look like {looks} cell records followed by K/V data: a cell_count of 0 before them "
                "would make llama.cpp restore nothing" if looks else "")
        ctx.find(sev, "trailing_bytes", end, src.size - end,
                 f"{src.size - end} bytes after the end of the state ({why}){hint}", node, looks_like_cells=looks)
    result = ParseResult(
        path=src.path,
        size=src.size,
        kind=kind,
        root=root,
        layout=LayoutChoice(gen.name, 1.0, features={**gen.to_json(), "cell_ext_bytes": ext}),
        header=cont.header,
        tokens=cont.tokens,
        token_payload=cont.token_payload,
        outputs=cont.outputs,
        sections=cont.sections,
        findings=ctx.findings,
        partial=partial,
        partial_certain=profile is not None,
        memory_offset=cont.memory_offset,
        memory_end=cont.memory_end,
        model_path=profile.path if profile is not None else None,
    )
    if kind in FILE_KINDS and is_newer_version(kind, cont.header.get("version")):
        newest = newest_generation(kind)
        known_v, build, read_as = file_version(newest, kind), build_writing(newest.name), file_version(gen, kind)
        word = version_word(kind)
        # llama.cpp refuses a version it does not know; kvscope reads it as the known layout that fits the
        # bytes best (the newest of equals): not damage, a file written by a newer llama.cpp (the verdict's "newer")
        ctx.find("warning", "version_newer", 4, 4,
                 f"{word} version {cont.header['version']} is newer than any this kvscope knows (the newest "
                 f"known, {build or newest.name}, writes {known_v}); read as {read_as} where the bytes fit",
                 root.find("/version"), version=cont.header["version"], version_word=word,
                 newest_known=known_v, newest_generation=newest.name, newest_build=build, read_as=read_as,
                 read_as_generation=gen.name)
    elif kind in FILE_KINDS and cont.header.get("version") is not None:
        known = {g.session_version if kind == "session_file" else g.seq_version for g in GENERATION_BY_NAME.values()}
        if cont.header["version"] not in known:
            ctx.find("error", "value_invalid", 4, 4, f"version {cont.header['version']} was never written by "
                     f"llama.cpp (known: {sorted(known)}); llama.cpp refuses any version but its own",
                     root.find("/version"))
    check_result(result, ctx, profile)
    ctx.resolve_paths()
    cov = coverage(root)
    version = cont.header.get("version")
    want_version = gen.session_version if kind == "session_file" else gen.seq_version
    version_ok = version is None or version == want_version or (kind in FILE_KINDS and is_newer_version(kind, version))
    # Without a model a cell extension is only believed when it explains the file cleanly: on a
    # damaged file, reading 8 or 12 extra bytes per cell makes garbage look better than it is.
    # A file cut short is damaged only by the cut: its extension reading is believed when it
    # explains a whole section cleanly before the cut.
    ext_ok = profile is not None or ext == 0 or result.n_errors == 0 or _whole_section_before_cut(result)
    # Running out of bytes is how a damaged file usually ends; any other error suggests the
    # layout is wrong. So count the two apart, then prefer the reading that explains more bytes.
    # A reading that says the file ends inside something far bigger than the whole file (a
    # garbage count read as the size of logits or rows) is misreading the bytes, not seeing a cut.
    n_trunc = sum(1 for f in result.findings if f.severity == "error" and f.code == "truncated"
                  and not _implausible_cut(f, src.size))
    n_tail = sum(1 for f in result.findings if f.severity == "error" and f.code == "trailing_bytes")
    # Untrusted bytes are explained (after a resync or an inferred count), just not vouched for:
    # the coarse comparison counts only bytes no reading could place.
    # The rows of a "cut" record far bigger than the file were words taken for a record size:
    # they count as lost too.
    lost = cov["unparsed_bytes"] + cov["trailing_bytes"] + sum(
        f.length for f in result.findings if f.severity == "error" and f.code == "truncated"
        and _implausible_cut(f, src.size))
    unexplained = lost + cov["untrusted_bytes"]
    # A bad value in a field only this generation has is evidence against the generation itself.
    n_layout = sum(1 for f in result.findings if f.severity == "error" and (
        f.extra.get("layout_field") or (f.code == "truncated" and _implausible_cut(f, src.size))))
    key = _Key(
        version_ok=version_ok,
        ext_ok=ext_ok,
        coarse_lost=-(lost * 4 // max(1, src.size)),
        # a PARTIAL_ONLY reading that leaves bytes after the state is reading the leading part
        # of a full state: what follows is the part the partial reading left out
        evidence=_first_section_clean(result) and not (partial and cov["trailing_bytes"]),
        layout_errors=-n_layout,
        errors=-(result.n_errors - n_trunc - n_tail + (1 if cov["trailing_bytes"] else 0)),
        truncations=-n_trunc,
        unexplained=-unexplained,
        warnings=-sum(1 for f in result.findings if f.severity == "warning"),
        swa_masking=_swa_masking_consistent(result, gen, profile),
    )
    clean = not any(f.severity != "info" for f in result.findings) and key.unexplained == 0
    return _Attempt(result, gen, ext, partial, key, result.n_errors, clean)


def _whole_section_before_cut(res: ParseResult) -> bool:
    """Only truncation errors, and the first memory section ends cleanly before the first of them."""
    errors = [f for f in res.findings if f.severity == "error"]
    if not errors or any(f.code != "truncated" for f in errors) or not res.sections:
        return False
    first = res.sections[0]
    return first.trusted and first.offset + first.size <= min(f.offset for f in errors)


IMPLAUSIBLE_CUT = 64  # a "cut" record more than this many times the file's size (and over 1 GiB)


def _implausible_cut(f: Finding, size: int) -> bool:
    needed = f.extra.get("needed")
    return isinstance(needed, int) and needed > IMPLAUSIBLE_CUT * max(1, size) and needed > (1 << 30)


def _first_section_clean(res: ParseResult) -> bool:
    """Positive evidence for a reading: its first memory section reads without damage.

    A PARTIAL_ONLY reading in particular must earn it: a full state damaged early can also look
    like the tail of a partial one. Running out of bytes inside the section is no evidence
    against a reading (any state can be cut short), unless the "cut" record is far bigger than
    the whole file: that reading takes other words for a record size.
    """
    if not res.sections:
        return False
    first = res.sections[0]
    end = first.offset + first.size
    return not any(f.severity == "error" and (f.code != "truncated" or _implausible_cut(f, res.size))
                   and f.offset < end for f in res.findings)


def _swa_masking_consistent(res: ParseResult, gen: Generation, profile: ModelProfile | None) -> bool:
    """Per-sequence SWA sections of masking builds hold no cell outside the window (a tie-break).

    From 2026-06 llama.cpp writes only the cells inside the sliding window of a sequence; an older
    file can hold cells that such a build would have left out, which tells the two apart.
    """
    if profile is None or not profile.n_swa or res.kind not in PER_SEQUENCE_KINDS or not gen.swa_perseq_masked:
        return True
    for sec in res.sections:
        if sec.role != "kv_swa":
            continue
        for st in sec.streams:
            t = st.cells
            if t is not None and t.count and int(t.pos.max()) - int(t.pos.min()) >= profile.n_swa:
                return False
    return True


def read_state(
    path: str | os.PathLike[str] | ByteSource | None = None,
    profile: ModelProfile | None = None,
    kind: str | None = None,
    layout: str | None = None,
    data: bytes | None = None,
) -> ParseResult:
    """Parse a state into a :class:`ParseResult`; never raises on bad bytes. The reader's one entry point.

    The state is ``path`` (a file, opened read-only here), an open :class:`ByteSource` (a caller that
    checks the file for a change afterwards, or reads it again), or ``data`` (bytes; ``path`` then
    names them). ``kind`` and ``layout`` override detection (``layout`` is a generation name such as
    ``"2026-10"``; an unknown one raises ValueError). Raises :class:`ReadError` only when ``path``
    cannot be opened.
    """
    if isinstance(path, ByteSource):
        return _read_source(path, profile, kind, layout)
    if data is not None:
        src = ByteSource(data, str(path or "<bytes>"))
    else:
        if path is None:
            raise ReadError("no file given")
        try:
            src = ByteSource.open(path)
        except (OSError, ValueError) as e:
            raise ReadError(f"cannot open {os.fspath(path)}: {e.strerror if isinstance(e, OSError) else e}") from e
    return _read_source(src, profile, kind, layout)


def _read_source(
    src: ByteSource, profile: ModelProfile | None = None, kind: str | None = None, layout: str | None = None
) -> ParseResult:
    detected = kind or detect_kind(src)
    if detected == "gguf":
        return _unknown(src, "a GGUF model file, not a llama.cpp state file (pass it with --model)")
    if detected is None or detected not in KINDS:
        return _unknown(src, "too short to be a llama.cpp state file" if detected is None
                        else f"unknown kind {detected!r}")
    version = src.u32(4) if detected in FILE_KINDS else None
    has_header = src.u32(0) == BLOB_IO_MAGIC if detected == "seq_blob" else None
    if layout is not None:
        forced = generation_named(layout)
        if forced is None:
            raise ValueError(f"unknown layout {layout!r}; known: {', '.join(GENERATION_BY_NAME)}")
        gens = [forced]
    else:
        gens = candidate_generations(detected, version, has_header)
    has_ext = profile.has_cell_ext() if profile is not None else _arch_cell_ext(arch_string(src, detected))
    attempts: list[_Attempt] = []
    per_seq = detected in PER_SEQUENCE_KINDS
    # Cell-extension readings are tried only when no plain reading explains the file cleanly:
    # on a file without extensions they can only misparse, and misparsing a big file costs time.
    for with_ext in (False, True):
        if with_ext and any(_clean(a) for a in attempts):
            break
        for gen in gens:
            for ext in ext_choices(gen, has_ext):
                if (ext > 0) != with_ext:
                    continue
                for partial, plan in _plans(profile, gen, detected):
                    _add(attempts, _attempt(src, detected, gen, ext, partial, plan, profile))
    attempts.sort(key=lambda a: a.rank, reverse=True)
    best = attempts[0]
    if profile is not None:
        best, attempts = _model_fit(src, detected, gens, per_seq, profile, best, attempts)
    res = _result(best)
    ties = [a for a in attempts[1:] if a.key == best.key]
    close = [a for a in attempts[1:] if a.key != best.key][:3]
    alts: list[dict[str, Any]] = []
    seen = {(best.gen.name, best.ext, best.partial)}
    for a in ties + close:
        ident = (a.gen.name, a.ext, a.partial)
        if ident in seen:
            continue
        seen.add(ident)
        alts.append({
            "name": a.gen.name,
            "cell_ext_bytes": a.ext,
            "partial": a.partial,
            "indistinguishable": a.key == best.key,
            "errors": a.n_errors,
            "title": a.gen.title,
        })
    n_tied = 1 + sum(1 for x in alts if x["indistinguishable"])
    if n_tied > 1:
        confidence = 1.0 / n_tied
    elif not alts:
        confidence = 1.0
    else:
        ident = (best.gen.name, best.ext, best.partial)
        runner = next(a for a in attempts[1:] if (a.gen.name, a.ext, a.partial) != ident)
        confidence = 0.99 if runner.key[:7] != best.key[:7] else 0.8
    res.layout = LayoutChoice(best.gen.name, confidence, alts, res.layout.features)
    if n_tied > 1:
        names = sorted({x["name"] for x in alts if x["indistinguishable"]} | {best.gen.name})
        res.layout.features["byte_identical_layouts"] = names
    from kvscope.core.reader.rotation import annotate

    annotate(res, profile)
    head = res.sections[0] if res.sections else None
    if head is not None and head.kind == "dsv4_header" and "mode" in head.fields:
        res.partial, res.partial_certain = head.fields["mode"] == 1, True  # DeepSeek-V4 records its flag
    if profile is None and not res.n_errors and not any(f.code == "unconfirmed_end" for f in res.findings):
        _unconfirmed_end(res)
    if kind is None and detected == "seq_blob" and not has_header and res.n_errors:
        cov = coverage(res.root)
        if cov["parsed_bytes"] + cov["untrusted_bytes"] < res.size // 2 and not _first_section_clean(res):
            first = res.findings[0] if res.findings else None
            why = "not a llama.cpp state file (no ggsn/ggsq magic, no blob header, no arch string)"
            detail = f"read as a headerless sequence blob: {first.message} at offset {first.offset}" if first else ""
            return _unknown(src, why, detail)
    return res


def _arch_cell_ext(arch: str | None) -> bool | None:
    """Without a model: does the architecture string a session or context blob carries fix the cell extension?

    An M-RoPE architecture's KV cells always carry one (llama_kv_cache::has_cell_ext():
    ``n_pos_per_embd() > 1``) in its first cache; any other architecture may still carry one
    (PLE, or M-RoPE set by the GGUF's rope sections), so only the bytes can tell there. A later
    cache of the same memory may differ (qwen4exp's indexer), which the memory walker finds by
    structure.
    """
    return True if arch in MROPE_ARCHES else None


def _unconfirmed_end(res: ParseResult) -> None:
    """Say what only the model could confirm: that no whole memory section is missing at the end.

    A state ends where its last section ends, and composite memories (iSWA, hybrid, DSA, ...)
    write their parts one after another, so a file cut exactly at a section boundary parses
    cleanly. Without the model nothing in the bytes says how many sections there should be.
    """
    end = res.memory_end if res.memory_end is not None else res.size
    if end != res.size or (res.sections and res.sections[0].kind == "dsv4_header"):
        return  # DeepSeek-V4's header says which blocks follow
    if res.sections and not may_continue([sec.kind for sec in res.sections]):
        return  # no memory class writes another section after these
    if not res.sections:
        what = ("the file holds no memory state: either the model has none (an embedding model) or the file "
                "ends early")
    else:
        what = (f"the memory state ends after {plural(len(res.sections), 'section')} exactly at the end of the file; "
                "a composite memory (the SWA cache of an iSWA model, the recurrent state of a hybrid model, "
                "an indexer cache) may have lost a whole section")
    res.findings.append(Finding("info", "unconfirmed_end", end, 0,
                                f"{what}: give the model (--model) to check that the file is complete", "/"))


def _clean(a: _Attempt) -> bool:
    """No finding above info and every byte parsed."""
    return a.clean


def _model_fit(
    src: ByteSource,
    kind: str,
    gens: list[Generation],
    per_seq: bool,
    profile: ModelProfile,
    best: _Attempt,
    attempts: list[_Attempt],
) -> tuple[_Attempt, list[_Attempt]]:
    """When the file fits its own structure far better than the model's plan, trust the structure.

    The model-planned reading stays the answer unless a structural reading has fewer errors of
    the non-truncation kind; then the file was most likely written by another model, which is
    said as a ``model_mismatch`` finding on the structural reading.
    """
    best_res = _result(best)
    structural = [f for f in best_res.findings if f.severity == "error" and f.code not in _MODEL_ONLY_CODES]
    if not structural:  # the model's plan explains the bytes (tokens or arch may still disagree)
        return best, attempts
    # running out of bytes says nothing about which model wrote the file
    disagree = [f for f in structural if f.code not in ("truncated", "trailing_bytes")]
    free: list[_Attempt] = []
    for gen in gens:
        for ext in ext_choices(gen, None):
            _add(free, _attempt(src, kind, gen, ext, False, None, None))
    free.sort(key=lambda a: a.rank, reverse=True)
    alt = free[0]
    alt_res = _result(alt)
    cov = coverage(alt_res.root)
    planned = sorted({f.code for f in structural})
    res = alt_res
    if disagree and alt_res.n_errors == 0 and cov["parsed_bytes"] == src.size:
        res.model_path = profile.path
        ctx = ParseCtx(src, alt.gen, alt.ext, per_seq, profile, res.findings)
        ctx.find("error", "model_mismatch", 0, src.size,
                 f"the file does not fit the model {profile.arch!r} ({os.path.basename(profile.path)}): read with "
                 f"the model's plan it gives {', '.join(sorted({f.code for f in disagree}))}; it parses cleanly on its "
                 "own structure, so it was "
                 "most likely written by another model", res.root)
        check_model_only(res, ctx, profile)
        ctx.resolve_paths()
        return alt, free
    # A damaged file: the model's plan must not explain fewer bytes with more damage than the
    # file's own structure does. Where it would, the structural reading is the answer, and says why.
    mine = coverage(best_res.root)
    explained_plan = mine["parsed_bytes"] + mine["untrusted_bytes"]
    explained_free = cov["parsed_bytes"] + cov["untrusted_bytes"]
    margin = max(64, src.size // 20)
    if explained_free > explained_plan + margin and alt_res.n_errors < len(structural):
        res.model_path = profile.path
        ctx = ParseCtx(src, alt.gen, alt.ext, per_seq, profile, res.findings)
        ctx.find("warning", "read_by_structure", 0, 0,
                 f"read by the file's own structure: the model's plan explains {explained_plan:,} of {src.size:,} "
                 f"bytes with {len(structural)} error(s) ({', '.join(planned)}); the structure explains "
                 f"{explained_free:,} with {alt_res.n_errors}", res.root,
                 plan_explained=explained_plan, plan_errors=planned)
        check_model_only(res, ctx, profile)
        ctx.resolve_paths()
        return alt, free
    return best, attempts


# findings about the model rather than the byte layout (they never make the structure the answer)
_MODEL_ONLY_CODES = frozenset({"token_out_of_vocab", "model_mismatch"})


def _unknown(src: ByteSource, why: str, detail: str = "") -> ParseResult:
    root = Node(os.path.basename(src.path) or "<bytes>", "file", 0, src.size)
    if src.size:
        root.add(Node("unparsed", "unparsed", 0, src.size, None, "unparsed"))
    f = Finding("error", "unknown_format", 0, src.size, why, root.path, extra={"detail": detail} if detail else {})
    return ParseResult(src.path, src.size, "unknown", root, LayoutChoice("unknown", 0.0), findings=[f])


def tiling_problems(result: ParseResult) -> list[str]:
    return check_tiling(result.root)
