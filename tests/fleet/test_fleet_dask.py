"""``kvscope scan --executor dask`` on a real ``dask.distributed`` LocalCluster with worker processes.

The results must equal the local executor's line for line (order aside), and a worker process
killed for real while it reads a file costs at most that file.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from distributed import Client, LocalCluster

from kvharness.fleet_tree import Killer, build_tree, write_slow_state
from kvscope.core.cli.main import main

pytestmark = pytest.mark.slow  # real dask clusters


def _scan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[dict[str, Any]], dict[str, Any]]:
    rc = main(["scan", *args, "--json"])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err, captured.err
    docs = [json.loads(line) for line in captured.out.splitlines()]
    return rc, docs[:-1], docs[-1]["summary"]


def _key(r: dict[str, Any]) -> str:
    return json.dumps(r, sort_keys=True)


def _tree(tmp_path: Path, slow: bool = False) -> Path:
    root = tmp_path / "root"
    build_tree(root, tmp_path / "outside")
    if slow:
        write_slow_state(root / "slots" / "a" / "big-slow.bin")
    return root


def test_dask_results_equal_local_executor(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = str(_tree(tmp_path))
    rc_l, local, s_l = _scan(capsys, root, "--target", "v4", "--jobs", "2")
    rc_d, dask, s_d = _scan(capsys, root, "--target", "v4", "--executor", "dask", "--jobs", "2", "--batch", "3")
    assert sorted(map(_key, dask)) == sorted(map(_key, local))
    assert len(local) == s_l["files"] == s_d["files"] > 15
    assert s_d["executor"] == "dask" and s_l["executor"] == "local"
    same = ("status", "kinds", "layouts", "verdicts", "findings", "codes", "target", "files_with_errors")
    assert {k: s_d[k] for k in same} == {k: s_l[k] for k in same}
    assert rc_d == rc_l == 1


def test_dask_worker_killed_twice_costs_one_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The first death splits the slow file's batch (re-run one file per task); the second charges it."""
    root = _tree(tmp_path, slow=True)
    slow = root / "slots" / "a" / "big-slow.bin"
    _, local, _ = _scan(capsys, str(root), "--jobs", "2")
    killer = Killer(slow, signal.SIGKILL, times=2)
    killer.start()
    try:
        rc, dask, summary = _scan(capsys, str(root), "--executor", "dask", "--jobs", "2")
    finally:
        killer.stop()
        killer.join()
    assert len(killer.victims) == 2, "the slow file was not seen open twice"
    dead = [r for r in dask if r["status"] == "error"]
    assert [r["path"] for r in dead] == [str(slow)], dead
    assert dead[0]["reason"].startswith("worker died: SIGKILL") and "dask worker tcp://" in dead[0]["reason"]
    others = [r for r in dask if r["path"] != str(slow)]
    assert sorted(map(_key, others)) == sorted(_key(r) for r in local if r["path"] != str(slow))
    assert summary["files"] == len(local) and summary["status"]["error"] == 1 and summary["workers_lost"] == 2
    assert rc == 1


def test_external_scheduler_retries_a_killed_worker(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """On the user's own cluster its scheduler re-runs a task whose worker died: no file is lost."""
    root = _tree(tmp_path, slow=True)
    _, local, _ = _scan(capsys, str(root), "--jobs", "2")
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      silence_logs=logging.CRITICAL, host="127.0.0.1",
                      scheduler_kwargs={"dashboard": False, "dashboard_address": "127.0.0.1:0"}) as cluster, \
            Client(cluster, set_as_default=False) as client:
        killer = Killer(root / "slots" / "a" / "big-slow.bin", signal.SIGKILL)
        killer.start()
        try:
            rc, dask, summary = _scan(capsys, str(root), "--executor", "dask", "--scheduler", cluster.scheduler_address)
        finally:
            killer.stop()
            killer.join()
        assert killer.victim is not None
        assert sorted(map(_key, dask)) == sorted(map(_key, local))
        assert summary["executor"] == "dask"
        assert client.submit(sum, [1, 2], pure=False).result() == 3  # kvscope left the cluster running
    assert rc == 1


def test_results_lost_with_their_workers_are_run_again(tmp_path: Path) -> None:
    """Workers killed while finished results wait on them (the scan paused) cost no file: each such
    task, its future gone ``lost``, is run once more."""
    from functools import partial

    from kvscope.core.cli.scan_command import scan_error
    from kvscope.core.fleet.daskpool import DaskPool
    from kvscope.core.fleet.scanfile import scan_entry
    from kvscope.core.fleet.source import open_source

    root = _tree(tmp_path)
    source = open_source(str(root))
    fn = partial(scan_entry, model=None, target=None)
    expected = sorted(_key(fn(e)) for e in source.walk())
    with DaskPool(jobs=2, batch=1) as pool:
        results = pool.map(fn, source.walk(), scan_error)
        got = [next(results)]
        client = pool.client
        deadline = time.monotonic() + 60
        held = running = 0  # finished results waiting on the workers; tasks still running there
        while time.monotonic() < deadline and (held < 3 or running):
            held = sum(len(keys) for keys in client.has_what().values())
            running = sum(len(keys) for keys in client.processing().values())
            time.sleep(0.01)
        assert held >= 3 and not running, (held, running)
        pids = client.run(os.getpid)
        for pid in pids.values():
            os.kill(pid, signal.SIGKILL)
        while time.monotonic() < deadline and set(pids) & set(client.scheduler_info()["workers"]):
            time.sleep(0.01)  # until the scheduler has seen them go (the waiting results are lost then)
        got.extend(results)
    assert not [r for r in got if r["status"] == "error"]
    assert sorted(map(_key, got)) == expected
