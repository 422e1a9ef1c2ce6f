"""The Lab view's background work and its inputs: which open files can be the live context or the state to
restore, loading a scenario, running the matrix. No widgets here.

The lab core (``kvscope.core.lab.scenario`` / ``runner``) needs torch; it is imported inside the jobs,
on a pool thread, so opening the app never pays for torch and works without it (:func:`lab_unavailable`).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvscope.app.base.tasks import CancelToken, Report
from kvscope.core.reader.state_kinds import ALL_KINDS, WHOLE_CONTEXT_KINDS

if TYPE_CHECKING:
    from kvscope.core.lab.report import CellResult, LabRun
    from kvscope.core.lab.runner import LabCase
    from kvscope.core.lab.scenario import Scenario
    from kvscope.core.model.profile import ModelProfile
    from kvscope.core.reader.records import CellTable, ParseResult

WHOLE_KINDS = WHOLE_CONTEXT_KINDS  # a scenario folder for these; any kind restores
RESTORE_KINDS = ALL_KINDS
SUFFIX_KINDS = {".seqdata.bin": "seq_blob", ".seqstate": "seq_file", ".state.bin": "context_blob",
                ".session": "session_file"}
CLEAN_SUFFIX = ".clean.seqdata.bin"
AS_IS, THEN_SEQ_RM = "as-is", "_then_seq_rm"  # kvscope.core.lab.runner's spellings


@functools.cache
def lab_unavailable() -> str | None:
    """Why the lab cannot run here (torch, the memory core's dependency, is missing), else None."""
    if importlib.util.find_spec("torch") is None:
        return "the lab needs kvscope's memory core (torch), which is not installed: pip install 'kvscope[memory]'"
    return None


def guess_kind(path: str, parsed_kind: str | None = None) -> str | None:
    """The state kind of ``path``: the parse's when known, else what the file name announces."""
    if parsed_kind is not None and parsed_kind != "unknown":
        return parsed_kind
    return next((k for s, k in SUFFIX_KINDS.items() if path.endswith(s)), None)


def scenario_folder(path: str) -> str | None:
    """The lab scenario folder ``path`` is (or sits in): a folder holding a ``context.json``."""
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    return folder if os.path.isfile(os.path.join(folder, "context.json")) else None


def clean_inputs(folder: str | None) -> list[str]:
    """The ``seq<N>.clean.seqdata.bin`` files of a scenario folder, by sequence id."""
    if folder is None or not os.path.isdir(folder):
        return []
    names = [n for n in os.listdir(folder) if n.startswith("seq") and n.endswith(CLEAN_SUFFIX)
             and n[3 : -len(CLEAN_SUFFIX)].isdigit()]
    return [os.path.join(folder, n) for n in sorted(names, key=lambda n: int(n[3 : -len(CLEAN_SUFFIX)]))]


@dataclass(frozen=True)
class Choice:
    """One entry of a file combo: the path (a scenario folder for a live context), its label (short, so a
    narrow combo box shows it whole) and where it comes from (the tooltip says)."""

    path: str
    label: str
    origin: str = "open"  # open | scenario | beside | file | folder

    @property
    def tooltip(self) -> str:
        where = {"open": "open in the window", "scenario": "the scenario's clean per-sequence state",
                 "beside": "beside the live context", "file": "chosen with File…",
                 "folder": "a lab scenario folder"}.get(self.origin, self.origin)
        return f"{self.path}\n({where})"


def live_choices(files: Iterable[tuple[str, str | None]], folders: Iterable[str] = ()) -> list[Choice]:
    """Live-context candidates: open whole-context states (``files``: (path, kind)) and scenario folders."""
    out = [Choice(p, os.path.basename(p)) for p, k in files if k in WHOLE_KINDS]
    for f in folders:
        if all(c.path != f for c in out):
            out.append(Choice(f, f"{os.path.basename(f.rstrip(os.sep))}/", "folder"))
    return out


PER_SEQ_SUFFIXES = (".seqdata.bin", ".seqstate")
BESIDE_LIMIT = 64


def _shared_prefix(a: str, b: str) -> int:
    return len(os.path.commonprefix([a, b]))


def beside_inputs(live: str | None, limit: int = BESIDE_LIMIT) -> list[str]:
    """Per-sequence state files (``*.seqdata.bin``, ``*.seqstate``) in the live context's folder, the ones
    whose names share the longest start with the live context's first (``llama-...-ctx.session`` goes with
    ``llama-...-seq0.seqdata.bin``), then by name."""
    if not live:
        return []
    folder = live if os.path.isdir(live) else os.path.dirname(live)
    try:
        names = [n for n in os.listdir(folder) if n.endswith(PER_SEQ_SUFFIXES)]
    except OSError:
        return []
    stem = os.path.basename(live.rstrip(os.sep))
    names.sort(key=lambda n: (-_shared_prefix(n, stem), n))
    return [os.path.join(folder, n) for n in names[:limit] if os.path.isfile(os.path.join(folder, n))]


def restore_choices(files: Iterable[tuple[str, str | None]], live: str | None) -> list[Choice]:
    """Inputs to restore: the open state files other than the live context, the clean per-sequence blobs of
    the live context's scenario folder, then the other per-sequence files beside it (none of them open)."""
    out = [Choice(p, os.path.basename(p)) for p, k in files if k in RESTORE_KINDS and p != live]
    for p in clean_inputs(scenario_folder(live) if live else None):
        if all(c.path != p for c in out):
            out.append(Choice(p, os.path.basename(p), "scenario"))
    for p in beside_inputs(live):
        if p != live and all(c.path != p for c in out):
            out.append(Choice(p, os.path.basename(p), "beside"))
    return out


# ---------------------------------------------------------------------------------------------
# scenario


@dataclass(frozen=True)
class TargetUnit:
    """Where the target sequence's cells live in one memory component: its role and KV stream (None:
    a recurrent component)."""

    role: str
    stream: int | None

    @property
    def label(self) -> str:
        return self.role if self.stream is None else f"{self.role} · stream {self.stream}"


@dataclass
class ScenarioReady:
    """A loaded scenario, the catalog cases that apply to it, and the live state's parse (the "before")."""

    scenario: Scenario
    live_path: str
    cases: list[LabCase]
    skipped: list[tuple[str, str]]
    before: ParseResult
    units: list[TargetUnit] = field(default_factory=list)

    @property
    def target(self) -> int:
        return self.scenario.target


def target_units(scenario: Scenario) -> list[TargetUnit]:
    """The components of the scenario's memory and the stream holding its target sequence."""
    from kvscope.core.memory import KvCache

    out = []
    for part in scenario.live.memory.parts:
        m = part.mem
        out.append(TargetUnit(part.role, m.seq_to_stream(scenario.target) if isinstance(m, KvCache) else None))
    return out


def unit_table(res: ParseResult | None, unit: TargetUnit) -> CellTable | None:
    """The cell table of ``unit`` in a parsed whole-context state (None when it is not there)."""
    if res is None:
        return None
    for sec in res.sections:
        if sec.role != unit.role:
            continue
        if sec.kind != "kv":
            return sec.cells
        return next((st.cells for st in sec.streams if st.index == unit.stream), None)
    return None


def scenario_job(live: str, restore: str, into: int, profile: ModelProfile,
                 base: ScenarioReady | None = None) -> Any:
    """Load the scenario (live context ``live``: a whole-context state or a scenario folder), read the
    input and find the catalog entries that apply. ``base`` with the same live context and model is
    reused (only the input and destination change)."""

    def job(token: CancelToken, report: Report) -> ScenarioReady:
        from kvscope.core.lab.runner import one_thread, standard_cases
        from kvscope.core.lab.scenario import load_scenario, read_input
        from kvscope.core.reader.parse import read_state

        with one_thread():
            if base is not None and base.live_path == live and base.scenario.profile is profile:
                report(None, f"reading {os.path.basename(restore)}")
                sc = base.scenario.with_restore(read_input(restore, profile), into)
                before = base.before
            else:
                report(None, f"building the live context from {os.path.basename(live.rstrip(os.sep))}")
                sc = load_scenario(live, model=profile, restore=restore, into=into)
                token.check()
                before = read_state(data=bytes(sc.live.get_data()), profile=profile)
            token.check()
            report(None, "applying the catalog")
            cases, skipped = standard_cases(sc)
        return ScenarioReady(sc, live, cases, skipped, before, target_units(sc))

    return job


# ---------------------------------------------------------------------------------------------
# the matrix


def check_specs(text: str) -> tuple[list[str], str]:
    """The corruption specs in free text (separated by spaces, ``;`` or new lines) and the first error ("" when
    none). Checked like ``parse_case`` does, with the torch-free corruption parser: a catalog name,
    ``KIND:key=value,...``, ``as-is``, with an optional ``+seq_rm`` suffix (``NAME_then_seq_rm`` for a
    catalog name)."""
    from kvscope.core.lab.corruptions import CATALOG, CorruptionError, parse_spec

    specs = text.replace(";", " ").split()
    for spec in specs:
        base = spec
        if spec.endswith("+seq_rm"):
            base = spec[: -len("+seq_rm")]
        elif spec.endswith(THEN_SEQ_RM) and spec[: -len(THEN_SEQ_RM)] in CATALOG:
            base = spec[: -len(THEN_SEQ_RM)]
        if base == AS_IS:
            continue
        try:
            parse_spec(base)
        except CorruptionError as e:
            return specs, f"{spec}: {e}"
    return specs, ""


def run_job(scenario: Scenario, cases: Sequence[LabCase], specs: Sequence[str], policies: Sequence[str],
            readers: Sequence[str], stop: threading.Event, sink: deque[CellResult]) -> Any:
    """Run the matrix of ``cases`` then ``specs`` (free-text cases, parsed with ``parse_case``) with
    ``LabRunner`` (after-states kept for the cell maps). Each finished cell is
    appended to ``sink`` as it comes, for the view to show before the run ends; ``stop`` (or the task's
    cancel) ends the run between cells and the job returns what ran (``LabRun.cancelled``)."""

    def job(token: CancelToken, report: Report) -> LabRun:
        from kvscope.core.lab.runner import LabRunner, parse_case

        class TappedRunner(LabRunner):
            def run_cell(self, case: LabCase, policy: str, reader: str) -> CellResult:
                r = super().run_cell(case, policy, reader)
                sink.append(r)
                return r

        report(None, "preparing the cases")
        runner = TappedRunner(scenario, [*cases, *(parse_case(s) for s in specs)], policies, readers,
                              keep_after_state=True)
        for case in runner.cases:  # a corruption that does not apply fails here, before any cell runs
            runner.prepare(case)
        total = runner.total
        report(0.0, f"0/{total} cells")

        def progress(done: int, n: int, label: str) -> None:
            report(done / max(1, n), f"{done}/{n} cells · {label}")

        return runner.run(progress, lambda: token.cancelled or stop.is_set())

    return job
