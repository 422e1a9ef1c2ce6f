"""``kvscope inspect --stats`` and ``kvscope diff``: outputs and exit codes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from kvscope.core.cli.main import main
from kvscope.core.reader.parse import read_state

D = Path(__file__).parent.parent / "data" / "llamacpp-2026-10-01"
CTX = D / "llama-f16-fa0-unified0-ctx.state.bin"
SEQ0, SEQ1 = D / "llama-f16-fa0-unified0-seq0.seqstate", D / "llama-f16-fa0-unified0-seq1.seqstate"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_inspect_stats_text_and_markdown(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "inspect", str(CTX), "--stats")
    assert rc == 0
    assert "payload statistics: 24 records" in out and "nonfinite" in out
    rc, out, _ = run(capsys, "inspect", str(CTX), "--stats", "--markdown")
    assert rc == 0 and "## payload statistics" in out and "| section | stream |" in out


def test_inspect_stats_json_reports_nan_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "inspect", str(CTX), "--stats", "--json")
    doc = json.loads(out)
    assert rc == 0 and len(doc["stats"]["layers"]) == 24
    assert all(x["n_nonfinite"] == 0 and x["zero_rows"] == 0 for x in doc["stats"]["layers"])
    rec = read_state(CTX).sections[0].streams[0].k_layers[1]
    bad = tmp_path / "nan.state.bin"
    shutil.copyfile(CTX, bad)
    data = bytearray(bad.read_bytes())
    data[rec.data_offset : rec.data_offset + rec.row_bytes] = np.full(rec.row_bytes // 2, 0x7E00, "<u2").tobytes()
    bad.write_bytes(bytes(data))
    rc, out, _ = run(capsys, "inspect", str(bad), "--stats", "--json")
    doc = json.loads(out)
    assert rc == 1
    (f,) = [f for f in doc["findings"] if f["code"] == "nonfinite_values"]
    assert (f["layer"], f["offset"], f["severity"]) == (1, rec.data_offset, "error")
    (ls,) = [x for x in doc["stats"]["layers"] if x["n_nan"]]
    assert (ls["stream"], ls["role"], ls["il"], ls["n_nan"]) == (0, "k", 1, 64)


def test_diff_exit_codes_and_outputs(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "diff", str(CTX), str(CTX))
    assert rc == 0 and out.rstrip().endswith("identical")
    rc, out, _ = run(capsys, "diff", str(SEQ0), str(SEQ1))
    assert rc == 1 and "differences:" in out and "token 1:" in out
    rc, out, _ = run(capsys, "diff", str(SEQ0), str(SEQ1), "--json")
    doc = json.loads(out)
    assert rc == 1 and doc["identical"] is False and doc["tokens"]["first_diff"] == 1
    assert {d["kind"] for d in doc["differences"]} >= {"bytes", "header", "token", "cell", "layer"}


def test_diff_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, _, err = run(capsys, "diff", str(CTX), str(tmp_path / "nope.bin"))
    assert rc == 2 and "no such file" in err
