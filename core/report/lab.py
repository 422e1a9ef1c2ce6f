"""The report's lab section: a standard-catalog matrix with the reported file as the state to restore.

The lab needs a live context to restore into. It is the lab scenario folder the file sits in (a
folder with a ``context.json``, as under ``tests/data/lab``), or ``--lab-context CTX``: a
whole-context state (``context.state.bin``), a scenario folder or its ``context.json``. The file
is restored into sequence ``--lab-into`` (default 0), first as it is, then corrupted by every
catalog entry that applies. No Qt here; torch is imported only when the lab runs.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from kvscope.core.report.model import Cancelled, LabSection, Progress, ReportError, ReportOptions

if TYPE_CHECKING:
    from kvscope.core.model.profile import ModelProfile

NEEDS_SCENARIO = ("--lab needs a live context to restore into, and this file is not in a lab scenario folder "
                  "(one with a context.json): give --lab-context CTX (a whole-context state such as "
                  "context.state.bin, a scenario folder or its context.json)")
NEEDS_MEMORY_CORE = ("the lab needs kvscope's memory core (torch), which is not installed here: "
                     "pip install 'kvscope[memory]'")


def scenario_folder(path: str) -> str | None:
    """The lab scenario folder ``path`` sits in (its folder holds a ``context.json``), else None."""
    folder = os.path.dirname(path) or "."
    return folder if os.path.isfile(os.path.join(folder, "context.json")) else None


def lab_context(options: ReportOptions) -> str | None:
    """The live context the lab would use: ``--lab-context``, else the file's scenario folder."""
    return options.lab_context or scenario_folder(options.file)


def memory_core_available() -> bool:
    """True when torch (and so the memory core) can be imported."""
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def run_lab(options: ReportOptions, profile: ModelProfile | None, progress: Progress,
            cancelled: Cancelled | None = None) -> LabSection:
    """Run the matrix, or say why not. An explicit ``--lab-context`` that does not work is bad input
    (ReportError); a scenario folder found next to the file that does not work is reported in the section."""
    explicit = options.lab_context is not None
    context = lab_context(options)
    if context is None:
        return LabSection(None, None, NEEDS_SCENARIO)
    if not memory_core_available():
        return LabSection(None, context, NEEDS_MEMORY_CORE)
    from kvscope.core.lab.corruptions import CorruptionError
    from kvscope.core.lab.runner import AS_IS, LabError, LabRunner, parse_case, standard_cases
    from kvscope.core.lab.scenario import ScenarioError, load_scenario

    progress(None, "lab: building the live context")
    try:
        scenario = load_scenario(context, model=profile,
                                 restore=options.file, into=options.lab_into)
        cases, skipped = standard_cases(scenario)
        runner = LabRunner(scenario, [parse_case(AS_IS), *cases])
        runner.skipped = skipped
        for case in runner.cases:
            runner.prepare(case)
    except (ScenarioError, LabError, CorruptionError, ValueError) as e:
        if explicit:
            raise ReportError(f"--lab-context {context}: {e}") from None
        return LabSection(None, context, f"the lab scenario in {context} cannot be used: {e}")

    def step(done: int, total: int, label: str) -> None:
        progress(done / max(1, total), f"lab {done}/{total}: {label}")

    run = runner.run(step, cancelled)
    return LabSection(run, context)
