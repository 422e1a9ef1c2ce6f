"""Replay of every recorded llama.cpp failed-restore case through the lab: the memory core matches what
llama.cpp did, field by field, and a file-API short read is reported as a hazard instead of an outcome.

0.3.36 (``llamacpp-2026-10-01``) is replayed with the ``contained`` policy, 0.3.35 (``llamacpp-2026-08-16``)
with ``legacy``. Each case restores its exact input bytes into seq 0 of the live context with the API
its extension names and that API's reader kind.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pytest

from kvharness.fixtures import DATA
from kvscope.core.lab.runner import HAZARD, LabCase, LabRunner
from kvscope.core.lab.scenario import KIND_BY_SUFFIX, READER_BY_KIND, Scenario, kind_of_path, load_scenario, read_input

LAB = DATA / "lab"
BUILDS = {"llamacpp-2026-10-01": "contained", "llamacpp-2026-08-16": "legacy"}
SCENARIOS = ("llama", "llama/fa0-unified1", "llama/fa1-unified1", "mamba", "gemma2", "lfm2")
CLEAN = {"seq_blob": "seq0.clean.seqdata.bin", "seq_file": "seq0.clean.seqstate", "context_blob": "context.state.bin",
         "session_file": "context.session"}
STATE_NAMES = {"as_input": "restored"}  # the observations' name for "holds exactly the input's section"
OBSERVED_KIND = {"seq_blob": "seq_blob", "seq_file": "seq_file", "ctx_blob": "context_blob", "session": "session_file"}


def _cases() -> list[tuple[str, str, str]]:
    out = []
    for build in BUILDS:
        for sc in SCENARIOS:
            obs = json.loads((LAB / build / sc / "observations.json").read_text())
            out += [(build, sc, name) for name in obs["cases"]]
    return out


CASES = _cases()


@cache
def _scenario(build: str, sc: str) -> Scenario:
    folder = LAB / build / sc
    # 0.3.35's whole-context restore keeps only the last of two streams: the README rebuilds that
    # context with one per-sequence restore per sequence (byte-identical to context.state.bin)
    cj = json.loads((folder / "context.json").read_text())
    two_streams = not cj["context_params"]["kv_unified"] and sc == "llama"
    live = "seqs" if build == "llamacpp-2026-08-16" and two_streams else "state"
    return load_scenario(folder, live=live)


@cache
def _runner(build: str, sc: str, kind: str) -> LabRunner:
    base = _scenario(build, sc)
    assert base.folder is not None
    clean = read_input(base.folder / CLEAN[kind], base.profile)
    return LabRunner(base.with_restore(clean), cases=[], policies=(BUILDS[build],), readers=(READER_BY_KIND[kind],),
                     keep_after_state=True)


@cache
def _observations(build: str, sc: str) -> dict[str, Any]:
    return json.loads((LAB / build / sc / "observations.json").read_text())  # type: ignore[no-any-return]


def _short_read(case: dict[str, Any]) -> bool:
    """llama.cpp's file reader read past the end of the input (the README's caveat)."""
    return case["input_kind"] in ("seq_file", "session") and "truncated" in case["case"]


@pytest.mark.parametrize(("build", "sc", "name"), CASES, ids=[f"{b[9:]}/{s}/{n}" for b, s, n in CASES])
def test_replay_matches_llamacpp(build: str, sc: str, name: str) -> None:
    folder = LAB / build / sc
    case = _observations(build, sc)["cases"][name]
    path = folder / case["input_file"]
    kind = kind_of_path(path)
    assert kind is not None and OBSERVED_KIND[case["input_kind"]] == kind
    runner = _runner(build, sc, kind)
    lab_case = LabCase(name, data=path.read_bytes(), then_seq_rm=name.endswith("_then_seq_rm"))
    res = runner.run_cell(lab_case, BUILDS[build], READER_BY_KIND[kind])
    assert res.error is None, res.error

    if _short_read(case):
        # the outcome depended on uninitialised memory (or aborted): the lab reports the hazard
        assert res.hazard and res.restore.failed_check == HAZARD and "uninitialised" in res.restore.message
        assert res.target.state == "undetermined" and res.recovered is None and not res.others
        return

    assert not case["process_crashed"]
    assert res.restore.returned == case["return"]
    assert [res.target.pos_min, res.target.pos_max] == case["after"]["0"]
    want = {role: STATE_NAMES.get(c["state"], c["state"]) for role, c in case["seq0_components_after"].items()}
    assert {role: c.state for role, c in res.target.components.items()} == want
    for role, c in case["seq0_components_after"].items():
        assert res.target.components[role].n_cells == c["n_cells"]
    assert res.others[1].intact == case["seq1_unchanged"]["all"]
    assert [res.others[1].pos_min, res.others[1].pos_max] == case["after"]["1"]
    assert res.after_state == (folder / case["after_state_file"]).read_bytes()
    _check_probe_and_recovery(build, sc, case, res.others[1].probe_diff, res.recovered)


def _check_probe_and_recovery(build: str, sc: str, case: dict[str, Any], diff: dict[str, float],
                              recovered: bool | None) -> None:
    """The probe of seq 1, with the kernel of the scenario's attention path, is non-finite exactly where
    llama.cpp's next logits on seq 1 were; zero where they were bit-identical, or where they moved by the
    placement control only (flash attention, README caveat)."""
    flash = _scenario(build, sc).params.flash_attn
    d = diff["skip-masked" if flash else "dense"]
    logits = case["seq1_next_logits"]
    poisoned = logits["n_nonfinite"] > 0
    assert (d == float("inf")) == poisoned
    if logits["bit_identical_to_baseline"]:
        assert d == 0.0
    elif d == 0.0:
        control = json.loads((LAB / build / sc / "context.json").read_text())["control_seq_rm_seq0"]
        assert logits["max_abs_diff"] == control["seq1_next_logits"]["max_abs_diff"] > 0
    # recovery: the same, except where llama.cpp's probe decode wrote NaN K/V of its own before the
    # recovery (README: "Recovery is measured after the probe decodes"); the lab's probe writes nothing
    want = case["summary"]["recovered_bit_identical"]
    assert recovered == (True if poisoned else want)


def test_every_input_kind_is_named() -> None:
    kinds = {kind_of_path(LAB / b / s / c["input_file"]) for b, s, _ in CASES
             for c in [_observations(b, s)["cases"][_]]}
    assert kinds == set(KIND_BY_SUFFIX.values())


def test_two_stream_live_from_sequences_equals_the_whole_state() -> None:
    """The README's rebuild of 0.3.35's two-stream context gives context.state.bin byte for byte."""
    sc = _scenario("llamacpp-2026-08-16", "llama")
    assert sc.folder is not None
    assert bytes(sc.live.get_data()) == (sc.folder / "context.state.bin").read_bytes()
    assert sc.sequences == (0, 1)
