"""Which llama.cpp layout generations can load a state file, and what the others would answer.

For every generation kvscope knows, :func:`compatibility` says whether a build of that
generation restores the file as it is, and if not, the refusal llama.cpp would log, the stage
at which it comes (``header``: refused before anything changed; ``memory``: the restore fails
inside the memory state, after the target sequence was cleared; ``silent``: it loads but reads
the rows wrongly), and whether ``kvscope rewrite --layout GEN`` can migrate it exactly
(:mod:`kvscope.core.convert.to_generation`).

The answers follow llama.cpp's read path: the exact ``(magic, version)`` check of the file
APIs, and for layouts that share a version (or blobs, which carry none) the first check the
other layout's reader trips over. Between the 2026-10 (v3) and 2026-10-v4 layouts that check is
computed exactly from the bytes (the rotation fields, or the first K record header read in
their place); between older layouts the message is the kvscope reader's reason, marked as such.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from kvscope.core import ggml_types as gt
from kvscope.core.analysis.verdict import model_mismatch_reason
from kvscope.core.findings import NEWER_CODES, Finding
from kvscope.core.model.profile import ModelProfile
from kvscope.core.pinned_builds import build_writing
from kvscope.core.reader.layouts import (
    GENERATION_BY_NAME,
    GENERATIONS,
    SEQ_MAGIC,
    SESSION_MAGIC,
    Generation,
)
from kvscope.core.reader.records import KvStream, ParseResult
from kvscope.core.reader.token_cells import CODE as TOKEN_CELL_CODE

# a migration note for a file read with a model it does not fit (the verdict's model_mismatch)
MODEL_MISFIT = "the file does not fit the model given (give the model that wrote it)"

# errors in the values a record holds, which no llama.cpp read path checks (it copies the rows into
# the cache as they are): a file whose only errors are these loads, and computes with the bad values
VALUE_ONLY_ERRORS = frozenset({"nonfinite_values"})
# and the errors no read path checks either: a token list that disagrees with the cells (llama.cpp restores the
# cells at the positions written; llama-server fails or misreads only on the next request, which
# kvscope.core.analysis.reuse predicts)
UNCHECKED_ERRORS = VALUE_ONLY_ERRORS | {TOKEN_CELL_CODE}


def _structural_errors(res: ParseResult) -> list[Finding]:
    """The error findings llama.cpp's read path can trip over (all but :data:`UNCHECKED_ERRORS`)."""
    return [f for f in res.findings if f.severity == "error" and f.code not in UNCHECKED_ERRORS]


@dataclass
class GenCompat:
    """What a build of one layout generation does with the file."""

    generation: str
    loads: bool | None  # None: cannot be told from the bytes alone (give the model)
    answer: str  # "loads", or the refusal llama.cpp would log
    stage: str  # "ok" | "header" | "memory" | "silent" | "unknown"
    exact_message: bool = True  # the answer is llama.cpp's own wording, not kvscope's paraphrase
    build: str | None = None
    migratable: bool | None = None  # rewrite --layout GEN gives an exact file (None: ask the memory core)
    migration_missing: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # the answer depends on how the build is launched: under this environment (``LLAMA_ATTN_ROT_DISABLE=1``)
    # it is ``launch_answer`` ("loads", or llama.cpp's refusal) instead (None: the launch does not matter)
    launch_env: str | None = None
    launch_answer: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _version_refusal(res: ParseResult, gen: Generation) -> str | None:
    version = res.header.get("version")
    if res.kind == "seq_file" and version is not None and version != gen.seq_version:
        return (f"state_seq_load_file: unknown (magic, version) for sequence state file: "
                f"{SEQ_MAGIC:08x}, {int(version):08x}")
    if res.kind == "session_file" and version is not None and version != gen.session_version:
        return f"state_load_file: unknown (magic, version) for session file: {SESSION_MAGIC:08x}, {int(version):08x}"
    return None


