"""The executor interface: run one pure per-file function over a stream of items, results as they complete.

An executor (:class:`~kvscope.core.fleet.localpool.LocalPool`, worker processes on this machine, or
:class:`~kvscope.core.fleet.daskpool.DaskPool`, a ``dask.distributed`` cluster; the command line
picks one with :func:`kvscope.core.cli.fleet_session.make_executor`) is used as a context manager;
:meth:`Executor.map` takes a picklable function ``fn(item) -> dict`` that never raises, an
iterable of picklable items, and ``on_error(item, reason) -> dict``, the result to report for
an item whose function could not run (its worker died, the cluster raised). It yields exactly
one result per item, in completion order, and keeps only a bounded number of items in flight,
so the client's memory does not grow with the number of files.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Any, Protocol, TypeVar

from kvscope.core.errors import SetupError

T = TypeVar("T")
Result = dict[str, Any]


class ExecutorError(SetupError):
    """The executor cannot run at all (no dask installed, the scheduler unreachable): one line for the user."""


class Executor(Protocol):
    name: str
    workers_lost: int  # worker deaths seen (each cost at most the file it was reading)

    def map(self, fn: Callable[[T], Result], items: Iterable[T], on_error: Callable[[T, str], Result]
            ) -> Iterator[Result]: ...

    def __enter__(self) -> Executor: ...

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None: ...


def default_jobs() -> int:
    """Worker processes when ``--jobs`` is not given: the cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


JOBS_PER_CORE = 4  # worker processes per usable core at most, however many --jobs asks for
MIN_JOB_LIMIT = 8  # ... and never fewer than this (a small machine reading a slow store)


def job_limit() -> int:
    """The most worker processes an executor starts on this machine: :data:`JOBS_PER_CORE` per core
    this process may use, at least :data:`MIN_JOB_LIMIT` (``--jobs 1000000000`` is capped to it)."""
    return max(MIN_JOB_LIMIT, JOBS_PER_CORE * default_jobs())


def bounded_jobs(jobs: int | None) -> int:
    """``jobs`` (None: :func:`default_jobs`) within ``1..``:func:`job_limit`."""
    return max(1, min(jobs if jobs is not None else default_jobs(), job_limit()))


def run_batch(fn: Callable[[Any], Result], items: list[Any]) -> list[Result]:
    """``fn`` over ``items`` in order (one task of a remote executor)."""
    return [fn(item) for item in items]
