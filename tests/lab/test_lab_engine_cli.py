"""``kvscope lab --engine``: llama.cpp, llama-server and both, in JSON and Markdown, and the one-line errors."""

from __future__ import annotations

import json

import pytest

from kvharness.fixtures import DATA
from kvscope.core.cli.lab_command import main
from kvscope.core.engine.builds import InstalledBuild

LAB = DATA / "lab/llamacpp-2026-10-01"


def _lab(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["lab", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_both_json_has_an_empty_disagreements_list(builds: dict[str, InstalledBuild],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _lab(capsys, "--context", str(LAB / "lfm2"), "--engine", "both", "--json", "--corrupt",
                          "recr_truncated_in_data", "--corrupt", "nan_rows_late_fail_recr", "--as-is")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["disagreements"] == []
    assert doc["engine"]["kind"] == "llama.cpp" and doc["engine"]["build"] == "0c1e5709"
    assert [r["corruption"] for r in doc["results"]] == ["as-is", "recr_truncated_in_data", "nan_rows_late_fail_recr"]
    assert [r["policy"] for r in doc["torch_results"]] == ["contained"] * 3
    assert doc["results"][0]["engine"]["aborted"] is None
    assert doc["results"][2]["restore"]["failed_check"] == "engine_refused"
    assert doc["results"][2]["restore"]["message"]  # llama.cpp's own log line
    assert doc["torch_results"][2]["restore"]["failed_check"] == "s_type"


def test_llama_cpp_markdown_and_another_build(builds: dict[str, InstalledBuild],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _lab(capsys, "--context", str(LAB / "mamba"), "--engine", "llama.cpp", "--build", "b11434",
                        "--corrupt", "cell_count_plus1", "--as-is")
    assert code == 0
    assert "| case | llama.cpp b11434 · buffer |" in out
    assert "writes layout 2026-10-v4" in out
    assert "real next-token logits" in out


def test_server_json_reports_the_poisoned_slot_check(builds: dict[str, InstalledBuild],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _lab(capsys, "--context", str(LAB / "gemma2"), "--engine", "server", "--json", "--corrupt",
                          "swa_cell_count_huge")
    assert code == 0, err
    doc = json.loads(out)
    (r,) = doc["results"]
    assert r["restore"]["ok"] is False and r["poisoned_slot"]["poisoned"] is False
    assert r["poisoned_slot"]["same_completion"] is True and r["engine"]["aborted"] is None


def test_bad_engine_arguments_exit_2(builds: dict[str, InstalledBuild], capsys: pytest.CaptureFixture[str]) -> None:
    for args, msg in (
        (["--engine", "llama.cpp", "--policy", "legacy"], "--policy and --reader"),
        (["--engine", "llama.cpp", "--server-bin", "/bin/true"], "--engine server"),
        (["--engine", "llama.cpp", "--build", "b9"], "unknown llama.cpp build"),
    ):
        code, out, err = _lab(capsys, "--context", str(LAB / "llama"), *args)
        assert code == 2 and msg in err and err.count("\n") == 1 and not out, (args, err)
