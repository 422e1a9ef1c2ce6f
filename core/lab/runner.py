"""The corrupt-and-restore matrix: cases x failure policies x reader kinds over one :class:`Scenario`.

Every cell starts from the live context (a :class:`LiveCopy` reset: one copy per tensor), restores the
case's bytes into the target sequence with the input's API, the cell's policy and reader kind, then
records:

* ``restore``: llama.cpp's return value, the bytes consumed, the failed check and its offset;
* ``target``: its state right after the restore (``unchanged`` / ``removed`` / ``restored`` = holds
  exactly what the input holds for it / ``changed``), per memory component and overall, with positions;
* ``others``: every other live sequence, bitwise intact or not, its positions and probe difference;
* ``stale_cells``: free cells of the target's stream(s) holding non-zero bytes (``stale_nonfinite``:
  of those, holding NaN/Inf), after the case's follow-up operation (``..._then_seq_rm``);
* ``recovered``: whether a clean restore of the original input (same API, policy and reader) then
  brings the target back byte for byte.

Where llama.cpp's **file** reader would read past the end of a truncated file (``seq_load_file``,
``load_file``), its outcome depends on uninitialised memory or aborts the process (spec §2.2); such a
cell reports ``restore.failed_check = "short_read_hazard"`` and no outcome.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from kvscope.core.errors import UsageError
from kvscope.core.lab.corruptions import CATALOG, Corruption, CorruptionError, parse_spec
from kvscope.core.lab.probe import Probe, component_bytes, probe_sequences, seq_cells, stale_cells
from kvscope.core.lab.report import (
    AS_IS,
    HAZARD,
    CellResult,
    ComponentOutcome,
    LabRun,
    OtherOutcome,
    RestoreOutcome,
    TargetOutcome,
)
from kvscope.core.lab.scenario import LiveCopy, RestoreInput, Scenario, blank_like, restore_into
from kvscope.core.memory import MemoryContext, ReadResult
from kvscope.core.reader.parse import read_state
from kvscope.core.reader.state_kinds import FILE_KINDS

POLICIES = ("contained", "legacy", "transactional")
READERS = ("buffer", "file")
THEN_SEQ_RM = "_then_seq_rm"

__all__ = [
    "AS_IS", "HAZARD", "POLICIES", "READERS", "CellResult", "ComponentOutcome", "LabCase", "LabError", "LabRun",
    "LabRunner", "OtherOutcome", "PreparedCase", "RestoreOutcome", "TargetOutcome", "one_thread", "parse_case",
    "run_matrix", "standard_cases",
]

Progress = Callable[[int, int, str], None]
Cancel = Callable[[], bool] | threading.Event


class LabError(UsageError, ValueError):
    """A case, policy or reader the lab cannot run (one-line message)."""


@dataclass(frozen=True)
class LabCase:
    """One row of the matrix: a corruption of the scenario's input (None: the input as is), or exact
    bytes (``data``), optionally followed by ``seq_rm(target)`` after the restore."""

    name: str
    corruption: Corruption | None = None
    data: bytes | None = None
    then_seq_rm: bool = False
    description: str = ""


def parse_case(spec: str) -> LabCase:
    """A case from ``as-is``, a catalog name, ``KIND:key=value,...``; ``NAME_then_seq_rm`` or a ``+seq_rm``
    suffix adds ``seq_rm(target)`` after the restore."""
    spec = spec.strip()
    if spec == AS_IS:
        return LabCase(AS_IS)
    base, rm = spec, False
    if spec.endswith("+seq_rm"):
        base, rm = spec[: -len("+seq_rm")], True
    elif spec.endswith(THEN_SEQ_RM) and spec[: -len(THEN_SEQ_RM)] in CATALOG:
        base, rm = spec[: -len(THEN_SEQ_RM)], True
    if base == AS_IS:
        return LabCase(spec, then_seq_rm=rm)
    try:
        return LabCase(spec, parse_spec(base), then_seq_rm=rm)
    except CorruptionError as e:
        raise LabError(f"--corrupt {spec}: {e}") from None


def standard_cases(scenario: Scenario) -> tuple[list[LabCase], list[tuple[str, str]]]:
    """The catalog entries that apply to the scenario's input and memory (``swa_*`` need a kv_swa cache,
    ``recr_*`` a recurrent part; a case giving the same bytes as an earlier one is dropped), plus
    ``nan_rows_valid_then_seq_rm``. Returns the cases and the skipped names with the reason."""
    roles = {p.role for p in scenario.live.memory.parts}
    clean = scenario.restore.data
    seen: dict[bytes, str] = {clean: "the input itself"}
    cases: list[LabCase] = []
    skipped: list[tuple[str, str]] = []
    for name, c in CATALOG.items():
        if name.startswith("swa_") and "kv_swa" not in roles:
            skipped.append((name, "no kv_swa cache"))
            continue
        if (name.startswith("recr_") or name.endswith("_recr")) and "recurrent" not in roles:
            skipped.append((name, "no recurrent part"))
            continue
        try:
            m = c.apply(clean, scenario.profile)
        except CorruptionError as e:
            skipped.append((name, str(e)))
            continue
        if m.data in seen:
            skipped.append((name, f"same bytes as {seen[m.data]}"))
            continue
        seen[m.data] = name
        cases.append(LabCase(name, c, m.data, description=m.description))
        if name == "nan_rows_valid":
            cases.append(LabCase(name + THEN_SEQ_RM, c, m.data, True, m.description + "; then seq_rm(target)"))
    return cases, skipped


# ---------------------------------------------------------------------------------------------
# the runner


@dataclass(frozen=True)
class PreparedCase:
    """A case's exact input and, per component, what the input holds for the target (None: unknown)."""

    input: RestoreInput
    description: str
    expected: dict[str, bytes] | None  # per component, what the input holds for the target


