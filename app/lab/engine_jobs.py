"""The Lab in a real engine: the background job that runs the matrix's cases in llama.cpp, a llama-server, or
both llama.cpp and the memory core (``kvscope lab --engine ...``), and the words for what an engine tells
(a crash, the poisoned-slot check) and for a disagreement between the two. No widgets here.

:func:`engine_run_job` builds :class:`kvscope.core.lab.engine_lab.EngineLabRunner` on a pool thread (it
starts the engine and decodes the scenario's prompts there), runs every case with progress, and stops
between cases when cancelled; each finished cell (the engine's, then with ``both`` the core's under the
``contained`` policy) is appended to the sink as it comes. The engine's build, library or server come
from the engine settings (:class:`~kvscope.app.document.verify_job.EngineChoice`).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kvscope.app.base.tasks import CancelToken, Job, Report
from kvscope.app.document.verify_job import EngineChoice

if TYPE_CHECKING:
    from kvscope.core.lab.engine_cells import Disagreement, EngineCell
    from kvscope.core.lab.engine_lab import EngineRun
    from kvscope.core.lab.report import CellResult
    from kvscope.core.lab.runner import LabCase
    from kvscope.core.lab.scenario import Scenario

ENGINE_TITLES = {"torch": "torch (the memory core)", "llama.cpp": "llama.cpp", "server": "llama-server",
                 "both": "both: core and llama.cpp"}
CORE_COLUMN = "contained"  # the policy of the core's cells in a ``both`` run


def engine_run_job(scenario: Scenario, cases: Sequence[LabCase], specs: Sequence[str], engine: str,
                   choice: EngineChoice, model: str | None, stop: threading.Event,
                   sink: deque[CellResult]) -> Job:
    """Run ``cases`` then ``specs`` of ``scenario`` in ``engine`` (``llama.cpp``, ``server``, ``both``)."""

    def job(token: CancelToken, report: Report) -> EngineRun:
        from kvscope.core.lab.engine_lab import EngineLabRunner
        from kvscope.core.lab.runner import parse_case

        every = [*cases, *(parse_case(s) for s in specs)]
        report(None, f"starting {ENGINE_TITLES.get(engine, engine)} and decoding the scenario's prompts")
        runner = EngineLabRunner(scenario, engine, every, model=model, **choice.lab_kwargs(engine))
        try:
            tap(runner, sink)
            total = len(runner.cases) * (2 if engine == "both" else 1)
            report(0.0, f"0/{total:,} cells")

            def progress(done: int, n: int, label: str) -> None:
                report(done / max(1, n), f"{done:,}/{n:,} cells · {label}")

            return runner.run(progress, lambda: token.cancelled or stop.is_set())
        finally:
            runner.close()

    return job


def tap(runner: Any, sink: deque[CellResult]) -> None:
    """Append each cell to ``sink`` as the runner finishes it: the engine's (``run_case``) and the core's
    (its lab runner's ``run_cell``), wrapped on this instance only."""
    run_case, run_cell = runner.run_case, runner.runner.run_cell

    def engine_case(case: Any) -> Any:
        cell = run_case(case)
        sink.append(cell.result)
        return cell

    def core_cell(case: Any, policy: str, reader: str) -> Any:
        r = run_cell(case, policy, reader)
        sink.append(r)
        return r

    runner.run_case = engine_case
    runner.runner.run_cell = core_cell


# ---------------------------------------------------------------------------------------------
# words


def disagreement_text(d: Disagreement, engine: str = "llama.cpp") -> str:
    """``state_after: core 1234, llama.cpp 1200 (the states afterwards differ from byte 40 ...)``, and the lab's
    explanation when it has one."""
    return (f"{d.field}: core {d.core!r}, {engine} {d.engine!r}" + (f" ({d.detail})" if d.detail else "")
            + (f"; explained: {d.explanation}" if d.explanation else ""))


def engine_lines(cell: EngineCell | None) -> list[str]:
    """What only the engine tells about a case: a crash with its log tail, the poisoned-slot check, notes."""
    if cell is None:
        return []
    out = []
    if cell.fault:
        out.append(f"llama.cpp's own failure: {cell.fault}")
    if cell.aborted:
        out.append(f"the engine died: {cell.aborted}")
        out += [f"  {line}" for line in cell.log[-4:]]
    p = cell.poisoned
    if p is not None:
        if p.skipped:
            out.append(f"poisoned-slot check: {p.skipped}")
        else:
            verdict = "POISONED" if p.poisoned else ("clean" if p.same else "not decided")
            out.append(f"poisoned-slot check: {verdict} (a request sharing the restored prefix: {p.completion}; on a "
                       f"fresh slot: {p.fresh_completion})" + (f"; {p.error}" if p.error else ""))
    out += [f"note: {n}" for n in cell.notes]
    return out


def by_case(er: EngineRun) -> tuple[dict[str, list[Disagreement]], dict[str, EngineCell]]:
    """The run's disagreements and engine cells, by case name."""
    dis: dict[str, list[Disagreement]] = {}
    for d in er.disagreements:
        dis.setdefault(d.case, []).append(d)
    return dis, {c.result.corruption: c for c in er.cells}
