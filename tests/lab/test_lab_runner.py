"""The matrix runner: full standard-catalog runs on every tiny model, invariants of the policies,
progress and cancellation, whole-context and file inputs, hazards, and the JSON / Markdown renderings."""

from __future__ import annotations

import json
import threading
from functools import cache

import pytest

from kvharness.fixtures import DATA
from kvscope.core.lab.report import cell_text, render_markdown, run_to_json
from kvscope.core.lab.runner import (
    HAZARD,
    POLICIES,
    READERS,
    LabError,
    LabRun,
    LabRunner,
    parse_case,
    run_matrix,
    standard_cases,
)
from kvscope.core.lab.scenario import Scenario, load_scenario, read_input

pytestmark = pytest.mark.slow  # the memory core's lab matrix

LAB = DATA / "lab/llamacpp-2026-10-01"
MODELS = ("llama", "mamba", "gemma2", "lfm2")


@cache
def _scenario(name: str) -> Scenario:
    return load_scenario(LAB / name)


@cache
def _full_run(name: str) -> LabRun:
    return run_matrix(_scenario(name))


@pytest.mark.parametrize("model", MODELS)
def test_full_standard_catalog_completes(model: str) -> None:
    run = _full_run(model)
    cases, _ = standard_cases(_scenario(model))
    assert not run.cancelled
    assert len(run.results) == len(cases) * len(POLICIES) * len(READERS) > 0
    assert [n for n, _ in run.cases] == [c.name for c in cases]
    for r in run.results:
        assert r.error is None, (r.corruption, r.policy, r.reader, r.error)
        assert not r.hazard  # a per-sequence blob goes through the buffer API: no file short read
        assert r.others_intact  # a per-sequence restore never touches another sequence
        assert r.recovered  # the core's probe writes nothing, so a clean restore always recovers
        if not r.restore.ok and r.policy == "transactional":
            assert r.target.state == "unchanged" and r.stale_cells == 0
            assert r.target.probe_diff == {"dense": 0.0, "skip-masked": 0.0}
        if r.restore.ok:
            assert r.restore.returned == r.restore.bytes
        assert r.target.components and set(r.target.components) == {
            p.role for p in _scenario(model).live.memory.parts}
    names = {n for n, _ in run.cases}
    assert "nan_rows_valid_then_seq_rm" in names and "nan_rows_late_fail" in names


def test_catalog_applicability() -> None:
    skipped = dict(standard_cases(_scenario("mamba"))[1])
    assert skipped["swa_cell_count_huge"] == "no kv_swa cache"
    assert skipped["recr_cell_count_huge"] == "same bytes as cell_count_huge"  # the first section is recurrent
    assert "drop_k_layer_1" in skipped
    gemma = {c.name for c in standard_cases(_scenario("gemma2"))[0]}
    assert {"swa_cell_count_huge", "swa_truncated_in_data"} <= gemma and "recr_cell_count_huge" not in gemma
    lfm2 = {c.name for c in standard_cases(_scenario("lfm2"))[0]}
    assert {"recr_cell_count_huge", "recr_truncated_in_data", "nan_rows_late_fail_recr"} <= lfm2


def test_lfm2_hybrid_undo_differs_by_policy() -> None:
    run = _full_run("lfm2")
    contained = run.cell("nan_rows_late_fail_recr", "contained", "buffer")
    legacy = run.cell("nan_rows_late_fail_recr", "legacy", "buffer")
    assert contained is not None and legacy is not None
    assert contained.target.state == "removed" and contained.stale_nonfinite == 0
    # before PR #27530 the attention part kept the rows read before the recurrent part failed
    assert legacy.target.components["kv_attn"].state == "restored"
    assert legacy.target.components["recurrent"].state == "removed"
    assert (legacy.target.pos_min, legacy.target.pos_max) == (0, -1)
    assert legacy.others_diff("dense") == float("inf")


def test_progress_and_cancel() -> None:
    runner = LabRunner(_scenario("mamba"), [parse_case("truncated_half"), parse_case("nan_rows_valid")])
    seen: list[tuple[int, int, str]] = []
    run = runner.run(progress=lambda d, t, label: seen.append((d, t, label)))
    assert [d for d, _, _ in seen] == list(range(1, 13)) and {t for _, t, _ in seen} == {12}
    assert seen[0][2] == "truncated_half · contained · buffer"
    stop = threading.Event()

    def progress(done: int, total: int, label: str) -> None:
        if done == 5:
            stop.set()

    run = runner.run(progress=progress, cancel=stop)
    assert run.cancelled and len(run.results) == 5
    assert "Cancelled after 5 cells" in render_markdown(run)
    run = runner.run(cancel=lambda: True)
    assert run.cancelled and run.results == []


