"""A smoke run of ``bench/bench_fleet.py`` so it cannot rot (no timing goal is asserted here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the fleet bench

ROOT = Path(__file__).resolve().parents[2]


def test_bench_fleet_small_run(tmp_path: Path) -> None:
    p = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_fleet.py"), "--files", "300", "--jobs", "2",
         "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=240, cwd=ROOT, check=False,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    for row in ("| the old scan loop, today's scan_file |", "| local |", "| dask (LocalCluster) |"):
        assert row in p.stdout, p.stdout
    assert "local executor / the old scan loop, today's scan_file: " in p.stdout
    assert "per-file cost of scan_file" in p.stdout and "scale-out: " in p.stdout
    assert list(tmp_path.iterdir()) == []  # the tree is deleted without --keep