@contextmanager
def one_thread() -> Iterator[None]:
    """Run torch with one intra-op thread in this thread (restored afterwards): the lab's tensors are one
    layer of one stream, where the thread pool's round trips cost more than the work (10-40x on 2 cores)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _cancelled(cancel: Cancel | None) -> bool:
    if cancel is None:
        return False
    return cancel.is_set() if isinstance(cancel, threading.Event) else bool(cancel())


class LabRunner:
    """Runs cells of the matrix over one scenario; safe to run off the GUI thread (one runner per thread).

    ``cases`` None: the standard catalog (:func:`standard_cases`); names must be unique. The live context
    is only read; every cell works on the runner's own copy.
    """

    def __init__(self, scenario: Scenario, cases: Sequence[LabCase] | None = None,
                 policies: Sequence[str] = POLICIES, readers: Sequence[str] = READERS, *,
                 keep_after_state: bool = False) -> None:
        for p in policies:
            if p not in POLICIES:
                raise LabError(f"unknown policy {p!r} ({', '.join(POLICIES)})")
        for r in readers:
            if r not in READERS:
                raise LabError(f"unknown reader kind {r!r} ({', '.join(READERS)})")
        self.scenario = scenario
        if cases is None:
            self.cases, self.skipped = standard_cases(scenario)
        else:
            self.cases, self.skipped = list(cases), []
        names = [c.name for c in self.cases]
        if len(set(names)) != len(names):
            raise LabError(f"case names must be unique: {sorted({n for n in names if names.count(n) > 1})}")
        self.policies, self.readers = tuple(policies), tuple(readers)
        self.keep_after_state = keep_after_state
        self._prepared: dict[str, PreparedCase] = {}
        live = scenario.live
        self._seqs = tuple(sorted({*scenario.sequences, scenario.target}))
        with one_thread():
            self._work = LiveCopy(live)
            self.baseline: dict[int, Probe] = probe_sequences(live, scenario.profile, self._seqs)
            self._before = {s: component_bytes(live, s) for s in self._seqs}
            self._before_cells = {s: seq_cells(live, s) for s in self._seqs}
            self._clean_expected = self._expected(scenario.restore)

    def working_context(self) -> MemoryContext:
        """The runner's working context, reset to the live state (the next cell resets it again)."""
        with one_thread():
            return self._work.reset()

    @property
    def total(self) -> int:
        return len(self.cases) * len(self.policies) * len(self.readers)

    def run(self, progress: Progress | None = None, cancel: Cancel | None = None) -> LabRun:
        """Every cell, row by row; ``progress(done, total, label)`` after each; ``cancel`` checked between cells."""
        t0 = time.perf_counter()
        results: list[CellResult] = []
        total = self.total
        with one_thread():
            cancelled = self._run_all(results, total, progress, cancel)
        cases = [(c.name, self._describe(c)) for c in self.cases]
        return LabRun(self.scenario.summary(), cases, list(self.skipped), self.policies, self.readers, results,
                      cancelled, time.perf_counter() - t0)

    def _run_all(self, results: list[CellResult], total: int, progress: Progress | None,
                 cancel: Cancel | None) -> bool:
        cancelled = False
        for case in self.cases:
            for policy in self.policies:
                for reader in self.readers:
                    if _cancelled(cancel):
                        cancelled = True
                        break
                    results.append(self.run_cell(case, policy, reader))
                    if progress is not None:
                        progress(len(results), total, f"{case.name} · {policy} · {reader}")
                if cancelled:
                    break
            if cancelled:
                break
        return cancelled

    def _describe(self, case: LabCase) -> str:
        prep = self._prepared.get(case.name)
        return prep.description if prep is not None else case.description

    # -- preparation ----------------------------------------------------------------------------
    def _expected(self, inp: RestoreInput) -> dict[str, bytes] | None:
        """What the input holds for the target, per component (per-sequence input: its sections;
        whole-context input: the target's sections after a clean ``contained`` restore into an empty context)."""
        sc = self.scenario
        if inp.per_seq:
            res = read_state(data=inp.data, profile=sc.profile)
            return {s.role: inp.data[s.offset : s.offset + s.size] for s in res.sections}
        fresh = blank_like(sc.live)
        r = restore_into(fresh, inp, sc.target, "contained", "buffer", sc.n_token_capacity)
        if not r.ok and r.check != "trailing":
            return None
        return component_bytes(fresh, sc.target)

    def prepare(self, case: LabCase) -> PreparedCase:
        """The case's bytes (corruption applied once) and what ``restored`` compares against."""
        if case.name in self._prepared:
            return self._prepared[case.name]
        sc = self.scenario
        clean = sc.restore.data
        if case.data is not None:
            data, desc = case.data, case.description or f"given bytes ({len(case.data)})"
        elif case.corruption is not None:
            try:
                m = case.corruption.apply(clean, sc.profile)
            except CorruptionError as e:
                raise LabError(f"{case.name}: {e}") from None
            data, desc = m.data, m.description
        else:
            data, desc = clean, "the input as is"
        if case.then_seq_rm and "seq_rm" not in desc:
            desc += f"; then seq_rm({sc.target})"
        inp = sc.restore.replace(data, case.name)
        prep = PreparedCase(inp, desc, self._expected(inp))
        self._prepared[case.name] = prep
        return prep

    def forget(self, name: str) -> None:
        """Drop a prepared case (long runs of one-off cases keep memory flat)."""
        self._prepared.pop(name, None)

    # -- one cell -------------------------------------------------------------------------------
    def run_cell(self, case: LabCase, policy: str, reader: str) -> CellResult:
        """One cell of the matrix, from a fresh copy of the live context."""
        with one_thread():
            return self._cell(case, policy, reader)

    def _cell(self, case: LabCase, policy: str, reader: str) -> CellResult:
        prep = self.prepare(case)
        t0 = time.perf_counter()
        sc = self.scenario
        ctx = self._work.reset()
        empty = TargetOutcome(sc.target, "undetermined", None, None)
        out = CellResult(case.name, prep.description, policy, reader,
                         RestoreOutcome(False, None, None, None, None), empty)
        try:
            res = restore_into(ctx, prep.input, sc.target, policy, reader, sc.n_token_capacity)
            out.restore = RestoreOutcome(res.ok, res.returned, res.n_read, res.check, res.offset, res.message,
                                         res.section, list(res.actions))
            if prep.input.kind in FILE_KINDS and reader == "file" and res.check == "truncated":
                out.restore = _hazard(res)
                return out
            if self.keep_after_state:
                out.after_state = bytes(ctx.get_data())
            out.target = self._target(ctx, prep.expected)
            out.others = self._others(ctx)
            if case.then_seq_rm:
                ctx.memory.seq_rm(sc.target)
            probes = probe_sequences(ctx, sc.profile, self._seqs)
            out.target.probe_diff = probes[sc.target].diff(self.baseline[sc.target])
            for s, o in out.others.items():
                o.probe_diff = probes[s].diff(self.baseline[s])
            stale = stale_cells(ctx, sc.target)
            out.stale_by_component = {role: n for role, (n, _) in stale.items()}
            out.stale_cells = sum(n for n, _ in stale.values())
            out.stale_nonfinite = sum(b for _, b in stale.values())
            out.recovered = self._recover(ctx, policy, reader)
        except Exception as e:  # one broken cell must not end the matrix; the error is reported in the cell
            out.error = f"{type(e).__name__}: {e}"
        finally:
            out.seconds = time.perf_counter() - t0
        return out

    def _target(self, ctx: MemoryContext, expected: dict[str, bytes] | None) -> TargetOutcome:
        t = self.scenario.target
        after, before = component_bytes(ctx, t), self._before[t]
        cells, cells0 = seq_cells(ctx, t), self._before_cells[t]
        comps: dict[str, ComponentOutcome] = {}
        for role, (n, lo, hi) in cells.items():
            a = after.get(role)
            if n == 0 and cells0[role][0] > 0:
                state = "removed"
            elif a == before.get(role):
                state = "unchanged"
            elif expected is not None and a == expected.get(role):
                state = "restored"
            else:
                state = "changed"
            comps[role] = ComponentOutcome(state, n, lo, hi)
        if all(c.n_cells == 0 for c in comps.values()) and any(n for n, _, _ in cells0.values()):
            state = "removed"
        elif after == before:
            state = "unchanged"
        elif expected is not None and all(expected.get(r) == b for r, b in after.items()):
            state = "restored"
        else:
            state = "changed"
        mem = ctx.memory
        return TargetOutcome(t, state, mem.seq_pos_min(t), mem.seq_pos_max(t), comps)

    def _others(self, ctx: MemoryContext) -> dict[int, OtherOutcome]:
        mem = ctx.memory
        return {s: OtherOutcome(s, component_bytes(ctx, s) == self._before[s], mem.seq_pos_min(s),
                                mem.seq_pos_max(s), {})
                for s in self._seqs if s != self.scenario.target}

    def classify(self, ctx: MemoryContext, case: LabCase) -> tuple[TargetOutcome, dict[int, OtherOutcome]]:
        """The target's and the other sequences' state in ``ctx`` as a cell of ``case`` reports them; ``ctx``
        is any context holding this scenario's memory (e.g. a real engine's state read back into the core)."""
        return self._target(ctx, self.prepare(case).expected), self._others(ctx)

    @property
    def clean_expected(self) -> dict[str, bytes] | None:
        """Per component, what a clean restore of the scenario's input holds for the target (``recovered``)."""
        return self._clean_expected

    def _recover(self, ctx: MemoryContext, policy: str, reader: str) -> bool | None:
        if self._clean_expected is None:
            return None
        sc = self.scenario
        restore_into(ctx, sc.restore, sc.target, policy, reader, sc.n_token_capacity)
        return component_bytes(ctx, sc.target) == self._clean_expected


def _hazard(res: ReadResult) -> RestoreOutcome:
    msg = (f"llama.cpp's file reader reads past the end of a truncated file without an error (spec §2.2): "
           f"{res.message}. What follows depends on uninitialised memory: a check failing on garbage, or "
           "GGML_ASSERT(nread <= state_size) aborting the process; not modelled")
    return RestoreOutcome(False, None, None, HAZARD, res.offset, msg, res.section, list(res.actions))


def run_matrix(scenario: Scenario, cases: Sequence[LabCase] | None = None, policies: Sequence[str] = POLICIES,
               readers: Sequence[str] = READERS, progress: Progress | None = None,
               cancel: Cancel | None = None) -> LabRun:
    """Build a :class:`LabRunner` and run every cell."""
    return LabRunner(scenario, cases, policies, readers).run(progress, cancel)
