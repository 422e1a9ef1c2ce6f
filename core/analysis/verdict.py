"""The one-line verdict on a parsed state file, and the bytes a truncated file is missing.

:func:`verdict` turns a :class:`~kvscope.core.reader.records.ParseResult` into a
:class:`Verdict`: ``healthy``, ``damaged``, ``suspicious``, ``newer`` or ``not_state``, with the reason in
one line and the findings that matter most. The app's overview, the report and the command line
all call it, so they never disagree. The rules:

- ``not_state``: the reader did not recognise the file (``kind == "unknown"``).
- ``newer``: a llama.cpp newer than this kvscope wrote it (a ``version_newer`` finding: its version word is
  above the newest the layout table knows); the reader read it as the newest known layout where the bytes fit,
  so no error of that reading is proof of damage (:func:`newer_reason`). Never ``damaged``; the command line
  exits 1 on it, as on an error.
- ``damaged``: at least one error finding (the file ends early, a count or record is invalid...),
  unless every error is about the model (see ``model_mismatch``).
- ``model_mismatch`` (a ``suspicious`` level, never ``damaged``): the file fits its own structure but
  not the model given: every error is a ``model_mismatch`` finding (the reader found the model's
  plan wrong and the file's own structure clean, or the file names another architecture) or a token
  id outside the model's vocabulary, and either such a finding is there or the token ids say the
  file used a larger vocabulary (:func:`vocabulary_mismatch`). One id outside the vocabulary among
  ids inside it is damage; most ids above it, all plausible vocabulary ids, are another model.
- ``suspicious``: warnings, or bytes that were not parsed or not trusted without an error.
- ``healthy``: nothing of the above (info notes, such as "give the model to confirm the end",
  are mentioned in the reason).

The verdict weighs the findings it is given: the tensor values (NaN/Inf, zero rows) count only once
the statistics scanned them (:mod:`kvscope.core.analysis.stats`, whose findings join the file's). A
caller that did not scan them says so in the line: :meth:`Verdict.line` with ``values_scanned=False``
reads ``healthy (values not scanned): ...`` (:data:`NOT_SCANNED`, the one wording every command uses).

:func:`missing_bytes` says where a truncated file should have gone on: the exact lower bound from
the truncation finding (``extra["needed"]``, ``extra["file_end"]``), extended by the records the
cut stream still had to hold (from its ``n_layer``, cell count and the record sizes already seen)
and at least the cell count of every stream after it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from kvscope.core.findings import NEWER_CODES, SEVERITY_RANK, Finding
from kvscope.core.model.memory_plan import ExpectedSection
from kvscope.core.model.profile import ModelProfile
from kvscope.core.reader.record_names import located_label, planned_layer
from kvscope.core.reader.records import KvStream, LayerRecord, ParseResult, Section
from kvscope.core.reader.tree import coverage
from kvscope.core.textsafe import plural as plural  # the one number form (re-exported: its old home)

Level = Literal["healthy", "damaged", "suspicious", "newer", "not_state"]
LEVELS: tuple[Level, ...] = ("healthy", "suspicious", "newer", "damaged", "not_state")
# A verdict's state: its level, or a finer state of that level ("model_mismatch" is "suspicious").
State = Literal["healthy", "damaged", "suspicious", "newer", "model_mismatch", "not_state"]
LEVEL_TITLE: dict[str, str] = {"healthy": "healthy", "damaged": "damaged", "suspicious": "suspicious",
                               "newer": "newer", "model_mismatch": "model mismatch", "not_state": "not a state file"}
MODEL_ONLY_CODES = frozenset({"model_mismatch", "token_out_of_vocab"})  # errors about the model, not the bytes
# ``kvscope verify``'s verdicts (kvscope.core.verify.result.VERDICTS) as levels: "diverges" (the state restores,
# but the model computes beyond the engine's own variation after it) is damage a user must act on
VERIFY_VERDICT_LEVEL: dict[str, Level] = {"ok": "healthy", "damaged": "damaged", "stale": "suspicious",
                                          "incompatible": "suspicious", "diverges": "damaged"}
VERIFY_VERDICT_TITLE: dict[str, str] = {"ok": "ok", "damaged": "damaged", "stale": "stale",
                                        "incompatible": "incompatible",
                                        "diverges": "diverges (restores, but the model computes otherwise)"}
# A larger vocabulary than the model's: at least this share of the token ids outside it, all of them
# ids a real vocabulary can have (the largest today hold about 2**18 tokens; random or NaN-filled
# bytes give ids far above, negative ones none)
VOCAB_MISMATCH_SHARE = 0.25
MAX_VOCAB_ID = 1 << 20
TOP_FINDINGS = 5
NOT_SCANNED = "values not scanned"  # the verdict of a file whose tensor values were not scanned says so
EMPTY_STREAM_BYTES = 4  # a stream holds at least its u32 cell_count


@dataclass(frozen=True)
class MissingRecord:
    """A record (or the rest of one) that a truncated file should still hold, past its end."""

    name: str  # e.g. "stream0/K3 (rest)", "stream0/V2", "stream1"
    offset: int  # where it would start (the file's end for the cut record's rest)
    size: int  # bytes it would take (a lower bound for streams whose cell count is unknown)
    estimated: bool  # the size comes from the records already seen, not from a field of the file
    label: str = ""  # a record's label as the tree names records (kvscope.core.reader.record_names); "" for a stream


@dataclass(frozen=True)
class MissingBytes:
    """The bytes past the end of a truncated file: ``[file_end, expected_end)``."""

    file_end: int
    needed_end: int  # the exact lower bound: where the item the file ends inside would end
    expected_end: int  # the size the file should have, as far as its own headers tell (>= needed_end)
    records: tuple[MissingRecord, ...]
    more_may_follow: bool  # later sections (or a model-dependent part) are not counted
    finding: Finding

    @property
    def missing(self) -> int:
        return self.expected_end - self.file_end

    def text(self) -> str:
        """``at least 3,688 bytes missing: the file should be 7,376 bytes (it has 3,688)``."""
        bound = "at least " if self.more_may_follow or self.expected_end == self.needed_end else ""
        return (f"{bound}{plural(self.missing, 'byte')} missing: the file should be "
                f"{'at least ' if bound else ''}{self.expected_end:,} bytes (it has {self.file_end:,})")

    def to_json(self) -> dict[str, Any]:
        return {"file_end": self.file_end, "needed_end": self.needed_end, "expected_end": self.expected_end,
                "missing": self.missing, "more_may_follow": self.more_may_follow,
                "records": [{"name": r.name, "offset": r.offset, "size": r.size, "estimated": r.estimated,
                             **({"label": r.label} if r.label else {})} for r in self.records]}


@dataclass(frozen=True)
class Verdict:
    """The verdict in one line: ``level`` (see :data:`LEVELS`), ``reason``, the findings that matter most."""

    level: Level
    reason: str
    top_findings: tuple[Finding, ...] = ()
    missing: MissingBytes | None = None
    counts: dict[str, int] = field(default_factory=dict)  # findings per severity
    detail: State | None = None  # a finer state than the level ("model_mismatch"); None: the level itself

    @property
    def state(self) -> State:
        """The level, or the finer state of it: ``model_mismatch`` is a ``suspicious`` file that does not fit
        the model given."""
        return self.detail or self.level

    @property
    def title(self) -> str:
        return LEVEL_TITLE[self.state]

    def line(self, values_scanned: bool = True) -> str:
        """``damaged: the file ends inside ...``; ``values_scanned=False``: the tensor values were not scanned
        (NaN/Inf and zero rows not looked for), which the title says: ``healthy (values not scanned): ...``."""
        return f"{self.title_for(values_scanned)}: {self.reason}"

    def title_for(self, values_scanned: bool = True) -> str:
        """The title, with `` (values not scanned)`` (:data:`NOT_SCANNED`) when the values were not scanned
        (never for a file that is not a state file: it has no values to scan)."""
        if values_scanned or self.level == "not_state":
            return self.title
        return f"{self.title} ({NOT_SCANNED})"

    def to_json(self) -> dict[str, Any]:
        return {"level": self.level, "state": self.state, "title": self.title, "reason": self.reason,
                "counts": dict(self.counts),
                "top_findings": [f.to_json() for f in self.top_findings],
                "missing": self.missing.to_json() if self.missing is not None else None}


def finding_counts(res: ParseResult) -> dict[str, int]:
    out = {"error": 0, "warning": 0, "info": 0}
    for f in res.findings:
        out[f.severity] = out.get(f.severity, 0) + 1
    return out


def counts_text(counts: dict[str, int]) -> str:
    """``8 findings (8 errors, 0 warnings, 0 info)``."""
    n = sum(counts.values())
    return (f"{plural(n, 'finding')} ({plural(counts.get('error', 0), 'error')}, "
            f"{plural(counts.get('warning', 0), 'warning')}, {counts.get('info', 0):,} info)")


def top_findings(res: ParseResult, n: int = TOP_FINDINGS) -> tuple[Finding, ...]:
    """The ``n`` findings that matter most: errors before warnings before info, each in file order;
    a code repeated with the same message shows once."""
    seen: set[tuple[str, str]] = set()
    out: list[Finding] = []
    for f in sorted(res.findings, key=lambda f: (-SEVERITY_RANK.get(f.severity, 0), f.offset)):
        key = (f.code, f.message)
        if key in seen:
            continue
        seen.add(key)
        out.append(f)
        if len(out) >= n:
            break
    return tuple(out)


def verdict(res: ParseResult, profile: ModelProfile | None = None) -> Verdict:
    """The verdict on ``res``, read with ``profile`` (see the module docstring for the rules)."""
    counts = finding_counts(res)
    top = top_findings(res)
    if res.kind == "unknown":
        why = res.findings[0].message if res.findings else "the bytes match no llama.cpp state layout"
        return Verdict("not_state", why, top, None, counts)
    errors = [f for f in res.findings if f.severity == "error"]
    missing = missing_bytes(res, profile)
    newer = newer_reason(res, errors)
    if newer is not None:
        return Verdict("newer", newer, top, missing, counts)
    if errors:
        more = f" (and {plural(len(errors) - 1, 'more error')})" if len(errors) > 1 else ""
        mismatch = model_mismatch_reason(res, profile)
        if mismatch is not None:
            if "does not fit" not in mismatch:
                mismatch = f"it does not fit the model: {mismatch}"
            return Verdict("suspicious", mismatch, top, None, counts, "model_mismatch")
        if missing is not None:
            first = missing.finding
            return Verdict("damaged", f"the file ends early, {missing.text()}; {first.message}{more}", top,
                           missing, counts)
        first = min((f for f in errors if f.code != "model_mismatch"), key=lambda f: f.offset)
        return Verdict("damaged", f"{first.message}{more}", top, None, counts)
    warnings = [f for f in res.findings if f.severity == "warning"]
    if warnings:
        first = min(warnings, key=lambda f: f.offset)
        more = f" (and {plural(len(warnings) - 1, 'more warning')})" if len(warnings) > 1 else ""
        about_model = all(f.code == "model_mismatch" for f in warnings)
        why = f"{first.message}{more}"
        if about_model and "does not fit" not in why:
            why = f"it does not fit the model: {why}"
        return Verdict("suspicious", why, top, None, counts, "model_mismatch" if about_model else None)
    cov = coverage(res.root)
    odd = cov["unparsed_bytes"] + cov["untrusted_bytes"] + cov["trailing_bytes"]
    if odd:
        return Verdict("suspicious", f"{plural(odd, 'byte')} not parsed or not trusted, though no check failed",
                       top, None, counts)
    notes = [f for f in res.findings if f.severity == "info"]
    reason = f"all {plural(res.size, 'byte')} parsed; no error or warning"
    if notes:
        reason += f" ({plural(len(notes), 'note')} in the findings)"
    return Verdict("healthy", reason, top, None, counts)


def newer_reason(res: ParseResult, errors: list[Finding] | None = None) -> str | None:
    """Why ``res`` was written by a llama.cpp newer than this kvscope knows (None: nothing says so): ``written by
    a llama.cpp newer than this kvscope knows (seq version 5; the newest known, b11434, writes 4); read as 4 where
    the bytes fit: 668 bytes trusted``. The numbers and the build come from the reader's finding (the layout table
    and the pinned builds); errors of that reading follow (a newer layout may differ where they are)."""
    found = next((f for f in res.findings if f.code in NEWER_CODES), None)
    if found is None:
        return None
    x = found.extra
    known, read_as = x.get("newest_known"), x.get("read_as", x.get("newest_known"))
    who = x.get("newest_build") or x.get("newest_generation")
    cov = coverage(res.root)
    trusted = cov["parsed_bytes"]
    of = f" of {res.size:,}" if trusted < res.size else ""
    why = (f"written by a llama.cpp newer than this kvscope knows ({x.get('version_word', 'file')} version "
           f"{x.get('version')}; the newest known, {who}, writes {known}); read as {read_as} where the bytes fit: "
           f"{plural(trusted, 'byte')}{of} trusted")
    errors = [f for f in res.findings if f.severity == "error"] if errors is None else errors
    if errors:
        first = min(errors, key=lambda f: f.offset)
        more = f" (and {plural(len(errors) - 1, 'more error')})" if len(errors) > 1 else ""
        why += f"; read as {read_as}: {first.message}{more}"
    return why


def vocabulary_mismatch(res: ParseResult, profile: ModelProfile | None) -> str | None:
    """Why the file's token ids say it was written with a larger vocabulary than ``profile``'s (None: they
    do not, or there is no model): at least two ids and :data:`VOCAB_MISMATCH_SHARE` of them outside the
    vocabulary, every one a plausible vocabulary id (0 <= id < :data:`MAX_VOCAB_ID`)."""
    if profile is None or not profile.n_vocab or not res.tokens:
        return None
    toks = np.asarray(res.tokens, dtype=np.int64)
    bad = toks[(toks < 0) | (toks >= profile.n_vocab)]
    if bad.size < 2 or bad.size < VOCAB_MISMATCH_SHARE * toks.size:
        return None
    if int(bad.min()) < 0 or int(bad.max()) >= MAX_VOCAB_ID:
        return None
    return (f"{bad.size:,} of its {plural(toks.size, 'token id')} are outside the model's vocabulary of "
            f"{profile.n_vocab:,} (ids up to {int(bad.max()):,}): it was written with a larger vocabulary")


def model_mismatch_reason(res: ParseResult, profile: ModelProfile | None = None) -> str | None:
    """Why ``res`` fits its own structure but not the model it was read with (None: it is not a model
    mismatch): every error is a model-only finding (:data:`MODEL_ONLY_CODES`) and a ``model_mismatch``
    error or :func:`vocabulary_mismatch` says the model is another one."""
    errors = [f for f in res.findings if f.severity == "error"]
    if not errors or any(f.code not in MODEL_ONLY_CODES for f in errors):
        return None
    named = [f for f in errors if f.code == "model_mismatch"]
    vocab = vocabulary_mismatch(res, profile)
    if not named and vocab is None:
        return None  # ids outside the vocabulary among ids inside it: damage, not another model
    parts = [f.message for f in named]
    if vocab is not None:
        parts.append(vocab)
    elif len(errors) > len(named):  # read with the wrong model, its vocabulary says nothing
        parts.append(f"{plural(len(errors) - len(named), 'token finding')} against its vocabulary")
    return "; ".join(parts)


# -- the bytes past the end ------------------------------------------------------------------------
def _truncation(res: ParseResult) -> Finding | None:
    cut = [f for f in res.findings
           if f.code == "truncated" and f.severity == "error" and isinstance(f.extra.get("needed"), int)]
    return max(cut, key=lambda f: f.offset) if cut else None


def _data_size(rec: LayerRecord) -> int:
    """The payload size a record's header announces (its ``data_size`` is cut short when truncated)."""
    if rec.transposed:
        return rec.el_bytes * rec.n_embd_v_gqa * rec.n_rows
    return rec.row_bytes * rec.n_rows


