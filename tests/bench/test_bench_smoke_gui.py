"""The GUI responsiveness bench in ``--quick`` mode (offscreen Qt; see conftest)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.bench.conftest import assert_rows, run_bench

pytestmark = pytest.mark.slow


def test_bench_gui_quick(tmp_path: Path) -> None:
    text = run_bench("bench_gui.py", "--dir", str(tmp_path), cwd=tmp_path, env={"QT_QPA_PLATFORM": "offscreen"})
    # the first paint of the verdict is measured (not nan): the open phase waits for it
    assert re.search(r"overview \(verdict\) first painted after \d+ ms", text), text
    assert re.search(r"tree, byte map and findings shown after \d+ ms", text), text
    for phase in ("open", "hex", "cells", "layers", "tokens", "findings", "diff", "lab"):
        assert re.search(rf"^{phase} +\d+ ms +\d+ ms +\d+ ms +[\d.]+x  (PASS|MISS)$", text, re.M), (phase, text)
    assert_rows(text, ("worst GUI-thread stall:", "baseline: the same timer with no file open"))
    assert list(tmp_path.iterdir()) == []
