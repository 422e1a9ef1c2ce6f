"""``report.md``: the report as Markdown, its pictures beside it in the same folder."""

from __future__ import annotations

from collections.abc import Callable

from kvscope.core.report.bookmarks import bookmarks_markdown
from kvscope.core.report.model import GUI_EXTRA, ReportData, ReportImage
from kvscope.core.report.summary import flagged_note, kvscope_version, overview, top_findings
from kvscope.core.textsafe import markdown_fence, markdown_line, markdown_text


def _demote(text: str) -> str:
    """Shift Markdown headings two levels down (core renderings start at level 1)."""
    return "\n".join("##" + line if line.startswith("#") else line for line in text.splitlines())


def _figures(images: list[ReportImage], prefix: str, md: Callable[[str], str]) -> list[str]:
    out: list[str] = []
    for im in images:
        if im.file.startswith(prefix):
            out += [f"### {md(im.title)}", "", f"![{md(im.title)}]({im.file})", "", md(im.caption), ""]
    return out


def render_markdown(data: ReportData, images: list[ReportImage]) -> str:
    """The whole Markdown page."""
    from kvscope.core.reader.render import result_to_text

    names = data.options.names()

    def md(text: str) -> str:  # a value from the file or its name: paths shortened, then escaped for Markdown
        return markdown_text(names.text(text))

    def md_block(text: str) -> list[str]:  # Markdown the core rendered, with file-derived text in it
        return [markdown_line(line) for line in names.text(text).rstrip("\n").split("\n")]

    v = data.overview.verdict
    lines = [f"# kvscope report: {md(data.name)}", ""]
    verify = data.overview.verify
    if verify:  # the verdict Verify measured in real llama.cpp leads; the bytes' own verdict follows
        from kvscope.core.report.verified import verify_headline, verify_lines

        title, reason = verify_headline(verify)
        lines += [f"## Verify: {md(str(verify.get('verdict')))}", "",
                  f"**{md(title)}**" + (f": {md(reason)}" if reason else ""), "",
                  *[f"- {md(line)}" for line in verify_lines(verify)], "", "## Inspection", ""]
    lines += [f"**{md(v.title.upper())}**: {md(v.reason)}", ""]
    top = top_findings(data)
    if top:
        lines += ["Top findings:", "", *[f"- {md(t)}" for t in top], ""]
    lines += ["## Overview", "", "| | |", "|---|---|"]
    lines += [f"| {md(k)} | {md(v)} |" for k, v in overview(data)]
    from kvscope.core.report.build_lines import head_text, text_lines

    bold, rest = head_text(data.overview)  # per pinned build and consumer, as the app's Overview says it
    lines += ["", "### Which llama.cpp builds load it", "",
              f"{md(bold)} **{md(rest)}**." if bold.startswith("Loads") else f"**{md(bold)}**"
              + (f" {md(rest)}" if rest else ""), ""]
    lines += [f"- {md(line)}" for line in text_lines(data.overview)]
    lines += ["", "## Structure", ""]
    lines += _figures(images, "bytemap", md)
    if not images:  # kvscope report without the gui extra: the Qt layer draws the pictures
        lines += [f"This report has no pictures: `kvscope report` draws them with the gui extra "
                  f"(`{GUI_EXTRA}`).", ""]
    cells = _figures(images, "cells-", md)
    if cells:
        lines += ["## Cells", "", *cells]
    stats = _figures(images, "stats-", md)
    if stats:
        lines += ["## Per-layer statistics", "", *stats]
    heat = _figures(images, "heatmap-", md)
    if heat:
        lines += ["## Layer heatmaps", "", *heat]
        note = flagged_note(data)
        if note:
            lines += [md(note), ""]
    if data.lab is not None:
        lines += ["## Lab", ""]
        if data.lab.run is None:
            lines += [f"The lab did not run: {md(data.lab.reason)}.", ""]
        else:
            from kvscope.core.lab.report import render_markdown as lab_markdown

            lines += _figures(images, "lab-", md)
            # the lab's Markdown escapes its values itself (core/textsafe's rule): only its paths are shortened
            lines += [*names.markdown(lab_markdown(data.lab.run)).rstrip("\n").split("\n"), ""]  # level 3 heading
    if data.diff is not None:
        lines += ["## Diff", "", *markdown_fence(names.text(data.diff.to_text())), ""]
    lines += bookmarks_markdown(data, md)
    # inspect's Markdown is escaped by the core already: only its paths are shortened here
    details = names.markdown(_demote(result_to_text(data.result, data.profile, markdown=True)))
    lines += ["## Details", ""]
    if data.overview.verify:
        lines += ["What the reader alone says (`kvscope inspect`): where Verify measured a guess of it, the sections "
                  "above say what was measured.", ""]
    lines += [*details.rstrip("\n").split("\n"), ""]
    if data.stats is not None:
        lines += [*md_block(_demote(data.stats.to_text(markdown=True))), ""]
    lines += ["---", "", f"Written by kvscope {kvscope_version()} (`kvscope report`). The same data as JSON: "
              "[report.json](report.json).", ""]
    return "\n".join(lines)
