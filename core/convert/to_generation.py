"""Migration between layout generations that differ only in framing, streamed byte for byte.

Some generations differ only in bytes around the tensor payloads: the version numbers of the
file headers, the rotation fields ``u32 n_rot_k, u32 n_rot_v`` of the v11/v4 KV data headers,
and the buffer-API blob header. Between those, a state is migrated by copying every payload
range of the source unchanged and writing the new framing in between: a :class:`MigrationPlan`
is that list of pieces, and :func:`write_plan` streams it with bounded reads (memory independent
of the file size, at copy speed). Conversions that change cell meta, sections or payload
(n_stream, context outputs, cell extension, rotated rows) are not framing: ``supported`` is
False and ``rewrite`` hands them to the memory core.

Rotation fields of a v3 -> v4 migration come from the file's rotation as inferred from the model
and the cache types (:mod:`kvscope.core.reader.rotation`), or from what the user says the source build
did (``rotation="off"``: it ran with ``LLAMA_ATTN_ROT_DISABLE=1``). A migration that cannot be
exact says what is missing.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from kvscope.core import ggml_types as gt
from kvscope.core.errors import InputError
from kvscope.core.model.profile import ModelProfile
from kvscope.core.reader.layouts import BLOB_IO_MAGIC, Generation, generation_named
from kvscope.core.reader.records import KvStream, ParseResult
from kvscope.core.reader.state_kinds import FILE_KINDS, PER_SEQUENCE_KINDS, WHOLE_CONTEXT_KINDS
from kvscope.core.reader.tree import coverage

Piece = tuple[int, int] | bytes  # (source offset, length) to copy, or literal bytes

_CHUNK = 4 << 20


@dataclass
class MigrationPlan:
    """How to turn a parsed state into the same state in another generation's layout."""

    source: str
    target: str
    supported: bool  # a framing-only conversion this module writes
    exact: bool  # the target build restores exactly the state the source build would
    missing: list[str] = field(default_factory=list)  # why not exact (or not supported)
    notes: list[str] = field(default_factory=list)  # conditions for the target build
    pieces: list[Piece] = field(default_factory=list)
    rotation: list[dict[str, Any]] = field(default_factory=list)  # per KV stream: n_rot_k/v written or dropped

    @property
    def size(self) -> int:
        return sum(p[1] if isinstance(p, tuple) else len(p) for p in self.pieces)

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source, "target": self.target, "supported": self.supported, "exact": self.exact,
            "missing": self.missing, "notes": self.notes, "size": self.size if self.supported else None,
            "rotation": self.rotation,
        }


def _framing_only(src: Generation, dst: Generation, res: ParseResult, profile: ModelProfile | None) -> list[str]:
    """Reasons the two layouts differ in more than framing for this file (empty: framing only).

    Exact means: the bytes a build of ``dst`` would have written for the same memory. Only the
    version words, the v4 rotation fields and the blob header may differ; any other difference
    of the two generations must be shown not to matter for this file and model.
    """
    why = []
    if src.n_stream != dst.n_stream:
        why.append("the n_stream layout differs")
    if src.ctx_outputs != dst.ctx_outputs and res.kind in WHOLE_CONTEXT_KINDS:
        why.append("the context outputs sections differ")
    if src.cell_ext != dst.cell_ext and (profile is None or profile.has_cell_ext()):
        why.append(f"the cell extension differs ({src.cell_ext} vs {dst.cell_ext} bytes per cell"
                   + (")" if profile is not None else "; give --model to show the model has none)"))
    per_seq = res.kind in PER_SEQUENCE_KINDS
    if src.swa_perseq_masked != dst.swa_perseq_masked and per_seq and (profile is None or profile.n_swa):
        why.append("per-sequence SWA masking differs (cells outside the sliding window)")
    if res.partial and src.partial_kinds != dst.partial_kinds:
        why.append("PARTIAL_ONLY means other sections in the target layout")
    if src.kv_rot != dst.kv_rot and _indexer_rows_change(res, profile):
        why.append("the indexer rows change width between the two builds (Qwen4exp's k-pool indexer: raw | pooled "
                   "keys in b11434, raw keys before)" if profile is not None else
                   "the indexer rows may change width between the two builds (Qwen4exp; give --model)")
    if src.rot_default != dst.rot_default and any(
            gt.is_quantized(r.type_id) for sec in res.sections if sec.kind == "kv" for r in sec.all_layers()):
        why.append("one build rotates quantized K/V rows by default and the other does not")
    return why


