"""``kvscope lab`` refuses special files (a FIFO would block the read forever) with one line, exit 2.

Run in a child process with a timeout: before the fix the read of a FIFO never returned.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvharness.fixtures import DATA, model_path

pytestmark = pytest.mark.slow  # special files through the lab

FA0 = DATA / "lab/llamacpp-2026-10-01/llama/fa0-unified1"


def _lab(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvscope.core.cli.main", "lab", *args], capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)


def _one_line_exit_2(r: subprocess.CompletedProcess[str], what: str) -> None:
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert what in r.stderr


@pytest.mark.parametrize("role", ["context", "restore"])
def test_fifo_is_refused(tmp_path: Path, role: str) -> None:
    fifo = tmp_path / "fifo.state.bin"
    os.mkfifo(fifo)
    if role == "context":
        r = _lab("--context", str(fifo), "--model", str(model_path("llama")))
    else:
        r = _lab("--context", str(FA0), "--restore", str(fifo))
    _one_line_exit_2(r, "not a regular file")


def test_fifo_as_context_json(tmp_path: Path) -> None:
    folder = tmp_path / "scenario"
    folder.mkdir()
    shutil.copy(FA0 / "context.state.bin", folder / "context.state.bin")
    os.mkfifo(folder / "context.json")
    r = _lab("--context", str(folder), "--model", str(model_path("llama")))
    _one_line_exit_2(r, "not a regular file")
