"""``kvscope verify`` on the command line: the JSON keys, the text report, exit codes 0 / 1 / 2, and
one line (how to get the engine) when it is missing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvharness.fixtures import MODELS, model_path
from kvharness.states import PROMPT, drop_records, kv_records, write_states
from kvscope.core.cli.main import main
from kvscope.core.engine.builds import InstalledBuild

SEQ = MODELS / "llama-f16-fa0-unified0-seq1.seqstate"


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(["verify", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_ok_json_has_the_fixed_keys(builds: dict[str, InstalledBuild], capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _run(capsys, str(SEQ), "--model", str(model_path("llama")), "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert d["verdict"] == "ok"
    assert d["engine"]["kind"] == "llama.cpp" and d["engine"]["build"] == "0c1e5709"
    assert d["restore"]["ok"] is True and isinstance(d["restore"]["message"], str)
    assert len(d["records"]) == 8
    for r in d["records"]:
        assert {"section", "stream", "role", "il", "status", "max_abs"} <= set(r)
        assert r["role"] in ("k", "v") and r["status"] == "match" and r["max_abs"] == 0.0
    assert {"max_abs_logit_diff", "same_argmax", "kl"} <= set(d["next_token"])
    assert d["next_token"]["same_argmax"] is True


def test_text_report_and_exit_1(builds: dict[str, InstalledBuild], capsys: pytest.CaptureFixture[str],
                                tmp_path: Path) -> None:
    paths = write_states("b11434", tmp_path)
    k, _ = kv_records(paths["seq_file"])
    bad = drop_records(paths["seq_file"], tmp_path / "bad.seqstate", [k[1]])
    rc, out, _ = _run(capsys, str(bad), "--model", str(model_path("llama")))
    assert rc == 1
    assert "verdict: damaged" in out and "layer 1 K" in out and "engine: llama.cpp b11434" in out
    rc, out, _ = _run(capsys, str(paths["seq_blob"]), "--model", str(model_path("llama")), "--build", "0c1e5709",
                      "--tokens", ",".join(map(str, PROMPT)), "--json")
    assert rc == 1 and json.loads(out)["verdict"] == "incompatible"


def test_ctx_param_overrides_reach_the_engine(builds: dict[str, InstalledBuild],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, str(SEQ), "--model", str(model_path("llama")), "--ctx-param", "n_ctx=1536",
                      "--ctx-param", "n_ubatch=4", "--ctx-param", "n_batch=8", "--json")
    d = json.loads(out)
    assert rc == 0, d["reasons"]
    assert d["context"]["ctx"]["n_ctx"] == 1536 and d["context"]["sources"]["n_ctx"] == "override"
    assert d["engine"]["n_ctx"] == 1536


def test_usage_and_setup_errors_exit_2_with_one_line(builds: dict[str, InstalledBuild],
                                                      capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    cases = [
        ([str(SEQ), "--model", str(tmp_path / "none.gguf")], "no such file (--model names the GGUF model file)"),
        ([str(tmp_path / "none.bin"), "--model", str(model_path("llama"))], "no such file"),
        ([str(SEQ), "--model", str(model_path("llama")), "--ctx-param", "n_ctx"], "expected KEY=VALUE"),
        ([str(SEQ), "--model", str(model_path("llama")), "--ctx-param", "bogus=1"], "not a context parameter"),
        ([str(SEQ), "--model", str(model_path("llama")), "--server", "http://127.0.0.1:9"], "--engine server"),
        ([str(SEQ), "--model", str(model_path("llama")), "--engine", "server", "--server", "http://127.0.0.1:9"],
         "--slot-dir"),
        ([str(SEQ), "--model", str(model_path("llama")), "--tokens", "1,x"], "comma-separated"),
    ]
    for args, msg in cases:
        rc, out, err = _run(capsys, *args)
        assert rc == 2 and msg in err and err.count("\n") == 1 and not out, (args, err)
    rc, _, err = _run(capsys, str(SEQ), "--model", str(model_path("llama")), "--engine", "server", "--server",
                      "http://127.0.0.1:9", "--slot-dir", str(tmp_path))
    assert rc == 2 and "does not answer" in err
    monkeypatch.setenv("KVSCOPE_LLAMA_CACHE", str(tmp_path / "empty"))
    rc, _, err = _run(capsys, str(SEQ), "--model", str(model_path("llama")))
    assert rc == 2 and "kvscope llama-build --build 0c1e5709" in err and err.count("\n") == 1


def test_without_the_binding_it_says_how_to_install_it(builds: dict[str, InstalledBuild]) -> None:
    code = ("import sys; sys.modules['llama_cpp'] = None\n"  # as on a machine without the engine extra
            "from kvscope.core.cli.main import main\n"
            f"sys.exit(main(['verify', {str(SEQ)!r}, '--model', {str(model_path('llama'))!r}]))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert "llama-cpp-python is not installed" in p.stderr and "pip install" in p.stderr
    assert "kvscope[engine]" in p.stderr and p.stderr.count("\n") == 1
