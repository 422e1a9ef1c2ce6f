"""Facts every rendering of a report shares: the overview rows, finding counts, the summary line, report.json.

The overview rows start with the core overview (:mod:`kvscope.core.analysis.overview`: verdict, file with
size and sha256, kind and writer, layout, model, sequences, sections, compatibility,
verification), so the report says what the app's Overview says. Paths are base names unless the
report was asked for ``full_paths`` (:mod:`kvscope.core.report.names`).
"""

from __future__ import annotations

from typing import Any

from kvscope.core.analysis.verdict import plural
from kvscope.core.report.model import GENERATOR, ReportData, ReportImage

MAX_TEXT = 300  # characters of detokenized text shown in the overview


def kvscope_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kvscope")
    except PackageNotFoundError:
        return "unknown"


def counts_text(data: ReportData) -> str:
    """``8 findings (8 errors, 0 warnings, 0 info)``."""
    from kvscope.core.analysis.verdict import counts_text as text

    return text(data.finding_counts())


def summary_line(data: ReportData, dest: str) -> str:
    """The line ``kvscope report`` prints once the report is written."""
    parts = [counts_text(data)]
    if data.diff is not None:
        n = len(data.diff.differences)
        parts.append("diff: identical" if not n else f"diff: {plural(n, 'difference')}")
    if data.lab is not None:
        run = data.lab.run
        parts.append(f"lab: {plural(len(run.results), 'cell')}" if run is not None
                     else "lab: not run (see the report)")
    verify = data.overview.verify
    head = f"verify: {verify.get('verdict')}; " if verify else ""
    return f"kvscope report: {dest}: {head}{data.overview.verdict.title}; " + "; ".join(parts)


def overview(data: ReportData) -> list[tuple[str, str]]:
    """(label, value) rows describing the file: the overview's, then header, tokens, coverage, findings."""
    res, j = data.result, data.inspect
    from kvscope.core.report.build_lines import consumer_lines, reuse_lines

    beside = {"consumers": consumer_lines, "llama-server reuse": reuse_lines}  # a Verify's measurement kept beside
    rows = [(k, "; ".join(beside[k](data.overview)) if k in beside and data.overview.verify else v)
            for k, v in data.overview.rows() if k not in ("verdict", "loads in")]
    if res.partial:
        rows.insert(3, ("partial", "PARTIAL_ONLY: the SWA / recurrent part only"))
    if res.header:
        rows.append(("header", ", ".join(f"{k}={v}" for k, v in res.header.items())))
    if res.tokens:
        text = j.get("text")
        tok = f"{len(res.tokens)}"
        if isinstance(text, str):
            tok += f": {text[:MAX_TEXT]!r}" + (" …" if len(text) > MAX_TEXT else "")
        rows.append(("tokens", tok))
    cov = j["coverage"]
    rows.append(("coverage", f"parsed {cov['parsed_bytes']:,}, untrusted {cov['untrusted_bytes']:,}, "
                             f"unparsed {cov['unparsed_bytes']:,}, trailing {cov['trailing_bytes']:,} "
                             f"of {cov['size']:,} bytes"))
    rows.append(("findings", counts_text(data)))
    if data.stats_error:
        rows.append(("statistics", f"failed: {data.stats_error}"))
    return rows


def top_findings(data: ReportData) -> list[str]:
    """The findings the verdict names first, one line each (the overview's links, as text)."""
    from kvscope.core.analysis.measured import measured_message

    v = data.overview.verdict
    verify = data.overview.verify
    out = [f"{f.severity} {f.code} @{f.offset:,} (+{f.length:,}): {measured_message(f, verify) or f.message}"
           for f in v.top_findings]
    if v.missing is not None:
        out.insert(0, f"missing bytes past the end: {v.missing.text()}")
    return out


def flagged_note(data: ReportData) -> str:
    """What the heatmaps leave out, when more records are flagged than pictured."""
    more = data.flagged_total - len(data.flagged)
    if more <= 0 or data.stats is None:
        return ""
    pictured = {id(f.stats) for f in data.flagged}
    rest = [ls for ls in data.stats.layers if (ls.n_nonfinite or ls.zero_rows) and id(ls) not in pictured]
    names = ", ".join(f"{ls.role.upper()}{'?' if ls.il is None else ls.il}"
                      + ("" if ls.stream is None else f" (stream {ls.stream})") for ls in rest)
    return f"{plural(more, 'more flagged record')} not pictured: {names}."


def measured_findings(data: ReportData, entries: list[Any]) -> list[Any]:
    """The findings' JSON (``entries``, one per finding of the file) with what Verify measured in place of the
    reader's guess: ``message`` the measured text, ``predicted`` the reader's own and ``measured`` true."""
    from kvscope.core.analysis.measured import measured_message

    findings = data.result.findings
    if len(entries) != len(findings):
        return entries
    out: list[Any] = []
    for f, entry in zip(findings, entries, strict=True):
        text = measured_message(f, data.overview.verify)
        out.append({**entry, "message": text, "predicted": f.message, "measured": True}
                   if text is not None and isinstance(entry, dict) else entry)
    return out


def report_json(data: ReportData, images: list[ReportImage]) -> dict[str, Any]:
    """``inspect --json --stats`` plus ``overview`` (verdict, compatibility, sha256...), ``report``
    (generator, images, flagged layers), ``diff`` and ``lab``; paths named as the report names them."""
    out: dict[str, Any] = {}
    if data.overview.verify:  # kvscope report --verify / --verify-json: the verdict Verify measured comes first
        from kvscope.core.report.verified import verify_json

        out["verify"] = verify_json(data.overview.verify)
    out.update(data.inspect)
    if data.overview.verify and isinstance(out.get("findings"), list):
        out["findings"] = measured_findings(data, out["findings"])
    out["overview"] = data.overview.to_json()
    heat = [im for im in images if im.file.startswith("heatmap-")]
    out["report"] = {
        "generator": GENERATOR,
        "version": kvscope_version(),
        "findings": data.finding_counts(),
        "stats_error": data.stats_error,
        "images": [im.to_json() for im in images],
        "flagged_layers": [
            {"section_index": f.stats.section_index if f.stats is not None else None,
             "stream": f.stats.stream if f.stats is not None else None,
             "role": f.record.role, "layer": f.record.il, "index": f.record.index, "why": f.why,
             "image": heat[i].file if i < len(heat) else None}
            for i, f in enumerate(data.flagged)],
        "flagged_total": data.flagged_total,
    }
    if data.diff is not None:
        out["diff"] = data.diff.to_json()
    if data.lab is not None:
        out["lab"] = data.lab.to_json()
    if data.options.bookmarks:
        from kvscope.core.report.bookmarks import bookmark_rows

        out["bookmarks"] = bookmark_rows(data)
    return data.options.names().json(out)  # type: ignore[no-any-return]