def _first_data_stream(res: ParseResult) -> KvStream | None:
    for sec in res.sections:
        if sec.kind != "kv":
            continue
        for st in sec.streams:
            if st.data_offset is not None:
                return st
    return None


def _expected_rot(st: KvStream) -> tuple[int | None, int | None]:
    """The rotation a default build of the file's own model and types would use (None: unknown)."""
    if st.n_rot_k is not None and st.n_rot_v is not None:
        return st.n_rot_k, st.n_rot_v
    return None, None


def _v3_v4_answer(res: ParseResult, src: Generation, dst: Generation, data: Any) -> tuple[str, str] | None:
    """llama.cpp's answer when a KV data header of ``src`` is read by a ``dst`` build (v3 <-> v4)."""
    st = _first_data_stream(res)
    if st is None or st.data_offset is None:
        return None  # no KV data header: the two layouts are byte-identical for this file
    off = st.data_offset + 8
    if dst.kv_rot and not src.kv_rot:
        # the v4 build reads n_rot_k / n_rot_v where the first K record's type and row size start
        rk, rv = data.u32(off), data.u32(off + 4)
        want_k, want_v = _expected_rot(st)
        if rk is None or rv is None:
            return "state_read_data: unexpectedly reached end of buffer", "memory"
        wk = "the context's n_rot_k" if want_k is None else str(want_k)
        wv = "the context's n_rot_v" if want_v is None else str(want_v)
        if want_k is None or rk != want_k:
            return f"state_read_data: incompatible key rotation ({rk} instead of {wk})", "memory"
        return f"state_read_data: incompatible value rotation ({rv} instead of {wv})", "memory"
    if src.kv_rot and not dst.kv_rot:
        # the v3 build reads the first K header where n_rot_k / n_rot_v stand
        t = data.i32(off)
        real = st.k_layers[0].type_id if st.k_layers else None
        il = st.k_layers[0].il if st.k_layers and st.k_layers[0].il is not None else 0
        if t is None:
            return "state_read_data: unexpectedly reached end of buffer", "memory"
        if real is not None and t != real:
            return (f"state_read_data: mismatched key type ({real} != {t}, layer {il})"
                    f" [{gt.type_name(real)} expected, the bytes hold n_rot_k={t}]"), "memory"
        row = data.u64(off + 4)
        want = st.k_layers[0].row_bytes if st.k_layers else None
        return f"state_read_data: mismatched key row size ({want} != {row}, layer {il})", "memory"
    return None


def _forced(res: ParseResult, gen: Generation, profile: ModelProfile | None, data: Any) -> ParseResult:
    from kvscope.core.reader.parse import read_state

    return read_state(data, profile, res.kind, gen.name)


def _same_reading(a: ParseResult, b: ParseResult) -> bool:
    """Two readings of one file see the same sections, streams, cells and records."""
    if _structural_errors(b) or len(a.sections) != len(b.sections):
        return False
    for sa, sb in zip(a.sections, b.sections, strict=True):
        if (sa.kind, sa.offset, sa.size) != (sb.kind, sb.offset, sb.size):
            return False
        if sa.kind == "kv":
            for x, y in zip(sa.streams, sb.streams, strict=False):
                if (x.cell_count, [r.data_offset for r in x.k_layers]) != (y.cell_count,
                                                                              [r.data_offset for r in y.k_layers]):
                    return False
                ex = x.cells.ext_bytes if x.cells is not None else 0
                ey = y.cells.ext_bytes if y.cells is not None else 0
                if ex != ey:
                    return False
    return True


