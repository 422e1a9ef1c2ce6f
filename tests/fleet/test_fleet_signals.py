"""Signals at random points of ``scan`` and ``migrate``, on both executors, then a look for leftovers.

Each run is a real ``kvscope`` child in its own session, with its own ``TMPDIR``; the signal
comes after a random number of output lines (seeded: the seed is in every message). After
SIGTERM or SIGHUP the child must exit ``128 + signal`` with one line on stderr (no traceback,
no leaked-semaphore warning) and leave nothing: no process of its session, nothing in its
``TMPDIR`` (``pymp-*``, ``kvscope-dask-*``, ``dask-scratch-space``), no temporary in DEST. After
SIGKILL (nothing can clean up) a rerun must end with no ``.kvscope-tmp-*`` in DEST and the same
outputs as a run never interrupted.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from kvharness.fleet_tree import build_tree, write_slow_state
from kvharness.proc_runs import CHILD

pytestmark = pytest.mark.slow  # signals to real scan/migrate runs

SEED = int(os.environ.get("KVSCOPE_TEST_SEED", "20"))
WAIT = 180.0


def _tree(tmp_path: Path) -> tuple[Path, int]:
    root = tmp_path / "root"
    n = len(build_tree(root, tmp_path / "outside"))
    write_slow_state(root / "slots" / "a" / "big-slow.bin", cells=600_000)
    return root, n + 1


def _session_processes(sid: int) -> list[int]:
    out = []
    for pid in psutil.pids():
        try:
            if os.getsid(pid) == sid:
                out.append(pid)
        except OSError:
            continue
    return out


@pytest.fixture
def run_tmp() -> Iterator[Path]:
    """The child's TMPDIR: short, as multiprocessing's AF_UNIX sockets live there (at most 107 bytes of path;
    pytest-xdist's tmp_path, ``.../popen-gw1/test_migrate_stopped_then_kil0/tmp``, leaves too little)."""
    d = Path(tempfile.mkdtemp(prefix="kvs-sig-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _run_until(args: list[str], tmpdir: Path, lines: int, sig: int) -> tuple[int, str, int]:
    """Start the child, send ``sig`` after ``lines`` lines of its stdout (or at its end); (status, stderr, sid)."""
    tmpdir.mkdir(exist_ok=True)
    env = dict(os.environ, TMPDIR=str(tmpdir))
    p = subprocess.Popen([sys.executable, "-c", CHILD, *args, "--json", "--jobs", "2"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env, start_new_session=True, text=True)
    assert p.stdout is not None and p.stderr is not None
    seen = 0
    while seen < lines and p.stdout.readline():
        seen += 1
    if p.poll() is None:
        p.send_signal(sig)
    p.stdout.read()
    err = p.stderr.read()
    p.stdout.close()
    p.stderr.close()
    return p.wait(WAIT), err, p.pid


def _gone(sid: int, tmpdir: Path) -> tuple[list[int], list[str]]:
    """What the session left: processes, and names in its TMPDIR (given time to go)."""
    end = time.monotonic() + 30
    while True:
        procs, names = _session_processes(sid), sorted(str(p.relative_to(tmpdir)) for p in tmpdir.rglob("*"))
        if (not procs and not names) or time.monotonic() > end:
            return procs, names
        time.sleep(0.2)


def _temporaries(dest: Path) -> list[str]:
    return [str(p) for p in dest.rglob(".kvscope-tmp-*")] if dest.exists() else []


@pytest.mark.parametrize(("executor", "sig"), [("local", signal.SIGTERM), ("local", signal.SIGHUP),
                                               ("dask", signal.SIGTERM), ("dask", signal.SIGHUP)])
def test_scan_stopped_by_a_signal_leaves_nothing(tmp_path: Path, run_tmp: Path, executor: str, sig: int) -> None:
    root, n = _tree(tmp_path)
    rng = random.Random(f"{SEED}-scan-{executor}-{sig}")
    at = rng.randrange(0, n // 2)
    rc, err, sid = _run_until(["scan", str(root), "--executor", executor], run_tmp, at, sig)
    why = f"seed {SEED}, {signal.Signals(sig).name} after {at} lines: {err[-2000:]}"
    if rc == -sig:  # it came before the command began (Python's start-up, imports): nothing to clean yet
        assert at == 0 and err == "", why
    else:
        assert rc == 128 + sig, why
        assert err.strip().splitlines()[-1] == f"kvscope: stopped by {signal.Signals(sig).name}", why
    assert "Traceback" not in err and "leaked" not in err, why
    procs, names = _gone(sid, run_tmp)
    assert procs == [] and names == [], (procs, names, why)


@pytest.mark.parametrize("executor", ["local", "dask"])
def test_migrate_stopped_then_killed_then_rerun(tmp_path: Path, run_tmp: Path, executor: str) -> None:
    root, n = _tree(tmp_path)
    rng = random.Random(f"{SEED}-migrate-{executor}")
    dest, clean = tmp_path / "dest", tmp_path / "clean"
    common = ["--layout", "v4", "--executor", executor]
    # SIGTERM: the run ends cleaned up, DEST included
    at = rng.randrange(0, n // 2)
    rc, err, sid = _run_until(["migrate", str(root), "--out", str(dest), *common], run_tmp, at,
                              signal.SIGTERM)
    why = f"seed {SEED}, SIGTERM after {at} lines: {err[-2000:]}"
    assert rc == 128 + signal.SIGTERM or (rc == -signal.SIGTERM and at == 0 and err == ""), why
    assert "Traceback" not in err and "leaked" not in err, why
    assert _gone(sid, run_tmp) == ([], []), why
    assert _temporaries(dest) == [], why
    # SIGKILL of the client (and of its workers: its whole session) at a random point
    at = rng.randrange(0, n)
    rc, err, sid = _run_until(["migrate", str(root), "--out", str(dest), *common], run_tmp, at,
                              signal.SIGKILL)
    for pid in _session_processes(sid):
        psutil.Process(pid).kill()
    # a rerun completes the migration and leaves no temporary behind
    rc, err, _ = _run_until(["migrate", str(root), "--out", str(dest), *common], run_tmp / "rerun", n + 10,
                            signal.SIGTERM)
    assert rc == 1 and "Traceback" not in err, f"seed {SEED}: {err[-2000:]}"
    assert _temporaries(dest) == []
    rc_clean, _, _ = _run_until(["migrate", str(root), "--out", str(clean), "--layout", "v4"], run_tmp / "clean",
                                n + 10, signal.SIGTERM)  # the local executor's outputs: the same by design
    assert rc_clean == 1
    assert _outputs(dest) == _outputs(clean)


def _outputs(dest: Path) -> dict[str, Any]:
    return {p.relative_to(dest).as_posix(): p.read_bytes() for p in dest.rglob("*")
            if p.is_file() and p.name != ".kvscope-migrate.jsonl"}
