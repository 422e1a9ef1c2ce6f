"""The benches and fuzzers that need neither the engine nor Qt, in ``--quick`` mode (see conftest)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.bench.conftest import assert_rows, run_bench

pytestmark = pytest.mark.slow


def test_bench_reader_quick(tmp_path: Path) -> None:
    out = tmp_path / "files"
    out.mkdir()
    text = run_bench("bench_reader.py", "--dir", str(out), cwd=tmp_path)
    assert_rows(text, (
        "read (cold, 8 MiB chunks)", "read (warm, 8 MiB chunks)", "index read_state (cold)",
        "index read_state (warm)", "inspect --json analysis (cold)", "inspect --json analysis (warm)",
        "inspect --json JSON text (cold)", "inspect --json JSON text (warm)", "cell table scan_cells",
        "--stats scan_stats (cold)", "--stats scan_stats (warm)", "peak RSS, index (subprocess)",
        "peak RSS, inspect --json, 1 GB sparse tail", "peak RSS, inspect --json, 50 GB sparse tail",
        "start-up: kvscope inspect --json", "start-up: torch/PySide6 imported", "| measurement", "goals met"))
    assert list(out.iterdir()) == []  # the synthetic file is deleted without --keep


def test_bench_rotation_quick(tmp_path: Path) -> None:
    text = run_bench("bench_rotation.py", "--dir", str(tmp_path), cwd=tmp_path)
    types = ("f16", "f16 transposed V", "bf16", "f32", "q8_0", "q4_0", "q8_0 rotated", "q4_0 rotated")
    for t in types:  # one row per cache type, cold and warm --stats beside the cold read
        assert re.search(rf"^\| {re.escape(t)} +\| +[\d,.]+ MiB/s \| +[\d,.]+ MiB/s \|", text, re.M), (t, text[-4000:])
    assert_rows(text, ("v4 q8_0 index (cold)", "v4 q8_0 index (warm)", "--stats de-rotated q8_0 / f16 (warm)",
                       "decode q8_0 (kvscope / gguf-py)", "statistics: "))
    assert not [p for p in tmp_path.iterdir() if p.suffix == ".seqstate"]


def test_bench_memory_quick(tmp_path: Path) -> None:
    text = run_bench("bench_memory.py", "--dir", str(tmp_path), cwd=tmp_path)
    assert_rows(text, ("state_write -> seq file", "state_read <- seq file", "peak RSS, write", "peak RSS, read",
                       "seq_get_data (blob, info)", "seq_set_data (blob, info)"))
    assert re.search(r"restored bytes == written +yes", text), text


def test_bench_fleet_quick(tmp_path: Path) -> None:
    text = run_bench("bench_fleet.py", "--dir", str(tmp_path), cwd=tmp_path)
    assert_rows(text, ("| the old scan loop, today's scan_file |", "| local |", "| dask (LocalCluster) |",
                       "per-file cost of scan_file", "local executor / the old scan loop"))
    assert [p for p in tmp_path.iterdir() if p.is_dir()] == []  # the tree is removed without --keep


def test_bench_lab_quick(tmp_path: Path) -> None:
    text = run_bench("bench_lab.py", cwd=tmp_path)
    for model in ("llama", "mamba", "gemma2", "lfm2"):
        assert re.search(rf"^\| {model} \| 3 \| \d+ \|", text, re.M), (model, text)
    assert "goals met" in text


def test_fuzz_long_quick(tmp_path: Path) -> None:
    text = run_bench("fuzz_long.py", "--out", str(tmp_path / "failures"), cwd=tmp_path)
    assert_rows(text, ("SUMMARY: 200 inputs", " 0 failures", "finding codes", "state mutations: peak allocation",
                       "model mutations:", "sparse giant tails (1-50 GB holes):", "concurrent truncation:"))
    assert not (tmp_path / "failures").exists()


def test_bench_corrupt_memory_quick(tmp_path: Path) -> None:
    text = run_bench("bench_corrupt_memory.py", cwd=tmp_path)
    assert "input: synthetic-32m.seqstate" in text, text
    for spec in ("truncated_last_byte", "fill:value=nan,role=v,index=1,cells=3", "nan_rows_valid",
                 "swap_k_layers_0_1", "drop:role=k,index=1", "trailer:bytes=1048576 + cell_count_plus1"):
        assert re.search(rf"^{re.escape(spec)} +exit 0 +[\d.]+ s +peak RSS +[\d,]+ MiB", text, re.M), (spec, text)