def _rotation_note(res: ParseResult, gen: Generation, profile: ModelProfile | None) -> tuple[bool | None, str | None]:
    """Does a default build of ``gen`` read the rows rotated the way they are stored?

    v11/v4 builds compare the file's rotation fields with their own and refuse a mismatch, so
    only older targets can misread silently: a non-rotating build given rotated rows, or a
    rotating build given rows it would have rotated but that are not.
    """
    if gen.kv_rot:
        return True, None
    from kvscope.core.reader.rotation import default_rotation, section_heads

    for sec in res.sections:
        if sec.kind != "kv":
            continue
        heads = section_heads(profile, sec)
        for st in sec.streams:
            want = default_rotation(st, sec, heads) if gen.rot_default else (0, 0)
            for recs, w in ((st.k_layers, want[0]), (st.v_layers, want[1])):
                for r in recs:
                    if r.rotated is None or w is None:
                        return None, "whether the rows are rotated the way that build expects needs the model"
                    if bool(r.rotated) != bool(w) or (r.rotated and r.rot_block != w):
                        if r.rotated:
                            return False, (f"{r.role.upper()} rows are Hadamard-rotated (block {r.rot_block}); a "
                                           f"{gen.name} build reads them as " + (f"block {w}" if w else "unrotated"))
                        return False, (f"{r.role.upper()} rows are not rotated; a default {gen.name} build rotates "
                                       f"{r.type} rows of this head size (run it with LLAMA_ATTN_ROT_DISABLE=1)")
    return True, None


ROT_DISABLE_ENV = "LLAMA_ATTN_ROT_DISABLE=1"


def _launch_blocks(st: KvStream, sec: Any, heads: Any, disabled: bool) -> tuple[int | None, int | None]:
    """``(n_rot_k, n_rot_v)`` a v11/v4 build computes for this stream's cache when launched with rotation
    disabled or not (None: not known without the model). Without the model a rotated file's own fields are
    its writer's, a default launch (only a default launch rotates, but for an indexer's forced K rotation)."""
    from kvscope.core.reader.rotation import default_rotation

    tk = st.k_layers[0].type_id if st.k_layers else None
    tv = st.v_layers[0].type_id if st.v_layers else None
    if heads is not None:
        blocks: tuple[int, int] = heads.blocks(tk, tv, disabled=disabled)
        return blocks
    if disabled:  # rot_v is off; rot_k too, except the forced rotation of a lightning indexer's cache
        return (None if sec.role == "kv_lid" else 0), 0
    rk, rv = default_rotation(st, sec, None)
    return (st.n_rot_k if st.n_rot_k else rk), (st.n_rot_v if st.n_rot_v else rv)


def _rotation_refusal(res: ParseResult, profile: ModelProfile | None, disabled: bool) -> tuple[bool | None, str]:
    """Does a v11/v4 build launched with rotation ``disabled`` (``LLAMA_ATTN_ROT_DISABLE=1``) or not accept the
    file's ``n_rot_k``/``n_rot_v`` fields? ``state_read_data`` (b11434 ``src/llama-kv-cache.cpp``) compares them
    with the cache's own, per stream, K first: (True, ""), (False, its refusal), or (None, why not known)."""
    from kvscope.core.reader.rotation import section_heads

    for sec in res.sections:
        if sec.kind != "kv":
            continue
        heads = section_heads(profile, sec, kv_rot=True)
        for st in sec.streams:
            if st.data_offset is None or st.n_rot_k is None or st.n_rot_v is None:
                continue
            want = _launch_blocks(st, sec, heads, disabled)
            for got, w, word in ((st.n_rot_k, want[0], "key"), (st.n_rot_v, want[1], "value")):
                if w is None:
                    rows = st.k_layers if word == "key" else st.v_layers
                    kind = rows[0].type if rows else "these"
                    return None, (f"whether it rotates the {kind} {word.upper()[0]} rows of this cache (a head size "
                                  "that is a multiple of 64) needs the model (--model)")
                if got != w:
                    return False, f"state_read_data: incompatible {word} rotation ({got} instead of {w})"
    return True, ""


