"""A worker that stops answering (SIGSTOP, for real) costs at most its file, on both executors; the run ends
with its summary instead of hanging.

The per-file deadline (``--file-timeout``) is short here; the stopped worker is killed once it
passes and no stopped process is left behind.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from kvharness.fleet_tree import Killer, build_tree, write_slow_state
from kvscope.core.cli.main import main

pytestmark = pytest.mark.slow  # stopped runs

TIMEOUT = "5"


def _scan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[dict[str, Any]], dict[str, Any]]:
    rc = main(["scan", *args, "--json", "--jobs", "2"])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err, captured.err
    docs = [json.loads(line) for line in captured.out.splitlines()]
    return rc, docs[:-1], docs[-1]["summary"]


def _key(r: dict[str, Any]) -> str:
    return json.dumps(r, sort_keys=True)


def _no_stopped_descendants() -> bool:
    end = time.monotonic() + 30
    while time.monotonic() < end:
        try:
            kids = [p for p in psutil.Process().children(recursive=True) if p.status() == psutil.STATUS_STOPPED]
        except psutil.NoSuchProcess:
            continue
        if not kids:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("executor", ["local", "dask"])
def test_stopped_worker_costs_at_most_its_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               executor: str) -> None:
    root = tmp_path / "root"
    build_tree(root, tmp_path / "outside")
    slow = write_slow_state(root / "slots" / "a" / "big-slow.bin")
    _, local, _ = _scan(capsys, str(root))
    stopper = Killer(slow, signal.SIGSTOP)
    stopper.start()
    try:
        rc, lines, summary = _scan(capsys, str(root), "--executor", executor, "--file-timeout", TIMEOUT)
    finally:
        stopper.stop()
        stopper.join()
    assert stopper.victim is not None, "the slow file was never seen open by a worker"
    assert summary["files"] == len(local) == len(lines)
    failed = [r for r in lines if r["status"] == "error"]
    assert [r["path"] for r in failed] in ([], [str(slow)]), failed
    if failed:  # local: the file of a worker past its deadline; dask: only if it timed out alone as well
        assert failed[0]["reason"].startswith("timed out: no result after 5 s"), failed
    others = [r for r in lines if r["path"] != str(slow)]
    assert sorted(map(_key, others)) == sorted(_key(r) for r in local if r["path"] != str(slow))
    if executor == "local":
        assert len(failed) == 1 and summary["workers_lost"] == 1
    assert rc == 1
    assert _no_stopped_descendants()
    assert not psutil.pid_exists(stopper.victim) or psutil.Process(stopper.victim).status() == psutil.STATUS_ZOMBIE
