"""``kvscope report --verify-json`` / ``--verify`` where no engine is needed (#29 item 8): malformed results, results
without the file's identity or about another file, and verify's options without ``--verify`` are one line and
exit 2 with no report written; without either option the report is as before. The runs against the real
llama.cpp builds are in tests/verify/test_report_verify.py.

Qt-free (tests/report/conftest.py collects this file in the core suite too).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from kvscope.core.cli.main import main
from kvscope.core.report.verified import MAX_VERIFY_JSON
from tests.support.report_paths import EXAMPLES

STATE = EXAMPLES / "llama-slot.seqstate"
GGUF = EXAMPLES / "tiny-llama.gguf"


def _report(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(["report", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _result(**changes: Any) -> dict[str, Any]:
    """A ``kvscope verify --json`` result of STATE, shaped as verify writes it (the keys the report reads)."""
    data = STATE.read_bytes()
    out: dict[str, Any] = {
        "file": str(STATE), "size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "kind": "seq_file",
        "layout": "2026-10", "model": str(GGUF),
        "engine": {"kind": "llama.cpp", "build": "0c1e5709", "reason": "given", "lib_dir": "/home/someone/lib"},
        "restore": {"ok": True, "message": "restored (12628 bytes read)"}, "compared": True,
        "records": [{"section": "kv", "stream": 1, "role": "k", "il": 0, "status": "match", "max_abs": 0.0}],
        "next_token": {"max_abs_logit_diff": 0.0, "same_argmax": True, "kl": 0.0}, "behaviour": None,
        "verdict": "ok", "reasons": ["all 1 records match"], "reuse": None, "setup_mismatch": [],
    }
    out.update(changes)
    return {k: v for k, v in out.items() if v is not ...}


def _refused(capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str | bytes, *want: str) -> None:
    path = tmp_path / "verify.json"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    dest = tmp_path / "r"
    rc, out, err = _report(capsys, str(STATE), "--model", str(GGUF), "-o", str(dest), "--verify-json", str(path))
    assert rc == 2 and not out and err.count("\n") == 1, (rc, err)
    assert err.startswith("kvscope: ") and all(w in err for w in want), err
    assert not dest.exists()


@pytest.mark.parametrize(("text", "want"), [
    ("{\"verdict\": \"ok\"", "not JSON"),
    ("", "not JSON"),
    (b"\xff\xfe{}", "not JSON"),
    ("[1, 2]", "a JSON list, not an object"),
    ("{\"kind\": \"seq_file\"}", "not the output of kvscope verify --json"),
    (json.dumps(_result(verdict="fine")), "verdict 'fine' is none of ok, damaged"),
    (json.dumps(_result(verdict=...)), "'verdict' is missing"),
    (json.dumps(_result(records={"k": 1})), "'records' is a dict"),
    (json.dumps(_result(records=[1, 2])), "records or reasons are not what verify writes"),
    (json.dumps(_result(engine="llama.cpp")), "'engine' is a str"),
])
def test_a_malformed_result_is_refused_in_one_line(text: str, want: str, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    _refused(capsys, tmp_path, text, "--verify-json", want)


def test_a_result_about_another_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _refused(capsys, tmp_path, json.dumps(_result(sha256="0" * 64)), "it verified another file", "sha256 0000")
    _refused(capsys, tmp_path, json.dumps(_result(size=1, sha256=None)), "it verified another file", "1 bytes")
    _refused(capsys, tmp_path, json.dumps(_result(layout="2026-10-v4")), "layout '2026-10-v4'")
    _refused(capsys, tmp_path, json.dumps(_result(size=None, sha256=None)), "names no size or sha256")


def test_an_oversized_or_special_file_is_refused_unread(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    big = tmp_path / "big.json"
    with big.open("wb") as fh:
        fh.truncate(MAX_VERIFY_JSON + 1)  # a hole: no disk used, and read_bounded refuses it from its size
    rc, out, err = _report(capsys, str(STATE), "-o", str(tmp_path / "r"), "--verify-json", str(big))
    assert rc == 2 and "more than the" in err and err.count("\n") == 1 and not out
    rc, _, err = _report(capsys, str(STATE), "-o", str(tmp_path / "r"), "--verify-json", str(tmp_path))
    assert rc == 2 and "not a regular file" in err and err.count("\n") == 1
    rc, _, err = _report(capsys, str(STATE), "-o", str(tmp_path / "r"), "--verify-json", str(tmp_path / "none"))
    assert rc == 2 and "no such file" in err and err.count("\n") == 1
    assert not (tmp_path / "r").exists()


def test_a_matching_result_leads_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "v.json"
    path.write_text(json.dumps(_result(verdict="damaged", reasons=["layer 1 V (kv stream 1): nonfinite"])))
    rc, out, err = _report(capsys, str(STATE), "--model", str(GGUF), "-o", str(tmp_path / "r"), "--verify-json",
                           str(path))
    assert rc == 1, err  # the file is healthy, but Verify's verdict is not ok
    assert "verify: damaged; healthy" in out
    md = (tmp_path / "r" / "report.md").read_text()
    lines = [line for line in md.splitlines() if line.strip()]
    assert lines[1] == "## Verify: damaged" and lines[2] == "**VERIFY: DAMAGED**: layer 1 V (kv stream 1): nonfinite"
    js = json.loads((tmp_path / "r" / "report.json").read_text())
    assert list(js)[0] == "verify" and js["verify"]["verdict"] == "damaged"
    assert js["verify"]["source"] == "kvscope verify --json (v.json)"
    assert "lib_dir" not in js["verify"]["engine"] and "file" not in js["verify"] and "model" not in js["verify"]
    assert "/home/someone" not in md + json.dumps(js)


def test_verify_options_without_verify_and_verify_without_a_model_are_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dest = str(tmp_path / "r")
    for args, want in [
        (["--engine", "server"], "--engine says how --verify runs: give --verify too"),
        (["--build", "0c1e5709", "--steps", "2"], "--build says how --verify runs"),
        (["--verify-json", str(tmp_path / "v.json"), "--no-calibrate"], "--no-calibrate says how --verify runs"),
        (["--verify"], "--verify needs --model"),
    ]:
        rc, out, err = _report(capsys, str(STATE), "-o", dest, *args)
        assert rc == 2 and want in err and err.count("\n") == 1 and not out, (args, err)
    rc, out, err = _report(capsys, str(STATE), "-o", dest, "--verify", "--verify-json", "x.json")
    assert rc == 2 and "not allowed with argument --verify" in err and err.count("\n") == 1 and not out
    assert not (tmp_path / "r").exists()


def test_without_verify_the_report_has_no_verify_section(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _report(capsys, str(STATE), "--model", str(GGUF), "-o", str(tmp_path / "r"))
    assert rc == 0, err
    assert "verify:" not in out
    md = (tmp_path / "r" / "report.md").read_text()
    assert "## Verify" not in md and "## Inspection" not in md and md.splitlines()[2].startswith("**HEALTHY**")
    js = json.loads((tmp_path / "r" / "report.json").read_text())
    assert "verify" not in js and list(js)[0] != "verify" and js["overview"]["verify"] is None