def _launch(res: ParseResult, profile: ModelProfile | None, out: GenCompat) -> None:
    """The answer of a v11/v4 build to the file's rotation fields, on a default launch and on one with
    ``LLAMA_ATTN_ROT_DISABLE=1`` (``llama_kv_cache``'s constructor reads it): set on ``out`` when they differ."""
    d_ok, d_msg = _rotation_refusal(res, profile, False)
    x_ok, x_msg = _rotation_refusal(res, profile, True)
    if d_ok and x_ok is False:
        out.launch_env, out.launch_answer = ROT_DISABLE_ENV, x_msg
        out.notes.append(f"a build launched with {ROT_DISABLE_ENV} refuses it: {x_msg}")
    elif d_ok is False:
        out.loads, out.stage = False, "memory"
        if x_ok:
            out.launch_env, out.launch_answer = ROT_DISABLE_ENV, "loads"
            out.answer = f"refuses on a default launch ({d_msg}); loads with {ROT_DISABLE_ENV}"
            out.exact_message = False
        else:
            out.answer = d_msg
            out.notes.append(f"launched with {ROT_DISABLE_ENV}: " + (x_msg if x_ok is False else f"unknown: {x_msg}"))
    elif d_ok is None:
        out.loads, out.stage, out.exact_message = None, "unknown", False
        if x_ok:
            out.launch_env, out.launch_answer = ROT_DISABLE_ENV, "loads"
            out.answer = (f"loads with {ROT_DISABLE_ENV} (the file records no rotation); on a default launch "
                          f"it refuses where the build rotates: {d_msg}")
        else:
            out.answer = f"loads, but {d_msg}"


def compatibility(res: ParseResult, profile: ModelProfile | None = None, data: Any = None) -> list[GenCompat]:
    """One :class:`GenCompat` per known generation, in generation order (empty for unknown files).

    ``data`` is the file's :class:`~kvscope.core.reader.source.ByteSource` or its bytes (opened from
    ``res.path`` when not given).
    """
    if res.kind == "unknown":
        return []
    own = GENERATION_BY_NAME.get(res.layout.name)
    if own is None:
        return []
    from kvscope.core.reader.source import ByteSource

    close = False
    if isinstance(data, (bytes, bytearray, memoryview)):
        data = ByteSource(bytes(data))  # the v3 <-> v4 answer reads fields of it
    elif data is None:
        data = ByteSource.open(res.path)
        close = True
    try:
        return [_one(res, own, gen, profile, data) for gen in GENERATIONS]
    finally:
        if close and hasattr(data, "close"):
            data.close()


