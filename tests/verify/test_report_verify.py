"""``kvscope report --verify`` / ``--verify-json`` (#29 item 8): the report leads with the verdict Verify measured in
the real pinned llama.cpp builds, in report.md (the first section), report.json (a ``verify`` object first) and
report.html (the banner at the top, where the gui extra is installed); the answers Verify measured stand beside
the predictions; a Verify that cannot run, or a ``verify --json`` result about another file, is one line and exit 2.
Every engine here is real: the pinned builds' libllama child and llama-server, on the tiny model's slot files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvharness.fixtures import MODELS, model_path
from kvscope.core.cli.main import main
from kvscope.core.cli.report_command import load_pictures
from kvscope.core.engine.builds import InstalledBuild
from kvscope.core.lab.damaged_copy import corrupt_file

pytestmark = pytest.mark.engine

SEQ = MODELS / "llama-f16-fa0-unified0-seq1.seqstate"  # a llama-server slot file of 0c1e5709
OTHER = MODELS / "llama-f16-fa0-unified0-seq0.seqstate"
NAN = "fill:value=nan,role=v,index=1,cells=3"  # the corruption catalog: NaN over cell 3 of V layer 1


def _have_html() -> bool:
    """Whether the report draws report.html here (the gui extra; asked when a test runs, not at collection)."""
    return load_pictures()[0] is not None


def _model() -> str:
    return str(model_path("llama"))


def _report(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(["report", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _read(folder: Path) -> tuple[str, dict[str, Any], str | None]:
    html = folder / "report.html"
    return ((folder / "report.md").read_text(), json.loads((folder / "report.json").read_text()),
            html.read_text() if html.exists() else None)


def _leads_with(folder: Path, verdict: str) -> dict[str, Any]:
    """The report in ``folder`` starts with Verify's ``verdict`` in every format; its JSON ``verify`` object."""
    md, js, html = _read(folder)
    sections = [line for line in md.splitlines() if line.startswith("## ")]
    assert sections[0] == f"## Verify: {verdict}", sections
    after_title = [line for line in md.splitlines()[1:] if line.strip()]
    assert after_title[0] == f"## Verify: {verdict}" and after_title[1].startswith(f"**VERIFY: {verdict.upper()}**")
    assert next(iter(js)) == "verify" and js["verify"]["verdict"] == verdict
    assert js["verify"]["summary"].startswith(f"VERIFY: {verdict.upper()}")
    assert js["overview"]["verify"]["verdict"] == verdict
    if _have_html():
        assert html is not None
        body = html.split("</h1>", 1)[1]
        assert body.lstrip().startswith('<section id="verify"><p class="verdict')
        assert f"<b>VERIFY: {verdict.upper()}</b>" in body.split("</section>", 1)[0]
    verify: dict[str, Any] = js["verify"]
    return verify


