"""The Overview's build section as plain text (no Qt): its head line and one line per build and consumer,
then per layout generation no pinned build writes. The report writes these; the app's
:mod:`kvscope.app.views.overview.builds_html` draws the same answers as a table.
"""

from __future__ import annotations

from typing import Any

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


def _measured_reuse(ov: Overview) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    verify = ov.verify or {}
    reuse = verify.get("reuse")
    return (reuse if isinstance(reuse, dict) else None), (verify.get("engine") or {})


def consumer_lines(ov: Overview) -> list[str]:
    """libllama's and llama-server's answer per pinned build, each prediction kept and, for the build and
    consumer a Verify restored the file in, the measured answer beside it (``measured by Verify``); a Verify in
    an engine that is no pinned build comes first. Without a Verify: the Overview's lines."""
    predicted = {(a.build, a.consumer): a for a in ov.consumers}
    out = []
    for e in ov.consumer_entries():
        if not e.measured:
            out.append(e.line())
            continue
        got = e.answer + (f": {e.message}" if e.message else "")
        p = predicted.get((e.build, e.consumer))
        if p is None:
            out.append(f"{e.build} {e.consumer}: {got} (measured by Verify)")
        else:
            out.append(f"{e.build} {e.consumer}: {p.answer}" + (f": {p.message}" if p.message else "")
                       + f" (predicted); {got} (measured by Verify)")
    return out


def reuse_lines(ov: Overview) -> list[str]:
    """What each pinned llama-server does with the slot on a prompt that continues it: each prediction kept and,
    where a Verify in kvscope's own llama-server of that build (and ``--swa-full``) measured it, the measurement
    beside it (the Overview's rule, :meth:`Overview.reuse_lines`, which replaces the prediction instead)."""
    measured, engine = _measured_reuse(ov)
    lines, beside = [], False
    for e in ov.reuse:
        if measured is not None and engine.get("started_by_kvscope") and e.build == engine.get("build") \
                and measured.get("swa_full") == e.swa_full:
            lines.append(f"{e.line()} (predicted); {measured.get('line')} (measured by Verify)")
            beside = True
        else:
            lines.append(e.line())
    if measured is not None and not beside:
        lines.insert(0, f"{measured.get('line')} (measured by Verify on {engine.get('url') or 'its server'})")
    return lines
