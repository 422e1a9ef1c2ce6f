"""The lab names what llama.cpp itself gets wrong as llama.cpp's own failure, with the evidence (issue #20).

The live contexts are written by b11434 from the tokens and context parameters of the generated fixtures
(tests/data/gen-b11434, whose files the same build wrote), and the fixtures themselves are restored into
them: a DSV4 sequence file cut short is refused ('DSV4 compressor state metadata mismatch') but leaves
sequence 0 holding cells, one cut nearer its end aborts in a GGML_ASSERT; a hybrid_idx (qwen4exp) partial
blob restored into an empty sequence (as verify does in a fresh context) restores without an error, after
which the model computes other logits than after a prefill of its tokens.
A refusal that leaves the context as llama.cpp's containment should (a llama blob cut short) is not
blamed on llama.cpp, and neither is a clean restore.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from kvharness.fixtures import DATA
from kvscope.core.cli.lab_command import main
from kvscope.core.engine.builds import InstalledBuild
from kvscope.core.lab.engine_lab import ENGINE_ABORTED, ENGINE_REFUSED, EngineLabRunner
from kvscope.core.lab.new_scenario import write_scenario
from kvscope.core.lab.runner import parse_case
from kvscope.core.lab.scenario import load_scenario
from kvscope.core.memory import ContextParams

GEN = DATA / "gen-b11434"
MODELS = DATA / "gen-models"
LAB = DATA / "lab/llamacpp-2026-10-01"


def _entry(name: str) -> dict[str, object]:
    files = json.loads((GEN / "manifest.json").read_text())["files"]
    return next(e for e in files if e["file"] == name)  # type: ignore[no-any-return]


@cache
def _scenario(prefix: str, root: str, empty_target: bool = False) -> Path:
    """A scenario folder with the live context of the fixtures ``prefix-*`` (their ``ctx.state.bin``'s tokens
    and parameters), written by b11434 into ``root``; ``empty_target``: sequence 0 is not decoded in the live
    context (the restore goes into an empty sequence, as in a fresh context)."""
    e = _entry(f"{prefix}-ctx.state.bin")
    cp = e["context_params"]
    assert isinstance(cp, dict)
    params = ContextParams(n_ctx=cp["n_ctx"], n_seq_max=cp["n_seq_max"], kv_unified=cp["kv_unified"],
                           flash_attn=cp["flash_attn"], type_k=cp["type_k"], type_v=cp["type_v"],
                           swa_full=cp["swa_full"], n_batch=cp["n_batch"], n_ubatch=cp["n_ubatch"])
    seqs = e["seqs"]
    assert isinstance(seqs, dict)
    tokens = {int(s): [int(t) for t in v["token_ids"]] for s, v in seqs.items()}
    model = MODELS / f"{prefix.split('-')[0]}.gguf"
    return write_scenario(Path(root) / (prefix + ("-empty0" if empty_target else "")), model, params, tokens,
                          build="b11434", empty_target=empty_target)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("lab-faults"))


def _cut(src: Path, dst: Path, frac: float) -> Path:
    data = src.read_bytes()
    dst.write_bytes(data[:int(len(data) * frac)])
    return dst


def _lab(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["lab", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_truncated_dsv4_file_that_leaves_cells_behind_is_llama_cpps_failure(
        builds: dict[str, InstalledBuild], root: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _scenario("deepseek4-f16-fa0-unified0", root)
    cut = _cut(GEN / "deepseek4-f16-fa0-unified0-seq0.seqstate", tmp_path / "cut.seqstate", 0.3)
    code, out, err = _lab(capsys, "--context", str(folder), "--restore", str(cut), "--into", "0", "--as-is",
                          "--engine", "both", "--json")
    doc = json.loads(out)
    res = doc["results"][0]
    assert res["restore"]["failed_check"] == ENGINE_REFUSED
    assert "DSV4 compressor state metadata mismatch" in res["restore"]["message"]
    fault = res["engine"]["fault"]
    assert fault is not None and "half-restored" in fault and "sequence 0 holds positions" in fault, fault
    assert res["target"]["pos_max"] >= 0  # llama.cpp's own seq_pos_max: the evidence
    assert doc["llama_cpp_failures"] == [{"case": "as-is", "fault": fault}]
    # every difference between the core and llama.cpp on that case is llama.cpp's failure, so none is unexplained
    assert all(d["explanation"] and "llama.cpp's own failure" in d["explanation"] for d in doc["disagreements"])
    assert doc["unexplained_disagreements"] == 0 and code == 0, err
    code, md, _ = _lab(capsys, "--context", str(folder), "--restore", str(cut), "--as-is", "--engine", "llama.cpp")
    assert code == 0 and "llama.cpp's own failures (1)" in md and "half-restored" in md


def test_an_assert_on_a_truncated_file_is_llama_cpps_failure(builds: dict[str, InstalledBuild], root: str,
                                                             tmp_path: Path) -> None:
    folder = _scenario("deepseek4-f16-fa0-unified0", root)
    cut = _cut(GEN / "deepseek4-f16-fa0-unified0-seq0.seqstate", tmp_path / "cut.seqstate", 0.9)
    with EngineLabRunner(load_scenario(folder, restore=cut), "llama.cpp", [parse_case("as-is")],
                         build="b11434") as r:
        er = r.run()
    c = er.cells[0]
    assert c.aborted == "SIGABRT" and c.result.restore.failed_check == ENGINE_ABORTED
    assert c.fault is not None and "GGML_ASSERT" in c.fault and "where it should refuse it" in c.fault, c.fault
    assert er.faults == [("as-is", c.fault)]


def test_a_partial_hybrid_idx_state_that_computes_other_logits_is_llama_cpps_failure(
        builds: dict[str, InstalledBuild], root: str) -> None:
    folder = _scenario("qwen4exp-f16-fa0-unified0", root, empty_target=True)
    assert json.loads((folder / "context.json").read_text())["sequences"]["0"]["live"] is False
    partial = GEN / "qwen4exp-f16-fa0-unified0-seq0-partial.seqdata.bin"
    sc = load_scenario(folder, restore=partial)
    assert sc.restore.flags == 1  # PARTIAL_ONLY, as the reader sees it: restored with the flag it was written with
    with EngineLabRunner(sc, "llama.cpp", [parse_case("as-is")], build="b11434") as r:
        er = r.run()
    c = er.cells[0]
    assert c.result.restore.ok and c.aborted is None
    beh = c.behaviour[0]
    assert beh.diverges and beh.first_beyond is not None and beh.first_beyond.kl is not None
    assert c.fault is not None and "without an error" in c.fault and "computes other logits" in c.fault, c.fault
    assert "KL" in c.fault and "limit" in c.fault  # the figures and the engine's own variation: the evidence
    whole = GEN / "qwen4exp-f16-fa0-unified0-seq0.seqdata.bin"  # the whole sequence: restored, computes the same
    with EngineLabRunner(load_scenario(folder, restore=whole), "llama.cpp", [parse_case("as-is")],
                         build="b11434") as r:
        ok = r.run()
    assert ok.faults == [] and ok.cells[0].result.restore.ok and not ok.cells[0].behaviour[0].diverges


def test_a_contained_refusal_is_not_blamed_on_llama_cpp(builds: dict[str, InstalledBuild]) -> None:
    cases = [parse_case("truncated_half"), parse_case("cell_count_huge"), parse_case("as-is")]
    with EngineLabRunner(load_scenario(LAB / "llama"), "llama.cpp", cases, build="0c1e5709") as r:
        er = r.run()
    assert [c.result.restore.ok for c in er.cells] == [False, False, True]
    assert er.faults == [], er.faults
    assert all(not b.diverges for c in er.cells for b in c.behaviour.values())
    assert set(er.cells[2].behaviour) == {0, 1}  # the target after the clean input, and the other sequence


def test_an_iswa_load_that_fails_in_kv_swa_is_named_by_the_lab_and_verify(builds: dict[str, InstalledBuild],
                                                                          tmp_path: Path) -> None:
    """llama_kv_cache_iswa::state_read reads kv_base then kv_swa with no cleanup across them, and its
    seq_pos_min/max look at kv_swa alone: a blob cut in its kv_swa section leaves kv_base holding the
    sequence while llama.cpp reports it empty. The lab (a live context) and verify (a fresh one) both name it."""
    from kvscope.core.verify.run import verify

    with EngineLabRunner(load_scenario(LAB / "gemma2"), "llama.cpp", [parse_case("swa_truncated_in_data")]) as r:
        er = r.run()
    c = er.cells[0]
    assert not c.result.restore.ok and c.fault is not None, c.fault
    assert "per memory component: kv_base unchanged" in c.fault and "kv_swa removed" in c.fault, c.fault
    assert "seq_pos_max reports sequence 0 empty" in c.fault
    src = DATA / "gen-0c1e5709/gemma2-f16-fa0-unified0-seq0.seqdata.bin"
    res = verify(_cut(src, tmp_path / "cut.seqdata.bin", 0.9), MODELS / "gemma2.gguf")
    assert res.restore is not None and not res.restore.ok
    fault = res.restore.engine_fault
    assert fault is not None and "seq_pos_max reports sequence 0 empty" in fault and "kv_base" in fault, fault
    assert any(x.startswith("llama.cpp's own failure: ") for x in res.reasons), res.reasons
    early = verify(_cut(src, tmp_path / "early.seqdata.bin", 0.3), MODELS / "gemma2.gguf")  # fails in kv_base:
    assert early.restore is not None and not early.restore.ok and early.restore.engine_fault is None  # nothing left
