"""kvscope's own Dask cluster left without any worker (retired, or a nanny that no longer starts one):
the run stops with the tasks in flight named (ExecutorDied, which scan and migrate turn into the summary
and one line, exit 2) instead of polling for ever for a result nothing will compute (seen once in eight
replays of the long fuzz's stopped-worker family, bench/fuzz_fleet.py --seed 1 --replay workers:34)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from kvscope.core.fleet.daskpool import DaskPool
from kvscope.core.fleet.localpool import ExecutorDied

pytestmark = pytest.mark.slow  # a dask cluster whose workers go


def test_a_cluster_without_workers_stops_the_run_and_names_the_files_in_flight() -> None:
    outcome: dict[str, Any] = {}
    with DaskPool(jobs=1, batch=1) as pool:
        pool.no_worker_grace = 3.0
        items = [20.0, 20.0, 20.0]

        def run() -> None:
            try:
                outcome["results"] = list(pool.map(time.sleep, items, lambda item, why: {"error": why}))
            except ExecutorDied as e:
                outcome["died"] = e

        t = threading.Thread(target=run, daemon=True)
        t.start()
        time.sleep(2.0)  # the first file is running on the one worker
        pool._cluster.scale(0)  # every worker retired: nothing will ever run the files in flight
        t.join(60.0)
        assert not t.is_alive(), "the run still waits for a result no worker will compute"
    died = outcome.get("died")
    assert isinstance(died, ExecutorDied), outcome
    assert "no worker for 3 s" in str(died)
    assert died.pending and all(x == 20.0 for x in died.pending)


# imported by the preload only: nothing the test's own module or the task's unpickling imports
LAZY = ("kvscope.core.analysis.inspection", "kvscope.core.analysis.reuse", "kvscope.core.fleet.migrate")


def _imported(_: Any) -> list[str]:
    import sys

    return [m for m in LAZY if m not in sys.modules]


def test_a_fresh_worker_has_kvscope_imported_before_its_first_file() -> None:
    """The per-file deadline's clock starts as a file begins: a fresh worker's first file must not pay
    for kvscope's imports (dask's preload: kvscope.core.fleet.dask_preload). The check runs as the
    worker's first task and looks at sys.modules without importing anything itself."""
    with DaskPool(jobs=1, batch=1) as pool:
        results = list(pool.map(_imported, [0], lambda item, why: {"error": why}))
    assert results == [[]], results
