"""One lab case as the engine saw it, and where it and kvscope's memory core disagree.

:class:`EngineCell` is a case's outcome in llama.cpp (the lab's cell plus what only an engine tells: an
abort, its log, the poisoned-slot check, llama.cpp's own failure, the next-token behaviour);
:func:`disagreements` lists every field where the core's cell and the engine's differ, and
:func:`explain` attaches the reason the lab established (:mod:`kvscope.core.lab.engine_lab` runs the cases).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvscope.core.lab.report import HAZARD, CellResult, OtherOutcome, TargetOutcome
from kvscope.core.verify.behaviour import Behaviour


@dataclass
class PoisonCheck:
    """After a failed slot restore: the same request on the slot and on a fresh slot."""

    prompt_tokens: int
    aborted: str | None = None  # the server died serving the request
    completion: list[int] | None = None
    fresh_completion: list[int] | None = None
    error: str | None = None
    skipped: str | None = None  # why no request was made

    @property
    def same(self) -> bool | None:
        if self.completion is None or self.fresh_completion is None:
            return None
        return self.completion == self.fresh_completion

    @property
    def poisoned(self) -> bool:
        return self.aborted is not None or self.same is False

    def to_json(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "aborted": self.aborted, "completion": self.completion,
                "fresh_completion": self.fresh_completion, "same_completion": self.same, "poisoned": self.poisoned,
                "error": self.error, "skipped": self.skipped}


@dataclass
class EngineCell:
    """One case in the engine: the lab's cell plus what only an engine tells."""

    result: CellResult
    aborted: str | None = None
    log: list[str] = field(default_factory=list)
    poisoned: PoisonCheck | None = None
    notes: list[str] = field(default_factory=list)  # what could not be observed, and why
    fault: str | None = None  # llama.cpp's own failure on this case, with the evidence (issue #20)
    behaviour: dict[int, Behaviour] = field(default_factory=dict)  # per sequence: next-token logits judged


@dataclass
class Disagreement:
    """One field where the core and the engine differ on one case."""

    case: str
    field: str  # return, aborted, target, target.<component>, others.<seq>, state_after, recovered, error
    core: Any
    engine: Any
    detail: str = ""
    explanation: str | None = None  # why the two differ here, as the lab established it (None: unexplained)

    def to_json(self) -> dict[str, Any]:
        return {"case": self.case, "field": self.field, "core": self.core, "engine": self.engine,
                "detail": self.detail, "explanation": self.explanation}



# ---------------------------------------------------------------------------------------------
# core vs engine


def _first_diff(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    for i in range(0, n, 4096):
        if a[i:i + 4096] != b[i:i + 4096]:
            return i + next(j for j in range(min(4096, n - i)) if a[i + j] != b[i + j])
    return n


def _components(t: TargetOutcome) -> dict[str, tuple[str, int, int, int]]:
    return {r: (c.state, c.n_cells, c.pos_min, c.pos_max) for r, c in t.components.items()}


def _others(o: dict[int, OtherOutcome]) -> dict[int, tuple[bool, int, int]]:
    return {s: (x.intact, x.pos_min, x.pos_max) for s, x in o.items()}


def disagreements(core: CellResult, engine: EngineCell) -> list[Disagreement]:
    """Every field where the core's cell and the engine's differ (none for a core ``short_read_hazard``)."""
    e = engine.result
    name = core.corruption
    out: list[Disagreement] = []
    if core.restore.failed_check == HAZARD:
        return out
    if core.error or e.error:
        if core.error != e.error:
            out.append(Disagreement(name, "error", core.error, e.error))
        return out
    if engine.aborted is not None:
        out.append(Disagreement(name, "aborted", core.restore.returned, engine.aborted,
                                f"llama.cpp died ({e.restore.message}); the core returned "
                                f"{core.restore.returned} ({core.restore.failed_check or 'ok'})"))
        return out
    if core.restore.returned != e.restore.returned:
        out.append(Disagreement(name, "return", core.restore.returned, e.restore.returned,
                                f"core: {core.restore.failed_check or 'ok'} {core.restore.message}; "
                                f"llama.cpp: {e.restore.message}"))
    ct, et = core.target, e.target
    a, b = core.after_state, e.after_state
    if (ct.pos_min, ct.pos_max) != (et.pos_min, et.pos_max):  # llama.cpp's own seq_pos_min/max
        out.append(Disagreement(name, "target.pos", [ct.pos_min, ct.pos_max], [et.pos_min, et.pos_max]))
    for s in sorted({*core.others, *e.others}):
        cp, ep = _pos(core.others.get(s)), _pos(e.others.get(s))
        if cp != ep:
            out.append(Disagreement(name, f"others.{s}.pos", cp, ep))
    if a is not None and b is not None and a == b:
        # llama.cpp's per-component state is seen through its state bytes (read back into the core), which
        # are the core's byte for byte: the target's and the others' states are the same observation
        return out + _recovered(core, e, name)
    if a is not None and b is not None:
        out.append(Disagreement(name, "state_after", len(a), len(b),
                                f"the states afterwards differ from byte {_first_diff(a, b)} ({len(a)} / {len(b)} "
                                "bytes)"))
    if ct.state != et.state:
        out.append(Disagreement(name, "target", ct.state, et.state))
    cc, ec = _components(ct), _components(et)
    for role in sorted({*cc, *ec}):
        if cc.get(role) != ec.get(role):
            out.append(Disagreement(name, f"target.{role}", list(cc.get(role) or ()), list(ec.get(role) or ())))
    co_, eo_ = _others(core.others), _others(e.others)
    for s in sorted({*co_, *eo_}):
        if (co_.get(s) or (None,))[0] != (eo_.get(s) or (None,))[0]:
            out.append(Disagreement(name, f"others.{s}", list(co_.get(s) or ()), list(eo_.get(s) or ())))
    return out + _recovered(core, e, name)


def _pos(o: OtherOutcome | None) -> list[int] | None:
    return None if o is None else [o.pos_min, o.pos_max]


def _recovered(core: CellResult, e: CellResult, name: str) -> list[Disagreement]:
    if core.recovered is not None and e.recovered is not None and core.recovered != e.recovered:
        return [Disagreement(name, "recovered", core.recovered, e.recovered)]
    return []


def explain(found: list[Disagreement], engine: EngineCell) -> list[Disagreement]:
    """Each disagreement of a case with the reason the lab established: a case where llama.cpp failed on its
    own (:attr:`EngineCell.fault`) is not the core's to reproduce (it models llama.cpp's intended checks)."""
    if engine.fault:
        for d in found:
            d.explanation = f"llama.cpp's own failure: {engine.fault}"
    return found
