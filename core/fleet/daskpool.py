"""The ``dask`` executor: the same per-file function on a ``dask.distributed`` cluster.

With ``scheduler`` (``tcp://host:8786``) it uses that cluster, whose workers must have kvscope
installed and must reach the files (the same paths, or URLs such as ``s3://``). Without, it
starts a ``LocalCluster`` of ``jobs`` single-threaded worker processes for the run and stops it
afterwards; that cluster fails a task at the first death of its worker
(``allowed_failures=0``) and gives each worker one task at a time (``worker-saturation`` 1.0),
so a death is charged to the task that was running.

Items go out in tasks of ``batch`` files (one scheduler round trip per batch, not per file)
with at most a few tasks per worker thread in flight (``as_completed`` refilled as tasks
finish), and results stream back as tasks complete. A task whose worker died
(``KilledWorker``, a ``CommClosedError`` fetching its result, or a finished future gone ``lost``
with its worker before its result was fetched) costs at most its file: a batch is
sent again one file per task, so the file that kills its worker is isolated, and a lone file
whose worker died gets ``on_error(item, "worker died: SIGKILL (dask worker ...)")`` (the
signal is known on kvscope's own cluster, from its nannies). So a file that kills every worker
that reads it costs itself only, and a worker killed from outside costs at most the one file it
was reading alone (a batch's files are simply re-run). On another cluster its scheduler's
``distributed.scheduler.allowed-failures`` (default 3) first retries a task on other workers; a
lone file is reported after that many deaths.

With ``timeout``, a worker process of kvscope's own cluster whose current file began more than
``timeout`` seconds ago (stopped by SIGSTOP, hung) is killed: its task fails as above, so a
batch is re-run one file per task and a lone file gets ``timed out: no result after N s``. The
clock is a mark each worker touches as a file begins (``run_marked``). A worker that holds tasks
and has begun none of them for ``timeout`` seconds (at least :data:`BEGIN_GRACE`) is killed too: one
stopped between two tasks, after its last result went out and before its next task began, kept a
mark naming a finished task, so no deadline ran for the task the scheduler gave it next and the run
waited for ever (the scheduler still counted the stopped worker). Its task is run again, not charged.
A worker stopped after its task finished but before the client fetched the result it holds is killed
after the same time (``_fetch``): the fetch had waited for ever, outside every deadline.
On another cluster its
scheduler's ``distributed.scheduler.worker-ttl`` (default 5 minutes) removes a worker that stops
answering.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import re
import shutil
import signal
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from types import TracebackType
from typing import Any, TypeVar

from kvscope.core.fleet.executors import ExecutorError, Result, bounded_jobs, run_batch
from kvscope.core.fleet.localpool import death_reason, timeout_reason
from kvscope.core.stopsignals import deferred

T = TypeVar("T")
DEFAULT_BATCH = 16
TASKS_PER_THREAD = 3
CONNECT_TIMEOUT = 30.0
PROBE_TIMEOUT = 120.0
SIGNAL_WAIT = 1.0  # seconds to wait for a nanny's word on how its worker died
DEADLINE_CHECK = 1.0  # seconds between looks at the workers' marks for one past its deadline
NO_WORKER_GRACE = 60.0  # seconds kvscope's own cluster may be without a worker before the run stops
BEGIN_GRACE = 10.0  # at least this long a worker may hold tasks it has not begun before it is killed


class _NoWorkers(Exception):
    """kvscope's own cluster has had no worker for :data:`NO_WORKER_GRACE` seconds."""
POLL = 0.02  # seconds between looks for a finished task while a deadline is kept
_DEATH = re.compile(r"Worker process (\d+) (?:was killed by signal (\d+)|exited with status (\d+))")


def probe() -> str:
    """Run on a worker before the scan: kvscope is importable there (returns its version)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kvscope")
    except PackageNotFoundError:
        return "unknown"


class _NannyDeaths(logging.Handler):
    """Exit codes of worker processes, from the nannies of kvscope's own cluster (pid -> exit code)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.codes: dict[int, int] = {}
        self.changed = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        m = _DEATH.search(record.getMessage())
        if m is None:
            return
        code = -int(m.group(2)) if m.group(2) else int(m.group(3))
        with self.changed:
            self.codes[int(m.group(1))] = code
            self.changed.notify_all()

    def wait_for(self, pid: int | None, timeout: float) -> int | None:
        if pid is None:
            return None
        with self.changed:
            self.changed.wait_for(lambda: pid in self.codes, timeout)
            return self.codes.get(pid)