def _full_size(rec: LayerRecord) -> int:
    return rec.data_offset - rec.header_offset + _data_size(rec)


@dataclass
class _Unit:
    """The records of one KV stream or recurrent section, per role in file order, with how many each
    role should have (None: unknown) and whether a role may borrow the record size of the role before."""

    name: str
    roles: list[tuple[str, list[LayerRecord], int | None]]
    borrow: bool
    section: str = ""
    stream: int | None = None  # said in the labels when the section has several streams
    plan: ExpectedSection | None = None  # the model's plan of the section (its layers), None without a model

    def label(self, role: str, index: int, rest: bool = False) -> str:
        """The label of record ``index`` of ``role`` (:func:`located_label`), present or not."""
        return located_label(self.section, role, index, planned_layer(self.plan, self.section, role, index),
                             self.stream, rest)


def _units(sec: Section, profile: ModelProfile | None) -> list[tuple[KvStream | None, _Unit]]:
    plan = profile.section_plan(sec.role) if profile is not None else None
    if sec.kind == "kv":
        no_v = profile is not None and profile.is_mla  # MLA caches keep K only
        several = max(sec.n_stream or 0, len(sec.streams)) > 1  # as record_names.stream_of says it
        return [(st, _Unit(f"stream{st.index}", [("k", st.k_layers, st.n_layer),
                                                 ("v", st.v_layers, 0 if no_v else st.n_layer)], True,
                           sec.role, st.index if several else None, plan))
                for st in sec.streams]
    # records are written for the recurrent layers only: how many there are takes the model
    n = len(profile.recurrent_layers) if profile is not None and profile.recurrent_layers else None
    return [(None, _Unit(sec.role, [("r", sec.r_layers, n), ("s", sec.s_layers, n)], False, sec.role, None, plan))]


