"""The corrupt-and-restore lab in a real engine, and the comparison with the memory core (``--engine both``).

:class:`EngineLabRunner` runs the lab's cases (the same catalog, the same prepared bytes) in
llama.cpp (libllama in a child process, :class:`~kvscope.core.lab.engine_live.LlamaLive`) or a
llama-server (:class:`~kvscope.core.lab.engine_live.ServerLive`), and reports each case in the
lab's result schema (:class:`~kvscope.core.lab.report.CellResult`): llama.cpp's return value and
log line, the target's and the other sequences' state afterwards (the engine's state read back into
the core and classified like the core's own cells), the next-token logits of every sequence
against the live baseline (``probe_diff["logits"]``), and recovery with the clean input. A crash
of the engine is an outcome (``failed_check = "engine_aborted"``) and the next case starts in a new
process.

With llama-server, a failed restore is followed by the poisoned-slot check
(:class:`~kvscope.core.lab.engine_cells.PoisonCheck`): a completion whose prompt shares the
restored prefix must neither abort the server nor differ from the same request on a fresh slot.

With ``both`` every case also runs in the core (policy ``contained``, the failure policy of
0c1e5709 and later, and the reader of the input's API) and :func:`disagreements` lists every
difference: return value, the target's and the other sequences' positions (llama.cpp's own
``seq_pos_min``/``seq_pos_max``: a cell restored at position -1 holds its sequence without being
serialized), the whole state afterwards byte for byte, recovery, and a crash the core does not
predict. llama.cpp's per-component state is only observable through those state bytes (read back
into the core), so when they are the core's the target's and the other sequences' states are too;
when they differ, the target state, each component and the others are compared as well. The
core's ``short_read_hazard`` cells (a file API reading past a truncated file: undefined) are not
compared.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kvscope.core.analysis.verdict import plural
from kvscope.core.engine.choices import LAB_ENGINES, LAB_LLAMA_ENGINES
from kvscope.core.engine.session import EngineError, EngineSetupError, Outcome, ServerDied, ServerError, ServerHTTPError
from kvscope.core.lab.engine_cells import Disagreement, EngineCell, PoisonCheck, disagreements, explain
from kvscope.core.lab.engine_live import (
    EngineLabError,
    LiveSpec,
    LlamaLive,
    ServerLive,
    core_scenario,
    logits_diff,
    spec_from_scenario,
)
from kvscope.core.lab.probe import component_bytes
from kvscope.core.lab.report import (
    CellResult,
    LabRun,
    OtherOutcome,
    RestoreOutcome,
    TargetOutcome,
)
from kvscope.core.lab.runner import LabCase, LabRunner, one_thread
from kvscope.core.lab.scenario import READER_BY_KIND, RestoreInput, Scenario, blank_like
from kvscope.core.memory import ContextParams, MemoryContext
from kvscope.core.model.profile import ModelProfile
from kvscope.core.pinned_builds import build_writing
from kvscope.core.reader.state_kinds import PER_SEQUENCE_KINDS
from kvscope.core.verify.behaviour import judge
from kvscope.core.verify.engines import Logits, engine_message
from kvscope.core.verify.faults import abort_fault, behaviour_fault, half_restored_fault

ENGINES = LAB_ENGINES
ENGINE_ABORTED = "engine_aborted"  # failed_check of a case that killed the engine
ENGINE_REFUSED = "engine_refused"  # failed_check of a case the engine refused (its message says why)
POISON_PREDICT = 4  # tokens the poisoned-slot check generates
CONTAINED = ("a failed load should remove the sequence it writes (llama.cpp's failure containment, PR #27530) or "
             "leave it as it was, and leave every other sequence intact")

Progress = Callable[[int, int, str], None]


@dataclass
class EngineRun:
    """A finished (or cancelled) lab run in an engine; ``torch`` and ``disagreements`` with ``both``."""

    engine: dict[str, Any]
    run: LabRun
    cells: list[EngineCell]
    torch: LabRun | None = None
    disagreements: list[Disagreement] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def faults(self) -> list[tuple[str, str]]:
        """``(case, what llama.cpp itself got wrong)`` for every case where it failed on its own."""
        return [(c.result.corruption, c.fault) for c in self.cells if c.fault]

    @property
    def unexplained(self) -> list[Disagreement]:
        return [d for d in self.disagreements if not d.explanation]


def _cancelled(cancel: Callable[[], bool] | threading.Event | None) -> bool:
    if cancel is None:
        return False
    return cancel.is_set() if isinstance(cancel, threading.Event) else bool(cancel())


def _returned(kind: str, o: Outcome) -> int | bool:
    if kind == "session_file":
        return bool(o.rc)
    if kind == "seq_file":
        return int(o.rc or 0)
    return int(o.value or 0)


class EngineLabRunner:
    """The lab's cases of one scenario in a real engine (``llama.cpp``, ``server``) or both engines."""

    def __init__(self, scenario: Scenario, engine: str = "llama.cpp", cases: Sequence[LabCase] | None = None, *,
                 build: str | None = None, lib_path: str | None = None, server_url: str | None = None,
                 slot_dir: str | None = None, server_bin: str | None = None, model: str | None = None,
                 probes: bool = True, timeout_s: float = 120.0) -> None:
        if engine not in LAB_LLAMA_ENGINES:
            raise EngineLabError(f"unknown engine {engine!r} ({', '.join(LAB_LLAMA_ENGINES)})")
        notes: list[str] = []
        if build is None and lib_path is None and server_bin is None and server_url is None:
            build = build_writing(scenario.layout.name)  # the pinned build that writes the scenario's files
        spec = spec_from_scenario(scenario, model)
        kind = scenario.restore.kind
        if engine == "server" and kind != "seq_file":
            path = scenario.folder / f"seq{scenario.target}.clean.seqstate" if scenario.folder is not None else None
            if path is None or not path.is_file():
                raise EngineLabError(f"llama-server restores slot files (sequence files), not a {kind}")
            from kvscope.core.lab.scenario import read_input

            scenario = scenario.with_restore(read_input(path, scenario.profile))
            kind = "seq_file"
            notes.append(f"llama-server restores slot files: the input is {path.name}")
        spec = replace(spec, kind=kind, n_token_capacity=scenario.n_token_capacity)
        try:
            if engine == "server":
                live: LlamaLive | ServerLive = ServerLive(spec, build=build, binary=server_bin, url=server_url,
                                                         slot_dir=slot_dir, timeout_s=timeout_s)
            else:
                live = LlamaLive(spec, build=build, lib_path=lib_path, timeout_s=timeout_s, baseline=probes)
        except (EngineSetupError, ServerError) as e:
            raise EngineLabError(str(e)) from None
        self._setup(scenario, engine, cases, live, spec, probes, notes, match=True)

    @classmethod
    def from_live(cls, profile: ModelProfile, params: ContextParams, live: LlamaLive, kind: str,
                  engine: str = "both", cases: Sequence[LabCase] | None = None,
                  probes: bool = False) -> EngineLabRunner:
        """A runner over an engine's live context (no scenario folder): the core's scenario is built from the
        engine's live state and its clean input of ``kind`` (the differential fuzz shares one ``live`` between
        the input kinds)."""
        spec = replace(live.spec, kind=kind)
        clean = RestoreInput(live.clean_input(kind), kind, f"llama.cpp clean {kind}")
        with one_thread():
            sc = core_scenario(profile, params, live.live_blob, clean, spec.target, live.writes or "2026-10",
                               spec.name, spec.n_token_capacity)
        self = cls.__new__(cls)
        self._setup(sc, engine, cases, live, spec, probes, [], match=False)
        return self

    def _setup(self, scenario: Scenario, engine: str, cases: Sequence[LabCase] | None, live: LlamaLive | ServerLive,
               spec: LiveSpec, probes: bool, notes: list[str], match: bool) -> None:
        self.kind, self.probes, self.notes, self.live, self.spec = engine, probes, notes, live, spec
        self.reader = READER_BY_KIND[spec.kind]
        self.scenario = self._match(scenario) if match else scenario
        self.runner = LabRunner(self.scenario, cases, ("contained",), (self.reader,), keep_after_state=True)
        label = self.engine_info().get("build") or "own"
        self.policy_label = f"{'llama-server' if engine == 'server' else 'llama.cpp'} {label}"
        self._ban_list: list[list[Any]] | None = None

    # -- set-up ---------------------------------------------------------------------------------------
    def engine_info(self) -> dict[str, Any]:
        live = self.live
        if isinstance(live, LlamaLive):
            i = live.info
            return {"kind": "llama.cpp", "build": i.get("build"), "commit": i.get("commit"), "writes": live.writes,
                    "lib_dir": i.get("lib_dir"), "binding": i.get("binding"), "restarts": live.restarts}
        p = live._process
        return {"kind": "server", "build": p.build.name if p is not None and p.build is not None else live.build,
                "url": live.client.url, "binary": p.binary if p is not None else None, "restarts": live.restarts}

    def _writes(self) -> str | None:
        if isinstance(self.live, LlamaLive):
            return self.live.writes
        from kvscope.core.engine.builds import BuildError, by_name

        b = self.engine_info().get("build")
        try:
            return by_name(str(b)).writes if b else None
        except BuildError:
            return None

    def _match(self, sc: Scenario) -> Scenario:
        """The core scenario for the engine's live context: the given one when the engine writes its layout and
        its live state, else one rebuilt from the engine's own live state and clean input."""
        writes = self._writes()
        with one_thread():
            own = bytes(sc.live.get_data())
        live = self.live
        if isinstance(live, ServerLive):
            if writes is not None and writes != sc.layout.name:
                raise EngineLabError(f"the llama-server build writes layout {writes}, the scenario's files are "
                                     f"{sc.layout.name}: give the build that wrote them")
            return sc
        if writes in (None, sc.layout.name):
            if live.live_blob != own:
                self.notes.append("llama.cpp's live context is not byte-identical to the scenario's: the core "
                                  "uses the engine's")
                return self._rebuild(sc, writes or sc.layout.name)
            return sc
        self.notes.append(f"llama.cpp {self.engine_info().get('build')} writes layout {writes}, the scenario's files "
                          f"are {sc.layout.name}: the live context and the clean input are the engine's own")
        return self._rebuild(sc, writes)

    def _rebuild(self, sc: Scenario, layout: str) -> Scenario:
        assert isinstance(self.live, LlamaLive)
        kind = self.spec.kind
        flags = sc.restore.flags
        clean = RestoreInput(self.live.clean_input(kind, flags), kind, f"engine clean {kind}", flags)
        with one_thread():
            return core_scenario(sc.profile, sc.params, self.live.live_blob, clean, sc.target, layout, sc.name,
                                 sc.n_token_capacity)

    @property
    def cases(self) -> list[LabCase]:
        return list(self.runner.cases)

    # -- the core's view of an engine state -------------------------------------------------------------
    def _view_whole(self, data: bytes) -> MemoryContext:
        ctx = blank_like(self.scenario.live)
        r = ctx.set_data(data, policy="contained")
        if not r.ok:
            raise EngineLabError(f"the memory core cannot read llama.cpp's state back: {r}")
        return ctx

    def _view_slots(self, slots: dict[int, bytes]) -> MemoryContext:
        ctx = blank_like(self.scenario.live)
        for s, data in sorted(slots.items()):
            r = ctx.seq_load_file(None, s, data=data, policy="contained", reader="file")
            if not r.ok:
                raise EngineLabError(f"the memory core cannot read llama-server's slot {s} back: {r}")
        return ctx

    # -- running --------------------------------------------------------------------------------------
    def run(self, progress: Progress | None = None,
            cancel: Callable[[], bool] | threading.Event | None = None) -> EngineRun:
        """Every case in the engine (and in the core with ``both``); ``progress(done, total, label)``."""
        t0 = time.perf_counter()
        cells: list[EngineCell] = []
        core: list[CellResult] = []
        cancelled = False
        total = len(self.cases) * (2 if self.kind == "both" else 1)
        with one_thread():
            for case in self.cases:
                if _cancelled(cancel):
                    cancelled = True
                    break
                cells.append(self.run_case(case))
                if progress is not None:
                    progress(len(cells) + len(core), total, f"{case.name} · {self.policy_label}")
                if self.kind == "both":
                    core.append(self.runner.run_cell(case, "contained", self.reader))
                    if progress is not None:
                        progress(len(cells) + len(core), total, f"{case.name} · core")
        seconds = time.perf_counter() - t0
        summary = dict(self.scenario.summary(), engine=self.engine_info())
        cases = [(c.name, self.runner.prepare(c).description) for c in self.cases]
        run = LabRun(summary, cases, list(self.runner.skipped), (self.policy_label,), (self.reader,),
                     [c.result for c in cells], cancelled, seconds)
        out = EngineRun(self.engine_info(), run, cells, notes=list(self.notes) + list(self.live.notes))
        if self.kind == "both":
            out.torch = LabRun(self.scenario.summary(), cases, list(self.runner.skipped), ("contained",),
                               (self.reader,), core, cancelled, seconds)
            for a, b in zip(core, cells, strict=False):
                out.disagreements += explain(disagreements(a, b), b)
        return out

    def run_case(self, case: LabCase) -> EngineCell:
        """One case in the engine, from the live context."""
        prep = self.runner.prepare(case)
        sc = self.scenario
        res = CellResult(case.name, prep.description, self.policy_label, self.reader,
                         RestoreOutcome(False, None, None, None, None), TargetOutcome(sc.target, "undetermined", None,
                                                                                      None))
        cell = EngineCell(res)
        t0 = time.perf_counter()
        try:
            if isinstance(self.live, LlamaLive):
                self._llama_case(case, prep.input, cell)
            else:
                self._server_case(case, prep.input, cell)
        except (EngineLabError, EngineError, ServerError, ValueError) as e:
            res.error = f"{type(e).__name__}: {e}"
        finally:
            res.seconds = time.perf_counter() - t0
        return cell

    def _seqs(self) -> list[int]:
        return sorted({*self.spec.seqs, self.spec.target})

    def _llama_case(self, case: LabCase, inp: RestoreInput, cell: EngineCell) -> None:
        live = self.live
        assert isinstance(live, LlamaLive)
        res, sc = cell.result, self.scenario
        live.reset()
        o = live.restore(inp.kind, inp.data, sc.n_token_capacity or 0, inp.flags)
        cell.log = list(o.log)
        if o.aborted is not None:
            cell.aborted = o.aborted
            cell.log += list(o.stderr[-5:])
            res.restore = RestoreOutcome(False, None, None, ENGINE_ABORTED, None, o.summary())
            cell.fault = abort_fault(o.aborted, list(o.log) + list(o.stderr), "this input")
            return
        returned = _returned(inp.kind, o)
        ok = bool(returned)
        n_read = returned if isinstance(returned, int) and not isinstance(returned, bool) else None
        res.restore = RestoreOutcome(ok, returned, n_read, None if ok else ENGINE_REFUSED, None,
                                     "restored" if ok else engine_message(o.log, "returned failure, no log line"))
        sess = live.session
        after = sess.save("context_blob")
        res.after_state = after
        unreadable: list[tuple[str, bytes, str]] = []  # states the core cannot read back: does llama.cpp?
        try:
            res.target, res.others = self.runner.classify(self._view_whole(after), case)
        except EngineLabError as e:
            unreadable.append(("the state afterwards", after, str(e)))
            cell.notes.append(f"the state afterwards cannot be read back, so its components are not classified: {e}")
            res.target = TargetOutcome(sc.target, "undetermined", None, None)
            res.others = {s: OtherOutcome(s, sess.save("seq_blob", s) == live.seq_blobs.get(s), -1, -1, {})
                          for s in self._seqs() if s != sc.target}
        # positions from llama.cpp itself: a cell the state does not serialize (pos -1) still counts there
        res.target.pos_min, res.target.pos_max = sess.positions(sc.target)
        for s, other in res.others.items():
            other.pos_min, other.pos_max = sess.positions(s)
        if not ok:
            cell.fault = self._refusal_fault(inp, res)
        if case.then_seq_rm:
            sess.clear(sc.target)
        if self.probes:
            logits = live.probe_logits(self._seqs())
            diffs = {s: logits_diff(v, live.baseline.get(s)) for s, v in logits.items()}
            res.target.probe_diff = {"logits": diffs.get(sc.target, float("inf"))}
            for s, other in res.others.items():
                other.probe_diff = {"logits": diffs.get(s, float("inf"))}
            clean = ok and not case.then_seq_rm and inp.data == sc.restore.data
            self._judge(cell, logits, clean)
        want = self.runner.clean_expected
        if want is not None:
            back = live.restore(sc.restore.kind, sc.restore.data, sc.n_token_capacity or 0, sc.restore.flags)
            if back.aborted is not None:
                res.recovered = False
            else:
                state = live.session.save("context_blob")
                try:
                    res.recovered = component_bytes(self._view_whole(state), sc.target) == want
                except EngineLabError as e:
                    unreadable.append(("the state after the clean restore", state, str(e)))
                    cell.notes.append(f"recovery not observed: the state after the clean restore cannot be read "
                                      f"back: {e}")
        for what, state, why in unreadable:  # the last step: it replaces the engine's state
            back = live.session.restore("context_blob", 0, data=state)
            if back.aborted is None and back.value == len(state):
                res.error = f"the memory core cannot read {what}, which llama.cpp reads back: {why}"
            else:
                said = back.summary() if back.aborted else engine_message(back.log, "returned 0")
                cell.notes.append(f"llama.cpp refuses {what} too: {said}")

    def _refusal_fault(self, inp: RestoreInput, res: CellResult) -> str | None:
        """After a refused load: a target left neither removed nor as it was in every component of the memory,
        or another sequence changed. The evidence is llama.cpp's own: its ``seq_pos_min``/``seq_pos_max`` and
        its state afterwards, read back per component (or, when that state cannot be read back, its
        per-sequence state against the live one)."""
        live = self.live
        assert isinstance(live, LlamaLive)
        sess, t, per_seq = live.session, self.spec.target, inp.kind in PER_SEQUENCE_KINDS
        held: dict[int, tuple[int, int]] = {}
        extra: list[str] = []
        tgt = res.target
        lo, hi = tgt.pos_min if tgt.pos_min is not None else -1, tgt.pos_max if tgt.pos_max is not None else -1
        comps = {role: c for role, c in tgt.components.items() if not (c.state == "unchanged" and c.n_cells == 0)}
        states = {c.state for c in comps.values()}
        same = sess.save("seq_blob", t) == live.seq_blobs.get(t)  # all of it, the parts without cells included
        by_cells = states <= {"removed"} or (states <= {"unchanged"} and same)
        clean = by_cells if comps else (hi < 0 or same)
        if not clean:
            if hi >= 0:
                held[t] = (lo, hi)
            else:
                extra.append(f"llama.cpp's seq_pos_max reports sequence {t} empty")
            if comps and states <= {"unchanged"}:
                extra.append(f"its cells are as before the load, but llama.cpp's state of sequence {t} "
                             "(llama_state_seq_get_data) is not: a part of the memory that holds no cells changed")
            if comps:
                extra.append(f"sequence {t} per memory component: " + ", ".join(
                    f"{role} {c.state}" + (f" ({plural(c.n_cells, 'cell')}, positions {c.pos_min}..{c.pos_max})"
                                           if c.n_cells else "") for role, c in comps.items()))
        for s, o in sorted(res.others.items()):
            if o.intact:
                continue
            if per_seq:
                extra.append(f"sequence {s}, which the load does not write, changed (llama.cpp's positions "
                             f"{o.pos_min}..{o.pos_max})")
            elif o.pos_max >= 0:
                held[s] = (o.pos_min, o.pos_max)
        return half_restored_fault(held, "the input", CONTAINED, extra)

    def _judge(self, cell: EngineCell, logits: dict[int, Any], clean: bool) -> None:
        """The next-token logits of each sequence against the live context's (a fresh prefill of its tokens),
        within the engine's own variation (verify's ``judge``): the target after a clean input restored without
        an error, and every other sequence after any case; beyond it, llama.cpp's own failure."""
        live = self.live
        assert isinstance(live, LlamaLive)
        t = self.spec.target
        faults: list[str] = []
        for s in self._seqs():
            base, var, got = live.baseline.get(s), live.variation.get(s), logits.get(s)
            if base is None or got is None or (s == t and not clean):
                continue
            spread = {"tail": [Logits(values=var)]} if var is not None else {}
            beh = judge(s, [self.spec.next_token], [Logits(values=base)], [Logits(values=got)], spread, wanted=1)
            cell.behaviour[s] = beh
            if s == t:
                fault = behaviour_fault(beh, "llama.cpp restored the input (the state it wrote for these tokens) "
                                             "without an error")
            else:
                done = "restored without an error" if cell.result.restore.ok else "was refused"
                fault = behaviour_fault(beh, f"the case's input {done} into sequence {t}, which is not sequence {s}")
            if fault is not None:
                faults.append(fault)
        if faults:
            cell.fault = "; ".join([cell.fault, *faults] if cell.fault else faults)

    # -- llama-server -------------------------------------------------------------------------------
    def _ban(self) -> list[list[Any]]:
        if self._ban_list is None:
            from kvscope.core.verify.engines import partial_utf8_tokens

            self._ban_list = [[t, False] for t in partial_utf8_tokens(self.scenario.profile)]
        return self._ban_list

    def _server_case(self, case: LabCase, inp: RestoreInput, cell: EngineCell) -> None:
        live = self.live
        assert isinstance(live, ServerLive)
        res, sc = cell.result, self.scenario
        live.reset()
        try:
            doc = live.restore(sc.target, inp.data)
            returned: int = int(doc.get("n_read") or 0)
            res.restore = RestoreOutcome(True, returned, returned, None, None,
                                         f"slot {sc.target} restored ({doc.get('n_restored')} tokens)")
        except ServerDied as e:
            cell.aborted, cell.log = e.aborted, list(e.log)
            res.restore = RestoreOutcome(False, None, None, ENGINE_ABORTED, None, str(e))
            cell.poisoned = PoisonCheck(len(self.spec.seqs.get(sc.target, [])) + 1,
                                        skipped=f"the server died restoring the slot ({e.aborted}): no request made")
            live.restart()
            return
        except ServerHTTPError as e:
            res.restore = RestoreOutcome(False, 0, 0, ENGINE_REFUSED, None, e.message)
        slots = {s: live.save(s) for s in self._seqs()}
        res.target, res.others = self.runner.classify(self._view_slots(slots), case)
        if not res.restore.ok:
            cell.poisoned = self._poison_check()
            if cell.poisoned.aborted is not None:
                return
        want = self.runner.clean_expected
        if want is not None:
            live.restore(sc.target, sc.restore.data)
            view = self._view_slots({sc.target: live.save(sc.target)})
            res.recovered = component_bytes(view, sc.target) == want

    def _poison_check(self) -> PoisonCheck:
        live = self.live
        assert isinstance(live, ServerLive)
        t = self.spec.target
        prompt = [*self.spec.seqs.get(t, []), self.spec.next_token]
        chk = PoisonCheck(len(prompt))
        body: dict[str, Any] = {"temperature": 0.0, "return_tokens": True, "logit_bias": self._ban()}
        try:
            a = live.complete(prompt, POISON_PREDICT, t, **body)
            chk.completion = [int(x) for x in a.get("tokens") or []]
            live.clear(t)
            b = live.complete(prompt, POISON_PREDICT, t, **body)
            chk.fresh_completion = [int(x) for x in b.get("tokens") or []]
        except ServerDied as e:
            chk.aborted = e.aborted
            chk.error = str(e)
            live.restart()
        except ServerHTTPError as e:
            chk.error = e.message
        return chk

    def close(self) -> None:
        self.live.close()

    def __enter__(self) -> EngineLabRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
