"""``kvscope rewrite``: byte-identical rewrites, exact conversions checked against the real files
of the newer build, clear refusals, exit codes, atomic output, and no torch in the reader."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvharness.fixtures import DATA, MODELS
from kvscope.core.cli import main as cli

SAMPLES = [
    "llamacpp-2026-10-01/llama-f16-fa0-unified0-seq1.slot-emulated.seqstate",
    "llamacpp-2026-10-01/qwen2vl-f16-fa0-unified0-ctx.session",
    "llamacpp-2026-10-01/lfm2-f16-fa0-unified0-seq0-partial.seqdata.bin",
    "llamacpp-2026-08-16/gemma2-f16-fa0-unified0-swafull1-ctx.state.bin",
    "llamacpp-2026-04-26/mamba-f32state-n3-seq2.seqstate",
    "llamacpp-2025-08-14/llama-q8_0-fa1-unified1-seq3.seqdata.bin",
    "llamacpp-2025-05-08/llama-f16-fa0-seq1-empty.seqstate",
    "llamacpp-2025-05-08/mamba-f32state-n3-ctx.session",
]


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = cli.main(["rewrite", *args])  # the built-in command, as `kvscope rewrite` runs it
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("name", SAMPLES, ids=[s.split("/")[1] for s in SAMPLES])
def test_rewrite_is_byte_identical(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = DATA / name
    before = src.read_bytes()
    out = tmp_path / "out.bin"
    rc, stdout, err = _run([str(src), "-o", str(out)], capsys)
    assert rc == 0, err
    assert "byte-identical" in stdout and out.read_bytes() == before == src.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]  # no temporary file left


@pytest.mark.parametrize(("src", "layout", "model", "real"), [
    ("llamacpp-2025-08-14/llama-f16-fa0-unified0-ctx.session", "2026-10", "llama",
     "llamacpp-2026-10-01/llama-f16-fa0-unified0-ctx.session"),
    ("llamacpp-2026-04-26/gemma2-f16-fa0-unified0-swafull1-seq0.seqdata.bin", "2026-10", "gemma2",
     "llamacpp-2026-10-01/gemma2-f16-fa0-unified0-swafull1-seq0.seqdata.bin"),
    ("llamacpp-2026-04-26/gemma2-f16-fa0-unified0-swafull1-seq0-partial.seqdata.bin", "2026-10", "gemma2",
     "llamacpp-2026-10-01/gemma2-f16-fa0-unified0-swafull1-seq0-partial.seqdata.bin"),
    ("llamacpp-2025-08-14/lfm2-f16-fa0-unified0-ctx.session", "2026-10", "lfm2",
     "llamacpp-2026-10-01/lfm2-f16-fa0-unified0-ctx.session"),
    ("llamacpp-2025-08-14/llama-f16-fa0-unified1-ctx.state.bin", "2026-10", "llama",
     "llamacpp-2026-10-01/llama-f16-fa0-unified1-ctx.state.bin"),
    ("llamacpp-2025-08-14/gemma2-f16-fa0-unified0-swafull1-seq1.seqdata.bin", "2026-08", "gemma2",
     "llamacpp-2026-08-16/gemma2-f16-fa0-unified0-swafull1-seq1.seqdata.bin"),
])
def test_conversion_matches_the_newer_build(src: str, layout: str, model: str | None, real: str, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "conv.bin"
    args = [str(DATA / src), "-o", str(out), "--layout", layout]
    if model:
        args += ["--model", str(MODELS / f"tiny-{model}.gguf")]
    rc, stdout, err = _run(args, capsys)
    assert rc == 0, err
    assert "converted" in stdout and out.read_bytes() == (DATA / real).read_bytes()


def test_mrope_ext_gets_token_ids_from_the_token_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "m.seqstate"
    src = DATA / "llamacpp-2026-04-26/qwen2vl-f16-fa0-unified0-seq0.seqstate"
    assert _run([str(src), "-o", str(out), "--layout", "2026-10"], capsys)[0] == 0
    from kvscope.core.reader.parse import read_state

    res = read_state(out, layout="2026-10")
    cells = res.sections[0].streams[0].cells
    assert cells is not None and cells.ext is not None
    assert cells.ext[:, 2].tolist() == res.tokens  # tok of the cell at pos i is token i
    blob = DATA / "llamacpp-2026-04-26/qwen2vl-f16-fa0-unified0-seq0.seqdata.bin"
    rc, _, err = _run([str(blob), "-o", str(out), "--layout", "2026-10"], capsys)
    assert rc == 1 and "llama_kv_cell_ext.tok" in err and "a blob carries no token list" in err


@pytest.mark.parametrize(("src", "args", "needle"), [
    ("llamacpp-2026-10-01/llama-f16-fa0-unified0-ctx.session", ["--layout", "2025-08"], "logits"),
    ("llamacpp-2025-08-14/llama-f16-fa0-unified0-ctx.state.bin", ["--layout", "2025-05"], "one stream, not 3"),
    ("llamacpp-2025-05-08/llama-f16-fa0-seq1.seqdata.bin", ["--layout", "2026-10"], "--seq-id"),
    ("llamacpp-2025-08-14/qwen2vl-f16-fa0-unified0-seq0.seqstate", ["--layout", "2026-10", "--model",
                                                                     str(MODELS / "tiny-qwen2vl.gguf")], "x, y"),
    ("llamacpp-2025-08-14/qwen2vl-f16-fa0-unified0-seq0.seqstate", ["--layout", "2026-10"], "M-RoPE or PLE"),
    ("llamacpp-2026-04-26/gemma2-f16-fa0-unified0-swafull1-seq0.seqdata.bin", ["--layout", "2026-10"],
     "sliding window"),
    ("llamacpp-2026-10-01/gemma2-f16-fa0-unified0-swafull1-seq0.seqdata.bin", ["--layout", "2026-04"],
     "outside the sliding window"),
    ("llamacpp-2026-10-01/lfm2-f16-fa0-unified0-seq0-partial.seqdata.bin", ["--layout", "2025-08"], "--model"),
])
def test_inexact_conversions_say_what_is_missing(src: str, args: list[str], needle: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x.bin"
    rc, _, err = _run([str(DATA / src), "-o", str(out), *args], capsys)
    assert rc == 1 and needle in err, err
    lines = [ln for ln in err.splitlines() if not ln.startswith("kvscope: note: ")]
    assert len(lines) == 1 and "Traceback" not in err and not out.exists()


def test_seq_id_makes_an_old_blob_convertible(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = DATA / "llamacpp-2025-05-08/llama-f16-fa0-seq1.seqdata.bin"
    out = tmp_path / "new.bin"
    model = str(MODELS / "tiny-llama.gguf")
    rc, _, err = _run([str(src), "-o", str(out), "--layout", "2026-08", "--seq-id", "1", "--model", model], capsys)
    assert rc == 0, err
    from kvscope.core.reader.parse import read_state

    res = read_state(out)
    assert res.n_errors == 0 and res.header["seq_id"] == 1 and res.layout.name in ("2026-08", "2026-10")


def test_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = DATA / "llamacpp-2026-10-01/llama-f16-fa0-unified0-seq0.seqstate"
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\x01\x02\x03")
    cut = tmp_path / "cut.seqstate"
    cut.write_bytes(good.read_bytes()[:-100])
    trailing = tmp_path / "trail.seqstate"
    trailing.write_bytes(good.read_bytes() + b"JUNK")
    out = tmp_path / "o.bin"
    for args, code in (
        ([str(tmp_path / "missing"), "-o", str(out)], 2),
        ([str(junk), "-o", str(out)], 2),
        ([str(cut), "-o", str(out)], 2),
        ([str(good), "-o", str(out), "--layout", "1999-01"], 2),
        ([str(good), "-o", str(out), "--model", str(junk)], 2),
        ([str(good), "-o", str(good)], 2),
        ([str(trailing), "-o", str(out)], 1),
    ):
        rc, _, err = _run(args, capsys)
        assert rc == code, (args, err)
        assert err.startswith("kvscope: ") and "Traceback" not in err
    assert not out.exists()
    rc, _, _ = _run([str(trailing), "-o", str(out), "--drop-trailing"], capsys)
    assert rc == 0 and out.read_bytes() == good.read_bytes()


def test_reader_and_cli_do_not_import_torch() -> None:
    code = ("import sys, kvscope.core.cli.main as c, kvscope.core.reader.parse as p, "
            "kvscope.core.cli.rewrite_command as r;"
            "import argparse; r.register(argparse.ArgumentParser().add_subparsers());"
            "p.read_state(sys.argv[1]); assert 'torch' not in sys.modules, 'torch imported'")
    path = DATA / "llamacpp-2026-10-01/llama-f16-fa0-unified0-seq0.seqstate"
    env = {**os.environ, "PYTHONPATH": ""}
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, env=env, timeout=120)
