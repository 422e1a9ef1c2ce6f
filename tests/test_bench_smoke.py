"""Smoke runs of the benchmark scripts so they cannot rot (no timing goal is asserted here).

``bench/bench_reader.py --quick`` writes a 16 MiB synthetic state file and runs every
measurement once; ``bench/fuzz_long.py`` runs a couple of hundred inputs on one process.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"

MEASUREMENTS = (
    "read (cold, 8 MiB chunks)",
    "read (warm, 8 MiB chunks)",
    "index read_state (cold)",
    "index read_state (warm)",
    "cell table scan_cells",
    "--stats scan_stats (cold)",
    "--stats scan_stats (warm)",
    "peak RSS, index (subprocess)",
    "start-up: kvscope inspect --json",
    "start-up: torch/PySide6 imported",
)


def test_bench_reader_quick(tmp_path: Path) -> None:
    p = subprocess.run(
        [sys.executable, str(BENCH / "bench_reader.py"), "--quick", "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=ROOT, check=False,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    for name in MEASUREMENTS:
        assert name in p.stdout, name
    assert "| measurement" in p.stdout and "goals met" in p.stdout
    assert list(tmp_path.iterdir()) == []  # the synthetic file is deleted without --keep


def test_fuzz_long_short_run(tmp_path: Path) -> None:
    p = subprocess.run(
        [sys.executable, str(BENCH / "fuzz_long.py"), "--inputs", "200", "--jobs", "1", "--mem-every", "50",
         "--out", str(tmp_path / "failures")],
        capture_output=True, text=True, timeout=120, cwd=ROOT, check=False,
    )
    # exit 1 means the fuzzer found something: that is the reader's bug, reported by
    # tests/test_fuzz_reader.py; here only the script itself must work
    assert p.returncode in (0, 1), p.stdout + p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    assert "SUMMARY: 200 inputs" in p.stdout, p.stdout
    assert "finding codes" in p.stdout
