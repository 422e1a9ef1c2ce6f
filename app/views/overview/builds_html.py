"""The Overview's "Which llama.cpp builds load it" section: per pinned build and per consumer, in one place.

For each pinned build (the layout generation it writes), libllama (``llama_state_seq_load_file`` and the
other state APIs) and llama-server (``/slots/N?action=restore``) are answered apart: loads, refuses with
the consumer's own message, crashes with the assert, or unknown, each marked *predicted* (from the bytes,
:meth:`kvscope.core.analysis.overview.Overview.consumer_entries`) or *measured by Verify* (the build and
consumer a Verify restored the file in: its restore replaces the prediction, and a link goes to the
Verification section). The layout generations no pinned build writes follow, libllama only, predicted.
The head line names the builds that load the file as it is, from the same answers, so nothing in the
section contradicts another line of it.
"""

from __future__ import annotations

from itertools import groupby

from kvscope.app.base.theme import verdict_color
from kvscope.core.analysis.overview import ConsumerEntry, Overview
from kvscope.core.report.build_lines import head_text
from kvscope.core.textsafe import html_text as escape  # one visible line (bidi, controls escaped), then entities

ANSWER_MARK = {"loads": "✔", "refuses": "✘", "crashes": "✘", "unknown": "?"}
STAGE_MARK = {"ok": "✔", "silent": "⚠", "header": "✘", "memory": "✘", "unknown": "?"}


def answer_level(e: ConsumerEntry) -> str:
    """The verdict level an answer is coloured as."""
    if e.answer == "loads":
        return "suspicious" if e.hint.startswith("but misreads") else "healthy"
    return "suspicious" if e.answer == "unknown" else "damaged"


def _answer_html(e: ConsumerEntry, dark: bool) -> str:
    col = verdict_color(answer_level(e), dark).name()
    text = f'<span style="color:{col}">{ANSWER_MARK.get(e.answer, "?")} <b>{escape(e.answer)}</b></span>'
    if e.message:
        text += f": {escape(e.message)}"
    if e.hint:
        text += f"; {escape(e.hint)}"
    if e.predicted:  # the prediction a measurement replaced, as secondary text
        text += f"; <i>predicted {escape(e.predicted)}</i>"
    return text


def _source_html(e: ConsumerEntry) -> str:
    if e.measured:
        return f'<a href="view:verify"><b>{escape(e.source)}</b></a>'
    return "<i>predicted</i>"


def head_html(ov: Overview) -> str:
    bold, rest = head_text(ov)
    if bold.startswith("Loads"):
        return f"<p>{escape(bold)} <b>{escape(rest)}</b></p>"
    return f"<p><b>{escape(bold)}</b>" + (f" {escape(rest)}" if rest else "") + "</p>"


def table_html(entries: list[ConsumerEntry], dark: bool) -> str:
    """One row per build and consumer, the build named once for its consumers."""
    rows = []
    for build, grouped in groupby(entries, key=lambda e: e.build):
        group = list(grouped)
        for k, e in enumerate(group):
            cell = ""
            if k == 0:
                layout = f"<br><small>writes {escape(e.layout)}</small>" if e.layout else ""
                cell = (f'<td rowspan="{len(group)}" style="padding-right:14px;vertical-align:top">'
                        f"<b>{escape(build)}</b>{layout}</td>")
            rows.append(f"<tr>{cell}<td style=\"padding-right:14px;vertical-align:top\">{escape(e.consumer)}</td>"
                        f'<td style="vertical-align:top">{_answer_html(e, dark)}</td>'
                        f'<td style="padding-left:14px;vertical-align:top">{_source_html(e)}</td></tr>')
    head = ('<tr><th align="left">build</th><th align="left">consumer</th><th align="left">answer</th>'
            '<th align="left" style="padding-left:14px">from</th></tr>')
    return f'<table cellspacing="0" cellpadding="2">{head}{"".join(rows)}</table>'


def others_html(ov: Overview, dark: bool) -> str:
    """The layout generations no pinned build writes: libllama's answer, predicted."""
    others = ov.other_generations()
    if not others:
        return ""
    items = []
    for c, line in others:
        level = "healthy" if c.loads else ("suspicious" if c.stage in ("silent", "unknown") else "damaged")
        col = verdict_color(level, dark).name()
        items.append(f'<li><span style="color:{col}">{STAGE_MARK.get(c.stage, "?")}</span> {escape(line)}</li>')
    return ("<p>Other layout generations (no pinned build; libllama, <i>predicted</i>):</p><ul>"
            + "".join(items) + "</ul>")


def section_html(ov: Overview, dark: bool, compat_error: str | None = None) -> str:
    """The whole section (its heading is the Overview's)."""
    if ov.compat is None:
        return f"<p>{escape('not known: ' + compat_error) if compat_error else 'working it out…'}</p>"
    if not ov.compat:
        return "<p>none: not a state file of a known layout</p>"
    return head_html(ov) + table_html(ov.consumer_entries(), dark) + others_html(ov, dark)