def _indexer_rows_change(res: ParseResult, profile: ModelProfile | None) -> bool:
    """Does the model's indexer cache have another row width in the v11/v4 build (or, without a model, may it)."""
    if profile is not None:
        return any(s.k_mult_v4 != 1 for s in profile.plan)
    return any(sec.role == "kv_idx" for sec in res.sections) and any(sec.kind == "recurrent" for sec in res.sections)


def _blob_seq_id(res: ParseResult) -> int | None:
    """The sequence a per-sequence state's cells name (None when they name none or several)."""
    seqs: set[int] = set()
    for sec in res.sections:
        tables = [st.cells for st in sec.streams] if sec.kind == "kv" else [sec.cells]
        for t in tables:
            if t is not None and t.count:
                seqs.update(t.seq_set())
    return next(iter(seqs)) if len(seqs) == 1 else None


def _streams(res: ParseResult) -> Iterator[KvStream]:
    for sec in res.sections:
        if sec.kind == "kv":
            for st in sec.streams:
                if st.data_offset is not None:
                    yield st


def _rot_for_v4(st: KvStream, rotation: str) -> tuple[int, int] | str:
    """(n_rot_k, n_rot_v) to write for a stream of a v3 file, or what is missing to know them."""
    if rotation == "off":
        return 0, 0
    recs = [*st.k_layers, *st.v_layers]
    if st.n_rot_k is not None and st.n_rot_v is not None:
        return st.n_rot_k, st.n_rot_v
    if recs and all(r.rotated is False for r in recs):
        return 0, 0
    rec = next((r for r in recs if r.rotated is None), recs[0] if recs else None)
    what = f"{rec.type} {rec.role.upper()}" if rec is not None else "KV"
    return (f"the model (--model) to tell whether the {what} rows are Hadamard-rotated and in which blocks "
            "(it depends on the head size)")


def plan_migration(
    res: ParseResult,
    target: str,
    profile: ModelProfile | None = None,
    data: Any = None,
    rotation: str = "auto",
    seq_id: int | None = None,
    drop_trailing: bool = False,
) -> MigrationPlan:
    """Plan the migration of ``res`` to generation ``target`` (``rotation``: auto | on | off).

    ``rotation`` says how the source build ran: ``auto`` infers it (model and cache types),
    ``off`` means ``LLAMA_ATTN_ROT_DISABLE=1`` (rows not rotated), ``on`` a default build.
    """
    dst = generation_named(target)
    src = generation_named(res.layout.name)
    if dst is None or src is None:
        return MigrationPlan(res.layout.name, target, False, False, [f"unknown layout {target!r}"])
    plan = MigrationPlan(src.name, dst.name, True, True)
    if res.kind == "unknown":
        plan.supported = plan.exact = False
        plan.missing.append("not a llama.cpp state file")
        return plan
    if res.n_errors:
        first = next(f for f in res.findings if f.severity == "error")
        plan.exact = False
        plan.missing.append(f"the file is damaged: {first.message} (offset {first.offset})")
    why = _framing_only(src, dst, res, profile)
    if why:
        plan.supported = plan.exact = False
        plan.missing.extend(why)
        return plan
    cov = coverage(res.root)
    end = res.size - cov["trailing_bytes"]
    if cov["trailing_bytes"] and not drop_trailing:
        plan.exact = False
        plan.missing.append(f"{cov['trailing_bytes']} trailing bytes after the state (drop them to migrate)")
    edits: list[tuple[int, int, bytes]] = []  # (offset, bytes replaced, new bytes)
    if res.kind in FILE_KINDS and res.header.get("version") is not None:
        version = dst.seq_version if res.kind == "seq_file" else dst.session_version
        edits.append((4, 4, struct.pack("<I", version)))
    if res.kind == "seq_blob" and src.blob_header != dst.blob_header:
        if dst.blob_header:
            sid = seq_id if seq_id is not None else _blob_seq_id(res)
            if sid is None:
                plan.exact = False
                plan.missing.append("the source sequence id for the blob header (the cells name none): give --seq-id")
                sid = 0
            edits.append((0, 0, struct.pack("<Ii", BLOB_IO_MAGIC, sid)))
        else:
            edits.append((0, 8, b""))
    if src.kv_rot != dst.kv_rot:
        _rotation_edits(res, dst, plan, edits, rotation, profile)
    if plan.exact and rotation == "auto" and not src.kv_rot and dst.kv_rot and any(
            st.n_rot_inferred and (st.n_rot_k or st.n_rot_v) for st in _streams(res)):
        plan.notes.append("rotation inferred from the model and the cache types of a default build; if the source "
                          "build ran with LLAMA_ATTN_ROT_DISABLE=1, migrate with --rotation off")
    plan.pieces = _pieces(edits, end)
    return plan


