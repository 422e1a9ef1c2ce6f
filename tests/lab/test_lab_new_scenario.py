"""``kvscope lab --prompt``: a scenario folder written by real llama.cpp (0c1e5709) from a model and prompts is
the one the outside generator wrote for the same model, prompts and context (tests/data/lab: the same
tokens, the live state and the clean inputs byte for byte), the lab replays it, and the
writer never writes into an existing folder or leaves a partial one behind."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kvharness.fixtures import DATA
from kvscope.core.cli.lab_command import main
from kvscope.core.engine.builds import InstalledBuild
from kvscope.core.lab.engine_live import EngineLabError
from kvscope.core.lab.new_scenario import write_scenario
from kvscope.core.memory import ContextParams

RECORDED = DATA / "lab/llamacpp-2026-10-01/llama"
MODEL = DATA / "llamacpp-2026-10-01/tiny-llama.gguf"


def test_a_new_scenario_is_the_recorded_one(builds: dict[str, InstalledBuild], tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    cj = json.loads((RECORDED / "context.json").read_text())
    cp = cj["context_params"]
    prompts = [cj["sequences"][s]["prompt_text"] for s in ("0", "1")]
    folder = tmp_path / "llama"
    args = ["lab", "--context", str(folder), "--model", str(MODEL), "--build", "0c1e5709", "--as-is", "--json"]
    for p in prompts:
        args += ["--prompt", p]
    for k in ("n_ctx", "n_batch", "n_ubatch", "kv_unified", "flash_attn", "swa_full"):
        args += ["--ctx-param", f"{k}={cp[k]}"]
    code = main(args)
    out = capsys.readouterr()
    assert code == 0 and "wrote the scenario" in out.err, out.err
    mine = json.loads((folder / "context.json").read_text())
    assert {s: v["tokens"] for s, v in mine["sequences"].items()} == {s: v["tokens"] for s, v in
                                                                     cj["sequences"].items()}
    for name in ("context.state.bin", "seq0.clean.seqdata.bin", "seq1.clean.seqdata.bin", "seq0.clean.seqstate"):
        assert (folder / name).read_bytes() == (RECORDED / name).read_bytes(), name
    assert mine["model"]["sha256"] == cj["model"]["sha256"] and mine["llama_cpp"]["writes"] == "2026-10"
    doc = json.loads(out.out)  # the lab ran on it: the clean input restores into sequence 0
    assert doc["results"][0]["restore"]["ok"] and doc["results"][0]["target"]["state"] in ("unchanged", "restored")
    with pytest.raises(EngineLabError, match="already exists"):
        write_scenario(folder, MODEL, ContextParams(n_seq_max=2), {0: [1, 2]}, build="0c1e5709")
    assert mine["next_token"]["token"] == cj["sequences"]["0"]["tokens"][-1]  # the default: the target's last
    assert np.load(folder / "baseline.seq0.next_logits.npy").shape == (cj["model"]["n_vocab"],)


def test_a_failed_write_leaves_nothing_behind(builds: dict[str, InstalledBuild], tmp_path: Path) -> None:
    with pytest.raises(EngineLabError, match="decode"):  # a token outside the vocabulary: llama_decode refuses
        write_scenario(tmp_path / "bad", MODEL, ContextParams(n_seq_max=1), {0: [1, 10_000_000]}, build="0c1e5709")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(EngineLabError, match="target sequence 1"):
        write_scenario(tmp_path / "bad", MODEL, ContextParams(n_seq_max=2), {0: [1, 2]}, target=1)
    assert list(tmp_path.iterdir()) == []


def test_an_empty_target_scenario(builds: dict[str, InstalledBuild], tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "empty"
    code = main(["lab", "--context", str(folder), "--model", str(MODEL), "--build", "0c1e5709", "--prompt",
                 "the quick brown fox", "--prompt", "hello world", "--empty-target", "--as-is", "--engine", "llama.cpp",
                 "--json", "--ctx-param", "n_ctx=256"])
    out = capsys.readouterr()
    assert code == 0, out.err
    cj = json.loads((folder / "context.json").read_text())
    assert cj["sequences"]["0"]["live"] is False and cj["sequences"]["1"]["live"] is True
    doc = json.loads(out.out)
    assert doc["scenario"]["live_sequences"] == [1]  # the restore goes into an empty sequence 0
    r = doc["results"][0]
    assert r["restore"]["ok"] and r["target"]["state"] == "restored" and r["engine"]["fault"] is None
    assert set(r["engine"]["behaviour"]) == {"0", "1"}  # the target judged against a prefill of its tokens
    assert not r["engine"]["behaviour"]["0"]["diverges"]


def test_empty_target_goes_with_prompt(capsys: pytest.CaptureFixture[str]) -> None:
    from kvscope.core.cli.main import main as kvscope

    assert kvscope(["lab", "--context", str(RECORDED), "--empty-target"]) == 2
    assert "--empty-target goes with --prompt" in capsys.readouterr().err
