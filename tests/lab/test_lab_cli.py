"""``kvscope lab``: Markdown and JSON output, the standard catalog, and exit code 2 with one line on bad input."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvharness.fixtures import DATA, model_path
from kvscope.core.cli.lab_command import main, register

FA0 = DATA / "lab/llamacpp-2026-10-01/llama/fa0-unified1"


def _lab(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["lab", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_markdown_is_the_default(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _lab(capsys, "--context", str(FA0 / "context.state.bin"), "--restore",
                          str(FA0 / "seq0.clean.seqdata.bin"), "--into", "0", "--model", str(model_path("llama")),
                          "--corrupt", "nan_rows_late_fail", "--as-is")
    assert code == 0 and err == ""
    assert "| case | contained · buffer | contained · file | legacy · buffer | legacy · file |" in out
    assert "| as-is | 7372 · unchanged [0,6] · ✓ · = |" in out
    row = next(line for line in out.splitlines() if line.startswith("| `nan_rows_late_fail`"))
    assert row.count("**NaN** ⚠") == 2 and "0 · unchanged [0,6] · ✓ · =" in row


def test_json_has_one_entry_per_cell(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _lab(capsys, "--context", str(FA0), "--corrupt", "truncated_half", "--corrupt",
                        "nan_rows_valid_then_seq_rm", "--policy", "legacy", "--policy", "transactional",
                        "--reader", "buffer", "--json")
    assert code == 0
    doc = json.loads(out)
    assert [(r["corruption"], r["policy"]) for r in doc["results"]] == [
        ("truncated_half", "legacy"), ("truncated_half", "transactional"),
        ("nan_rows_valid_then_seq_rm", "legacy"), ("nan_rows_valid_then_seq_rm", "transactional")]
    r = doc["results"][2]
    assert r["restore"] == r["restore"] | {"ok": True, "bytes": 7372, "failed_check": None, "offset": None}
    assert r["target"]["seq"] == 0 and r["others"]["1"]["intact"] is True
    assert r["others"]["1"]["probe_diff"] == {"dense": None, "skip-masked": 0.0}
    assert r["stale_cells"] == 7 and r["recovered"] is True


def test_standard_catalog_without_corrupt(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _lab(capsys, "--context", str(DATA / "lab/llamacpp-2026-10-01/mamba"), "--policy", "contained",
                        "--json")
    assert code == 0
    doc = json.loads(out)
    names = [c["name"] for c in doc["cases"]]
    assert names[:3] == ["truncated_after_seq_header", "truncated_half", "truncated_last_byte"]
    assert "swa_cell_count_huge" in {s["name"] for s in doc["skipped"]}
    assert len(doc["results"]) == 2 * len(names)


def test_ctx_params_and_live_sequences(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _lab(capsys, "--context", str(FA0 / "context.json"), "--live-seq",
                        f"0={FA0 / 'seq0.clean.seqdata.bin'}", "--live-seq", f"1={FA0 / 'seq1.clean.seqdata.bin'}",
                        "--ctx-param", "n_ctx=512", "--as-is", "--policy", "contained", "--reader", "buffer", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["scenario"]["n_ctx"] == 512 and doc["scenario"]["live_sequences"] == [0, 1]


@pytest.mark.parametrize(("args", "message"), [
    (["--context", "/nonexistent/ctx.state.bin"], "no such file"),
    (["--context", str(FA0), "--corrupt", "explode:now=1"], "unknown corruption kind"),
    (["--context", str(FA0), "--corrupt", "swa_cell_count_huge"], "section='kv_swa': no such section"),
    (["--context", str(FA0), "--policy", "optimistic"], "--policy optimistic"),
    (["--context", str(FA0), "--reader", "mmap"], "--reader mmap"),
    (["--context", str(FA0), "--into", "9"], "seq9"),
    (["--context", str(FA0), "--ctx-param", "n_ctx=lots"], "expected an integer"),
    (["--context", str(FA0), "--ctx-param", "colour=red"], "not a context parameter"),
    (["--context", str(FA0), "--live-seq", "zero=x"], "must be an integer"),
    (["--context", str(FA0), "--model", str(FA0 / "context.json")], "cannot use model"),
])
def test_bad_input_exits_2_with_one_line(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    code, out, err = _lab(capsys, *args)
    assert code == 2 and out == ""
    assert err.startswith("kvscope: ") and err.count("\n") == 1 and message in err, err


def test_register_does_not_import_torch() -> None:
    code = ("import argparse, sys; from kvscope.core.cli.lab_command import register; "
            "p = argparse.ArgumentParser(); register(p.add_subparsers()); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False,
                       cwd=Path(__file__).parent)
    assert p.returncode == 0, p.stderr


def test_register_adds_lab() -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["lab", "--context", "x", "--json"])
    assert args.func.__name__ == "cmd_lab" and args.json and args.into == 0
