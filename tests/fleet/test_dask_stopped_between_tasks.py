"""A worker of kvscope's own Dask cluster stopped (SIGSTOP, for real) between two tasks: after its last
result went out and before its next task began. Its mark still names the finished task, so the per-file
deadline never ran for the tasks the scheduler gave it next, and the scheduler still counted it (no
``no_worker_grace`` either): the run waited for ever. The fuzz's stopped-worker family
(bench/fuzz_fleet.py --seed 1 --replay workers:34, under load) can stop a worker there: its signaller
sees the slow file open, and the signal lands a few ms later, after the file's task has finished.
Now a worker that holds tasks and has begun none of them for the deadline is killed, and its tasks are
run again on the one its nanny starts, not charged."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from functools import partial
from typing import Any

import pytest

from kvscope.core.fleet.daskpool import DaskPool

pytestmark = pytest.mark.slow  # dask workers stopped between tasks


def _pid(_: Any) -> int:
    return os.getpid()


def _double(x: int) -> int:
    return 2 * x


def test_a_worker_stopped_between_tasks_is_killed_and_its_tasks_run_again() -> None:
    with DaskPool(jobs=1, batch=1, timeout=2.0) as pool:
        pool.begin_grace = 3.0
        pool.no_worker_grace = 120.0  # not what ends this run: the stopped worker is still counted
        (stopped,) = list(pool.map(_pid, [0], lambda item, why: why))
        os.kill(stopped, signal.SIGSTOP)  # idle: its mark names the finished task
        outcome: dict[str, Any] = {}

        def run() -> None:
            outcome["results"] = list(pool.map(_double, [1, 2, 3], lambda item, why: f"error: {why}"))

        t = threading.Thread(target=run, daemon=True)
        start = time.monotonic()
        t.start()
        try:
            t.join(45.0)
            took = time.monotonic() - start
            assert not t.is_alive(), "the run still waits for tasks given to a stopped worker"
        finally:
            with contextlib.suppress(ProcessLookupError):  # the old code left it stopped: let the cluster close
                os.kill(stopped, signal.SIGKILL)
            t.join(30.0)
    assert sorted(outcome["results"]) == [2, 4, 6], outcome  # run again, not charged
    assert took < 30.0, took


def _stop_after_returning(x: int, flag: str) -> int:
    """Return ``x``; the first time, stop this worker process 0.5 s later: its result is out (the
    scheduler has it finished) and still held by the worker, not yet fetched by the client."""
    if x == 2 and not os.path.exists(flag):
        open(flag, "w").close()
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGSTOP)).start()
    return x


def test_a_worker_stopped_holding_a_finished_result_is_killed_and_the_task_run_again(tmp_path: Any) -> None:
    """Seen with the real `kvscope scan` too: a stop 50-70 ms after the worker closed the slow file
    (the late edge of the fuzz's signaller) left the client fetching the result for ever (4 of 4 runs
    with the old code; the run ends in ~12 s now)."""
    flag = str(tmp_path / "stopped-once")
    with DaskPool(jobs=1, batch=1, timeout=2.0) as pool:
        pool.begin_grace = 3.0
        gen = pool.map(partial(_stop_after_returning, flag=flag), [1, 2], lambda item, why: f"error: {why}")
        first = next(gen)
        time.sleep(2.0)  # the second task has finished, its worker is stopped, its result not fetched
        (pid,) = [n.pid for n in pool._cluster.workers.values()]
        outcome: dict[str, Any] = {}
        t = threading.Thread(target=lambda: outcome.setdefault("rest", list(gen)), daemon=True)
        t.start()
        try:
            t.join(45.0)
            assert not t.is_alive(), "the run still fetches a result from a stopped worker"
        finally:
            with contextlib.suppress(ProcessLookupError):  # the old code left it stopped: let the cluster close
                os.kill(pid, signal.SIGKILL)
            t.join(30.0)
    assert sorted([first, *outcome["rest"]]) == [1, 2], outcome  # run again, not charged
