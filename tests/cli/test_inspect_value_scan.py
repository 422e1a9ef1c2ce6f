"""``kvscope inspect`` scans the tensor values by default (issue #29): a slot with NaN rows is ``damaged``
(exit 1), as the app's document and the report say; ``--no-stats`` skips the scan and the verdict says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvscope.core.analysis.inspection import inspect_source, open_state
from kvscope.core.analysis.stats import scan_stats
from kvscope.core.analysis.verdict import verdict
from kvscope.core.cli.main import main
from kvscope.core.model.profile import load_model_profile
from kvscope.core.reader.parse import read_state

EXAMPLES = Path(__file__).parent.parent.parent / "resources" / "examples"
SLOT, MODEL = EXAMPLES / "llama-slot.seqstate", EXAMPLES / "tiny-llama.gguf"
NAN_REASON = "V layer 1: 64 non-finite values (64 NaN, 0 Inf); first at cell 3, dim 0"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def nan_slot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """The bundled slot with NaN over cell 3 of V layer 1 (the README's example)."""
    out = tmp_path / "slot-nan.seqstate"
    rc, _, err = run(capsys, "corrupt", str(SLOT), "--corrupt", "fill:value=nan,role=v,index=1,cells=3", "-o", str(out))
    assert rc == 0, err
    return out


def _verdict_line(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("verdict: "))


def test_inspect_scans_the_values_by_default(nan_slot: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for extra in ((), ("--stats",)):  # --stats is the default, still accepted
        rc, out, _ = run(capsys, "inspect", str(nan_slot), "--model", str(MODEL), *extra)
        assert rc == 1
        assert _verdict_line(out) == f"verdict: damaged: {NAN_REASON}"
        assert "payload statistics: 8 records" in out


def test_no_stats_skips_the_scan_and_the_verdict_says_so(nan_slot: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "inspect", str(nan_slot), "--model", str(MODEL), "--no-stats")
    assert rc == 0
    assert _verdict_line(out) == "verdict: healthy (values not scanned): all 12,628 bytes parsed; no error or warning"
    assert "payload statistics" not in out
    rc, out, _ = run(capsys, "inspect", str(nan_slot), "--model", str(MODEL), "--no-stats", "--markdown")
    assert rc == 0 and "**verdict** healthy (values not scanned): all 12,628 bytes parsed" in out


def test_stats_and_no_stats_together_are_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(SLOT), "--stats", "--no-stats"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvscope: inspect: argument --no-stats: not allowed with argument --stats")


def test_the_json_says_whether_the_values_were_scanned(nan_slot: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "inspect", str(nan_slot), "--model", str(MODEL), "--json")
    doc = json.loads(out)
    assert rc == 1 and doc["values_scanned"] is True
    assert doc["verdict"]["level"] == "damaged" and "stats" in doc
    rc, out, _ = run(capsys, "inspect", str(nan_slot), "--model", str(MODEL), "--json", "--no-stats")
    doc = json.loads(out)
    assert rc == 0 and doc["values_scanned"] is False
    assert doc["verdict"]["level"] == "healthy" and doc["verdict"]["title"] == "healthy" and "stats" not in doc


def test_the_cli_verdict_is_the_apps_and_the_reports(nan_slot: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The same file and model: the CLI's verdict is what the app's document (the pipeline's parse and verdict,
    then ``Inspection.add_stats``) and the report (the parse, ``scan_stats``, then the verdict) compute."""
    rc, out, _ = run(capsys, "inspect", str(nan_slot), "--model", str(MODEL), "--json")
    cli = json.loads(out)["verdict"]
    profile = load_model_profile(MODEL)
    src = open_state(nan_slot)
    try:
        doc = inspect_source(src, profile, compat=False)  # the app's load task
        assert doc.verdict.level == "healthy" and not doc.values_scanned  # before its statistics task
        doc.add_stats(src)
    finally:
        src.close()
    res = read_state(nan_slot, profile=profile)  # the report's collect
    scan_stats(res)
    report = verdict(res, profile)
    assert cli == doc.verdict.to_json() == report.to_json()
    assert (cli["level"], cli["reason"]) == ("damaged", NAN_REASON)
