"""``kvscope inspect --target RELEASE`` and ``scan --target RELEASE``: bad names are one line, exit 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kvharness.fixtures import DATA
from kvscope.core.cli.main import main

V4_SEQ = DATA / "gen-b11434/llama-f16-fa0-unified0-seq0.seqstate"


@pytest.mark.parametrize(("name", "words"), [
    ("b9000", "older than the first numbered release"), ("nonsense", "unknown release 'nonsense'"),
    ("0.3.5", "llama-cpp-python 0.3.5 is older than the first"), ("2024-01-01", "before the first release"),
    ("2026-02-30", "is not a date"), ("llama-cpp-python==9", "unknown release")])
def test_bad_release_is_one_line_exit_2(capsys: pytest.CaptureFixture[str], name: str, words: str) -> None:
    assert main(["inspect", str(V4_SEQ), "--target", name]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("kvscope: ") and err.count("\n") == 1 and "Traceback" not in err
    assert words in err


@pytest.mark.parametrize(("name", "answer"), [("b9300", "refuses"), ("b10700", "refuses"), ("b11300", "refuses"),
                                              ("b11434", "loads"), ("0.3.14", "unknown"),
                                              ("llama-cpp-python==0.3.14", "unknown"), ("2026-08-30", "refuses"),
                                              ("b12000", "unknown")])
def test_target_answers(capsys: pytest.CaptureFixture[str], name: str, answer: str) -> None:
    assert main(["inspect", str(V4_SEQ), "--no-stats", "--json", "--target", name]) == 0
    assert json.loads(capsys.readouterr().out)["target"]["answer"] == answer


def test_not_a_state_file_with_target_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"this is a text file, not a llama.cpp state\n" * 4)
    assert main(["inspect", str(junk), "--target", "b10700"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvscope: ") and err.count("\n") == 1
    assert main(["inspect", str(junk), "--target", "b1000"]) == 2  # the release is checked first
    assert "older than the first" in capsys.readouterr().err


def test_scan_target_release(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    shutil.copy(V4_SEQ, tmp_path / "a.seqstate")
    assert main(["scan", str(tmp_path), "--target", "b10700", "--json", "--jobs", "1"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    t = lines[0]["target"]
    assert (t["release"], t["generation"], t["status"]) == ("b10700", "2026-10", "migratable")
    assert main(["scan", str(tmp_path), "--target", "0.3.14", "--json", "--jobs", "1"]) == 0
    t = json.loads(capsys.readouterr().out.splitlines()[0])["target"]
    assert (t["status"], t["generation"]) == ("unknown", None)
    assert main(["scan", str(tmp_path), "--target", "v4", "--jobs", "1"]) == 0  # generation names still work
    capsys.readouterr()
    assert main(["scan", str(tmp_path), "--target", "b9000", "--jobs", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvscope: ") and "older than the first" in err
