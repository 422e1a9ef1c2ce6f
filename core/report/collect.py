"""Step 1 of a report: read the file and gather everything the report shows (no Qt; any thread).

The ``inspect`` object is built exactly as ``kvscope inspect --json --stats`` builds it, so a
report's ``report.json`` is that object plus the report's own keys (``overview``, ``report``,
``diff``, ``lab``); the overview (:func:`kvscope.core.analysis.overview.build_overview`) carries the verdict,
which llama.cpp generations load the file, its size and sha256.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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
    from kvscope.core.analysis.compat import GenCompat
    from kvscope.core.analysis.diff import StateDiff
    from kvscope.core.analysis.overview import Overview
    from kvscope.core.analysis.stats import StatsReport
    from kvscope.core.model.profile import ModelProfile
    from kvscope.core.reader.records import ParseResult


@dataclass(frozen=True)
class Preloaded:
    """Work an open document has already done (the app's export reuses it instead of reading again)."""

    result: ParseResult
    profile: ModelProfile | None
    stats: StatsReport
    diff: StateDiff | None = None
    compat: list[GenCompat] | None = None
    verify: dict[str, Any] | None = None  # the document's ``kvscope verify`` result (verify_for_report)


VERIFY_KEYS = ("verdict", "reasons", "restore", "records", "cells", "next_token", "compared")


def verify_for_report(result: dict[str, Any] | None) -> dict[str, Any] | None:
    """A verify result as a report shows it: the verdict, engine kind / build / why, restore, records, next
    token; no paths (the file, the model and the engine's library folder stay out of public bug reports)."""
    if not result:
        return None
    out = {k: result[k] for k in VERIFY_KEYS if k in result}
    eng = result.get("engine") or {}
    out["engine"] = {k: eng[k] for k in ("kind", "build", "commit", "writes", "reason") if k in eng}
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
    from kvscope.core.model.profile import ModelProfileError, load_model_profile

    try:
        return load_model_profile(path)
    except ModelProfileError as e:
        raise ReportError(f"cannot use model {path}: {e}") from None


def read(path: str, profile: ModelProfile | None) -> ParseResult:
    """Parse ``path``; ReportError when it is unreadable or not a llama.cpp state file."""
    from kvscope.core.reader.parse import ReadError, read_state
    from kvscope.core.reader.source import FileChangedError

    try:
        res = read_state(path, profile=profile)
    except FileChangedError as e:
        raise ReportError(f"{path}: {e}") from None
    except (ReadError, ValueError) as e:
        raise ReportError(str(e)) from None
    except OSError as e:
        raise ReportError(f"{path}: {e.strerror or e}") from None
    if res.kind == "unknown":
        why = res.findings[0].message if res.findings else "not a llama.cpp state file"
        raise ReportError(f"{path}: {why}")
    return res


def inspect_object(res: ParseResult, profile: ModelProfile | None, stats: StatsReport | None,
                   compat: list[GenCompat] | None) -> dict[str, object]:
    """What ``kvscope inspect --json --stats`` prints for ``res``: the same :class:`Inspection` object."""
    from kvscope.core.analysis.inspection import Inspection
    from kvscope.core.analysis.verdict import verdict

    return Inspection(res, profile, verdict(res, profile), compat, stats).to_json()


def flagged_records(res: ParseResult, stats: StatsReport | None) -> tuple[list[Flagged], int]:
    """Records with non-finite values or zero rows (at most :data:`MAX_HEATMAPS`, plus how many in all);
    with none, the first K record (else the first record) so the report still shows one heatmap."""
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
    recs = [r for _, _, _, r in records]
    first = next((r for r in recs if r.role == "k"), recs[0] if recs else None)
    if first is None:
        return [], 0
    ref = next((x for x in stats.layers if x.data_offset == first.data_offset), None) if stats is not None else None
    return [Flagged(first, ref, "for reference: no record has non-finite values or zero rows")], 0


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


def report_compat(options: ReportOptions, res: ParseResult, profile: ModelProfile | None) -> list[GenCompat]:
    """Which layout generations load the file (the overview's and the inspect object's table)."""
    from kvscope.core.analysis.compat import compatibility

    try:
        return compatibility(res, profile)
    except (OSError, ValueError) as e:
        raise ReportError(f"{options.file}: {e}") from None


# Files above this size get no sha256 in the report: hashing reads every byte, holes of a sparse file
# included (a 20 GB sparse file took 21-61 s, its parse 0.8 s); the size still identifies them.
SHA256_MAX_BYTES = 2 << 30


def report_overview(options: ReportOptions, res: ParseResult, profile: ModelProfile | None,
                    compat: list[GenCompat] | None = None, verify: dict[str, Any] | None = None) -> Overview:
    """The overview that heads the report: with the compatibility per generation and the file's sha256 (files up to
    :data:`SHA256_MAX_BYTES`)."""
    from kvscope.core.analysis.overview import build_overview
    from kvscope.core.fsutil import sha256_file

    if compat is None:
        compat = report_compat(options, res, profile)
    sha = None
    if res.size <= SHA256_MAX_BYTES:
        try:
            sha = sha256_file(res.path)
        except OSError as e:
            raise ReportError(f"{options.file}: {e.strerror or e}") from None
    return build_overview(res, profile, compat, verify, options.full_paths, sha)


def collect(options: ReportOptions, progress: Progress = no_progress, cancelled: Cancelled | None = None,
            preloaded: Preloaded | None = None) -> ReportData:
    """Gather the report's data; ``preloaded`` skips the parse and statistics an open document already has."""
    check_inputs(options)

    def check() -> None:
        if cancelled is not None and cancelled():
            raise ReportError("cancelled")

    stats_error: str | None = None
    if preloaded is not None:
        res, profile, stats = preloaded.result, preloaded.profile, preloaded.stats
    else:
        progress(None, "reading model" if options.model else "parsing")
        profile = load_profile(options.model)
        check()
        progress(None, "parsing")
        res = read(options.file, profile)
        check()
        progress(None, "scanning payloads")
        stats = None
        from kvscope.core.analysis.stats import scan_stats
        from kvscope.core.reader.source import FileChangedError

        try:
            stats = scan_stats(res)
        except FileChangedError as e:  # the report would describe bytes that are gone
            raise ReportError(f"{options.file}: {e}") from None
        except Exception as e:  # a report without statistics beats no report; the failure is shown
            stats_error = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    check()
    progress(None, "which llama.cpp builds load it")
    compat = preloaded.compat if preloaded is not None and preloaded.compat is not None else None
    if compat is None:
        compat = report_compat(options, res, profile)
    overview = report_overview(options, res, profile, compat, preloaded.verify if preloaded is not None else None)
    check()
    data = ReportData(options, res, profile, stats, stats_error, inspect_object(res, profile, stats, compat),
                      overview)
    data.flagged, data.flagged_total = flagged_records(res, stats)
    if options.compare:
        data.diff = preloaded.diff if preloaded is not None and preloaded.diff is not None else None
        if data.diff is None:
            progress(None, f"comparing with {os.path.basename(options.compare)}")
            from kvscope.core.analysis.diff import diff_states
            from kvscope.core.reader.source import FileChangedError

            other = read(options.compare, profile)
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