@dataclass
class _Task:
    items: list[Any]
    results_lost: int = 0  # times its finished result went with a dying worker (not the files' fault)
    spared: int = 0  # times it died with a worker that was running another task
    key: str = ""  # the dask key it was last submitted under


def run_marked(fn: Callable[[Any], Result], items: list[Any], key: str, marks: str | None) -> list[Result]:
    """:func:`run_batch`, noting in ``marks/<pid>`` which task this worker process runs now (read
    when the process dies: the task it was running is the one to charge), and touching that mark
    as each item begins (its mtime is when the current file began: the per-file deadline's clock)."""
    if marks is None:
        return run_batch(fn, items)
    mark = os.path.join(marks, str(os.getpid()))
    with contextlib.suppress(OSError), open(mark, "w") as fh:
        fh.write(key)
    out = []
    for item in items:
        with contextlib.suppress(OSError):
            os.utime(mark)
        out.append(fn(item))
    return out


def _remove_tree(path: str, tries: int = 50) -> None:
    """Remove ``path``; again while a worker that is still exiting writes into it (a few seconds at most)."""
    for _ in range(tries):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            return
        time.sleep(0.1)


def _dask() -> tuple[Any, Any]:
    try:
        import dask
        import distributed
    except ImportError as e:
        raise ExecutorError("the dask executor needs dask.distributed: pip install 'kvscope[fleet]'") from e
    return dask, distributed


