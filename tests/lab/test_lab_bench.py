"""Smoke run of ``bench/bench_lab.py`` so it cannot rot (no timing goal is asserted here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the lab bench

ROOT = Path(__file__).resolve().parents[2]


def test_bench_lab_quick() -> None:
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_lab.py"), "--quick", "--model", "mamba",
                        "--model", "lfm2"], capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "| model | cases | cells | load | prepare | matrix |" in p.stdout
    assert "| mamba | 3 | 18 |" in p.stdout and "| lfm2 | 3 | 18 |" in p.stdout
    assert "goals met" in p.stdout
