"""The overview of a state file: what it is, the verdict, which llama.cpp builds load it, its verification.

:func:`build_overview` gathers, from a parse, everything a first look needs: the kind and the
llama.cpp API that writes it, the layout generation with its confidence and runners-up, the model
and whether the file fits it, the sequences (cells, positions, tokens), the memory sections and
their sizes, the :mod:`verdict <kvscope.core.analysis.verdict>`, the per-generation compatibility
(:mod:`kvscope.core.analysis.compat`), for a slot file what each pinned llama-server will reuse of it
(:mod:`kvscope.core.analysis.reuse`) and, when ``kvscope verify`` has run, its result (a reuse it
measured replaces that build's prediction). The app's Overview
view and every report format render this one object, so they say the same thing. No Qt here.

File and model paths are shown by base name unless ``full_paths`` is set (reports end up in
public bug trackers); the JSON always has the base name, and the full path only with ``full_paths``.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvscope.core.analysis.compat import GenCompat, compat_text, migration_text
from kvscope.core.analysis.consumers import ConsumerAnswer, consumer_answers, server_after
from kvscope.core.analysis.measured import measured_text, measured_verdict
from kvscope.core.analysis.reuse import ReusePrediction, predict_reuse
from kvscope.core.analysis.verdict import Verdict, model_mismatch_reason, plural, verdict
from kvscope.core.model.profile import ModelProfile
from kvscope.core.reader.layouts import GENERATION_BY_NAME
from kvscope.core.reader.records import CellTable, LayerRecord, ParseResult
from kvscope.core.reader.seq_owner import ASSUMED_SEQ, file_sequence

KIND_TITLES = {
    "seq_file": "sequence state file",
    "session_file": "session file",
    "seq_blob": "sequence state blob",
    "context_blob": "whole-context state blob",
    "unknown": "not a llama.cpp state file",
}
WRITERS = {
    "seq_file": "llama_state_seq_save_file (a sequence state file)",
    "session_file": "llama_state_save_file (llama-completion --prompt-cache, common's state save)",
    "seq_blob": "llama_state_seq_get_data(_ext) (an in-memory sequence checkpoint)",
    "context_blob": "llama_state_get_data (the whole context in memory)",
}
SLOT_WRITER = ("llama_state_seq_save_file by llama-server's slot save (POST /slots/ID?action=save), with its "
               "packed token payload")
PARTIAL_WRITER = "llama_state_seq_get_data_ext with LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY (the SWA / recurrent part only)"
# Findings that are about the model the file was read with rather than about the bytes alone.
MODEL_CODES = frozenset({"model_mismatch", "layer_count_mismatch", "row_size_mismatch", "type_mismatch",
                         "token_out_of_vocab"})
# ... of which these compare the model's plan with the records (in a damaged file they may be the damage)
PLAN_CODES = frozenset({"layer_count_mismatch", "row_size_mismatch", "type_mismatch"})
FITS = "fits (layer count, row sizes and types agree)"
MAX_VERIFY_RECORDS = 12  # records that are not a match, listed by verify_lines
VERIFY_STATUSES = ("match", "differs", "nonfinite", "missing", "extra")  # kvscope.core.verify.compare.STATUSES order
NOT_VERIFIED = "not verified: `kvscope verify` restores the file into a real llama.cpp build and compares the " \
               "next-token logits"


@dataclass(frozen=True)
class SequenceFacts:
    """One sequence in one cell table."""

    seq: int | None  # None: a per-sequence file's sequence, whose id its bytes do not store
    table: str  # "kv · stream 0", "recurrent"
    cells: int
    pos_min: int
    pos_max: int

    def text(self) -> str:
        who = f"seq {self.seq}" if self.seq is not None else f"seq {ASSUMED_SEQ} (assumed)"
        where = (f"position {self.pos_min}" if self.pos_min == self.pos_max
                 else f"positions {self.pos_min}..{self.pos_max}")
        unnamed = (f" (its id is not stored: verify and repair restore it as seq {ASSUMED_SEQ})"
                   if self.seq is None else "")
        return f"{who} ({self.table}): {plural(self.cells, 'cell')}, {where}{unnamed}"


@dataclass(frozen=True)
class SectionFacts:
    """One memory section."""

    role: str
    kind: str
    offset: int
    size: int
    cells: str
    records: int
    trusted: bool

    def text(self) -> str:
        return (f"{self.role} ({self.kind}) at {self.offset:,}: {self.size:,} bytes, {self.cells}, "
                f"{plural(self.records, 'record')}" + ("" if self.trusted else " [not trusted]"))


@dataclass(frozen=True)
class ConsumerEntry:
    """One consumer's answer for one pinned build, as the Overview shows it: predicted from the bytes, or
    measured by a Verify that restored the file in that build and consumer (which then replaces the
    prediction)."""

    build: str
    layout: str | None  # the layout generation the build writes
    consumer: str  # "libllama" | "llama-server"
    answer: str  # "loads" | "refuses" | "crashes" | "unknown"
    message: str  # the refusal or the assert as the consumer says it, or why it cannot be told
    measured: bool  # True: a Verify's restore (or what follows from it: ``via``); False: the prediction
    hint: str = ""  # what else to know: libllama's layout refusal that `kvscope rewrite` migrates exactly...
    via: str = ""  # the consumer whose measured answer this one follows ("libllama": llama-server restores
    # through the same llama_state_seq_load_file), "": measured itself or predicted
    predicted: str = ""  # the prediction a measurement replaced, where it said otherwise ("unknown")

    @property
    def source(self) -> str:
        if self.via:
            return f"{self.via}'s restore measured by Verify"
        return "measured by Verify" if self.measured else "predicted"

    def detail(self, hint: bool = True) -> str:
        """``refuses: <message>; <hint>; predicted unknown``: the answer and what follows it."""
        return (self.answer + (f": {self.message}" if self.message else "")
                + (f"; {self.hint}" if self.hint and hint else "")
                + (f"; predicted {self.predicted}" if self.predicted else ""))

    def line(self) -> str:
        """``b11434 llama-server: refuses: Unable to restore slot: ... (predicted)``."""
        return f"{self.build} {self.consumer}: {self.detail()} ({self.source})"


VERIFY_CONSUMER = {"llama.cpp": "libllama", "server": "llama-server"}  # a verify result's engine kind


@dataclass
class Overview:
    """Everything the first view of a file shows (see the module docstring)."""

    file: str  # base name, or the full path with ``full_paths``
    path: str  # always the full path (for the app; reports print ``file``)
    size: int
    kind: str
    kind_title: str
    writer: str
    layout: str
    layout_title: str
    confidence: float
    runners_up: list[str]
    model: str
    model_fits: bool | None  # None: no model given
    model_note: str
    tokens: int
    sequences: list[SequenceFacts]
    sections: list[SectionFacts]
    verdict: Verdict
    cache_types: list[str] = field(default_factory=list)  # one line per memory section
    rotation: list[str] = field(default_factory=list)  # one line per KV stream with records
    compat: list[GenCompat] | None = None  # None: not computed (yet)
    verify: dict[str, Any] | None = None  # a ``kvscope verify`` result, None: not verified
    reuse: list[ReusePrediction] = field(default_factory=list)  # llama-server's reuse, predicted (slot files)
    consumers: list[ConsumerAnswer] = field(default_factory=list)  # libllama and llama-server apart, per build
    sha256: str | None = None
    full_paths: bool = False
    # the release ranges that write and load the file (release_answers.releases_json; None: not a state)
    releases: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # what a Verify measured replaces the prediction it measured: the reader's guess at a dropped record
        if self.verify:
            self.verdict = measured_verdict(self.verdict, self.verify)

    def measured(self, text: str) -> str:
        """``text`` with what the Verify measured in place of the reader's guess it measured."""
        return measured_text(text, self.verify)

    # -- text -------------------------------------------------------------------------------------
    def file_line(self) -> str:
        sha = f", sha256 {self.sha256}" if self.sha256 else ""
        return f"{self.file} ({self.size:,} bytes{sha})"

    def layout_line(self) -> str:
        runners = f"; runners-up: {', '.join(self.runners_up)}" if self.runners_up else ""
        return f"{self.layout} ({self.layout_title}), confidence {self.confidence:.2f}{runners}"

    def model_line(self) -> str:
        return self.model + (f": {self.model_note}" if self.model_note else "")

    def sequences_line(self) -> str:
        toks = f"{plural(self.tokens, 'token')}; " if self.tokens else ""
        seqs = "; ".join(s.text() for s in self.sequences) or "no cells"
        return toks + seqs

    def compat_lines(self) -> list[str]:
        """One line per llama.cpp generation (``compat_text``), or why there are none."""
        if self.compat is None:
            return ["(being computed)"]
        if not self.compat:
            return ["no generation can load it: not a state file of a known layout"]
        return [line.strip() for line in compat_text(self.compat)]

    def loads_in(self) -> list[str]:
        """The generations that load the file as it is."""
        return [c.generation for c in self.compat or [] if c.loads]

    def releases_line(self) -> str:
        """The one line: ``written by b10644–b11401 (2026-08-27 → 10-05); loads in …`` (empty: not a state)."""
        from kvscope.core.analysis.release_answers import releases_line

        return releases_line(self.releases) if self.releases is not None else ""

    def verify_lines(self) -> list[str]:
        return verify_lines(self.verify)

    def reuse_lines(self) -> list[str]:
        """What each pinned llama-server does with the slot on a prompt that continues it: the
        prediction per build and ``--swa-full``, replaced by what a Verify measured: the reuse it measured in
        kvscope's own llama-server of that build, or the restore it measured (llama-server's own, or
        libllama's, which llama-server's follows) where that restore fails; empty for a file that is not a
        slot file. The restore's answer is the builds table's (:meth:`consumer_entries`), so the two agree."""
        measured = (self.verify or {}).get("reuse")
        engine = (self.verify or {}).get("engine") or {}
        restore = {e.build: e for e in self.consumer_entries() if e.consumer == "llama-server" and e.measured}
        lines = []
        replaced = False
        for e in self.reuse:
            flag = " --swa-full" if e.swa_full else ""
            got = restore.get(e.build or "")
            if isinstance(measured, dict) and engine.get("started_by_kvscope") and e.build == engine.get("build") \
                    and measured.get("swa_full") == e.swa_full:
                lines.append(f"llama-server {e.build}{flag}: measured by Verify (replaces the prediction): "
                             f"{measured.get('line')}")
                replaced = True
            elif got is not None and got.answer in ("refuses", "crashes"):
                said = {True: "restores", False: "refuses", None: "unknown"}[e.restores]
                verb = "refuses the slot" if got.answer == "refuses" else "crashes restoring the slot"
                lines.append(f"llama-server {e.build}{flag}: {verb}" + (f": {got.message}" if got.message else "")
                             + ("" if said == got.answer else f"; predicted {said}") + f" ({got.source})")
            else:
                lines.append(self.measured(e.line()))
        if isinstance(measured, dict) and not replaced:
            lines.insert(0, f"measured by Verify on {engine.get('url') or 'the server'}: {measured.get('line')}")
        return lines

    def rows(self) -> list[tuple[str, str]]:
        """(label, plain text) rows, in the order every rendering shows them."""
        rows = [
            ("verdict", self.verdict.line()),
            ("file", self.file_line()),
            ("kind", f"{self.kind_title} ({self.kind})"),
            ("written by", self.writer),
            ("layout", self.layout_line()),
            ("releases", self.releases_line() or "not a state file"),
            ("model", self.model_line()),
            ("sequences", self.sequences_line()),
            ("sections", "; ".join(s.text() for s in self.sections) or "none"),
            ("cache types", "; ".join(self.cache_types) or "no records"),
            ("rotation", "; ".join(self.rotation) or "no KV records"),
            ("loads in", "; ".join(self.compat_lines())),
            ("verified", "; ".join(self.verify_lines())),
        ]
        if self.consumers:
            rows.append(("consumers", "; ".join(self.consumer_lines())))
        if self.reuse:
            rows.append(("llama-server reuse", "; ".join(self.reuse_lines())))
        return rows

    def measured_consumer(self) -> ConsumerEntry | None:
        """The consumer answer a Verify measured (its restore in libllama or llama-server), None without one."""
        v = self.verify or {}
        engine, restore = v.get("engine") or {}, v.get("restore") or {}
        consumer = VERIFY_CONSUMER.get(str(engine.get("kind")))
        if consumer is None or restore.get("ok") is None:
            return None
        got = "loads" if restore["ok"] else ("crashes" if restore.get("aborted") else "refuses")
        build = engine.get("build") or engine.get("url") or engine.get("lib_dir") or "the engine"
        gen = next((c.generation for c in self.compat or [] if c.build == build), None)
        return ConsumerEntry(str(build), gen, consumer, got, "" if restore["ok"] else str(restore.get("message") or ""),
                             True)

    def consumer_entries(self) -> list[ConsumerEntry]:
        """libllama's and llama-server's answer per pinned build, each predicted or, for the build and
        consumer a Verify restored the file in, measured (replacing the prediction, which is kept as
        ``predicted`` where it said otherwise); llama-server's answer where it follows libllama's (it restores
        through the same ``llama_state_seq_load_file``) follows libllama's measured one. A Verify in an engine
        that is no pinned build (a running server, the user's libllama) comes first. The reader's guess at a
        dropped record, in a predicted message, is replaced by the record Verify names."""
        measured = self.measured_consumer()
        by_build = {c.build: c for c in self.compat or [] if c.build}
        predicted = {(a.build, a.consumer): a for a in self.consumers}
        out = []
        for a in self.consumers:
            c = by_build.get(a.build)
            layout = c.generation if c is not None else None
            if measured is not None and (measured.build, measured.consumer) == (a.build, a.consumer):
                out.append(dataclasses.replace(measured, layout=layout,
                                               predicted="" if a.answer == measured.answer else a.answer))
                continue
            lib = predicted.get((a.build, "libllama"))
            if measured is not None and a.consumer == "llama-server" and measured.consumer == "libllama" \
                    and measured.build == a.build and lib is not None:
                after = server_after(a, measured.answer, measured.message)
                if after is not None:
                    out.append(ConsumerEntry(a.build, layout, a.consumer, after.answer, after.message, True,
                                             via="libllama",
                                             predicted="" if a.answer == after.answer else a.answer))
                    continue
            hint = ""
            if c is not None and a.consumer == "libllama":
                if a.answer == "refuses" and c.stage == "header":
                    hint = migration_text(c)
                elif a.answer == "loads" and c.stage == "silent":
                    hint = f"but misreads it: {c.answer}"
            out.append(ConsumerEntry(a.build, layout, a.consumer, a.answer, self.measured(a.message), False,
                                     self.measured(hint)))
        if measured is not None and not any(e.measured and not e.via for e in out):
            out.insert(0, measured)
        return out

    def other_generations(self) -> list[tuple[GenCompat, str]]:
        """The layout generations no pinned build writes, each with its compatibility line (libllama's,
        predicted from the bytes)."""
        pinned = {a.build for a in self.consumers}
        lines = self.compat_lines() if self.compat else []
        return [(c, self.measured(line)) for c, line in zip(self.compat or [], lines, strict=True)
                if c.build not in pinned]

    def loads_in_consumers(self) -> list[str]:
        """``b11434 (libllama, llama-server)``: every pinned build in which some consumer loads the file."""
        out: dict[str, list[str]] = {}
        for e in self.consumer_entries():
            if e.answer == "loads":
                out.setdefault(e.build, []).append(e.consumer)
        return [f"{b} ({', '.join(cs)})" for b, cs in out.items()]

    def consumer_lines(self) -> list[str]:
        """libllama's and llama-server's answer per pinned build (loads / refuses / crashes / unknown); a
        Verify's restore in a build and consumer replaces that line and says so."""
        lines = []
        for e in self.consumer_entries():
            if e.measured:
                lines.append(f"{e.build} {e.consumer}: {e.source} (replaces the prediction): {e.detail(False)}")
            else:
                lines.append(f"{e.build} {e.consumer}: {e.detail(False)}")
        return lines

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "file": os.path.basename(self.path), "size": self.size, "sha256": self.sha256,
            "kind": self.kind, "kind_title": self.kind_title, "writer": self.writer,
            "layout": {"name": self.layout, "title": self.layout_title, "confidence": round(self.confidence, 3),
                       "runners_up": self.runners_up},
            "model": {"name": self.model, "fits": self.model_fits, "note": self.model_note},
            "tokens": self.tokens,
            "sequences": [s.__dict__ for s in self.sequences],
            "sections": [s.__dict__ for s in self.sections],
            "cache_types": list(self.cache_types),
            "rotation": list(self.rotation),
            "verdict": self.verdict.to_json(),
            "compatibility": [c.to_json() for c in self.compat] if self.compat is not None else None,
            "compatibility_text": self.compat_lines(),
            "releases": self.releases,
            "releases_text": self.releases_line(),
            "verify": self.verify,
            "reuse_prediction": [e.to_json() for e in self.reuse],
            "reuse_text": self.reuse_lines(),
            "consumers": [a.to_json() for a in self.consumers],
            "consumers_text": self.consumer_lines(),
        }
        if self.full_paths:
            out["path"] = self.path
        return out


