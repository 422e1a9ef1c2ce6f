"""The Overview's build section as plain text (no Qt): its head line and one line per build and consumer,
then per layout generation no pinned build writes. The report writes these; the app's
:mod:`kvscope.app.views.overview.builds_html` draws the same answers as a table.
"""

from __future__ import annotations

from kvscope.core.analysis.overview import Overview


def head_text(ov: Overview) -> tuple[str, str]:
    """The section's first line as (bold part, rest): the builds that load the file as it is, or none (the
    report writes the same line)."""
    if ov.verdict.state == "model_mismatch":
        return ("Not with the model given:", "the file does not fit it. Give the model that wrote it to tell which "
                "builds load it.")
    loads = ov.loads_in_consumers()
    if loads:
        return "Loads as it is in:", "; ".join(loads)
    others = [c.generation for c, _ in ov.other_generations() if c.loads]
    if others:
        return "No pinned llama.cpp build loads it as it is;", f"a build of layout {', '.join(others)} would."
    return "No llama.cpp build loads it as it is.", ""


def text_lines(ov: Overview) -> list[str]:
    """The section as lines of text (the report's list): each build's consumers (a Verify's measurement beside
    the prediction it measured: :func:`consumer_lines`), then the other layouts."""
    return consumer_lines(ov) + [
        f"{line} (libllama of a build of that layout, predicted)" for _, line in ov.other_generations()]


def consumer_lines(ov: Overview) -> list[str]:
    """libllama's and llama-server's answer per pinned build (:meth:`Overview.consumer_entries`, the Overview's
    table): for the build and consumer a Verify restored the file in (and llama-server's answer where it follows
    libllama's), the measured answer replaces the prediction, which stays as secondary text (``predicted
    unknown``, or ``as predicted``); a Verify in an engine that is no pinned build comes first."""
    predicted = {(a.build, a.consumer) for a in ov.consumers}
    out = []
    for e in ov.consumer_entries():
        if e.measured and not e.predicted and (e.build, e.consumer) in predicted:
            out.append(f"{e.build} {e.consumer}: {e.detail()} ({e.source}; as predicted)")
        else:
            out.append(e.line())
    return out


def reuse_lines(ov: Overview) -> list[str]:
    """What each pinned llama-server does with the slot on a prompt that continues it: the Overview's lines
    (:meth:`Overview.reuse_lines`: a Verify's measurement replaces the prediction it measured, the restore
    answer is the builds table's)."""
    return ov.reuse_lines()
