"""Facts every rendering of a report shares: the overview rows, finding counts, the summary line, report.json."""

from __future__ import annotations

from typing import Any

from kvscope.app.report.model import GENERATOR, ReportData, ReportImage

MAX_TEXT = 300  # characters of detokenized text shown in the overview


def kvscope_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kvscope")
    except PackageNotFoundError:
        return "unknown"


def counts_text(data: ReportData) -> str:
    """``8 findings (8 errors, 0 warnings, 0 info)``."""
    c = data.finding_counts()
    n = sum(c.values())
    return (f"{n} finding{'s' if n != 1 else ''} ({c['error']} error{'s' if c['error'] != 1 else ''}, "
            f"{c['warning']} warning{'s' if c['warning'] != 1 else ''}, {c['info']} info)")


def summary_line(data: ReportData, dest: str) -> str:
    """The line ``kvscope report`` prints once the report is written."""
    parts = [counts_text(data)]
    if data.diff is not None:
        n = len(data.diff.differences)
        parts.append("diff: identical" if not n else f"diff: {n} differences")
    if data.lab is not None:
        run = data.lab.run
        parts.append(f"lab: {len(run.results)} cells" if run is not None else "lab: not run (see the report)")
    return f"kvscope report: {dest}: " + "; ".join(parts)


def overview(data: ReportData) -> list[tuple[str, str]]:
    """(label, value) rows describing the file."""
    res, j = data.result, data.inspect
    lay = res.layout
    same = ", ".join(a["name"] for a in lay.alternatives if a.get("indistinguishable"))
    rows = [
        ("file", f"{res.path} ({res.size:,} bytes)"),
        ("kind", res.kind + (" (PARTIAL_ONLY)" if res.partial else "")),
        ("layout", f"{lay.name} (confidence {lay.confidence:.2f}" + (f"; byte-identical under {same}" if same else "")
         + ")"),
        ("model", data.profile.path if data.profile is not None else "none (model checks off)"),
    ]
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


def flagged_note(data: ReportData) -> str:
    """What the heatmaps leave out, when more records are flagged than pictured."""
    more = data.flagged_total - len(data.flagged)
    if more <= 0 or data.stats is None:
        return ""
    pictured = {id(f.stats) for f in data.flagged}
    rest = [ls for ls in data.stats.layers if (ls.n_nonfinite or ls.zero_rows) and id(ls) not in pictured]
    names = ", ".join(f"{ls.role.upper()}{'?' if ls.il is None else ls.il}"
                      + ("" if ls.stream is None else f" (stream {ls.stream})") for ls in rest)
    return f"{more} more flagged record{'s' if more != 1 else ''} not pictured: {names}."


def report_json(data: ReportData, images: list[ReportImage]) -> dict[str, Any]:
    """``inspect --json --stats`` plus ``report`` (generator, images, flagged layers), ``diff`` and ``lab``."""
    out = dict(data.inspect)
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
    return out
