"""``kvscope inspect``: exit codes, JSON keys, one-line errors, overrides."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvharness.fixtures import DATA, model_path
from kvscope.core.cli.main import main

SLOT = DATA / "llamacpp-2026-10-01/llama-f16-fa0-unified0-seq1.slot-emulated.seqstate"
LAB = DATA / "lab/llamacpp-2026-10-01/llama"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_json_keys_and_slot_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "inspect", str(SLOT), "--model", str(model_path("llama")), "--json")
    assert rc == 0
    doc = json.loads(out)
    for key in ("kind", "partial", "layout", "header", "tokens", "memory", "findings", "coverage"):
        assert key in doc
    assert doc["kind"] == "seq_file"
    assert set(doc["layout"]) >= {"name", "confidence", "alternatives"}
    assert doc["layout"]["name"] == "2026-10"
    assert doc["header"]["magic"] == "0x67677371" and doc["header"]["version"] == 3
    assert doc["tokens"] == [1, 332, 337, 47, 298, 324, 327, 316, 320, 298, 346, 349]
    assert doc["token_payload"]["format"] == "server_tokens"
    sec = doc["memory"][0]
    assert sec["role"] == "kv" and sec["n_stream"] == 3
    st = sec["streams"][1]
    assert st["cell_count"] == 12 and st["cells"][0] == [0, [1]]
    assert st["v_trans"] == 1 and st["n_layer"] == 4
    assert st["k_layers"][0] == {**st["k_layers"][0], "il": 0, "type": "f16", "row_bytes": 128}
    assert {"el_bytes", "n_embd_v_gqa", "offset", "size"} <= set(st["v_layers"][0])
    assert doc["coverage"] == {"size": SLOT.stat().st_size, "parsed_bytes": SLOT.stat().st_size,
                               "untrusted_bytes": 0, "unparsed_bytes": 0, "trailing_bytes": 0}
    assert doc["text"].startswith("<s>")


def test_error_findings_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "inspect", str(LAB / "truncated_half.seqdata.bin"), "--json")
    assert rc == 1
    doc = json.loads(out)
    assert any(f["code"] == "truncated" for f in doc["findings"])


@pytest.mark.parametrize("fmt", [[], ["--markdown"]])
def test_text_and_markdown(capsys: pytest.CaptureFixture[str], fmt: list[str]) -> None:
    rc, out, _ = run(capsys, "inspect", str(LAB / "drop_k_layer_1.seqdata.bin"), *fmt)
    assert rc == 1
    assert "missing_layer" in out and "layout:" in out
    if fmt:
        assert "| stream | rec |" in out


def test_bad_inputs_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, _, err = run(capsys, "inspect", str(tmp_path / "nope.bin"))
    assert rc == 2 and err.count("\n") == 1 and "no such file" in err
    rc, _, err = run(capsys, "inspect", str(tmp_path))
    assert rc == 2 and "directory" in err
    text = tmp_path / "notes.txt"
    text.write_text("hello, this is not a state file\n" * 4)
    rc, out, err = run(capsys, "inspect", str(text))
    assert rc == 2 and "kvscope:" in err and "Traceback" not in err
    rc, _, err = run(capsys, "inspect", str(SLOT), "--model", str(text))
    assert rc == 2 and err.startswith("kvscope: cannot use model")
    rc, _, err = run(capsys, "inspect", str(SLOT), "--layout", "1999-01")
    assert rc == 2 and "unknown layout" in err
    rc, _, _ = run(capsys, "inspect")
    assert rc == 2
    rc, _, _ = run(capsys)
    assert rc == 2


def test_overrides(capsys: pytest.CaptureFixture[str]) -> None:
    blob = DATA / "llamacpp-2026-04-26/llama-f16-fa0-unified0-seq0.seqdata.bin"
    rc, out, _ = run(capsys, "inspect", str(blob), "--json", "--layout", "2025-08")
    assert rc == 0 and json.loads(out)["layout"]["name"] == "2025-08"
    rc, out, _ = run(capsys, "inspect", str(blob), "--json", "--kind", "context_blob")
    assert rc == 1 and json.loads(out)["kind"] == "context_blob"


def test_input_not_modified(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    src = tmp_path / "slot.bin"
    src.write_bytes(SLOT.read_bytes())
    src.chmod(0o444)
    before = src.stat().st_mtime_ns, src.read_bytes()
    run(capsys, "inspect", str(src), "--json", "--stats")
    assert (src.stat().st_mtime_ns, src.read_bytes()) == before


def test_console_script_imports_neither_torch_nor_qt() -> None:
    code = ("import sys, io, contextlib; from kvscope.core.cli.main import main; "
            "buf = io.StringIO(); contextlib.redirect_stdout(buf).__enter__(); "
            f"main(['inspect', r'{SLOT}', '--json']); "
            "sys.stderr.write(','.join(m for m in ('torch', 'PySide6', 'pyqtgraph') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stderr == ""
