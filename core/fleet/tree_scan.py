"""Fleet scan, the library view: every state file under a directory, one JSON-able summary per file.

``scan_file`` is a pure function from a path (and an optional model path and target layout) to
a plain dict, so the per-file work can move to any process pool or distributed executor
unchanged (it lives in :mod:`kvscope.core.fleet.scanfile`). ``scan_tree`` runs it over a
directory in worker processes that survive each other's death
(:mod:`kvscope.core.fleet.localpool`) and yields results as they finish; ``summarise`` counts
them (:mod:`kvscope.core.fleet.summary`). The ``kvscope scan`` command, with its Dask executor and
fsspec sources, is :mod:`kvscope.core.cli.scan_command`.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

from kvscope.core.fleet.executors import default_jobs
from kvscope.core.fleet.localpool import LocalPool
from kvscope.core.fleet.scanfile import scan_entry, scan_file
from kvscope.core.fleet.source import open_source
from kvscope.core.fleet.summary import exit_code, format_line, format_summary, summarise

__all__ = ["exit_code", "format_line", "format_summary", "scan_file", "scan_tree", "summarise"]


def _error(entry: Any, reason: str) -> dict[str, Any]:
    return {"path": entry.ref, "status": "error", "reason": reason}


def scan_tree(root: str, model: str | None = None, jobs: int | None = None, target: str | None = None
              ) -> Iterator[dict[str, Any]]:
    """Results of :func:`scan_file` for every file under ``root``, in completion order.

    A worker process that dies costs the file it was reading: that file's result is
    ``{"status": "error", "reason": "worker died: SIGKILL ..."}`` and the scan goes on.
    """
    source = open_source(root)
    with LocalPool(jobs or default_jobs()) as pool:
        yield from pool.map(partial(scan_entry, model=model, target=target), source.walk(), _error)
