"""The one inspection pipeline (kvscope.core.analysis.inspection): what every front end gets from it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvharness.fixtures import DATA, MODELS, model_path
from kvscope.core.analysis.inspection import inspect_file
from kvscope.core.errors import InputError
from kvscope.core.model.profile import load_model_profile

CLEAN = MODELS / "llama-f16-fa0-unified0-seq0.seqstate"
SAMPLES = [CLEAN, *sorted((DATA / "gen-b11434").glob("qwen35-*seq0.seqstate"))[:1],
           *sorted((DATA / "gen-b11434").glob("*-ctx.state.bin"))[:1]]


def _cli_json(*args: str) -> dict:  # type: ignore[type-arg]
    out = subprocess.run([sys.executable, "-m", "kvscope.core.cli.main", "inspect", *args, "--json"],
                         capture_output=True, text=True, timeout=120)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_the_cli_prints_the_inspection(path: Path) -> None:
    found = inspect_file(path, stats=True)
    assert json.loads(json.dumps(found.to_json())) == _cli_json(str(path), "--stats")
    assert {"verdict", "compatibility", "stats"} <= set(found.to_json())


def test_with_the_model_the_verdict_and_the_table_are_the_models() -> None:
    profile = load_model_profile(model_path("llama"))
    found = inspect_file(CLEAN, profile)
    assert found.is_state and found.verdict.state == "healthy" and found.stats is None
    assert found.compatibility is not None and {c.generation for c in found.compatibility} >= {"2026-10"}
    # inspect scans the values by default: the pipeline without the scan is what --no-stats prints
    assert found.to_json()["verdict"] == _cli_json(str(CLEAN), "--model", str(model_path("llama")),
                                                   "--no-stats")["verdict"]
    assert found.to_text().splitlines()[2].startswith("verdict: healthy (values not scanned): ")


def test_a_file_that_is_not_a_state_is_said_so(tmp_path: Path) -> None:
    junk = tmp_path / "junk.bin"
    junk.write_bytes(os.urandom(4096))
    found = inspect_file(junk)
    assert not found.is_state and found.compatibility is None
    assert found.not_state_reason() and found.to_json()["verdict"]["state"] != "ok"


def test_missing_special_and_folder_inputs_are_one_input_error(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, words in ((tmp_path / "absent", "no such file"), (tmp_path, "is a directory"), (fifo, "")):
        with pytest.raises(InputError) as info:
            inspect_file(path)  # a FIFO without a writer must not block
        assert str(path) in info.value.message and words in info.value.message


def test_an_unknown_layout_is_an_input_error() -> None:
    with pytest.raises(InputError, match="unknown layout"):
        inspect_file(CLEAN, layout="1999-01")