def test_report_verify_leads_with_ok_on_a_healthy_slot(builds: dict[str, InstalledBuild], tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _report(capsys, str(SEQ), "--model", _model(), "-o", str(tmp_path / "r"), "--verify")
    assert rc == 0, err
    assert "verify: ok; healthy" in out
    v = _leads_with(tmp_path / "r", "ok")
    assert v["engine"]["kind"] == "llama.cpp" and v["engine"]["build"] == "0c1e5709"
    assert v["restore"]["ok"] is True and {r["status"] for r in v["records"]} == {"match"}
    assert v["source"] == "kvscope report --verify" and v["size"] == SEQ.stat().st_size and len(v["sha256"]) == 64
    assert "lib_dir" not in v["engine"] and "model" not in v  # no paths of this machine in a public report
    md, js, _ = _read(tmp_path / "r")
    # the restore Verify measured replaces its prediction (said to agree): in the build section and the overview's row
    assert md.count("0c1e5709 libllama: loads (measured by Verify; as predicted)") == 2, md
    assert js["kind"] == "seq_file" and "findings" in js  # inspect --json's object follows, as before


def test_report_verify_on_a_damaged_copy_leads_with_damaged(builds: dict[str, InstalledBuild], tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "slot-nan.seqstate"
    corrupt_file(SEQ, bad, [NAN], _model())
    rc, out, err = _report(capsys, str(bad), "--model", _model(), "-o", str(tmp_path / "r"), "--verify")
    assert rc == 1, err
    assert "verify: damaged; damaged" in out
    v = _leads_with(tmp_path / "r", "damaged")
    assert any(r["status"] != "match" and r["role"] == "v" and r["il"] == 1 for r in v["records"]), v["records"]
    assert any("layer 1 V" in reason for reason in v["reasons"]), v["reasons"]
    md, _, _ = _read(tmp_path / "r")
    assert md.index("## Verify: damaged") < md.index("## Inspection") < md.index("**DAMAGED**")


def test_report_verify_json_from_a_real_verify_run(builds: dict[str, InstalledBuild], tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", str(SEQ), "--model", _model(), "--json"]) == 0
    result = tmp_path / "verify.json"
    result.write_text(capsys.readouterr().out)
    rc, out, err = _report(capsys, str(SEQ), "--model", _model(), "-o", str(tmp_path / "r"), "--verify-json",
                           str(result))
    assert rc == 0, err
    v = _leads_with(tmp_path / "r", "ok")
    assert v["source"] == "kvscope verify --json (verify.json)"
    assert v["sha256"] == json.loads(result.read_text())["sha256"]
    # the same result, for another file (another slot of the same build and model): refused in one line
    rc, out, err = _report(capsys, str(OTHER), "--model", _model(), "-o", str(tmp_path / "r2"), "--verify-json",
                           str(result))
    assert rc == 2 and not out and err.count("\n") == 1, err
    assert "it verified another file" in err and "not " + str(OTHER) in err
    assert not (tmp_path / "r2").exists()
    # and for a damaged copy of the same file (same size, kind and layout: only the bytes tell)
    bad = tmp_path / "slot-nan.seqstate"
    corrupt_file(SEQ, bad, [NAN], _model())
    rc, _, err = _report(capsys, str(bad), "-o", str(tmp_path / "r3"), "--verify-json", str(result))
    assert rc == 2 and "sha256" in err and err.count("\n") == 1, err


def test_report_verify_in_llama_server_puts_the_measured_reuse_beside_the_prediction(
        builds: dict[str, InstalledBuild], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _report(capsys, str(SEQ), "--model", _model(), "-o", str(tmp_path / "r"), "--verify",
                         "--engine", "server", "--build", "0c1e5709")
    assert rc == 0, err
    v = _leads_with(tmp_path / "r", "ok")
    assert v["engine"]["kind"] == "server" and v["reuse"]["reused_tokens"] == 12
    md, js, html = _read(tmp_path / "r")
    beside = md.splitlines()
    assert any("llama-server 0c1e5709 --swa-full: measured by Verify (replaces the prediction): llama-server reuses "
               "12 of 12 restored tokens" in line for line in md.splitlines()), md
    assert any("0c1e5709 llama-server: loads (measured by Verify; as predicted)" in line for line in beside)
    if _have_html():
        assert html is not None and "measured by Verify" in html


def test_report_verify_that_cannot_run_is_one_line_and_exit_2(builds: dict[str, InstalledBuild], tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    rc, out, err = _report(capsys, str(SEQ), "--model", str(tmp_path / "none.gguf"), "-o", str(tmp_path / "r"),
                           "--verify")
    assert rc == 2 and not out and err.count("\n") == 1 and "no such file" in err, err
    rc, out, err = _report(capsys, str(SEQ), "--model", _model(), "-o", str(tmp_path / "r"), "--verify", "--build",
                           "nope")
    assert rc == 2 and not out and err.count("\n") == 1 and "--verify cannot run" in err, err
    monkeypatch.setenv("KVSCOPE_LLAMA_CACHE", str(tmp_path / "empty"))  # no pinned build installed
    rc, out, err = _report(capsys, str(SEQ), "--model", _model(), "-o", str(tmp_path / "r"), "--verify")
    assert rc == 2 and not out and err.count("\n") == 1, err
    assert "--verify cannot run" in err and "kvscope llama-build --build 0c1e5709" in err
    assert not (tmp_path / "r").exists()


def test_report_verify_without_the_binding_says_how_to_install_it(builds: dict[str, InstalledBuild],
                                                                  tmp_path: Path) -> None:
    code = ("import sys; sys.modules['llama_cpp'] = None\n"  # as on a machine without the engine extra
            "from kvscope.core.cli.main import main\n"
            f"sys.exit(main(['report', {str(SEQ)!r}, '--model', {_model()!r}, '-o', {str(tmp_path / 'r')!r}, "
            "'--verify']))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr
    assert "llama-cpp-python is not installed" in p.stderr and p.stderr.count("\n") == 1 and not p.stdout
    assert not (tmp_path / "r").exists()
