"""``kvscope scan`` survives a worker that dies: the file it was reading gets an error line, the rest go on.

A real worker process of the scan is sent SIGKILL (as the out-of-memory killer would) or SIGBUS
(as a mapping of a file that shrinks would) by the test while it reads a slow, real-format file.
"""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest

from kvharness.fixtures import DATA
from kvharness.fleet_tree import Killer, write_slow_state
from kvscope.core.cli.main import main
from kvscope.core.fleet.tree_scan import scan_file, scan_tree

SMALL = ("llama-f16-fa0-unified0-seq0.seqstate", "llama-f16-fa0-unified1-seq1.seqstate",
         "lfm2-f16-fa0-unified0-seq1.seqstate", "llama-f16-fa0-unified0-ctx.session",
         "llama-f16-fa0-unified0-seq2.seqdata.bin", "tiny-mamba.gguf")


def _tree(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "slots"
    (root / "x").mkdir(parents=True)
    for i, name in enumerate(SMALL):
        shutil.copyfile(DATA / "llamacpp-2026-10-01" / name, root / ("x" if i % 2 else "") / name)
    slow = write_slow_state(root / "x" / "slow.seqstate")
    return root, slow


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGBUS])
def test_dead_worker_costs_its_file_only(tmp_path: Path, sig: int) -> None:
    root, slow = _tree(tmp_path)
    killer = Killer(slow, sig)
    killer.start()
    try:
        results = list(scan_tree(str(root), jobs=2))
    finally:
        killer.stop()
        killer.join()
    assert killer.victim is not None, "the slow file was never seen open by a worker"
    by_path = {r["path"]: r for r in results}
    assert len(results) == len(by_path) == len(SMALL) + 1
    dead = by_path.pop(str(slow))
    assert dead["status"] == "error"
    assert dead["reason"].startswith(f"worker died: {signal.Signals(sig).name}"), dead
    for path, r in by_path.items():  # every other file: the same answer as a scan in this process
        assert r == scan_file(path), path


def test_cli_reports_the_dead_worker_and_counts_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, slow = _tree(tmp_path)
    killer = Killer(slow, signal.SIGKILL)
    killer.start()
    try:
        rc = main(["scan", str(root), "--json", "--jobs", "2"])
    finally:
        killer.stop()
        killer.join()
    out = capsys.readouterr()
    assert killer.victim is not None
    assert "Traceback" not in out.err and "BrokenProcessPool" not in out.err
    docs = [json.loads(line) for line in out.out.splitlines()]
    lines, summary = docs[:-1], docs[-1]["summary"]
    assert len(lines) == len(SMALL) + 1
    assert [d["status"] for d in lines].count("error") == 1
    assert next(d for d in lines if d["path"] == str(slow))["reason"].startswith("worker died: SIGKILL")
    assert summary["files"] == len(SMALL) + 1 and summary["status"]["error"] == 1
    assert rc == 1
