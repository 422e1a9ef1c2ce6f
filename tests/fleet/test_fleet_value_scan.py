"""scan and migrate over a whole store keep the value scan opt-in (issue #29): ``--stats`` scans every file's
tensor values (a slot with NaN rows is damaged, and migrate does not write it); without it every result and
the summary say the values were not scanned."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from kvscope.core.cli.main import main
from kvscope.core.fleet.summary import format_line, format_summary, summarise

EXAMPLES = Path(__file__).parent.parent.parent / "resources" / "examples"
SLOT, MODEL = EXAMPLES / "llama-slot.seqstate", EXAMPLES / "tiny-llama.gguf"
NAN_REASON = "V layer 1: 64 non-finite values (64 NaN, 0 Inf); first at cell 3, dim 0"


@pytest.fixture
def store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """A store of two slots: the bundled one, and a copy with NaN over cell 3 of V layer 1."""
    src = tmp_path / "src"
    src.mkdir()
    shutil.copyfile(SLOT, src / "clean.seqstate")
    spec = "fill:value=nan,role=v,index=1,cells=3"
    assert main(["corrupt", str(SLOT), "--corrupt", spec, "-o", str(src / "nan.seqstate")]) == 0
    capsys.readouterr()
    return src


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, dict[str, Any]], dict[str, Any]]:
    rc = main([*argv, "--json", "--jobs", "1", "--model", str(MODEL)])
    docs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    return rc, {Path(d["path"]).name: d for d in docs[:-1]}, docs[-1]["summary"]


def test_scan_without_stats_says_the_values_were_not_scanned(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, files, summary = _run(capsys, "scan", str(store))
    assert rc == 0 and {r["verdict"] for r in files.values()} == {"healthy"}
    assert all(r["values_scanned"] is False for r in files.values())
    assert summary["values_not_scanned"] == 2
    assert main(["scan", str(store), "--jobs", "1", "--model", str(MODEL)]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.endswith("| files with errors: 0 | values not scanned (--stats scans them: NaN/Inf, zero rows)")


def test_scan_with_stats_finds_the_nan_rows(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, files, summary = _run(capsys, "scan", str(store), "--stats")
    assert rc == 1
    assert (files["nan.seqstate"]["verdict"], files["nan.seqstate"]["verdict_reason"]) == ("damaged", NAN_REASON)
    assert files["clean.seqstate"]["verdict"] == "healthy"
    assert all(r["values_scanned"] is True for r in files.values()) and summary["values_not_scanned"] == 0
    assert main(["scan", str(store), "--jobs", "1", "--model", str(MODEL), "--stats"]) == 1
    assert "values not scanned" not in capsys.readouterr().out


def test_migrate_with_stats_refuses_the_nan_slot(store: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    rc, files, summary = _run(capsys, "migrate", str(store), "--layout", "2026-10-v4", "--out", str(tmp_path / "a"))
    assert rc == 0 and {r["action"] for r in files.values()} == {"migrated"} and summary["values_scanned"] is False
    rc, files, summary = _run(capsys, "migrate", str(store), "--layout", "2026-10-v4", "--out", str(tmp_path / "b"),
                              "--stats")
    assert rc == 1 and summary["values_scanned"] is True
    assert (files["nan.seqstate"]["action"], files["nan.seqstate"]["reason"]) == ("damaged", NAN_REASON)
    assert files["clean.seqstate"]["action"] == "migrated" and not (tmp_path / "b" / "nan.seqstate").exists()
    # a run with --stats does not take an earlier run's unscanned output for done
    rc, files, _ = _run(capsys, "migrate", str(store), "--layout", "2026-10-v4", "--out", str(tmp_path / "a"),
                        "--stats")
    assert rc == 1 and files["clean.seqstate"]["action"] == "migrated"
    assert files["nan.seqstate"]["reason"] == NAN_REASON + "; DEST still holds what an earlier run wrote of it"
    rc, files, _ = _run(capsys, "migrate", str(store), "--layout", "2026-10-v4", "--out", str(tmp_path / "a"),
                        "--stats")
    assert files["clean.seqstate"]["action"] == "already"


def test_migrate_text_summary_says_the_values_were_not_scanned(store: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["migrate", str(store), "--layout", "2026-10-v4", "--out", str(tmp_path / "o"), "--jobs", "1"]) == 0
    summary = capsys.readouterr().out.splitlines()[-1]
    assert summary.endswith("| values not scanned: a file with NaN/Inf values is migrated as it is "
                            "(--stats refuses it)")


def test_scan_lines_and_summary_take_their_number() -> None:
    """A count of 1 takes the singular in scan's lines and summary (issue #29 item 10)."""
    r = {"path": "a", "status": "parsed", "kind": "seq_file", "layout": "2026-10", "sections": ["kv"],
         "sequences": {"0": 1}, "n_tokens": 1, "findings": {"error": 1, "warning": 1, "info": 0},
         "codes": ["nonfinite_values"], "worst": "error", "verdict": "damaged", "verdict_reason": "x",
         "values_scanned": True,
         "target": {"generation": "2026-10", "status": "loads", "server": {"wasted": True}}}
    assert "| 1 error, 1 warning (nonfinite_values)" in format_line({k: v for k, v in r.items() if k != "target"}, "a")
    text = format_summary(summarise([r], target="2026-10"))
    assert "1 slot restores but will not be reused by llama-server" in text
