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
    """The section as lines of text (the report's list): each build's consumers, then the other layouts."""
    return [e.line() for e in ov.consumer_entries()] + [
        f"{line} (libllama of a build of that layout, predicted)" for _, line in ov.other_generations()]
