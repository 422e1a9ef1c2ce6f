"""The lab on the trained model (issue #17 item 6): a Gemma 3 270M scenario (iSWA: 3 global layers, 15
sliding-window layers of window 512) written by ``kvscope lab --prompt`` with b11434, one sequence longer
than the window, and the standard catalog under ``--engine both``: the memory core and llama.cpp agree on
every case, or each disagreement carries the lab's explanation (exit 0 either way; 1 only when one is
unexplained). The memory core holds Gemma 3's iSWA (kv_base: the 3 global layers, kv_swa: the 15 window
layers, the window's cells in a restored state) and reproduces llama.cpp's failed loads byte for byte,
including the ones the lab names as llama.cpp's own failure: a refused load that leaves one of the two
caches holding the sequence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvscope.core.cli.lab_command import main
from kvscope.core.engine.builds import InstalledBuild
from tests.support.trained import trained_model

TEXT = ("the river runs past the old mill and under the stone bridge where the children wait for the evening "
        "light to fall across the water")
WORDS = TEXT.split(" ")


def _text(n_words: int, salt: int) -> str:
    return " ".join(WORDS[(i + salt) % len(WORDS)] for i in range(n_words))


def test_the_lab_on_gemma3_both_engines(builds: dict[str, InstalledBuild], tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "gemma3"
    code = main(["lab", "--context", str(folder), "--model", str(trained_model()), "--build", "b11434",
                 "--prompt", _text(560, 0), "--prompt", _text(60, 7), "--ctx-param", "n_ctx=2048",
                 "--ctx-param", "swa_full=false", "--ctx-param", "flash_attn=false", "--engine", "both", "--json"])
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert "wrote the scenario" in out.err
    summ = doc["scenario"]
    assert summ["arch"] == "gemma3" and summ["components"] == ["kv_base", "kv_swa"], summ
    cj = json.loads((folder / "context.json").read_text())
    assert len(cj["sequences"]["0"]["tokens"]) > 512  # longer than the sliding window
    assert len(doc["results"]) == len(doc["torch_results"]) >= 10
    names = [r["corruption"] for r in doc["results"]]
    assert any(n.startswith("swa_") for n in names)  # the catalog's SWA cases apply
    for d in doc["disagreements"]:  # none, or each one explained by the lab itself
        assert d["explanation"], d
    assert doc["unexplained_disagreements"] == 0 and code == 0, doc["disagreements"]
    faulted = set()
    for r in doc["results"]:
        assert r["error"] is None, r["error"]
        fault = r["engine"]["fault"]
        if r["restore"]["ok"]:
            assert fault is None, fault  # a restore llama.cpp accepts computes as the live prefill for the others
        elif fault is not None:
            # llama_kv_cache_iswa::state_read reads kv_base then kv_swa with no cleanup across them: a failure in
            # one leaves the other as the load left it, and seq_pos_min/max look at kv_swa alone
            assert "half-restored" in fault and "per memory component: kv_base" in fault and "kv_swa" in fault, fault
            faulted.add(r["corruption"])
        for s, beh in r["engine"]["behaviour"].items():  # the other sequence's logits, against its own prefill
            assert s == "1" and not beh["diverges"], (r["corruption"], beh)
    assert {"truncated_half", "cell_count_huge"} <= faulted  # kv_swa failing after kv_base; kv_base failing first
    assert {f["case"] for f in doc["llama_cpp_failures"]} == faulted