def _rotation_edits(
    res: ParseResult, dst: Generation, plan: MigrationPlan, edits: list[tuple[int, int, bytes]],
    rotation: str, profile: ModelProfile | None,
) -> None:
    for st in _streams(res):
        assert st.data_offset is not None
        at = st.data_offset + 8
        if dst.kv_rot:
            rot = _rot_for_v4(st, rotation)
            if isinstance(rot, str):
                plan.exact = False
                if rot not in plan.missing:
                    plan.missing.append(rot)
                rot = (0, 0)
            edits.append((at, 0, struct.pack("<II", *rot)))
            plan.rotation.append({"offset": st.data_offset, "n_rot_k": rot[0], "n_rot_v": rot[1], "written": True})
            continue
        edits.append((at, 8, b""))
        plan.rotation.append({"offset": st.data_offset, "n_rot_k": st.n_rot_k, "n_rot_v": st.n_rot_v,
                              "written": False})
    if not dst.kv_rot and dst.rot_default:
        _check_target_rotation(res, dst, plan, profile)


def _check_target_rotation(res: ParseResult, dst: Generation, plan: MigrationPlan,
                           profile: ModelProfile | None) -> None:
    """A v4 -> v3 migration: the target build picks its own rotation, with no record in the file."""
    from kvscope.core.reader.rotation import default_rotation, section_heads

    for sec in res.sections:
        if sec.kind != "kv":
            continue
        heads = section_heads(profile, sec)
        for st in sec.streams:
            if st.data_offset is None:
                continue
            k, v = st.n_rot_k, st.n_rot_v
            wk, wv = default_rotation(st, sec, heads)
            if wk is None or wv is None:
                plan.notes.append(f"a {dst.name} build picks its own rotation, with no record in the file: it must "
                                  f"be n_rot_k={k}, n_rot_v={v} (give --model to check)")
                return
            if (k, v) == (wk, wv):
                continue
            if not (k or v):
                plan.notes.append(f"the rows are not rotated, but a default {dst.name} build rotates this cache "
                                  f"(n_rot_k={wk}, n_rot_v={wv}): load it in a build run with LLAMA_ATTN_ROT_DISABLE=1")
            else:
                plan.exact = False
                plan.missing.append(f"the rows are rotated with n_rot_k={k}, n_rot_v={v}, but a {dst.name} build "
                                    f"uses n_rot_k={wk}, n_rot_v={wv} for this cache")
            return


def _pieces(edits: list[tuple[int, int, bytes]], end: int) -> list[Piece]:
    pieces: list[Piece] = []
    cur = 0
    for off, drop, new in sorted(edits, key=lambda e: (e[0], -e[1])):
        if off > cur:
            pieces.append((cur, off - cur))
        if new:
            pieces.append(new)
        cur = max(cur, off + drop)
    if end > cur:
        pieces.append((cur, end - cur))
    return pieces


class SourceChanged(InputError):
    """The source file changed while it was copied."""


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev


def write_plan(plan: MigrationPlan, source: str | os.PathLike[str], out: IO[bytes]) -> int:
    """Stream ``plan`` from ``source`` into ``out`` with bounded reads; returns the bytes written.

    Raises :class:`SourceChanged` when the source's size, mtime, inode or device differ after
    the copy (llama-server rewrites slot files in place).
    """
    if not plan.supported:
        raise ValueError("this migration is not a framing-only conversion")
    fd = os.open(source, os.O_RDONLY)
    try:
        before = _identity(os.fstat(fd))
        written = 0
        for p in plan.pieces:
            if isinstance(p, bytes):
                out.write(p)
                written += len(p)
                continue
            off, n = p
            while n > 0:
                chunk = os.pread(fd, min(n, _CHUNK), off)
                if not chunk:
                    raise SourceChanged(f"{os.fspath(source)}: the file changed while it was read")
                out.write(chunk)
                off += len(chunk)
                n -= len(chunk)
                written += len(chunk)
        if _identity(os.fstat(fd)) != before or _identity(os.stat(source)) != before:
            raise SourceChanged(f"{os.fspath(source)}: the file changed while it was read")
        return written
    finally:
        os.close(fd)
