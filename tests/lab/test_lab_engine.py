"""The lab against real llama.cpp: the catalog in libllama and llama-server (context built by decoding the
scenario's prompts), the same result schema, ``both`` listing every disagreement with the core, crashes as
outcomes, the poisoned-slot check, and the real next-token logits as the probe."""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path

import pytest

from kvharness.fixtures import DATA
from kvscope.core.engine.builds import InstalledBuild
from kvscope.core.engine.server import ServerProcess
from kvscope.core.lab.engine_lab import ENGINE_ABORTED, ENGINE_REFUSED, EngineLabRunner, EngineRun
from kvscope.core.lab.engine_live import EngineLabError
from kvscope.core.lab.engine_report import engine_run_to_json, render_engine_markdown
from kvscope.core.lab.report import cell_to_json
from kvscope.core.lab.runner import parse_case
from kvscope.core.lab.scenario import load_scenario

LAB = DATA / "lab/llamacpp-2026-10-01"


@cache
def _both(name: str, build: str) -> EngineRun:
    with EngineLabRunner(load_scenario(LAB / name), "both", build=build) as r:
        return r.run()


@pytest.mark.parametrize("build", ["0c1e5709", "b11434"])
@pytest.mark.parametrize("name", ["llama", "gemma2", "mamba", "lfm2", "llama/fa1-unified1"])
def test_the_core_and_llama_cpp_agree_on_the_catalog(name: str, build: str, builds: dict[str, InstalledBuild]) -> None:
    er = _both(name, build)
    assert er.torch is not None and len(er.cells) == len(er.torch.results) >= 13
    assert er.disagreements == [], [d.to_json() for d in er.disagreements]
    assert er.engine["build"] == build
    same_layout = build == "0c1e5709"
    assert any("writes layout 2026-10-v4" in n for n in er.notes) != same_layout  # 0c1e5709: the folder's own bytes
    for c in er.cells:
        assert c.result.error is None, c.result.error
        assert c.result.after_state is not None or c.aborted
    j = engine_run_to_json(er)
    assert j["disagreements"] == [] and len(j["torch_results"]) == len(j["results"])
    core_keys = set(cell_to_json(er.torch.results[0]))
    assert all(core_keys <= set(r) for r in j["results"])  # the lab's schema, plus engine fields


def test_engine_cells_match_the_recorded_llama_cpp_observations(builds: dict[str, InstalledBuild]) -> None:
    """0c1e5709 in the engine gives what the recorded 0c1e5709 run observed (tests/data/lab)."""
    import json

    er = _both("llama", "0c1e5709")
    obs = json.loads((LAB / "llama/observations.json").read_text())["cases"]
    checked = 0
    for c in er.cells:
        o = obs.get(c.result.corruption)
        if o is None or o.get("process_crashed") or o["input_kind"] != "seq_blob":
            continue
        assert c.result.restore.returned == o["return"], c.result.corruption
        assert [c.result.target.pos_min, c.result.target.pos_max] == o["after"]["0"], c.result.corruption
        after = (LAB / "llama" / o["after_state_file"]).read_bytes()
        assert c.result.after_state == after, c.result.corruption
        checked += 1
    assert checked >= 8


def test_nan_rows_poison_the_other_sequence_in_real_llama_cpp(builds: dict[str, InstalledBuild]) -> None:
    """gemma2 without flash attention: NaN K/V rows restored into seq 0 make seq 1's real logits NaN, as the
    core's dense probe says (llama.cpp issue #27068)."""
    er = _both("gemma2", "0c1e5709")
    assert er.torch is not None
    cell = next(c for c in er.cells if c.result.corruption == "nan_rows_valid")
    core = next(c for c in er.torch.results if c.corruption == "nan_rows_valid")
    assert cell.result.restore.ok and cell.result.others[1].intact
    assert math.isinf(cell.result.others[1].probe_diff["logits"])
    assert math.isinf(core.others[1].probe_diff["dense"])
    clean = next(c for c in er.cells if c.result.corruption == "cell_count_zero")
    assert clean.result.others[1].probe_diff["logits"] == 0.0