def verify_lines(result: dict[str, Any] | None) -> list[str]:
    """A ``kvscope verify`` result dict as lines (``verdict``, ``engine``, ``restore``, ``next_token``,
    ``records``), or the "not verified" line."""
    if not result:
        return [NOT_VERIFIED]
    lines = []
    engine = result.get("engine") or {}
    eng = " ".join(str(engine[k]) for k in ("kind", "build") if engine.get(k))
    lines.append(f"{result.get('verdict', 'no verdict')}" + (f" (engine {eng})" if eng else ""))
    restore = result.get("restore") or {}
    if restore:
        ok = restore.get("ok")
        lines.append(f"restore: {'ok' if ok else 'failed' if ok is not None else 'not run'}"
                     + (f": {restore['message']}" if restore.get("message") else ""))
    nt = result.get("next_token") or {}
    if nt:
        parts = []
        if nt.get("max_abs_logit_diff") is not None:
            parts.append(f"max |logit diff| {float(nt['max_abs_logit_diff']):.3g}")
        if nt.get("same_argmax") is not None:
            parts.append("same next token" if nt["same_argmax"] else "a different next token")
        if nt.get("kl") is not None:
            parts.append(f"KL {float(nt['kl']):.3g}")
        lines.append("next token: " + (", ".join(parts) or "not compared"))
    records = list(result.get("records") or [])
    checks = [r for r in records if isinstance(r, dict) and "status" in r]
    if checks:  # kvscope verify's records: how many per status, then each one that is not a match
        counts: dict[str, int] = dict.fromkeys(VERIFY_STATUSES, 0)
        for r in checks:
            counts[str(r["status"])] = counts.get(str(r["status"]), 0) + 1
        lines.append("records: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n))
        for r in [r for r in checks if r["status"] != "match"][:MAX_VERIFY_RECORDS]:
            where = f"{r.get('section')}" + (f" stream {r['stream']}" if r.get("stream") is not None else "")
            lines.append(f"record: layer {r.get('il')} {str(r.get('role', '')).upper()} ({where}): {r['status']}"
                         + (f", max |diff| {float(r['max_abs']):.3g}" if r.get("max_abs") is not None
                            and r["status"] == "differs" else ""))
        records = [r for r in records if r not in checks]
    for rec in records:
        if isinstance(rec, dict):
            lines.append("record: " + ", ".join(f"{k} {v}" for k, v in rec.items()))
        else:
            lines.append(f"record: {rec}")
    return lines


def _tables(res: ParseResult) -> list[tuple[str, CellTable]]:
    out = []
    for sec in res.sections:
        if sec.kind == "kv":
            out += [(f"{sec.role} · stream {st.index}", st.cells) for st in sec.streams if st.cells is not None]
        elif sec.cells is not None:
            out.append((sec.role, sec.cells))
    return out


def sequences(res: ParseResult) -> list[SequenceFacts]:
    """Every sequence of every cell table, with its cells and position range (one sort per table).

    A per-sequence file's cells stored without sequence ids (llama.cpp writes none for a recurrent
    memory's cell, nor, before 2025-08, for any) are the cells of the file's one sequence."""
    out = []
    owner = file_sequence(res)
    for label, t in _tables(res):
        if not t.count:
            continue
        if not t.seq_ids.size:
            if owner is not None and t.pos.size:
                out.append(SequenceFacts(owner.seq, label, int(t.count), int(t.pos.min()), int(t.pos.max())))
            continue
        cell_of = np.repeat(np.arange(t.count, dtype=np.int64), np.maximum(t.n_seq, 0))[: t.seq_ids.size]
        order = np.argsort(t.seq_ids[: cell_of.size], kind="stable")
        ids, pos = t.seq_ids[order], t.pos[cell_of[order]]
        uniq, starts = np.unique(ids, return_index=True)
        counts = np.diff(np.append(starts, ids.size))
        lo, hi = np.minimum.reduceat(pos, starts), np.maximum.reduceat(pos, starts)
        out += [SequenceFacts(int(q), label, int(n), int(a), int(b))
                for q, n, a, b in zip(uniq, counts, lo, hi, strict=True)]
    return out


def sections(res: ParseResult) -> list[SectionFacts]:
    out = []
    for sec in res.sections:
        if sec.kind == "kv":
            cells = ", ".join(f"stream {st.index}: {plural(st.cell_count, 'cell')}" for st in sec.streams)
            cells = cells or "no stream"
            recs = sum(len(st.k_layers) + len(st.v_layers) for st in sec.streams)
        else:
            cells, recs = plural(sec.cell_count, "cell"), len(sec.all_layers())
        out.append(SectionFacts(sec.role, sec.kind, sec.offset, sec.size, cells, recs, sec.trusted))
    return out


def _types(recs: list[LayerRecord]) -> str:
    """``f16`` or ``q8_0 ×3, f16`` (how many records of each type, when they differ)."""
    counts: dict[str, int] = {}
    for r in recs:
        counts[r.type] = counts.get(r.type, 0) + 1
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{t} ×{n}" for t, n in counts.items())


def cache_types(res: ParseResult) -> list[str]:
    """The record types of every memory section: ``kv: K f16, V q8_0 (transposed)``."""
    out = []
    for sec in res.sections:
        roles: list[tuple[str, list[LayerRecord]]]
        if sec.kind == "kv":
            k = [r for st in sec.streams for r in st.k_layers]
            v = [r for st in sec.streams for r in st.v_layers]
            roles = [("K", k), ("V", v)]
        else:
            roles = [("r", sec.r_layers), ("s", sec.s_layers)]
        parts = []
        for name, recs in roles:
            if recs:
                trans = " (transposed)" if name == "V" and any(r.transposed for r in recs) else ""
                parts.append(f"{name} {_types(recs)}{trans}")
        if parts:
            out.append(f"{sec.role}: {', '.join(parts)}")
    return out


def _rows_rotated(recs: list[LayerRecord]) -> str:
    marks = {(r.rotated, r.rot_block) for r in recs}
    if len(marks) != 1:
        return "rotated in some records only"
    rotated, block = next(iter(marks))
    if rotated is None:
        return "not known"
    return f"Hadamard-rotated, blocks of {block}" if rotated else "not rotated"


def rotation(res: ParseResult, profile: ModelProfile | None = None) -> list[str]:
    """The K/V rotation of every KV stream with records: the ``n_rot_k``/``n_rot_v`` fields (as written by
    2026-10-v4 files, else inferred: from the model and cache types when ``profile``, the model the file was
    read with, is given; without it, from the cache types alone, where no build rotates such rows) and
    whether the rows are rotated."""
    out = []
    inferred = ("inferred from the model and cache types" if profile is not None
                else "inferred from the cache types: no build rotates such rows")
    for sec in res.sections:
        if sec.kind != "kv":
            continue
        for st in sec.streams:
            if not st.k_layers and not st.v_layers:
                continue
            if st.n_rot_k is not None or st.n_rot_v is not None:
                how = inferred if st.n_rot_inferred else "as written"
                fields = f"n_rot_k {st.n_rot_k if st.n_rot_k is not None else '?'}, " \
                         f"n_rot_v {st.n_rot_v if st.n_rot_v is not None else '?'} ({how})"
            else:
                fields = "n_rot_k/n_rot_v not stored in this layout (give the model to infer them)"
            rows = [f"{name} rows {_rows_rotated(recs)}" for name, recs in (("K", st.k_layers), ("V", st.v_layers))
                    if recs]
            out.append(f"{sec.role} stream {st.index}: {fields}; {', '.join(rows)}")
    return out


def _model(res: ParseResult, profile: ModelProfile | None, full_paths: bool) -> tuple[str, bool | None, str]:
    arch = res.header.get("arch")
    if profile is None:
        note = f"the file names the architecture '{arch}'; " if isinstance(arch, str) else ""
        return "none given", None, note + "give the GGUF model to check the rows, layers and tokens against it"
    name = profile.path if full_paths else os.path.basename(profile.path)
    what = f"{name} ({profile.arch}, {plural(profile.n_layer, 'layer')}, {profile.memory_class} memory)"
    if res.kind == "unknown":
        return what, None, "not checked: the file is not a llama.cpp state file"
    mismatch = model_mismatch_reason(res, profile)
    if mismatch is not None:
        return what, False, f"does not fit: {mismatch}"
    warned = [f for f in res.findings if f.code == "model_mismatch" and f.severity == "warning"]
    if warned:
        return what, False, f"does not fit: {warned[0].message}"
    plan = [f for f in res.findings if f.code in PLAN_CODES and f.severity in ("error", "warning")]
    if plan:  # the file is damaged (else it would be a model mismatch): the damage may be the disagreement
        return what, None, f"not certain: the file is damaged where it disagrees with the model ({plan[0].message})"
    if any(f.code == "token_out_of_vocab" for f in res.findings):
        return what, True, f"{FITS}; the token ids outside its vocabulary are damage (see the findings)"
    if res.n_errors and not res.sections:
        return what, None, "not certain: the file is damaged before its memory state"
    return what, True, FITS


def slot_reuse(res: ParseResult, profile: ModelProfile | None, compat: list[GenCompat] | None,
               consumers: list[ConsumerAnswer] | None = None) -> list[ReusePrediction]:
    """The Overview's reuse prediction (empty for a file that is not a slot file); ``compat`` gives each
    build's libllama answer (None while it is being computed: whether it restores is then not told),
    ``consumers`` each build's llama-server answer to the restore (the builds table's: worked out when not given)."""
    return predict_reuse(res, profile, compat, consumers=consumers) if res.kind == "seq_file" else []


def build_overview(res: ParseResult, profile: ModelProfile | None = None, compat: list[GenCompat] | None = None,
                   verify: dict[str, Any] | None = None, full_paths: bool = False,
                   sha256: str | None = None) -> Overview:
    """The overview of ``res`` (read with ``profile``); ``compat`` from
    :func:`kvscope.core.analysis.compat.compatibility` (None while it is being computed), ``verify``
    a ``kvscope verify`` result dict (None: not verified)."""
    lay = res.layout
    gen = GENERATION_BY_NAME.get(lay.name)
    runners = []
    others = [alt for alt in lay.alternatives if alt.get("name") != lay.name]  # another reading of the same one
    for alt in others[:3]:
        note = "byte-identical" if alt.get("indistinguishable") else plural(int(alt.get("errors", 0)), "error")
        runners.append(f"{alt.get('name')} ({note})")
    writer = WRITERS.get(res.kind, "unknown")
    if res.partial and res.kind == "seq_blob":
        writer = PARTIAL_WRITER
    if res.kind == "seq_file" and res.token_payload is not None:
        writer = SLOT_WRITER
    model, fits, note = _model(res, profile, full_paths)
    consumers = consumer_answers(res, profile, compat)  # once: the builds table and the reuse lines follow it
    from kvscope.core.analysis.release_answers import release_ranges

    rel = release_ranges(res, compat, profile)
    return Overview(
        file=res.path if full_paths else os.path.basename(res.path), path=res.path, size=res.size,
        kind=res.kind, kind_title=KIND_TITLES.get(res.kind, res.kind), writer=writer,
        layout=lay.name, layout_title=gen.title if gen is not None else "no known layout", confidence=lay.confidence,
        runners_up=runners, model=model, model_fits=fits, model_note=note, tokens=len(res.tokens),
        sequences=sequences(res), sections=sections(res), verdict=verdict(res, profile),
        cache_types=cache_types(res), rotation=rotation(res, profile), compat=compat, verify=verify,
        reuse=slot_reuse(res, profile, compat, consumers if compat is not None else None), consumers=consumers,
        sha256=sha256, full_paths=full_paths, releases=rel)
