"""Item 2 of issue 12: an untrusted size never drives allocation (sparse giant tails).

A real sequence file extended with a hole to 1 GB and to 50 GB (``truncate -s``: a few KB on
disk) used to push ``inspect --json`` to 2.6 GB and past 6 GB: the trailing-bytes check read the
tail as cell records and built arrays 1.5 times its size. The check now looks at a bounded
number of records (``MAX_PLAUSIBLE_CELLS``) and builds no table at all (``scan_extent``), so the
peak stays under a fixed bound whatever the tail's size.
"""

from __future__ import annotations

import json
import os
import struct
import tracemalloc
from pathlib import Path

import pytest

from kvharness.fixtures import DATA
from kvscope.core.reader.cells import OPEN_SCAN_RECORDS, WINDOW_WORDS, scan_cells, scan_extent
from kvscope.core.reader.parse import read_state
from kvscope.core.reader.source import ByteSource
from tests.support.bigstate import run_kvscope, sparse_copy

pytestmark = pytest.mark.slow  # GiB-sized sparse files

SEQ = DATA / "llamacpp-2026-10-01" / "llama-f16-fa0-unified0-seq0.seqstate"
RSS_BOUND_MIB = 200
GB = 1 << 30


def _sparse(tmp_path: Path, size: int, src: Path = SEQ) -> Path:
    path = tmp_path / f"tail-{size >> 30}g.seqstate"
    if not sparse_copy(src, path, size):
        pytest.fail(f"{tmp_path}: the file system does not keep holes (the test needs sparse files)")
    return path


@pytest.mark.parametrize("size", [1 * GB, 50 * GB])
def test_inspect_json_sparse_tail_peak_rss(tmp_path: Path, size: int) -> None:
    path = _sparse(tmp_path, size)
    out = tmp_path / "out.json"
    r = run_kvscope("inspect", "--json", str(path), stdout_to=out, timeout=120)
    assert r.rc == 0, r.err
    assert 0 < r.hwm_mib < RSS_BOUND_MIB, f"peak RSS {r.hwm_mib:.0f} MiB on a {size >> 30} GB sparse tail"
    doc = json.loads(out.read_text())
    tail = next(f for f in doc["findings"] if f["code"] == "trailing_bytes")
    assert tail["length"] == size - SEQ.stat().st_size and tail["extra"]["looks_like_cells"] is None
    assert doc["coverage"]["trailing_bytes"] == tail["length"]


def test_text_and_stats_on_a_sparse_tail(tmp_path: Path) -> None:
    path = _sparse(tmp_path, 50 * GB)
    r = run_kvscope("inspect", "--stats", str(path), timeout=120)
    assert r.rc == 0 and "trailing_bytes" in r.out, r.err
    assert r.hwm_mib < RSS_BOUND_MIB


def test_parse_allocation_is_bounded(tmp_path: Path) -> None:
    """tracemalloc peak of the parse (Python and numpy allocations) on a 50 GB tail."""
    path = _sparse(tmp_path, 50 * GB)
    tracemalloc.start()
    try:
        res = read_state(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert res.kind == "seq_file" and res.size == 50 * GB
    assert peak < 32 << 20, f"parse peak {peak >> 20} MiB"


def test_scan_extent_is_window_bounded(tmp_path: Path) -> None:
    """An open-ended record scan over 8 GB of zeros: counts at most max_records, memory one window."""
    path = tmp_path / "zeros.bin"
    path.touch()
    os.truncate(path, 8 * GB)
    src = ByteSource.open(path)
    tracemalloc.start()
    try:
        ext = scan_extent(src, 0, 0, src.size, OPEN_SCAN_RECORDS)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert ext.count == OPEN_SCAN_RECORDS and ext.end == 8 * OPEN_SCAN_RECORDS and ext.reason == ""
    assert ext.end_after(ext.count) == ext.end and ext.end_after(ext.count - 3) == ext.end - 24
    assert peak < 4 * WINDOW_WORDS * 4 + (4 << 20), f"scan_extent peak {peak >> 20} MiB"
    # an open-ended table scan is bounded by max_records too
    scan = scan_cells(src, 0, None, 0, src.size, max_records=1000)
    assert scan.table is not None and scan.table.count == 1000 and scan.end == 8000
    src.close()


def test_sparse_cell_count_claim(tmp_path: Path) -> None:
    """A stream claiming 2**24 cells over a hole: read as what it is, in bounded time and memory."""
    path = tmp_path / "claim.seqstate"
    with open(path, "wb") as fh:
        fh.write(struct.pack("<III", 0x67677371, 3, 0) + struct.pack("<II", 1, 1 << 24))
    os.truncate(path, 20 + (1 << 24) * 8 // 2)  # half of the claimed records: a truncated table
    r = run_kvscope("inspect", str(path), timeout=120)
    assert r.rc == 1, r.err
    assert "cell meta (8388608 of 16777216 records present)" in r.out
    assert r.hwm_mib < 600, f"peak RSS {r.hwm_mib:.0f} MiB for 8M records of 8 bytes (64 MiB of table)"


def test_output_count_over_a_sparse_tail_is_bounded(tmp_path: Path) -> None:
    """A damaged DSV4 context state over a 20 GB hole: read under an older layout (whose context
    state has outputs) its n_outputs claims billions of output ids that the hole holds. They are
    refused as implausible, not read into a list (that attempt hung the long fuzz for minutes).
    """
    src = DATA / "fuzz-regressions" / "sparse-outputs-ab37c6d5b6-67000.bin"
    path = _sparse(tmp_path, 20 * GB, src)
    r = run_kvscope("inspect", "--json", str(path), "--model", str(DATA / "gen-models" / "deepseek4.gguf"),
                    stdout_to=tmp_path / "out.json", timeout=60)
    assert r.rc == 1, r.err
    assert r.hwm_mib < RSS_BOUND_MIB
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["kind"] == "context_blob" and doc["size"] == 20 * GB


def test_implausible_output_count_is_a_finding() -> None:
    """The same refusal where the layout has outputs (a 2025-08 context state), at its offset."""
    src = DATA / "llamacpp-2025-08-14" / "gemma2-f16-fa0-unified0-swafull1-ctx.state.bin"
    res = read_state(src)
    assert res.outputs is not None and not [f for f in res.findings if f.severity == "error"]
    off = int(res.outputs["offset"])
    data = bytearray(src.read_bytes())
    data[off : off + 4] = struct.pack("<I", (1 << 24) + 1)
    bad = read_state(data=bytes(data), layout=res.layout.name)
    assert any(f.code == "value_invalid" and f.offset == off and "implausible" in f.message for f in bad.findings)
