"""``kvscope lab --context DIR`` uses the model ``context.json`` names only when it is the recorded file.

A scenario folder is input: its ``model.path_from_this_folder`` may say ``../../anything``. The model is
opened only when its size and sha256 match the ones recorded beside the path (without a sha256, only a
path inside the folder is followed); else one line, exit 2, and ``--model`` still works.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kvharness.fixtures import DATA, model_path
from kvscope.core.cli.main import main

FA0 = DATA / "lab/llamacpp-2026-10-01/llama/fa0-unified1"


def _scenario(tmp_path: Path, model: dict[str, object]) -> Path:
    folder = tmp_path / "lab" / "scenario"
    folder.mkdir(parents=True)
    for f in ("context.state.bin", "seq0.clean.seqdata.bin"):
        shutil.copy(FA0 / f, folder / f)
    cj = json.loads((FA0 / "context.json").read_text())
    cj["model"] = {**cj["model"], **model}
    (folder / "context.json").write_text(json.dumps(cj))
    return folder


def _lab(capsys: pytest.CaptureFixture[str], folder: Path, *extra: str) -> tuple[int, str]:
    rc = main(["lab", "--context", str(folder), "--corrupt", "truncated_half", "--policy", "contained",
               "--reader", "buffer", "--json", *extra])
    return rc, capsys.readouterr().err


def test_the_recorded_model_is_used(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    folder = _scenario(tmp_path, {"path_from_this_folder": str(model_path("llama").resolve())})
    assert _lab(capsys, folder) == (0, "")


def test_another_file_at_the_path_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    other = tmp_path / "other.gguf"
    shutil.copy(model_path("gemma2"), other)
    for record in ({"path_from_this_folder": "../../other.gguf"},  # same size recorded: fails on size
                   {"path_from_this_folder": "../../other.gguf", "size": other.stat().st_size}):  # on sha256
        shutil.rmtree(tmp_path / "lab", ignore_errors=True)
        folder = _scenario(tmp_path, record)
        rc, err = _lab(capsys, folder)
        assert rc == 2 and err.count("\n") == 1 and "not the model context.json records" in err, err
        assert "give --model" in err
    rc, err = _lab(capsys, folder, "--model", str(model_path("llama")))
    assert (rc, err) == (0, "")


def test_no_sha256_only_inside_the_folder(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    folder = _scenario(tmp_path, {"path_from_this_folder": "../../../etc/passwd", "sha256": None})
    rc, err = _lab(capsys, folder)
    assert rc == 2 and "outside the scenario folder" in err and err.count("\n") == 1
    shutil.rmtree(tmp_path / "lab")
    folder = _scenario(tmp_path, {"path_from_this_folder": "model.gguf", "sha256": None})
    shutil.copy(model_path("llama"), folder / "model.gguf")
    assert _lab(capsys, folder) == (0, "")