def test_runs_off_the_main_thread() -> None:
    runner = LabRunner(_scenario("llama/fa0-unified1"), [parse_case("nan_rows_late_fail")], ["legacy"], ["buffer"])
    out: list[LabRun] = []
    th = threading.Thread(target=lambda: out.append(runner.run()))
    th.start()
    th.join(60)
    assert out and out[0].results[0].stale_nonfinite == 7


def test_file_input_short_read_is_a_hazard() -> None:
    base = _scenario("llama")
    assert base.folder is not None
    sc = base.with_restore(read_input(base.folder / "seq0.clean.seqstate", base.profile))
    run = LabRunner(sc, [parse_case("truncated_half"), parse_case("as-is")], ["contained"]).run()
    hazard = run.cell("truncated_half", "contained", "file")
    clean_fail = run.cell("truncated_half", "contained", "buffer")
    assert hazard is not None and clean_fail is not None
    assert hazard.hazard and hazard.restore.failed_check == HAZARD and hazard.restore.returned is None
    assert "short read" in cell_text(hazard)
    assert not clean_fail.hazard and clean_fail.restore.failed_check == "truncated"
    as_is = run.cell("as-is", "contained", "file")
    assert as_is is not None and as_is.restore.ok and as_is.target.state == "unchanged"
    assert "⚠ short read" in render_markdown(run) and "uninitialised" in render_markdown(run)


def test_whole_context_input_under_legacy_keeps_only_the_last_stream() -> None:
    base = _scenario("llama")  # two streams
    assert base.folder is not None
    sc = base.with_restore(read_input(base.folder / "context.state.bin", base.profile))
    run = LabRunner(sc, [parse_case("as-is"), parse_case("truncated_half")], readers=["buffer"]).run()
    ok = run.cell("as-is", "contained", "buffer")
    bug = run.cell("as-is", "legacy", "buffer")
    cut = run.cell("truncated_half", "contained", "buffer")
    assert ok is not None and bug is not None and cut is not None
    assert ok.target.state == "unchanged" and ok.recovered
    assert bug.restore.ok and bug.restore.returned == len(sc.restore.data)
    assert bug.target.state == "removed" and bug.others_intact and not bug.recovered
    assert cut.target.state == "removed" and cut.others_intact is False  # the whole cache was cleared
    assert cut.others[1].pos_max == -1


def test_json_and_markdown() -> None:
    run = _full_run("gemma2")
    doc = run_to_json(run)
    text = json.dumps(doc, allow_nan=False)  # non-finite differences are null, as in the observations
    assert json.loads(text)["results"][0].keys() >= {"corruption", "policy", "reader", "restore", "target",
                                                       "others", "stale_cells", "recovered"}
    cell = next(c for c in doc["results"] if c["corruption"] == "nan_rows_valid" and c["policy"] == "legacy")
    assert cell["others"]["1"]["probe_diff"] == {"dense": None, "skip-masked": 0.0}
    assert cell["restore"].keys() >= {"ok", "bytes", "failed_check", "offset"}
    assert cell["target"].keys() >= {"seq", "state", "pos_min", "pos_max", "components"}
    md = render_markdown(run)
    assert "| case | contained · buffer | contained · file | legacy · buffer |" in md
    assert md.count("\n| `") == len(run.cases)
    assert "kv_base unchanged, kv_swa removed [-1,-1]" in md  # iSWA: no cross-cache undo
    assert "7472 · restored [0,6] · ✓ · **NaN**" in md


def test_bad_arguments() -> None:
    sc = _scenario("mamba")
    with pytest.raises(LabError):
        LabRunner(sc, [], ["optimistic"])
    with pytest.raises(LabError):
        LabRunner(sc, [], readers=["mmap"])
    with pytest.raises(LabError):
        parse_case("explode:now=1")
    runner = LabRunner(sc, [parse_case("swa_cell_count_huge")])
    with pytest.raises(LabError, match="swa_cell_count_huge"):
        runner.prepare(runner.cases[0])
    assert parse_case("nan_rows_valid_then_seq_rm").then_seq_rm
    assert parse_case("fill:value=nan,role=r+seq_rm").then_seq_rm
    assert parse_case("as-is").corruption is None


def test_case_names_must_be_unique() -> None:
    with pytest.raises(LabError, match="unique"):
        LabRunner(_scenario("mamba"), [parse_case("truncated_half"), parse_case("truncated_half")])
