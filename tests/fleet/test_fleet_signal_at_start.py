"""A stop that lands while kvscope's own Dask cluster is starting (inside ``LocalCluster()``) still
leaves nothing: found by ``bench/fuzz_fleet.py`` (signals family, seed 1, inputs 21 and 33).

Before, the constructor was cut short, so no cluster object came back to close: SIGINT ended with
dask's exit hook printing a traceback (``AssertionError: Status.init``), SIGHUP left the
``kvscope-dask-*`` folder with its scratch space's lock files in TMPDIR (workers still starting
wrote them after the folder was removed), and a signal a little later printed dask's own error
lines ("distributed.diskutils - ERROR - Failed to remove ..."). The signal is sent here the moment
the run's private folder appears (kvscope makes it just before it builds the cluster), or the
moment the scheduler's scratch space appears in it (the cluster half built).
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from kvharness.fleet_tree import build_tree
from kvharness.proc_runs import leftovers, run_until, temporaries

pytestmark = pytest.mark.slow  # signals while a cluster starts

MOMENTS = {"folder": "kvscope-dask-*", "scratch": "kvscope-dask-*/scratch/dask-scratch-space"}


@pytest.mark.parametrize("moment", sorted(MOMENTS))
@pytest.mark.parametrize(("command", "sig"), [("scan", signal.SIGINT), ("scan", signal.SIGTERM),
                                              ("migrate", signal.SIGHUP)])
def test_a_stop_while_the_cluster_starts_leaves_nothing(tmp_path: Path, command: str, sig: int, moment: str) -> None:
    root, dest, tmp = tmp_path / "root", tmp_path / "dest", tmp_path / "tmp"
    build_tree(root)
    args = [command, str(root), "--executor", "dask", "--jobs", "2", "--json"]
    if command == "migrate":
        args += ["--layout", "v4", "--out", str(dest)]
    tmp.mkdir()
    rc, _, err, sid = run_until(args, tmp, sig=sig, when=lambda: any(tmp.glob(MOMENTS[moment])))
    assert rc == (130 if sig == signal.SIGINT else 128 + sig), err[-3000:]
    # nothing on stderr but kvscope's one line (Ctrl-C: none), no traceback, no dask log line
    assert err.strip().splitlines() == ([] if sig == signal.SIGINT else
                                        [f"kvscope: stopped by {signal.Signals(sig).name}"]), err[-3000:]
    procs, names = leftovers(sid, tmp)
    assert procs == [] and names == [], (procs, names)
    assert temporaries(dest) == []