def _one(res: ParseResult, own: Generation, gen: Generation, profile: ModelProfile | None, data: Any) -> GenCompat:
    from kvscope.core.convert.to_generation import plan_migration

    build = build_writing(gen.name)
    out = GenCompat(gen.name, None, "", "unknown", build=build)
    tied = set(res.layout.features.get("byte_identical_layouts", ()))
    mismatch = model_mismatch_reason(res, profile) if res.n_errors else None
    if gen.name != own.name:
        plan = plan_migration(res, gen.name, profile, data=data)
        # a conversion that is more than framing goes through the memory core, which alone can
        # tell whether the file holds everything the target layout writes
        out.migratable = plan.exact if plan.supported else None
        out.migration_missing = list(plan.missing)
        if mismatch is not None:  # the errors the plan saw are the model's, not damage
            out.migration_missing = [MODEL_MISFIT if m.startswith("the file is damaged") else m
                                     for m in out.migration_missing]
        out.notes.extend(plan.notes)
        newer = next((f for f in res.findings if f.code in NEWER_CODES), None)
        if newer is not None:  # what the newer layout adds is unknown: no rewrite can be exact
            out.migratable = False
            out.migration_missing = [f"a llama.cpp newer than kvscope wrote it: {newer.message} "
                                     f"(offset {newer.offset})"]
    refusal = _version_refusal(res, gen)
    if refusal is not None:
        out.loads, out.answer, out.stage = False, refusal, "header"
        return out
    if gen.name == own.name or gen.name in tied:
        if mismatch is not None:  # the bytes fit their own structure: the model is another one
            out.loads, out.stage, out.exact_message = None, "unknown", False
            out.answer = (f"not with the model given, which does not fit the file ({mismatch}); "
                          "give the model that wrote it")
            return out
        structural = _structural_errors(res)
        if structural:
            bad = structural[0]
            out.loads, out.stage, out.exact_message = False, "memory", False
            out.answer = f"the file is damaged: {bad.message} (offset {bad.offset})"
            return out
        if res.n_errors:  # only errors llama.cpp does not check: it loads the file as it is
            bad = next(f for f in res.findings if f.severity == "error")
            if bad.code == TOKEN_CELL_CODE:
                out.notes.append(f"loads the cells as they are (llama.cpp does not compare the token list with "
                                 f"them): {bad.message} (offset {bad.offset})")
            else:
                out.notes.append(f"loads the damaged values as they are (llama.cpp does not check values): "
                                 f"{bad.message} (offset {bad.offset})")
        ok, note = _rotation_note(res, gen, profile) if gen.name != own.name else (True, None)
        out.loads, out.answer, out.stage = ok, "loads" if ok else (note or "loads"), "ok" if ok else "silent"
        if ok is None:
            out.stage, out.answer = "unknown", f"loads, but {note}"
        if ok and gen.kv_rot and res.layout.features.get("kv_rot"):  # the fields the build compares with its own
            _launch(res, profile, out)
        return out
    pair = _v3_v4_answer(res, own, gen, data) if {own.name, gen.name} == {"2026-10", "2026-10-v4"} else None
    if pair is not None:
        out.loads, out.answer, out.stage = False, pair[0], pair[1]
        return out
    other = _forced(res, gen, profile, data)
    if _same_reading(res, other):
        ok, note = _rotation_note(res, gen, profile)
        out.loads = ok
        out.stage = "ok" if ok else ("silent" if ok is False else "unknown")
        out.answer = "loads" if ok else (note or "")
        if ok is None:
            out.answer = f"loads, but {note}"
        return out
    first = next((f for f in other.findings if f.severity == "error"), None)
    out.loads, out.stage, out.exact_message = False, "memory", False
    out.answer = (f"a {gen.name} build reads these bytes differently: {first.message} (offset {first.offset})"
                  if first is not None else f"a {gen.name} build reads these bytes as a different state")
    return out


def migration_text(e: GenCompat) -> str:
    """Whether ``kvscope rewrite`` migrates a file this generation refuses (empty when it loads or nothing is known)."""
    if not e.loads and e.migratable is None and e.migration_missing:
        return f"not a framing change ({e.migration_missing[0]}): `kvscope rewrite` tells whether it converts"
    if not e.loads and e.migratable is not None:
        if e.migratable:
            return "`kvscope rewrite` migrates it exactly"
        return "`kvscope rewrite` cannot migrate it exactly" + (f": {e.migration_missing[0]}" if e.migration_missing
                                                                else "")
    return ""


def compat_text(entries: list[GenCompat]) -> list[str]:
    """One line per generation for the text report."""
    lines = []
    for e in entries:
        mark = {True: "loads", False: "refuses", None: "unknown"}[e.loads]
        if e.stage == "silent":
            mark = "misreads"
        build = f" ({e.build})" if e.build else ""
        mig = f"; {migration_text(e)}" if migration_text(e) else ""
        detail = "" if e.answer == "loads" else f": {e.answer}"
        if e.loads and e.launch_env:
            detail = f" on a default launch; refuses with {e.launch_env}: {e.launch_answer}"
        if e.loads is False and e.launch_env:  # "refuses on a default launch (...); loads with ..."
            mark, detail = "", e.answer
        lines.append(f"  {e.generation}{build}: {mark}{detail}{mig}")
    return lines
