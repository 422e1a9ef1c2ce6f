"""The lab's result objects (:class:`CellResult` per matrix cell, :class:`LabRun` per matrix) and their
renderings: JSON (one entry per cell) and a Markdown table for bug reports.

JSON numbers follow the recorded observations: a probe difference that is not finite (NaN or Inf in
the read-out) is ``null``. The Markdown table is laid out like llama.cpp PR #27530's test table: one
row per case, one column per policy x reader, each cell ``return · target state [pos_min,pos_max] ·
others ✓/✗ · dense probe``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvscope.core.analysis.verdict import plural
from kvscope.core.textsafe import markdown_code, markdown_text, safe_text

HAZARD = "short_read_hazard"
AS_IS = "as-is"

# ---------------------------------------------------------------------------------------------
# results (filled in by kvscope.core.lab.runner)


@dataclass
class RestoreOutcome:
    """The restore call: ``returned`` is llama.cpp's API value, ``bytes`` the bytes consumed."""

    ok: bool
    returned: int | bool | None
    bytes: int | None
    failed_check: str | None
    offset: int | None
    message: str = ""
    section: str | None = None
    actions: list[str] = field(default_factory=list)


@dataclass
class ComponentOutcome:
    state: str
    n_cells: int
    pos_min: int
    pos_max: int


@dataclass
class TargetOutcome:
    seq: int
    state: str  # unchanged / removed / restored / changed (undetermined: short-read hazard)
    pos_min: int | None
    pos_max: int | None
    components: dict[str, ComponentOutcome] = field(default_factory=dict)
    probe_diff: dict[str, float] | None = None


@dataclass
class OtherOutcome:
    seq: int
    intact: bool
    pos_min: int
    pos_max: int
    probe_diff: dict[str, float]


@dataclass
class CellResult:
    """One matrix cell. ``probe_diff`` values are max abs differences (``inf``: non-finite read-out)."""

    corruption: str
    description: str
    policy: str
    reader: str
    restore: RestoreOutcome
    target: TargetOutcome
    others: dict[int, OtherOutcome] = field(default_factory=dict)
    stale_cells: int | None = None
    stale_nonfinite: int | None = None
    stale_by_component: dict[str, int] = field(default_factory=dict)
    recovered: bool | None = None
    error: str | None = None
    after_state: bytes | None = None  # get_data right after the restore (runner option keep_after_state)
    seconds: float = 0.0

    @property
    def hazard(self) -> bool:
        return self.restore.failed_check == HAZARD

    @property
    def others_intact(self) -> bool | None:
        return None if not self.others else all(o.intact for o in self.others.values())

    def others_diff(self, kernel: str = "dense") -> float | None:
        """The largest probe difference over the other sequences (None: none measured)."""
        vals = [o.probe_diff[kernel] for o in self.others.values() if kernel in o.probe_diff]
        return max(vals) if vals else None


@dataclass
class LabRun:
    """A finished (or cancelled) matrix."""

    scenario: dict[str, Any]
    cases: list[tuple[str, str]]  # (name, description) in row order
    skipped: list[tuple[str, str]]
    policies: tuple[str, ...]
    readers: tuple[str, ...]
    results: list[CellResult]
    cancelled: bool = False
    seconds: float = 0.0

    def cell(self, case: str, policy: str, reader: str) -> CellResult | None:
        for r in self.results:
            if (r.corruption, r.policy, r.reader) == (case, policy, reader):
                return r
        return None


# ---------------------------------------------------------------------------------------------
# JSON


