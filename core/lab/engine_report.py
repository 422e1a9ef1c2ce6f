"""Renderings of a lab run in a real engine (:class:`~kvscope.core.lab.engine_lab.EngineRun`).

JSON: the lab's schema (``scenario``, ``policies``, ``readers``, ``cases``, ``skipped``, ``results``
with one entry per case) plus ``engine`` (kind, build), ``notes``, per result an ``engine`` object
(``aborted``, the log tail, ``fault``: llama.cpp's own failure on the case with the evidence, and
``behaviour``: each sequence's next-token logits judged against the live context's) and, with
llama-server, ``poisoned_slot``; ``llama_cpp_failures`` lists the cases where llama.cpp failed on its
own; with ``both``, ``torch_results`` (the core's cells) and ``disagreements`` (empty when the two
agree on every case; each with its ``explanation``, null when the lab has none) and
``unexplained_disagreements`` (their count). Markdown: the lab's table for each engine, the
poisoned-slot checks, llama.cpp's own failures, and the disagreements with their explanations.
"""

from __future__ import annotations

from typing import Any

from kvscope.core.lab.engine_cells import EngineCell
from kvscope.core.lab.engine_lab import EngineRun
from kvscope.core.lab.report import cell_to_json, render_markdown, run_to_json
from kvscope.core.textsafe import markdown_code, markdown_text


def engine_cell_to_json(c: EngineCell) -> dict[str, Any]:
    d = cell_to_json(c.result)
    d["engine"] = {"aborted": c.aborted, "log": list(c.log[-8:]), "notes": list(c.notes), "fault": c.fault,
                   "behaviour": {str(s): b.to_json() for s, b in sorted(c.behaviour.items())}}
    if c.poisoned is not None:
        d["poisoned_slot"] = c.poisoned.to_json()
    return d


def engine_run_to_json(er: EngineRun) -> dict[str, Any]:
    doc = run_to_json(er.run)
    doc["results"] = [engine_cell_to_json(c) for c in er.cells]
    doc["engine"] = dict(er.engine)
    doc["notes"] = list(er.notes)
    doc["llama_cpp_failures"] = [{"case": name, "fault": fault} for name, fault in er.faults]
    if er.torch is not None:
        doc["torch_results"] = run_to_json(er.torch)["results"]
        doc["disagreements"] = [d.to_json() for d in er.disagreements]
        doc["unexplained_disagreements"] = len(er.unexplained)
    return doc


def _fault_lines(er: EngineRun) -> list[str]:
    if not er.faults:
        return []
    lines = [f"llama.cpp's own failures ({len(er.faults)}): what llama.cpp itself got wrong, with the evidence", ""]
    return lines + [f"- {markdown_code(name)}: {markdown_text(fault)}" for name, fault in er.faults]


def _poison_lines(er: EngineRun) -> list[str]:
    rows = [(c.result.corruption, c.poisoned) for c in er.cells if c.poisoned is not None]
    if not rows:
        return []
    lines = ["", "Poisoned-slot check after each failed restore (a request sharing the restored prefix, against the "
             "same request on a fresh slot):", "", "| case | server | completion | fresh slot | verdict |",
             "|---|---|---|---|---|"]
    md = markdown_text  # the completions are a model's output, the errors a server's: values, escaped
    for name, p in rows:
        if p.skipped:
            lines.append(f"| {markdown_code(name)} | – | – | – | {md(p.skipped)} |")
            continue
        server = f"aborted: {p.aborted}" if p.aborted else ("error: " + p.error if p.error else "alive")
        verdict = "**poisoned**" if p.poisoned else ("clean" if p.same else "–")
        lines.append(f"| {markdown_code(name)} | {md(server)} | {md(p.completion)} | {md(p.fresh_completion)} | "
                     f"{verdict} |")
    return lines


def render_engine_markdown(er: EngineRun) -> str:
    """The engine's table (and the core's, with ``both``), the poisoned-slot checks and the disagreements."""
    eng = er.engine
    head = [markdown_text(f"Engine: {eng.get('kind')} {eng.get('build') or ''}".rstrip()) + ". Each cell's probe is "
            "the real next-token logits of the other sequences against the live context (max \\|Δ\\|)."]
    head += [f"Note: {markdown_text(n)}" for n in er.notes]
    parts = ["\n".join(head) + "\n", render_markdown(er.run)]
    poison = _poison_lines(er)
    if poison:
        parts.append("\n".join(poison) + "\n")
    faults = _fault_lines(er)
    if faults:
        parts.append("\n".join(faults) + "\n")
    if er.torch is not None:
        parts.append("Memory core (policy `contained`, the same cases):\n\n" + render_markdown(er.torch))
        if er.disagreements:
            n_un = len(er.unexplained)
            lines = [f"Disagreements ({len(er.disagreements)}, {n_un} unexplained):", ""]
            lines += [f"- {markdown_code(d.case)} " + markdown_text(f"{d.field}: core {d.core!r}, llama.cpp "
                                                                     f"{d.engine!r}"
                                                                     + (f" ({d.detail})" if d.detail else ""))
                      + (f". Explained: {markdown_text(d.explanation)}" if d.explanation else ". Unexplained")
                      for d in er.disagreements]
        else:
            lines = ["Disagreements: none (the core and llama.cpp agree on every case: return value, target and "
                     "per-component state, other sequences, the whole state afterwards byte for byte)."]
        parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)