def _rest_of_unit(unit: _Unit, cut: Finding, file_end: int) -> tuple[list[MissingRecord], int, bool]:
    """Records of ``unit`` still to come after the file's end: (records, expected end, every count known)."""
    needed_end = cut.offset + int(cut.extra["needed"])
    records = [r for _, recs, _ in unit.roles for r in recs]
    if not records:
        return [], needed_end, False
    last = max(records, key=lambda r: r.header_offset)
    last_role = next(i for i, (_, recs, _) in enumerate(unit.roles) if recs and recs[-1] is last)
    last_end = last.header_offset + _full_size(last)
    out: list[MissingRecord] = []
    pos, placed = file_end, False
    template: LayerRecord | None = None
    for i, (role, recs, expected) in enumerate(unit.roles):
        template = recs[-1] if recs else (template if unit.borrow else None)
        if i < last_role:
            continue
        if expected is None or template is None:
            return out, max(pos, needed_end), False
        have = len(recs)
        if i == last_role and last.header_offset <= cut.offset < last_end:  # the file ends inside the last record
            out.append(MissingRecord(f"{unit.name}/{role.upper()}{have - 1} (rest)", pos, last_end - pos, False,
                                     unit.label(role, have - 1, rest=True)))
            pos, placed = last_end, True
        elif not placed and have < expected:  # it ends inside the next record of this role
            end = last_end + _full_size(template)
            out.append(MissingRecord(f"{unit.name}/{role.upper()}{have} (rest)", pos, max(0, end - pos), True,
                                     unit.label(role, have, rest=True)))
            pos, placed, have = max(pos, end), True, have + 1
        for j in range(have, expected):
            size = _full_size(template)
            out.append(MissingRecord(f"{unit.name}/{role.upper()}{j}", pos, size, True, unit.label(role, j)))
            pos += size
    return out, max(pos, needed_end), True