class DaskPool:
    """See the module docstring."""

    name = "dask"

    def __init__(self, scheduler: str | None = None, jobs: int | None = None, batch: int | None = None,
                 timeout: float | None = None) -> None:
        self.scheduler = scheduler
        self.timeout = timeout if timeout else None  # seconds per file on kvscope's own cluster
        self._timed_out: set[str] = set()  # keys of tasks whose worker was killed at the deadline
        self._idle_since: dict[int, float] = {}  # worker pid -> since when it holds tasks and runs none of them
        self.jobs = jobs
        self.batch = max(1, batch or DEFAULT_BATCH)
        self._lost: set[str] = set()
        self.client: Any = None
        self._cluster: Any = None
        self._deaths: _NannyDeaths | None = None
        self._nanny_logger_state: tuple[int, bool] | None = None
        self._seq = itertools.count()
        self._tmp: str | None = None  # our LocalCluster's private folder (0700): marks/ and the workers' scratch/
        self._marks: str | None = None  # its workers' running tasks (pid -> task key)
        self.no_worker_grace = NO_WORKER_GRACE
        self.begin_grace = BEGIN_GRACE

    @property
    def workers_lost(self) -> int:
        """Workers that died during the run (by address)."""
        return len(self._lost)

    # -- the cluster --------------------------------------------------------------------------
    def __enter__(self) -> DaskPool:
        self.start()
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def start(self) -> None:
        dask, distributed = _dask()
        try:
            if self.scheduler is not None:
                self.client = distributed.Client(self.scheduler, timeout=CONNECT_TIMEOUT, set_as_default=False)
            else:
                self._watch_nannies()
                with deferred():  # a stop between the folder's making and its record here left it behind
                    self._tmp = tempfile.mkdtemp(prefix="kvscope-dask-")
                marks, scratch = os.path.join(self._tmp, "marks"), os.path.join(self._tmp, "scratch")
                os.mkdir(marks, 0o700)
                os.mkdir(scratch, 0o700)
                # a stop while the cluster starts waits for it to exist (deferred): cut short inside
                # LocalCluster() it is never returned, so nothing could close it (its workers and their
                # scratch space outlived the run, and dask's own exit hook printed a traceback)
                with dask.config.set({"distributed.scheduler.worker-saturation": 1.0,
                                      "temporary-directory": scratch}), deferred():  # the scheduler's scratch too
                    self._cluster = distributed.LocalCluster(
                        n_workers=bounded_jobs(self.jobs), threads_per_worker=1, processes=True,
                        dashboard_address=None, silence_logs=logging.CRITICAL, host="127.0.0.1",
                        # the scheduler's HTTP routes (/health, /metrics) listen even without a dashboard,
                        # on 8787 unless told: a free port on loopback, so a second cluster does not warn
                        # "Port 8787 is already in use" (and distributed leak the refused socket)
                        scheduler_kwargs={"allowed_failures": 0, "dashboard": False,
                                          "dashboard_address": "127.0.0.1:0"},
                        local_directory=scratch,
                        # kvscope's imports before a worker's first file, not inside its deadline
                        preload=["kvscope.core.fleet.dask_preload"],
                    )
                self.client = distributed.Client(self._cluster, set_as_default=False)
                self._marks = marks
        except (OSError, TimeoutError) as e:
            self.close()
            where = self.scheduler or "a local cluster"
            raise ExecutorError(f"cannot reach the dask scheduler at {where}: {e}") from None
        try:
            self.client.submit(probe, pure=False).result(timeout=PROBE_TIMEOUT)
        except Exception as e:
            self.close()
            raise ExecutorError(f"the dask workers cannot run kvscope ({type(e).__name__}: {e}); install kvscope "
                              "with the fleet extra on every worker") from None

    def _watch_nannies(self) -> None:
        log = logging.getLogger("distributed.nanny")
        self._deaths = _NannyDeaths()
        self._nanny_logger_state = (log.level, log.propagate)
        log.addHandler(self._deaths)

    def _unwatch_nannies(self) -> None:
        log = logging.getLogger("distributed.nanny")
        if self._deaths is not None:
            log.removeHandler(self._deaths)
        if self._nanny_logger_state is not None:
            log.setLevel(self._nanny_logger_state[0])
            log.propagate = self._nanny_logger_state[1]
        self._deaths = None
        self._nanny_logger_state = None

    def _hear_nannies(self) -> None:
        """Let the nannies' INFO lines reach our handler only (LocalCluster silenced the loggers)."""
        log = logging.getLogger("distributed.nanny")
        log.setLevel(logging.INFO)
        log.propagate = False

    def close(self) -> None:
        # asyncio's CancelledError is a BaseException: a cluster call cut short by a stop raises it, and
        # the folder and processes below must go however the calls above ended
        quiet = (Exception, asyncio.CancelledError)
        pids: list[int] = []
        try:
            if self._cluster is not None and self.client is not None:  # our own workers, to be sure they are gone
                with contextlib.suppress(*quiet):
                    pids = [int(w["pid"]) for w in self.client.scheduler_info()["workers"].values() if "pid" in w]
            with contextlib.suppress(*quiet):
                if self.client is not None:
                    self.client.close()
            with contextlib.suppress(*quiet):
                if self._cluster is not None:
                    self._cluster.close()
        finally:
            self.client = self._cluster = None
            for pid in pids:  # one its nanny did not stop in time (a loaded machine) would write into our folder
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            if self._tmp is not None:  # the marks and the workers' scratch space (no dask-scratch-space in /tmp)
                _remove_tree(self._tmp)
            self._tmp = self._marks = None
            self._unwatch_nannies()

    def nthreads(self) -> int:
        info = self.client.scheduler_info()
        return max(1, sum(int(w.get("nthreads", 1)) for w in info.get("workers", {}).values()))

    # -- running --------------------------------------------------------------------------------
    def map(self, fn: Callable[[T], Result], items: Iterable[T], on_error: Callable[[T, str], Result]
            ) -> Iterator[Result]:
        _, distributed = _dask()
        if self.client is None:
            self.start()
        if self._deaths is not None:
            self._hear_nannies()
        source = iter(items)
        retry: deque[_Task] = deque()
        window = TASKS_PER_THREAD * self.nthreads()
        done = distributed.as_completed(loop=self.client.loop)
        tasks: dict[str, _Task] = {}

        def submit() -> bool:
            task = retry.popleft() if retry else _Task(list(itertools.islice(source, self.batch)))
            if not task.items:
                return False
            key = f"kvscope-{fn.func.__name__ if isinstance(fn, partial) else 'task'}-{next(self._seq)}"
            marks = self._marks
            task.key = key
            fut = self.client.submit(run_marked, fn, task.items, key, marks, key=key, pure=False, retries=0)
            tasks[fut.key] = task
            done.add(fut)
            return True

        while len(tasks) < window and submit():
            pass
        while tasks:
            try:
                fut = self._next(done, tasks)
            except _NoWorkers as e:  # nothing would ever run the tasks in flight: stop with what was done
                from kvscope.core.fleet.localpool import ExecutorDied

                pending = [it for t in tasks.values() for it in t.items] + [it for t in retry for it in t.items]
                raise ExecutorDied(str(e), pending, source) from None
            task = tasks.pop(fut.key)
            yield from self._finished(fut, task, on_error, retry, distributed)
            fut.release()
            del fut
            while len(tasks) < window and submit():
                pass

    def _next(self, done: Any, tasks: dict[str, _Task]) -> Any:
        """The next finished future; meanwhile, on kvscope's own cluster, a worker process whose
        current file began more than ``timeout`` seconds ago (by its mark) is killed, and a cluster left
        without any worker for ``no_worker_grace`` seconds (its workers gone and none started again: a
        stopped or killed nanny) raises :class:`_NoWorkers` instead of waiting for ever."""
        if self._cluster is None:
            return next(done)
        checked = 0.0
        without: float | None = None  # since when the cluster has had no worker
        while not done.has_ready():
            now = time.monotonic()
            if now - checked >= DEADLINE_CHECK:
                checked = now
                if self.timeout is not None and self._marks is not None:
                    self._kill_overdue({t.key for t in tasks.values()})
                if self._n_workers() == 0:
                    without = now if without is None else without
                    if now - without > self.no_worker_grace:
                        raise _NoWorkers(f"the dask cluster has had no worker for {self.no_worker_grace:.0f} s "
                                         "(its workers are gone and none was started again)")
                else:
                    without = None
            time.sleep(POLL)
        return next(done)

    def _n_workers(self) -> int:
        """The workers the scheduler knows now (-1: it cannot be asked)."""
        try:
            return len(self.client.scheduler_info().get("workers", {}))
        except (OSError, TimeoutError, RuntimeError):  # a scheduler going away: the futures will say so
            return -1

    def _kill_overdue(self, keys: set[str]) -> None:
        assert self._marks is not None and self.timeout is not None
        marks = self._marks
        for name in os.listdir(marks):
            path = os.path.join(marks, name)
            try:
                with open(path) as fh:
                    key = fh.read()
                age = time.time() - os.stat(path).st_mtime
            except OSError:
                continue
            if key in keys and key not in self._timed_out and age > self.timeout:
                self._timed_out.add(key)
                with contextlib.suppress(OSError, ValueError):
                    os.kill(int(name), signal.SIGKILL)  # its nanny starts another; the task fails KilledWorker
        self._kill_not_begun(keys)

    def _worker_pids(self) -> dict[str, int]:
        """Worker address -> process id, from the nannies of kvscope's own cluster (in this process; the
        scheduler's ``scheduler_info()`` does not carry workers' pids)."""
        out: dict[str, int] = {}
        with contextlib.suppress(Exception):  # nannies changing under us: the next look sees them
            for nanny in list(self._cluster.workers.values()):
                address, pid = nanny.worker_address, nanny.pid
                if address is not None and pid is not None:
                    out[str(address)] = int(pid)
        return out

    def _kill_not_begun(self, keys: set[str]) -> None:
        """Kill a worker process that has held tasks of this run for ``timeout`` seconds (at least
        ``begin_grace``, :data:`BEGIN_GRACE`) without beginning any of them (its mark names none): stopped
        or hung between two tasks, it would hold them for ever, and its stale mark gives them no deadline.
        Its tasks fail ``KilledWorker`` with its mark naming another task (or none), so they are run
        again, not charged."""
        assert self._marks is not None and self.timeout is not None
        try:
            processing = self.client.processing()
        except (OSError, TimeoutError, RuntimeError):  # a scheduler going away: the futures will say so
            return
        pids = self._worker_pids()
        now, grace = time.monotonic(), max(self.timeout, self.begin_grace)
        holding: set[int] = set()
        for address, held in processing.items():
            mine = {str(k) for k in held} & keys
            pid = pids.get(address)
            if not mine or pid is None:
                continue
            try:
                with open(os.path.join(self._marks, str(pid))) as fh:
                    running = fh.read()
            except OSError:
                running = ""  # no task begun yet
            if running in mine:
                continue  # it runs one of them: the mark's deadline holds
            holding.add(pid)
            since = self._idle_since.setdefault(pid, now)
            if now - since > grace:
                del self._idle_since[pid]
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)  # its nanny starts another
        for pid in set(self._idle_since) - holding:
            del self._idle_since[pid]

    def _fetch(self, fut: Any) -> Any:
        """A finished task's result, fetched from the worker that holds it. On kvscope's own cluster with a
        deadline, a holder that has not answered for ``timeout`` seconds (at least ``begin_grace``) is
        killed: one stopped after its task finished and before its result was fetched (the worker keeps the
        result, the client asks it) held the run for ever, the fetch waiting outside every deadline. The
        result then goes with it (``lost``, or a ``CommClosedError``), and the task is run again."""
        if self._cluster is None or self.timeout is None:
            return fut.result()
        grace = max(self.timeout, self.begin_grace)
        start = time.monotonic()
        while True:
            try:
                return fut.result(timeout=DEADLINE_CHECK)
            except TimeoutError:
                if fut.status != "finished":
                    return fut.result()  # lost or erred meanwhile: its exception says which
                if time.monotonic() - start > grace:
                    start = time.monotonic()
                    self._kill_holders(fut)

    def _kill_holders(self, fut: Any) -> None:
        """SIGKILL the worker processes of kvscope's own cluster that hold ``fut``'s result."""
        with contextlib.suppress(Exception):  # a scheduler going away: the future will say so
            holders = self.client.who_has([fut]).get(fut.key, ())
            pids = self._worker_pids()
            for address in holders:
                pid = pids.get(str(address))
                if pid is not None:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)  # its nanny starts another

    def _finished(self, fut: Any, task: _Task, on_error: Callable[[Any, str], Result], retry: deque[_Task],
                  distributed: Any) -> Iterator[Result]:
        if fut.status == "finished":
            try:
                yield from self._fetch(fut)
                return
            except distributed.comm.CommClosedError as e:  # the worker holding the result died
                yield from self._result_lost(task, str(e), on_error, retry)
                return
        if fut.status == "lost":  # it had finished, but its result went with a dying worker
            yield from self._result_lost(task, "its worker died after the task finished", on_error, retry)
            return
        exc = fut.exception() if fut.status == "error" else None
        if isinstance(exc, distributed.KilledWorker):
            ws = exc.last_worker
            self._lost.add(str(ws.address))
            yield from self._died(task, ws, "", on_error, retry)
            return
        if isinstance(exc, distributed.comm.CommClosedError):
            yield from self._result_lost(task, str(exc), on_error, retry)
            return
        if fut.status == "cancelled":
            raise ExecutorError("the dask scheduler cancelled the scan (lost connection, or the cluster was closed)")
        reason = f"{type(exc).__name__}: {exc}" if exc is not None else f"task {fut.status}"
        for item in task.items:
            yield on_error(item, reason)

    def _died(self, task: _Task, ws: Any, detail: str, on_error: Callable[[Any, str], Result],
              retry: deque[_Task]) -> Iterator[Result]:
        """A task lost with its worker: a batch is split into one task per file, a lone file is charged,
        unless the worker was running another task then (dask fails every task a dying worker holds)."""
        if len(task.items) > 1:
            retry.extend(_Task([item]) for item in task.items)
            return
        if task.key in self._timed_out:
            assert self.timeout is not None
            yield on_error(task.items[0], f"{timeout_reason(self.timeout)} ({self._where(ws)})")
            return
        if task.spared < 2 and self._running_other(ws, task.key):
            task.spared += 1
            retry.append(task)
            return
        yield on_error(task.items[0], self._reason(ws, detail))

    def _running_other(self, ws: Any, key: str) -> bool:
        """Was worker ``ws`` (by pid) running a task other than ``key`` when it died, by its mark?"""
        pid = getattr(ws, "pid", None)
        if self._marks is None or pid is None:
            return False
        try:
            with open(os.path.join(self._marks, str(pid))) as fh:
                return fh.read() != key
        except FileNotFoundError:  # it had begun no task at all (killed holding tasks it had not begun)
            return True
        except OSError:
            return False

    def _result_lost(self, task: _Task, detail: str, on_error: Callable[[Any, str], Result],
                     retry: deque[_Task]) -> Iterator[Result]:
        """A result lost in transit (its worker died after computing it): run the task again, once."""
        if task.results_lost == 0:
            task.results_lost += 1
            retry.append(task)
            return
        yield from self._died(task, None, f"result lost: {detail}", on_error, retry)

    def _reason(self, ws: Any, detail: str) -> str:
        if ws is None:
            return f"worker died: {detail or 'lost its dask worker'}"
        code = self._deaths.wait_for(getattr(ws, "pid", None), SIGNAL_WAIT) if self._deaths is not None else None
        where = self._where(ws)
        if code is None:
            return f"worker died: {where}"
        return f"{death_reason(code)} ({where})"

    @staticmethod
    def _where(ws: Any) -> str:
        if ws is None:
            return "its dask worker"
        return f"dask worker {ws.address}, pid {getattr(ws, 'pid', '?')}"
