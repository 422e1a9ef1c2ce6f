"""The rules that name llama.cpp's own failures (core/verify/faults.py, shared by verify and the lab) and the
lab's use of them for its disagreements, without an engine: which outcomes are blamed on llama.cpp and
which are not, and what evidence the message carries."""

from __future__ import annotations

import numpy as np

from kvscope.core.lab.engine_cells import Disagreement, EngineCell, explain
from kvscope.core.lab.report import CellResult, RestoreOutcome, TargetOutcome
from kvscope.core.verify.behaviour import judge
from kvscope.core.verify.engines import Logits
from kvscope.core.verify.faults import abort_fault, behaviour_fault, half_restored_fault


def test_an_abort_is_llama_cpps_failure_only_with_its_assert() -> None:
    log = ["llama_state_seq_load_file: reading", "llama-context.cpp:3373: GGML_ASSERT(nread <= state_size) failed"]
    f = abort_fault("SIGABRT", log)
    assert f is not None and "GGML_ASSERT(nread <= state_size)" in f and "where it should refuse it" in f
    assert abort_fault("SIGKILL", ["killed"]) is None  # e.g. out of memory: the input may be to blame
    assert abort_fault(None, log) is None


def test_a_refusal_is_blamed_only_when_cells_or_changes_are_left() -> None:
    assert half_restored_fault({0: (-1, -1), 1: (-1, -1)}) is None
    f = half_restored_fault({0: (4, 130), 1: (-1, -1)})
    assert f is not None and "half-restored" in f and "sequence 0 holds positions 4..130" in f
    assert "sequence 1" not in f
    g = half_restored_fault({}, "the input", "it should be removed", ["sequence 2, which the load does not write, "
                                                                      "changed"])
    assert g is not None and g.startswith("llama.cpp refused the input") and "sequence 2" in g
    assert g.endswith("(it should be removed)")


def _lg(values: list[float]) -> Logits:
    return Logits(values=np.array(values, dtype=np.float32))


def test_a_restore_is_blamed_for_other_logits_only_beyond_the_engines_own_variation() -> None:
    base = [3.0, 1.0, 0.0, -1.0]
    same = judge(0, [5], [_lg(base)], [_lg(base)], {"tail": [_lg(base)]}, wanted=1)
    assert behaviour_fault(same) is None
    moved = judge(0, [5], [_lg(base)], [_lg([0.0, 1.0, 3.0, -1.0])], {"tail": [_lg(base)]}, wanted=1)
    f = behaviour_fault(moved)
    assert f is not None and "sequence 0 then computes other logits" in f and "KL" in f and "limit" in f
    noisy = judge(0, [5], [_lg(base)], [_lg([0.0, 1.0, 3.0, -1.0])], {"tail": [_lg([0.0, 1.0, 3.0, -1.0])]},
                  wanted=1)
    assert behaviour_fault(noisy) is None  # the engine varies as much on its own


def _cell(fault: str | None) -> EngineCell:
    r = CellResult("truncated_half", "", "llama.cpp b11434", "file",
                   RestoreOutcome(False, 0, 0, "engine_refused", None), TargetOutcome(0, "changed", 0, 5))
    return EngineCell(r, fault=fault)


def test_disagreements_are_explained_by_llama_cpps_own_failure_and_only_by_it() -> None:
    found = [Disagreement("truncated_half", "target", "removed", "changed")]
    assert explain(found, _cell(None))[0].explanation is None
    d = explain([Disagreement("truncated_half", "target", "removed", "changed")], _cell("llama.cpp refused ..."))[0]
    assert d.explanation == "llama.cpp's own failure: llama.cpp refused ..." and d.to_json()["explanation"]