def _last_section(res: ParseResult, sec: Section, profile: ModelProfile | None) -> bool:
    """True when the model says no memory section follows ``sec``."""
    if profile is None:
        return False
    expected = profile.expected_sections(res.partial)
    return bool(expected) and expected[-1].role == sec.role


def _starts_before(stream: KvStream | None, offset: int) -> bool:
    return stream is None or stream.offset <= offset


def missing_bytes(res: ParseResult, profile: ModelProfile | None = None) -> MissingBytes | None:
    """Where a truncated file should have gone on (None when no finding says the file ends early).

    Without ``profile`` (the model it was read with) the counts a model decides (how many recurrent
    layers, whether another memory section follows) stay open and the result is a lower bound."""
    cut = _truncation(res)
    if cut is None:
        return None
    file_end = int(cut.extra.get("file_end", res.size))
    needed_end = max(file_end, cut.offset + int(cut.extra["needed"]))
    records: list[MissingRecord] = []
    expected = needed_end
    more = True
    sec = next((s for s in reversed(res.sections) if s.offset <= cut.offset), None)
    if sec is not None and cut.offset >= (res.memory_offset or 0):
        units = _units(sec, profile)
        hit = next((i for i in reversed(range(len(units))) if _starts_before(units[i][0], cut.offset)), None)
        if hit is not None:
            rest, end, complete = _rest_of_unit(units[hit][1], cut, file_end)
            records += rest
            expected = max(expected, end)
            more = not complete
            if sec.kind == "kv":
                n_stream = sec.n_stream if sec.n_stream is not None else len(sec.streams)
                for i in range(hit + 1, n_stream):
                    records.append(MissingRecord(f"stream{i}", expected, EMPTY_STREAM_BYTES, False))
                    expected += EMPTY_STREAM_BYTES
                    more = True  # a later stream holds at least its cell count; its cells are unknown
            more = more or not _last_section(res, sec, profile)
    return MissingBytes(file_end, needed_end, expected, tuple(records), more, cut)
