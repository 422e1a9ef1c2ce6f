"""``report.md``: the report as Markdown, its pictures beside it in the same folder."""

from __future__ import annotations

from kvscope.app.report.model import ReportData, ReportImage
from kvscope.app.report.summary import flagged_note, kvscope_version, overview, top_findings


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _demote(text: str) -> str:
    """Shift Markdown headings two levels down (core renderings start at level 1)."""
    return "\n".join("##" + line if line.startswith("#") else line for line in text.splitlines())


def _figures(images: list[ReportImage], prefix: str) -> list[str]:
    out: list[str] = []
    for im in images:
        if im.file.startswith(prefix):
            out += [f"### {im.title}", "", f"![{im.title}]({im.file})", "", im.caption, ""]
    return out


def render_markdown(data: ReportData, images: list[ReportImage]) -> str:
    """The whole Markdown page."""
    from kvscope.core.reader.render import result_to_text

    names = data.options.names()
    v = data.overview.verdict
    lines = [f"# kvscope report: {data.name}", "", f"**{v.title.upper()}**: {v.reason}", ""]
    top = top_findings(data)
    if top:
        lines += ["Top findings:", "", *[f"- {_cell(t)}" for t in top], ""]
    lines += ["## Overview", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {_cell(v)} |" for k, v in overview(data)]
    loads = data.overview.loads_in()
    lines += ["", "### Which llama.cpp builds load it", "",
              f"Loads as it is in: **{', '.join(loads)}**." if loads else "**No llama.cpp generation loads it as it "
              "is.**", ""]
    lines += [f"- {line}" for line in data.overview.compat_lines()]
    lines += ["", "## Structure", ""]
    lines += _figures(images, "bytemap")
    cells = _figures(images, "cells-")
    if cells:
        lines += ["## Cells", "", *cells]
    stats = _figures(images, "stats-")
    if stats:
        lines += ["## Per-layer statistics", "", *stats]
    heat = _figures(images, "heatmap-")
    if heat:
        lines += ["## Layer heatmaps", "", *heat]
        note = flagged_note(data)
        if note:
            lines += [note, ""]
    if data.lab is not None:
        lines += ["## Lab", ""]
        if data.lab.run is None:
            lines += [f"The lab did not run: {data.lab.reason}.", ""]
        else:
            from kvscope.core.lab.report import render_markdown as lab_markdown

            lines += _figures(images, "lab-")
            lines += [lab_markdown(data.lab.run), ""]  # its heading is level 3 already
    if data.diff is not None:
        lines += ["## Diff", "", "```text", data.diff.to_text().rstrip("\n"), "```", ""]
    lines += ["## Details", "", _demote(result_to_text(data.result, data.profile, markdown=True)).rstrip("\n"), ""]
    if data.stats is not None:
        lines += [_demote(data.stats.to_text(markdown=True)).rstrip("\n"), ""]
    lines += ["---", "", f"Written by kvscope {kvscope_version()} (`kvscope report`). The same data as JSON: "
              "[report.json](report.json).", ""]
    return names.text("\n".join(lines))
