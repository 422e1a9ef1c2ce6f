"""``kvscope repair`` / ``kvscope verify`` check their preconditions before any engine starts (#29 item 5):
a llama-server slot with one token outside the model's vocabulary is refused in one line, exit 2, with the
core's reason (llama-server would answer the re-prefill with HTTP 400 after it started), and the input is
untouched; an empty file is refused by both commands the same way. No engine is started: starting one fails
the test. The app's side: tests/app/test_gui_preconditions.py."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from kvscope.core.cli.main import main
from tests.support.slot_damage import LLAMA, oov_slot


@pytest.fixture
def no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    import kvscope.core.verify.repair as repair_mod
    import kvscope.core.verify.run as run_mod

    def started(*_a: object, **_k: object) -> None:
        raise AssertionError("an engine was started")

    for mod, names in ((repair_mod, ("_rebuild", "ServerEngine", "LlamaCppEngine", "LlamaSession")),
                       (run_mod, ("LlamaCppEngine", "ServerEngine", "TorchEngine"))):
        for name in names:
            monkeypatch.setattr(mod, name, started)


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    rc = main(list(args))
    return rc, capsys.readouterr().err


def test_repair_refuses_a_token_outside_the_vocabulary_before_any_engine(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], no_engine: None) -> None:
    path = oov_slot(tmp_path / "oov.bin")
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    out = tmp_path / "out.bin"
    rc, err = _run(capsys, "repair", str(path), "--model", str(LLAMA), "-o", str(out))
    assert rc == 2 and err.count("\n") == 1, err
    assert "outside the model's vocabulary" in err and "token id 384" in err and str(path) in err, err
    assert not out.exists() and hashlib.sha256(path.read_bytes()).hexdigest() == before


@pytest.mark.parametrize("command", ["repair", "verify"])
def test_an_empty_file_is_refused_in_one_line_before_any_engine(
        command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], no_engine: None) -> None:
    path = tmp_path / "empty.bin"
    path.write_bytes(b"")
    extra = ["-o", str(tmp_path / "out.bin")] if command == "repair" else []
    rc, err = _run(capsys, command, str(path), "--model", str(LLAMA), *extra)
    assert rc == 2 and err.count("\n") == 1 and "empty" in err, err
