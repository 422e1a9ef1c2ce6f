"""The local executor's fork server killed for real during ``kvscope scan``/``migrate``: no file is blamed.

The fork server (multiprocessing's, which forks the workers) is sent SIGKILL while its workers read
slow, real-format files. Its workers outlive it, but their exits can no longer be heard: before, every
file in flight was charged ``worker died: exit status 255``. Now the pool is restarted once and the
files in flight run again, with one note; a second death stops the run with one line, exit 2, and the
summary of what was done, naming in ``--json`` every file that got no result.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import psutil
import pytest

from kvharness.fixtures import DATA
from kvharness.fleet_tree import ServerKiller, write_slow_state
from kvscope.core.cli.main import main
from kvscope.core.fleet.tree_scan import scan_file

pytestmark = pytest.mark.slow  # a dask scheduler killed mid-run

SMALL = ("llama-f16-fa0-unified0-seq0.seqstate", "llama-f16-fa0-unified1-seq1.seqstate",
         "lfm2-f16-fa0-unified0-seq1.seqstate", "llama-f16-fa0-unified0-ctx.session")


def _tree(tmp_path: Path, slow: int = 3) -> tuple[Path, list[Path]]:
    root = tmp_path / "slots"
    (root / "x").mkdir(parents=True)
    for i, name in enumerate(SMALL):
        shutil.copyfile(DATA / "llamacpp-2026-10-01" / name, root / ("x" if i % 2 else "") / name)
    slows = [write_slow_state(root / "x" / f"slow{i}.seqstate") for i in range(slow)]
    return root, slows


def _files(root: Path) -> set[str]:
    return {str(p) for p in root.rglob("*") if p.is_file()}


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _no_workers_left(killer: ServerKiller) -> None:
    """No worker of the run still runs: neither the killed servers' (orphans now) nor the new server's."""
    import multiprocessing.forkserver as fs

    assert killer.orphans, "no worker was seen under the killed fork server"
    server = fs._forkserver._forkserver_pid
    end = time.monotonic() + 15
    while True:
        left = [p for p in killer.orphans if _running(p)]
        if server is not None and _running(server):
            left += [c.pid for c in psutil.Process(server).children() if _running(c.pid)]
        if not left or time.monotonic() > end:
            break
        time.sleep(0.1)
    assert not left, left


def _scan(root: Path, killer: ServerKiller, capsys: pytest.CaptureFixture[str], *extra: str
          ) -> tuple[int, list[dict], dict, str]:
    killer.start()
    try:
        rc = main(["scan", str(root), "--json", "--jobs", "2", *extra])
    finally:
        killer.stop()
        killer.join()
    out = capsys.readouterr()
    docs = [json.loads(line) for line in out.out.splitlines()]
    return rc, docs[:-1], docs[-1]["summary"], out.err


def test_killed_fork_server_restarts_the_pool_and_blames_no_file(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    root, slows = _tree(tmp_path)
    killer = ServerKiller(slows, signal.SIGKILL, times=1)
    rc, lines, summary, err = _scan(root, killer, capsys)
    assert len(killer.victims) == 1, "the fork server was never seen with a slow file in flight"
    assert "Traceback" not in err
    by_path = {r["path"]: r for r in lines}
    assert len(lines) == len(by_path) and set(by_path) == _files(root)
    for path, r in by_path.items():  # not one file charged: each the answer of a scan in this process
        assert r == scan_file(path), path
    notes = [ln for ln in err.splitlines() if "fork server died" in ln]
    assert len(notes) == 1 and notes[0].startswith("kvscope: note: the local executor's fork server died (SIGKILL)")
    assert summary["executor_restarts"] == 1 and summary["workers_lost"] == 0
    assert summary["executor_events"] == [notes[0].removeprefix("kvscope: note: ")]
    assert "not_scanned" not in summary
    assert rc == 0
    _no_workers_left(killer)


def test_fork_server_killed_twice_stops_with_one_line_and_names_the_rest(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    root, slows = _tree(tmp_path, slow=4)
    killer = ServerKiller(slows, signal.SIGKILL, times=2)
    rc, lines, summary, err = _scan(root, killer, capsys)
    assert len(killer.victims) == 2
    assert rc == 2
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("kvscope: the local executor's fork server died (SIGKILL) again after a restart: "
                           f"stopped; {summary['not_scanned']} file"), last
    scanned = [r["path"] for r in lines]
    assert not any(r["status"] == "error" for r in lines), lines  # no file is blamed
    missing = summary["not_scanned_files"]
    assert summary["not_scanned"] == len(missing) >= 1
    assert set(scanned).isdisjoint(missing) and len(set(scanned)) == len(scanned)
    assert set(scanned) | set(missing) == _files(root)  # every file scanned once or named
    assert summary["files"] == len(scanned) and summary["executor_restarts"] == 2
    _no_workers_left(killer)


def test_text_summary_says_it_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, slows = _tree(tmp_path)
    killer = ServerKiller(slows, signal.SIGKILL, times=1)
    killer.start()
    try:
        rc = main(["scan", str(root), "--jobs", "2"])
    finally:
        killer.stop()
        killer.join()
    out = capsys.readouterr()
    assert len(killer.victims) == 1
    assert out.out.count("fork server died") == 1 and out.err.count("fork server died") == 1
    assert "worker died" not in out.out and rc == 0


def test_migrate_after_a_killed_fork_server_writes_every_file(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    root, slows = _tree(tmp_path, slow=2)
    dest = tmp_path / "dest"
    killer = ServerKiller(slows, signal.SIGKILL, times=1)
    killer.start()
    try:
        rc = main(["migrate", str(root), "--layout", "2026-10-v4", "--out", str(dest), "--json", "--jobs", "2"])
    finally:
        killer.stop()
        killer.join()
    out = capsys.readouterr()
    assert len(killer.victims) == 1 and "Traceback" not in out.err
    docs = [json.loads(line) for line in out.out.splitlines()]
    lines, summary = docs[:-1], docs[-1]["summary"]
    assert sorted(r["rel"] for r in lines) == sorted(os.path.relpath(p, root) for p in _files(root))
    assert not any(r["action"] == "error" for r in lines), lines
    assert summary["executor_restarts"] == 1 and summary["workers_lost"] == 0
    assert not [p for p in dest.rglob("*") if p.name.startswith(".kvscope-tmp")]
    assert rc in (0, 1)
    _no_workers_left(killer)