def test_a_crash_is_an_outcome_and_the_next_case_runs(builds: dict[str, InstalledBuild]) -> None:
    sc = load_scenario(LAB / "llama")
    sc = sc.with_restore(__import__("kvscope.core.lab.scenario", fromlist=["read_input"]).read_input(
        LAB / "llama/seq0.clean.seqstate", sc.profile))
    cases = [parse_case("truncated_last_byte"), parse_case("as-is")]
    with EngineLabRunner(sc, "both", cases, build="0c1e5709") as r:
        er = r.run()
        assert r.engine_info()["restarts"] == 1
    cut, ok = er.cells
    assert cut.aborted == "SIGABRT" and cut.result.restore.failed_check == ENGINE_ABORTED
    assert "GGML_ASSERT" in cut.result.restore.message
    assert er.torch is not None and er.torch.results[0].restore.failed_check == "short_read_hazard"
    assert ok.aborted is None and ok.result.restore.ok and ok.result.target.state == "unchanged"
    assert er.disagreements == []  # a hazard cell is not compared
    md = render_engine_markdown(er)
    assert "Disagreements: none" in md and "llama.cpp 0c1e5709 · file" in md


def test_the_server_lab_and_its_poisoned_slot_check(builds: dict[str, InstalledBuild]) -> None:
    sc = load_scenario(LAB / "llama")
    cases = [parse_case(n) for n in ("as-is", "truncated_half", "cell_count_huge", "truncated_last_byte",
                                      "nan_rows_valid")]
    with EngineLabRunner(sc, "server", cases, build="0c1e5709") as r:
        er = r.run()
    by = {c.result.corruption: c for c in er.cells}
    assert any("seq0.clean.seqstate" in n for n in er.notes)
    assert by["as-is"].result.restore.ok and by["as-is"].poisoned is None
    for name in ("truncated_half", "cell_count_huge"):
        c = by[name]
        assert c.result.restore.failed_check == ENGINE_REFUSED and "Unable to restore slot" in c.result.restore.message
        assert c.result.target.state == "removed" and c.result.others[1].intact
        p = c.poisoned
        assert p is not None and p.aborted is None and p.completion and p.same is True and not p.poisoned
        assert c.result.recovered is True
    cut = by["truncated_last_byte"]
    assert cut.aborted == "SIGABRT" and cut.poisoned is not None and cut.poisoned.skipped
    after = by["nan_rows_valid"]  # the server was restarted after the crash
    assert after.result.restore.ok and after.result.target.state == "restored"
    j = engine_run_to_json(er)
    assert j["results"][1]["poisoned_slot"]["same_completion"] is True
    assert "Poisoned-slot check" in render_engine_markdown(er)


def test_a_users_server_by_url(builds: dict[str, InstalledBuild], tmp_path: Path) -> None:
    sc = load_scenario(LAB / "llama")
    srv = ServerProcess(sc.profile.path, build="0c1e5709", n_parallel=2, n_ctx=512,
                        args=["--no-kv-unified", "-fa", "off", "-b", "256", "-ub", "256"])
    with srv, EngineLabRunner(sc, "server", [parse_case("as-is"), parse_case("cell_count_plus1")],
                              server_url=srv.url, slot_dir=srv.slot_dir) as r:
        er = r.run()
    assert er.engine["url"] == srv.url
    assert er.cells[0].result.restore.ok and not er.cells[1].result.restore.ok
    assert er.cells[1].poisoned is not None and er.cells[1].poisoned.same is True


def test_setup_errors_are_one_line(builds: dict[str, InstalledBuild], tmp_path: Path) -> None:
    with pytest.raises(EngineLabError, match="unknown engine"):
        EngineLabRunner(load_scenario(LAB / "llama"), "vllm")
    live = LAB / "llama/context.state.bin"
    bare = tmp_path / "context.state.bin"
    bare.write_bytes(live.read_bytes())
    with pytest.raises(EngineLabError, match="context.json"):
        EngineLabRunner(load_scenario(bare, model=load_scenario(LAB / "llama").profile.path,
                                      restore=LAB / "llama/seq0.clean.seqdata.bin"), "llama.cpp")
    with pytest.raises(EngineLabError, match="unknown llama.cpp build"):
        EngineLabRunner(load_scenario(LAB / "llama"), "llama.cpp", build="b1")
