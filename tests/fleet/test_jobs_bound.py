"""``--jobs N`` starts no more worker processes than there are files, nor more than the machine's bound.

Issue #31 item 11: ``kvscope scan --jobs 1000000000`` on 4 files started a billion workers one after
another (about 60 processes a second) until it was killed. The local executor now starts a worker
for each item it hands out, up to ``--jobs`` (capped at :func:`kvscope.core.fleet.executors.job_limit`,
with a note), so 4 files get at most 4 workers.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import psutil
import pytest

from kvharness.fixtures import DATA
from kvharness.proc_runs import CHILD
from kvscope.core.cli.main import main
from kvscope.core.fleet.executors import job_limit
from kvscope.core.fleet.localpool import LocalPool
from kvscope.core.fleet.scanfile import scan_entry
from kvscope.core.fleet.source import open_source

SLOT = DATA / "llamacpp-2026-10-01/llama-f16-fa0-unified0-seq0.seqstate"


def _four_files(root: Path) -> Path:
    for i in range(4):
        (root / f"d{i % 2}").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SLOT, root / f"d{i % 2}" / f"slot{i}.bin")
    return root


def _error(entry: object, reason: str) -> dict[str, object]:
    return {"path": str(entry), "status": "error", "reason": reason}


def test_pool_starts_no_more_workers_than_items(tmp_path: Path) -> None:
    source = open_source(str(_four_files(tmp_path / "src")))
    entries = list(source.walk())[:2]
    with LocalPool(8) as pool:
        results = list(pool.map(partial(scan_entry, model=None, target=None), entries, _error))
        assert len(results) == 2 and all(r["status"] == "parsed" for r in results), results
        assert len(pool._workers) == 2  # not 8 for 2 files


def test_pool_jobs_are_capped() -> None:
    assert LocalPool(10**9).jobs == job_limit()


def test_scan_with_a_billion_jobs_on_four_files_ends_with_four_workers(tmp_path: Path) -> None:
    """The real command as a child: every process it starts is counted (psutil, polled) while it runs."""
    root = _four_files(tmp_path / "src")
    p = subprocess.Popen([sys.executable, "-c", CHILD, "scan", str(root), "--json", "--jobs", "1000000000"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    me = psutil.Process(p.pid)
    seen: set[int] = set()
    end = time.monotonic() + 60
    try:
        while p.poll() is None and time.monotonic() < end and len(seen) <= 4 + 2:
            with contextlib.suppress(psutil.Error):
                seen.update(c.pid for c in me.children(recursive=True))
            time.sleep(0.005)
    finally:
        if p.poll() is None:
            p.kill()
        out, err = p.communicate(timeout=30)
    # the workers, plus multiprocessing's fork server and resource tracker
    assert len(seen) <= 4 + 2, f"{len(seen)} processes started for 4 files (rc {p.returncode})"
    assert p.returncode == 0, err
    docs = [json.loads(line) for line in out.splitlines()]
    assert len(docs) == 5 and docs[-1]["summary"]["files"] == 4
    assert err.count("\n") == 1 and err.startswith("kvscope: note: --jobs 1000000000 capped to "), err


@pytest.mark.parametrize("jobs", ["0", "-3"])
def test_jobs_below_one_is_a_usage_error(tmp_path: Path, jobs: str, capsys: pytest.CaptureFixture[str]) -> None:
    root = _four_files(tmp_path / "src")
    assert main(["scan", str(root), "--jobs", jobs]) == 2
    err = capsys.readouterr().err
    assert err == "kvscope: --jobs must be at least 1\n"
