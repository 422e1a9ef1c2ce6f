"""``kvscope report`` on the command line: complete files, JSON = inspect --json, exit codes, the lab."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from kvscope.core.cli import main as core_cli
from kvscope.core.cli.report_command import main, register
from tests.support.report_paths import EXAMPLES, LAB, MODEL, NAN_FILE

EXTRA_KEYS = {"overview", "report", "diff", "lab"}
NAMED = {"file", "model"}  # the report names these by base name unless --full-paths


def _json(path: Path) -> dict:  # type: ignore[type-arg]
    return json.loads(path.read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def test_report_files_are_complete(nan_report: Path) -> None:
    from PySide6.QtGui import QImage

    meta = _json(nan_report / "report.json")["report"]
    images = meta["images"]
    names = {im["file"] for im in images}
    assert {"bytemap.png", "cells-1.png", "stats-1.png"} <= names
    heat = sorted(n for n in names if n.startswith("heatmap-"))
    assert len(heat) == 4 and meta["flagged_total"] == 7  # 7 NaN records, 4 pictured (K and V among them)
    assert any("-k" in n for n in heat) and any("-v" in n for n in heat)
    assert sorted(p.name for p in nan_report.iterdir()) == sorted([*names, "report.html", "report.md", "report.json"])
    for im in images:
        img = QImage(str(nan_report / im["file"]))
        assert not img.isNull() and (img.width(), img.height()) == (im["width"], im["height"])
    md = (nan_report / "report.md").read_text(encoding="utf-8")
    for n in names:
        assert f"]({n})" in md
    assert "8 findings (8 errors, 0 warnings, 0 info)" in md
    assert meta["findings"] == {"error": 8, "warning": 0, "info": 0}


def test_report_json_is_inspect_json(nan_report: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert core_cli.main(["inspect", str(NAN_FILE.resolve()), "--model", str(MODEL.resolve()), "--json",
                          "--stats"]) == 1
    inspect = json.loads(capsys.readouterr().out)
    report = _json(nan_report / "report.json")
    same = {k for k in inspect if k not in NAMED}
    assert {k: v for k, v in report.items() if k in same} == {k: inspect[k] for k in same}
    assert set(report) - EXTRA_KEYS == set(inspect)
    assert report["file"] == NAN_FILE.name and report["model"] == MODEL.name
    assert "stats" in report and "lab" not in report and "diff" not in report
    assert {"verdict", "compatibility"} <= set(report)  # the report's JSON once lacked both


def test_full_paths_report_json_is_inspect_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [str(NAN_FILE.resolve()), "--model", str(MODEL.resolve())]
    assert main([*args, "--full-paths", "-o", str(tmp_path / "r")]) == 1
    capsys.readouterr()
    assert core_cli.main(["inspect", *args, "--json", "--stats"]) == 1
    inspect = json.loads(capsys.readouterr().out)
    report = _json(tmp_path / "r" / "report.json")
    assert {k: v for k, v in report.items() if k not in EXTRA_KEYS} == inspect
    assert report["overview"]["path"] == str(NAN_FILE.resolve())


def test_summary_line_and_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(NAN_FILE), "--model", str(MODEL), "-o", str(tmp_path / "r")]) == 1  # error findings: 1
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [f"kvscope report: {tmp_path / 'r'}: damaged; 8 findings (8 errors, 0 warnings, 0 info)"]
    clean = NAN_FILE.parent / "seq0.clean.seqdata.bin"
    assert main([str(clean), "--model", str(MODEL), "-o", str(tmp_path / "c")]) == 0  # no error finding: 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith(f"kvscope report: {tmp_path / 'c'}: healthy; ")
    assert "(0 errors, 0 warnings, " in out[0]


def test_help_documents_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "exit status: 0 the report is written and the file has no error findings, 1" in text
    assert "--full-paths" in text


@pytest.mark.parametrize("case", ["missing", "not_state", "bad_model", "missing_compare", "dest_is_file",
                                  "dest_not_report"])
def test_bad_input_exit_2(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dest = tmp_path / "out"
    args = [str(NAN_FILE), "-o", str(dest)]
    if case == "missing":
        args[0] = str(tmp_path / "nope.bin")
    elif case == "not_state":
        (tmp_path / "x.bin").write_text("hello, this is not a llama.cpp state file at all\n")
        args[0] = str(tmp_path / "x.bin")
    elif case == "bad_model":
        args += ["--model", str(NAN_FILE)]
    elif case == "missing_compare":
        args += ["--compare", str(tmp_path / "nope.bin")]
    elif case == "dest_is_file":
        dest.write_text("keep")
    else:
        dest.mkdir()
        (dest / "notes.txt").write_text("keep")
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvscope: ") and len(err.splitlines()) == 1, err  # the one message prefix
    if case == "dest_is_file":
        assert dest.read_text() == "keep"
    elif case == "dest_not_report":
        assert sorted(p.name for p in dest.iterdir()) == ["notes.txt"]
    else:
        assert not dest.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_compare_adds_the_diff(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = LAB / "fa0-unified1" / "seq0.clean.seqdata.bin"
    assert main([str(NAN_FILE), "--model", str(MODEL), "--compare", str(other), "--full-paths",
                 "-o", str(tmp_path / "r")]) == 1
    assert "diff: " in capsys.readouterr().out
    assert core_cli.main(["diff", str(NAN_FILE), str(other), "--model", str(MODEL), "--json"]) == 1
    expected = json.loads(capsys.readouterr().out)
    assert _json(tmp_path / "r" / "report.json")["diff"] == expected
    assert "<h2 id=\"diff\">Diff</h2>" in (tmp_path / "r" / "report.html").read_text(encoding="utf-8")


def test_lab_needs_a_scenario(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    slot = EXAMPLES / "llama-slot.seqstate"
    assert main([str(slot), "--model", str(EXAMPLES / "tiny-llama.gguf"), "--lab", "-o", str(tmp_path / "r")]) == 0
    captured = capsys.readouterr()
    assert "the lab did not run" in captured.err and "lab: not run" in captured.out
    lab = _json(tmp_path / "r" / "report.json")["lab"]
    assert lab["ran"] is False and "--lab-context" in lab["reason"]
    assert "--lab-context" in (tmp_path / "r" / "report.html").read_text(encoding="utf-8")
    assert not (tmp_path / "r" / "lab-matrix.png").exists()


def test_lab_runs_in_a_scenario_folder(tmp_path: Path) -> None:
    clean = LAB / "fa0-unified1" / "seq0.clean.seqdata.bin"
    assert main([str(clean), "--lab", "-o", str(tmp_path / "r")]) == 0  # the model comes from context.json
    report = _json(tmp_path / "r" / "report.json")
    lab = report["lab"]
    assert lab["ran"] is True and not lab["cancelled"]
    names = [c["name"] for c in lab["cases"]]
    assert names[0] == "as-is" and "nan_rows_valid" in names
    assert len(lab["results"]) == len(names) * len(lab["policies"]) * len(lab["readers"])
    as_is = [r for r in lab["results"] if r["corruption"] == "as-is"]
    # seq 0 of the live context already holds exactly this blob: every restore succeeds and changes nothing
    assert all(r["restore"]["ok"] and r["target"]["state"] == "unchanged" for r in as_is)
    assert (tmp_path / "r" / "lab-matrix.png").is_file()
    assert "lab-matrix.png" in {im["file"] for im in report["report"]["images"]}


def test_bad_lab_context_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "ctx"
    empty.mkdir()
    assert main([str(NAN_FILE), "--lab-context", str(empty), "-o", str(tmp_path / "r")]) == 2
    assert "--lab-context" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_registers_as_a_plugin_command() -> None:
    ap = core_cli.build_parser({"report": register})
    args = ap.parse_args(["report", "f.bin", "-o", "out", "--lab-context", "ctx"])
    assert args.func.__name__ == "cmd_report" and args.lab_context == "ctx" and args.lab_into == 0
    assert isinstance(ap, argparse.ArgumentParser)
