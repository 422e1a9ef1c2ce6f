"""Step 1 of a report: read the file and gather everything the report shows (no Qt; any thread).

The file goes through the one inspection pipeline (:func:`kvscope.core.analysis.inspection.inspect_file`,
with the statistics and the compatibility), or the app's document's inspection of it is reused, so a
report's ``report.json`` is ``kvscope inspect --json --stats``'s object (:meth:`Inspection.to_json`) plus the
report's own keys (``overview``, ``report``, ``diff``, ``lab``); the overview
(:func:`kvscope.core.analysis.overview.build_overview`) carries the verdict, which llama.cpp generations
load the file, its size and sha256.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvscope.core.errors import InputError
from kvscope.core.fsutil import SHA256_MAX_BYTES
from kvscope.core.reader.record_names import record_label, section_of_path
from kvscope.core.report.model import (
    MAX_HEATMAPS,
    Cancelled,
    Flagged,
    Progress,
    ReportData,
    ReportError,
    ReportOptions,
    layer_records,
    no_progress,
)

if TYPE_CHECKING:
    from kvscope.core.analysis.diff import StateDiff
    from kvscope.core.analysis.inspection import Inspection
    from kvscope.core.analysis.overview import Overview
    from kvscope.core.analysis.stats import LayerStats, StatsReport
    from kvscope.core.findings import Finding
    from kvscope.core.model.profile import ModelProfile
    from kvscope.core.reader.records import KvStream, LayerRecord, ParseResult, Section


@dataclass(frozen=True)
class Preloaded:
    """Work an open document has already done (the app's export reuses it instead of reading again): its
    inspection (the pipeline's, statistics and compatibility in), its diff, its verify result."""

    inspection: Inspection
    diff: StateDiff | None = None
    verify: dict[str, Any] | None = None  # the document's ``kvscope verify`` result (verify_for_report)


VERIFY_KEYS = ("verdict", "reasons", "restore", "records", "cells", "next_token", "compared", "reuse",
               "setup_mismatch", "size", "sha256", "kind", "layout")


def verify_for_report(result: dict[str, Any] | None, source: str | None = None) -> dict[str, Any] | None:
    """A verify result as a report shows it: the verdict, engine kind / build / why, restore, records, next
    token, the llama-server reuse it measured, the size and sha256 of the file it read; no paths (the file, the
    model and the engine's library folder stay out of public bug reports). ``source``: where it came from
    (``kvscope report --verify``, a ``verify --json`` file), said in the report."""
    if not result:
        return None
    out = {k: result[k] for k in VERIFY_KEYS if k in result}
    eng = result.get("engine") or {}
    out["engine"] = {k: eng[k] for k in ("kind", "build", "commit", "writes", "reason", "started_by_kvscope")
                     if k in eng}
    if "(given with --lib)" in str(out["engine"].get("reason") or ""):  # "the library in PATH (given with --lib)"
        out["engine"]["reason"] = "a libllama given with --lib"
    if eng.get("url") and not eng.get("started_by_kvscope"):
        out["engine"]["url"] = eng["url"]  # the user's own llama-server (kvscope's own listens on a random port)
    if source:
        out["source"] = source
    restore = result.get("restore")
    if isinstance(restore, dict):
        out["restore"] = {k: restore.get(k) for k in ("ok", "message", "returned", "aborted")}
    return out


def check_inputs(options: ReportOptions) -> None:
    """Fail early, with one line, on paths that cannot be read."""
    named = [("", options.file), ("model ", options.model), ("--compare ", options.compare),
             ("--lab-context ", options.lab_context)]
    for what, path in named:
        if path is None:
            continue
        if not os.path.exists(path):
            raise ReportError(f"{what}{path}: no such file")
        if os.path.isdir(path) and what != "--lab-context ":
            raise ReportError(f"{what}{path}: is a directory")


def load_profile(path: str | None) -> ModelProfile | None:
    """The model profile of ``path`` (None without one); ReportError when it cannot be used."""
    if path is None:
        return None
    from kvscope.core.model.profile import load_model_or

    return load_model_or(path, ReportError)


def inspect(path: str, profile: ModelProfile | None, stats: bool = True, compat: bool = True) -> Inspection:
    """``path`` through the one inspection pipeline (:func:`kvscope.core.analysis.inspection.inspect_file`):
    parse, verdict, with ``stats`` the payload statistics (a scan that fails is kept as ``stats_error``: a
    report without statistics beats none) and with ``compat`` which layout generations load it. ReportError
    when the file cannot be read, changed while it was read, or is not a llama.cpp state file."""
    from kvscope.core.analysis.inspection import inspect_file

    try:
        found = inspect_file(path, profile, stats=stats, compat=compat, keep_stats_error=True)
    except InputError as e:  # unreadable, special, changed meanwhile
        raise ReportError(str(e)) from None
    except OSError as e:
        raise ReportError(f"{path}: {e.strerror or e}") from None
    except ValueError as e:
        raise ReportError(f"{path}: {e}") from None
    if not found.is_state:
        raise ReportError(f"{path}: {found.not_state_reason()}")
    return found


def flagged_records(res: ParseResult, stats: StatsReport | None,
                    verify: dict[str, Any] | None = None) -> tuple[list[Flagged], int]:
    """Records with non-finite values or zero rows (at most :data:`MAX_HEATMAPS`, plus how many in all);
    with none, a record of the damaged layer: the first record a ``kvscope verify`` result (``verify``) measured
    as not right (:func:`measured_record`), else the one the reader's findings name (:func:`damaged_record`:
    where a truncated file's end cuts a record), else the first K record (else the first record) so the report
    still shows one heatmap."""
    records = layer_records(res)
    by_key = {(si, st.index if st is not None else None, r.role, r.index): r for si, _, st, r in records}
    hits: list[Flagged] = []
    for ls in stats.layers if stats is not None else []:
        if not (ls.n_nonfinite or ls.zero_rows):
            continue
        rec = by_key.get((ls.section_index, ls.stream, ls.role, ls.index))
        if rec is None:
            continue
        why = "flagged for " + " and ".join(x for x in (f"{ls.n_nonfinite} non-finite values" if ls.n_nonfinite
                                                        else "", f"{ls.zero_rows} zero rows" if ls.zero_rows
                                                        else "") if x)
        hits.append(Flagged(rec, ls, why))
    if hits:
        return _spread(hits), len(hits)
    damaged = measured_record(res, stats, verify) or damaged_record(res, stats)
    if damaged is not None:
        return [damaged], 0
    recs = [r for _, _, _, r in records]
    first = next((r for r in recs if r.role == "k"), recs[0] if recs else None)
    if first is None:
        return [], 0
    ref = _stats_of(first, stats)
    return [Flagged(first, ref, "for reference: no record has non-finite values or zero rows")], 0


def _stats_of(rec: LayerRecord, stats: StatsReport | None) -> LayerStats | None:
    """The statistics of ``rec`` in ``stats`` (matched by its data offset), None without them."""
    return next((x for x in stats.layers if x.data_offset == rec.data_offset), None) if stats is not None else None


def _finding_place(path: str) -> tuple[str | None, int | None]:
    """The record role (``k``/``v``) and KV stream a finding's node path names (``/memory/kv/stream0/V1``)."""
    import re

    last = path.rstrip("/").rsplit("/", 1)[-1]
    role = last[0].lower() if re.fullmatch(r"[KV]\d+( .*)?", last) else None
    m = re.search(r"/stream(\d+)(/|$)", path)
    return role, int(m.group(1)) if m else None


def _picture(mine: list[LayerRecord], layer: int, role: str | None, stats: StatsReport | None,
             what: str, *, absent: bool = False) -> Flagged | None:
    """The record that pictures ``layer`` (its ``role`` record) among ``mine``: its own (unless ``absent``: a
    record measured missing, whose name the reader may have given to another), else the same layer's other
    record, else the nearest record of its role; None when there is none. ``what`` says why, and the caption
    says which record stands in."""
    same = [r for r in mine if r.il == layer]
    rec = None if absent else next((r for r in same if role is None or r.role == role), None)
    if absent:
        same = [r for r in same if role is None or r.role != role]
    if rec is None and same:
        rec = same[0]
        what += (f" (its {(role or '?').upper()} record is cut short or missing: its {rec.role.upper()} record "
                 "is shown)")
    if rec is None:
        near = [r for r in mine if r.il is not None and (role is None or r.role == role)]
        if not near:
            return None
        rec = min(near, key=lambda r: (abs((r.il or 0) - layer), -(r.il or 0)))
        what += (f" (layer {layer} has no record in the file: the nearest, {rec.role.upper()} layer {rec.il}, is "
                 "shown)")
    return Flagged(rec, _stats_of(rec, stats), what)


def measured_record(res: ParseResult, stats: StatsReport | None, verify: dict[str, Any] | None) -> Flagged | None:
    """The record that pictures the first record a ``kvscope verify`` result measured as not right (missing,
    differing, non-finite, extra: its section, stream, layer and role against a real engine's), in place of
    the reader's guess; None without such a record, or when Verify's verdict is ``ok`` (records that drifted by
    rounding, or a chunk reused after another prefix, are not damage to picture)."""
    if not verify or verify.get("verdict") == "ok":
        return None
    records = layer_records(res)
    for c in verify.get("records") or []:
        if not isinstance(c, dict) or c.get("status") in (None, "match") or not isinstance(c.get("il"), int):
            continue
        section, stream, role = str(c.get("section")), c.get("stream"), str(c.get("role") or "") or None
        mine = [r for _, sec, st, r in records
                if sec.role == section and (stream is None or st is None or st.index == stream)]
        name = f"{role.upper()} " if role else ""
        found = _picture(mine, int(c["il"]), role, stats,
                         f"the damaged layer {c['il']}: {name}{c['status']} (measured by Verify)",
                         absent=c["status"] == "missing")
        if found is not None:
            return found
    return None


def _indexed(records: list[tuple[int, Section, KvStream | None, LayerRecord]], f: Finding, role: str | None,
             stream: int | None, stats: StatsReport | None) -> Flagged | None:
    """The record finding ``f`` names by its section and index (read without a model, an iSWA half's or a
    hybrid's record ``i`` is not layer ``i``), where the file holds it."""
    section, index = str(section_of_path(f.path or "")), int(f.extra["index"])
    role = role or (str(f.extra["role"]) if f.extra.get("role") in ("k", "v") else None)  # a dropped record's
    mine = [r for _, sec, st, r in records if sec.role == section and (stream is None or st is None
                                                                       or st.index == stream)]
    what = f"the damaged record {record_label(section, role or 'record', index, None)}: {f.message}"
    rec = next((r for r in mine if r.index == index and (role is None or r.role == role)), None)
    if rec is None:  # cut short or missing: the nearest record of its role in its section stands in
        near = [r for r in mine if role is None or r.role == role]
        if not near:
            return None
        rec = min(near, key=lambda r: (abs(r.index - index), -r.index))
        stand_in = record_label(section, rec.role, rec.index, None)
        what += f" (it has no values in the file: the nearest, {stand_in}, is shown)"
    return Flagged(rec, _stats_of(rec, stats), what)


def damaged_record(res: ParseResult, stats: StatsReport | None) -> Flagged | None:
    """The record that pictures the damaged layer: the first error finding in the file that names a layer (a
    record cut short by the file's end, a missing layer record...), its own record where the file holds it, else
    the same layer's other record, else the nearest record of its role; None when no error names a layer."""
    errors = sorted((f for f in res.findings if f.severity == "error"
                     and (f.layer is not None or isinstance(f.extra.get("index"), int))), key=lambda f: f.offset)
    records = layer_records(res)
    for f in errors:
        role, stream = _finding_place(f.path or "")
        if f.layer is None:  # a record named by its index: its layer is not known without the model
            found = _indexed(records, f, role, stream, stats)
            if found is not None:
                return found
            continue
        mine = [r for _, _, st, r in records if stream is None or st is None or st.index == stream]
        found = _picture(mine, f.layer, role, stats, f"the damaged layer {f.layer}: {f.message}")
        if found is not None:
            return found
    return None


def _spread(hits: list[Flagged]) -> list[Flagged]:
    """At most :data:`MAX_HEATMAPS` of ``hits``: the first of each section/stream/role first, then the
    next ones; kept in file order."""
    def unit(f: Flagged) -> tuple[object, ...]:
        ls = f.stats
        return (ls.section_index, ls.stream, f.record.role) if ls is not None else (f.record.role,)

    seen: set[tuple[object, ...]] = set()
    first: list[int] = []
    for i, f in enumerate(hits):
        if unit(f) not in seen:
            seen.add(unit(f))
            first.append(i)
    rest = [i for i in range(len(hits)) if i not in first]
    keep = sorted((first + rest)[:MAX_HEATMAPS])
    return [hits[i] for i in keep]




def report_overview(options: ReportOptions, found: Inspection, verify: dict[str, Any] | None = None) -> Overview:
    """The overview that heads the report: with the compatibility per generation and the file's sha256 (files up to
    :data:`SHA256_MAX_BYTES`)."""
    from kvscope.core.analysis.overview import build_overview
    from kvscope.core.fsutil import sha256_file

    res = found.result
    sha = None
    if res.size <= SHA256_MAX_BYTES:
        try:
            sha = sha256_file(res.path)
        except OSError as e:
            raise ReportError(f"{options.file}: {e.strerror or e}") from None
    return build_overview(res, found.profile, found.compatibility or [], verify, options.full_paths, sha)


def collect(options: ReportOptions, progress: Progress = no_progress, cancelled: Cancelled | None = None,
            preloaded: Preloaded | None = None, verify: dict[str, Any] | None = None) -> ReportData:
    """Gather the report's data; ``preloaded`` skips the inspection an open document has already done.
    ``verify``: a Verify result of the file (:func:`verify_for_report`'s, ``kvscope report --verify`` /
    ``--verify-json``), checked to be about the file read (ReportError otherwise) and put at the report's head."""
    check_inputs(options)

    def check() -> None:
        if cancelled is not None and cancelled():
            raise ReportError("cancelled")

    if preloaded is not None:
        found = preloaded.inspection
    else:
        progress(None, "reading model" if options.model else "parsing")
        profile = load_profile(options.model)
        check()
        progress(None, "parsing, scanning payloads, which llama.cpp builds load it")
        found = inspect(options.file, profile)
    check()
    res, profile = found.result, found.profile
    if verify is None and preloaded is not None:
        verify = preloaded.verify
    overview = report_overview(options, found, verify)
    if verify is not None and verify.get("source"):  # the CLI's: checked against the bytes read here
        from kvscope.core.report.verified import check_same_file

        check_same_file(verify, options.file, overview, res, str(verify["source"]))
    check()
    data = ReportData(options, res, profile, found.stats, found.stats_error, found.to_json(), overview)
    data.flagged, data.flagged_total = flagged_records(res, found.stats, verify)
    if options.compare:
        data.diff = preloaded.diff if preloaded is not None and preloaded.diff is not None else None
        if data.diff is None:
            progress(None, f"comparing with {os.path.basename(options.compare)}")
            from kvscope.core.analysis.diff import diff_states
            from kvscope.core.reader.source import FileChangedError

            other = inspect(options.compare, profile, stats=False, compat=False).result
            try:
                data.diff = diff_states(res, other)
            except FileChangedError as e:
                raise ReportError(f"{options.compare if e.path == other.path else options.file}: {e}") from None
        check()
    if options.lab:
        from kvscope.core.report.lab import run_lab

        data.lab = run_lab(options, profile, progress, cancelled)
        check()
    return data