def _num(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def _diffs(d: dict[str, float] | None) -> dict[str, float | None] | None:
    return None if d is None else {k: _num(v) for k, v in d.items()}


def cell_to_json(r: CellResult) -> dict[str, Any]:
    """One matrix cell as plain JSON types."""
    t = r.target
    return {
        "corruption": r.corruption,
        "description": r.description,
        "policy": r.policy,
        "reader": r.reader,
        "restore": {
            "ok": r.restore.ok, "returned": r.restore.returned, "bytes": r.restore.bytes,
            "failed_check": r.restore.failed_check, "offset": r.restore.offset, "message": r.restore.message,
            "section": r.restore.section, "actions": list(r.restore.actions),
        },
        "target": {
            "seq": t.seq, "state": t.state, "pos_min": t.pos_min, "pos_max": t.pos_max,
            "components": {role: {"state": c.state, "n_cells": c.n_cells, "pos_min": c.pos_min, "pos_max": c.pos_max}
                           for role, c in t.components.items()},
            "probe_diff": _diffs(t.probe_diff),
        },
        "others": {str(s): {"intact": o.intact, "pos_min": o.pos_min, "pos_max": o.pos_max,
                            "probe_diff": _diffs(o.probe_diff)} for s, o in r.others.items()},
        "stale_cells": r.stale_cells,
        "stale_nonfinite": r.stale_nonfinite,
        "stale_by_component": dict(r.stale_by_component),
        "recovered": r.recovered,
        "error": r.error,
        "seconds": round(r.seconds, 4),
    }


def run_to_json(run: LabRun) -> dict[str, Any]:
    """``{"scenario", "cases", "skipped", "cancelled", "seconds", "results": [...]}``."""
    return {
        "scenario": run.scenario,
        "policies": list(run.policies),
        "readers": list(run.readers),
        "cases": [{"name": n, "description": d} for n, d in run.cases],
        "skipped": [{"name": n, "why": w} for n, w in run.skipped],
        "cancelled": run.cancelled,
        "seconds": round(run.seconds, 3),
        "results": [cell_to_json(r) for r in run.results],
    }


# ---------------------------------------------------------------------------------------------
# Markdown


def diff_text(d: float | None, nonfinite: str = "**NaN**", digits: int = 3) -> str:
    """A probe difference: ``=`` identical, ``nonfinite`` for a non-finite read-out, else the value."""
    if d is None:
        return "–"
    if not math.isfinite(d):
        return nonfinite
    return "=" if d == 0.0 else f"{d:.{digits}g}"


def _state_text(r: CellResult, esc: Callable[[object], str]) -> str:
    t = r.target
    states = {c.state for c in t.components.values()}
    if len(t.components) > 1 and len(states) > 1:
        text = ", ".join(f"{role} {c.state}" for role, c in t.components.items())
    else:
        text = t.state
    return esc(f"{text} [{t.pos_min},{t.pos_max}]")


def _kernel(r: CellResult) -> str:
    """The read-out the cell's probes hold: the core's ``dense`` kernel, or a real engine's ``logits``."""
    for o in r.others.values():
        if o.probe_diff and "dense" not in o.probe_diff:
            return next(iter(o.probe_diff))
    return "dense"


def cell_text(r: CellResult | None, esc: Callable[[object], str] = safe_text) -> str:
    """``return · target state [pos] · others ✓/✗ · dense probe`` (``⚠`` marks NaN/Inf left in free cells); the
    values in it (an error, the target's state) escaped by ``esc``: one terminal line by default (the app's
    matrix), :func:`~kvscope.core.textsafe.markdown_text` in the Markdown table."""
    if r is None:
        return "–"
    if r.error is not None:
        return "error: " + esc((r.error.splitlines() or [""])[0][:60])
    if r.hazard:
        return "⚠ short read: undefined (uninitialised memory / abort)"
    ret = r.restore.returned
    ret_s = str(ret).lower() if isinstance(ret, bool) else str(ret)
    intact = r.others_intact
    others = "–" if intact is None else ("✓" if intact else "✗")
    text = f"{ret_s} · {_state_text(r, esc)} · {others} · {diff_text(r.others_diff(_kernel(r)))}"
    if r.stale_nonfinite:
        text += " ⚠"
    return text


def render_markdown(run: LabRun) -> str:
    """The matrix as a Markdown document: header, table, legend, hazards and errors, skipped cases. Every value
    from the scenario (its folder's name, the restored file's, a spec's label, an error) is escaped for Markdown
    (:mod:`kvscope.core.textsafe`): no ``|`` splits a cell, no control or bidi character reaches the page."""
    sc = run.scenario
    md = markdown_text
    restore = sc.get("restore", {})
    attn = "on" if sc.get("flash_attn") else "off"
    components = ", ".join(str(c) for c in sc.get("components", []))
    lines = [
        f"### kvscope lab: {md(sc.get('name') or sc.get('arch'))}",
        "",
        f"Model {markdown_code(sc.get('arch'))} ({md(sc.get('memory_class'))}: {md(components)}), "
        f"{md(sc.get('n_stream'))} stream(s), flash attention {attn}, layout {md(sc.get('layout'))}. "
        f"Restore {markdown_code(restore.get('name') or restore.get('kind'))} ({md(restore.get('api'))}) into seq "
        f"{md(sc.get('target'))}; live sequences {md(sc.get('live_sequences'))}.",
        "",
    ]
    cols = [(p, r) for p in run.policies for r in run.readers]
    lines.append("| case | " + " | ".join(f"{md(p)} · {md(r)}" for p, r in cols) + " |")
    lines.append("|---|" + "---|" * len(cols))
    for name, _ in run.cases:
        cells = [cell_text(run.cell(name, p, r), markdown_text) for p, r in cols]
        label = md(name) if name == AS_IS else markdown_code(name)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Each cell: return value · target sequence afterwards [pos_min,pos_max] (`restored`: holds exactly "
        "the input's data) · other sequences bitwise intact ✓/✗ · their `dense` probe (the attention path "
        "without flash attention) against the clean baseline: `=` identical, **NaN** non-finite, else the max "
        "abs difference. ⚠ after a cell: NaN/Inf rows left in free cells of the target's stream.",
    ]
    notes: dict[tuple[str, str], list[str]] = {}
    for r in run.results:
        if r.hazard or r.error:
            notes.setdefault((r.corruption, r.error or r.restore.message), []).append(f"{r.policy} · {r.reader}")
    if notes:
        lines += ["", "Notes:"]
        for (case, why), where in notes.items():
            lines.append(f"- {markdown_code(case)} ({md(', '.join(where))}): {md(why)}")
    if run.skipped:
        lines += ["", "Not applicable: " + "; ".join(f"{markdown_code(n)} ({md(w)})" for n, w in run.skipped) + "."]
    if run.cancelled:
        lines += ["", f"Cancelled after {plural(len(run.results), 'cell')}."]
    return "\n".join(lines) + "\n"
