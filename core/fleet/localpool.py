"""Worker processes on this machine that survive each other's death: the ``local`` executor.

Each worker is a process with its own pipe. The client sends it a few items at a time and it
answers one message per item, in order, so the client always knows which item each worker is
on: the first one it has not answered. When a worker dies (any signal: SIGKILL from the
out-of-memory killer, SIGBUS, SIGSEGV; or an exit), that item gets ``on_error(item, "worker
died: SIGKILL")``, the items queued behind it go back to the queue, a new worker takes its
place and the run goes on. A worker that gives no answer for ``timeout`` seconds on one item
(stopped by SIGSTOP, hung in a system call) is killed and treated the same way, its item getting
``timed out: no result after N s``. Nothing else is lost; ``concurrent.futures``' process pool instead
breaks as a whole (``BrokenProcessPool``) and fails every pending item.

Workers start as items come, one for each item handed out until there are ``jobs`` of them (capped
at :func:`~kvscope.core.fleet.executors.job_limit`), so a pool never runs more workers than it was
given items: ``--jobs 1000000000`` on 4 files starts 4.

Workers are forked from a fork server that has imported the per-file code once
(``forkserver`` start method), so a replacement starts in milliseconds and the client may have
threads. Workers ignore SIGINT (the client handles Ctrl-C and stops them); the client
terminates every worker when the run ends or is abandoned.

The fork server can die too (the out-of-memory killer, a user's ``kill``). Its workers live on,
but the client no longer hears of their exits (each one's sentinel reads as ``exit status 255``),
so charging their files ``worker died`` would blame files for nothing they did. Instead the pool
says so once (:attr:`LocalPool.events`), stops those workers (through a pidfd: they are no
longer the client's children), starts a new fork server and workers, and runs the files that
were in flight again, from the start (the per-file work is pure or writes atomically). If the
fork server dies again within the same pool, :meth:`LocalPool.map` raises
:class:`ExecutorDied` with the items that got no result, and the command stops with one line.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeVar

from kvscope.core.fleet.executors import ExecutorError, Result, bounded_jobs

T = TypeVar("T")
BATCH = 8  # items per message to a worker
START_TRIES = 3  # tries to start a worker (the fork server may have just died)
LOW_WATER = 4  # send more when a worker holds fewer unanswered items than this
PRELOAD = ["kvscope.core.fleet.scanfile", "kvscope.core.reader.parse", "kvscope.core.analysis.verdict"]
RESTARTS = 1  # fork-server deaths a pool recovers from; the next one stops the run (ExecutorDied)
SETTLE_S = 1.0  # how long a sentinel's end-of-file may precede the fork server's exit being visible
_END = None


class ExecutorDied(ExecutorError):
    """The pool's fork server died again after the pool was restarted: the run cannot go on.

    ``pending``: the items given to the pool that got no result, in order; ``rest``: the iterator of
    items the pool never took (the caller may walk it to name them)."""

    def __init__(self, message: str, pending: list[Any], rest: Iterator[Any]) -> None:
        super().__init__(message)
        self.pending = pending
        self.rest = rest


def _worker_main(conn: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is _END:
            return
        fn, batch = msg
        for item in batch:
            try:
                res = fn(item)
            except Exception as e:  # fn never raises; a bug still costs only this item
                res = {"__error__": f"{type(e).__name__}: {e}"}
            try:
                conn.send(res)
            except OSError:  # the client is gone (killed): nobody to answer, and nothing to print
                return


def death_reason(exitcode: int | None) -> str:
    """``worker died: SIGKILL`` for a process killed by a signal, ``worker died: exit status 3`` else."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = " (killed: out of memory, or by a user)" if -exitcode == signal.SIGKILL else ""
        return f"worker died: {name}{hint}"
    return f"worker died: exit status {exitcode}"


def server_death_reason(pid: int | None) -> str | None:
    """None while the fork server ``pid`` runs; else how it ended (``SIGKILL``, ``exit status 1``,
    ``unknown`` once reaped). Peeks with ``WNOWAIT``: multiprocessing reaps it when it starts the next."""
    if pid is None:
        return None
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped already (multiprocessing started a new one)
        return "unknown"
    if info is None:
        return None
    if info.si_code == os.CLD_EXITED:
        return f"exit status {info.si_status}"
    try:
        return signal.Signals(info.si_status).name
    except ValueError:
        return f"signal {info.si_status}"


def _server_pid(ctx: Any) -> int | None:
    """The pid of the fork server that starts ``ctx``'s processes now (None: not a fork-server context)."""
    if ctx.get_start_method() != "forkserver":
        return None
    import multiprocessing.forkserver as fs

    pid = getattr(getattr(fs, "_forkserver", None), "_forkserver_pid", None)
    return pid if isinstance(pid, int) else None


def _pidfd(pid: int | None) -> int | None:
    """A pidfd of ``pid`` (Linux 5.3+), to signal and watch a worker that is not (or no longer) our child."""
    if pid is None or not hasattr(os, "pidfd_open"):
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def timeout_reason(seconds: float) -> str:
    """The result's reason for a file whose worker gave no answer within the deadline."""
    return f"timed out: no result after {seconds:g} s (its worker was stopped or hung, and was killed)"


@dataclass
class _Worker:
    proc: Any
    conn: Any
    server: int | None = None  # the pid of the fork server that forked it
    pidfd: int | None = None
    held: deque[Any] = field(default_factory=deque)  # items sent, not answered, in order
    since: float = 0.0  # when it began its current item (the first of ``held``), monotonic

    def alive(self) -> bool:
        if self.pidfd is not None:  # readable once it has exited, whoever its parent is now
            return not multiprocessing.connection.wait([self.pidfd], 0)
        return bool(self.proc.is_alive())

    def send_signal(self, sig: int) -> None:
        with contextlib.suppress(OSError):
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, sig)
            elif self.proc.is_alive():
                os.kill(self.proc.pid, sig)

    def release(self) -> None:
        self.conn.close()
        if self.pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self.pidfd)
            self.pidfd = None


class LocalPool:
    """``jobs`` worker processes (see the module docstring)."""

    name = "local"

    def __init__(self, jobs: int, timeout: float | None = None) -> None:
        self.jobs = bounded_jobs(jobs)  # at most job_limit(); and never more started than items given (map)
        self.timeout = timeout if timeout else None  # seconds per item; None: no deadline
        self.workers_lost = 0
        self.restarts = 0  # times the pool was restarted after its fork server died
        self.events: list[str] = []  # what happened to the pool itself, one sentence each
        self._ctx: Any = None
        self._workers: list[_Worker] = []

    def __enter__(self) -> LocalPool:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _context(self) -> Any:
        if self._ctx is None:
            methods = multiprocessing.get_all_start_methods()
            self._ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
            if "forkserver" in methods:
                self._ctx.set_forkserver_preload(PRELOAD)
        return self._ctx

    def _start(self) -> _Worker:
        """A new worker; if the fork server died (killed) as it forked, once more (multiprocessing starts
        a new fork server), then :class:`ExecutorError`."""
        ctx = self._context()
        for attempt in range(START_TRIES):
            ours, theirs = ctx.Pipe(duplex=True)
            proc = ctx.Process(target=_worker_main, args=(theirs,), daemon=True, name="kvscope-worker")
            try:
                proc.start()
            except (EOFError, OSError) as e:
                ours.close()
                theirs.close()
                if attempt + 1 == START_TRIES:
                    raise ExecutorError(f"cannot start a worker process: {type(e).__name__}: {e}") from None
                time.sleep(0.1)
                continue
            theirs.close()
            return _Worker(proc, ours, _server_pid(ctx), _pidfd(proc.pid))
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Stop every worker: politely; a busy one after a second by SIGTERM (its temporary outputs
        are removed by :mod:`kvscope.core.fsutil`'s handler), then by SIGKILL (a stopped one)."""
        workers, self._workers = self._workers, []
        self._stop(workers)

    @staticmethod
    def _stop(workers: list[_Worker]) -> None:
        for w in workers:
            with contextlib.suppress(OSError, ValueError):
                w.conn.send(_END)
        for sig, grace in ((signal.SIGTERM, 1.0), (signal.SIGKILL, 2.0), (None, None)):
            end = time.monotonic() + (grace or 0.0)
            while True:
                alive = [w for w in workers if w.alive()]
                left = end - time.monotonic()
                if not alive or (grace is not None and left <= 0):
                    break
                watch = [w.pidfd if w.pidfd is not None else w.proc.sentinel for w in alive]
                multiprocessing.connection.wait(watch, left if grace is not None else None)
            if sig is None or not alive:
                break
            for w in alive:
                w.send_signal(sig)
        for w in workers:
            w.proc.join(5.0)  # reaps our own children (a worker of a dead fork server is not ours)
            w.release()

    def map(self, fn: Callable[[T], Result], items: Iterable[T], on_error: Callable[[T, str], Result]
            ) -> Iterator[Result]:
        source = iter(items)
        retry: deque[T] = deque()  # items of a dead worker that it had not started
        exhausted = False

        def take() -> T | None:
            nonlocal exhausted
            if retry:
                return retry.popleft()
            if exhausted:
                return None
            try:
                return next(source)
            except StopIteration:
                exhausted = True
                return None

        while True:
            # workers start as items come, one item for each new one, up to ``jobs``: never more workers
            # than files (--jobs 1000000000 on 4 files starts 4 workers, not a billion one after another)
            while len(self._workers) < self.jobs:
                first = take()
                if first is None:
                    break
                w = self._start()
                self._workers.append(w)
                try:
                    w.conn.send((fn, [first]))
                except OSError:  # it died before its first item: that item goes to the next one
                    retry.appendleft(first)
                    self._replace(w)
                    continue
                w.since = time.monotonic()
                w.held.append(first)
            for w in self._workers:
                if len(w.held) >= LOW_WATER:
                    continue
                batch: list[T] = []
                while len(batch) < BATCH:
                    item = take()
                    if item is None:
                        break
                    batch.append(item)
                if not batch:
                    continue
                try:
                    w.conn.send((fn, batch))
                except OSError:  # it died idle: nothing of it was lost
                    retry.extendleft(reversed(batch))
                    self._replace(w)
                    continue
                if not w.held:
                    w.since = time.monotonic()
                w.held.extend(batch)
            busy = [w for w in self._workers if w.held]
            if not busy:
                if retry:  # every send failed (workers that died idle were replaced): send again
                    continue
                return
            wait = None
            if self.timeout is not None:
                wait = max(0.0, min(w.since for w in busy) + self.timeout - time.monotonic())
            ready = multiprocessing.connection.wait([w.conn for w in busy] + [w.proc.sentinel for w in busy], wait)
            gone = next((w for w in busy if w.proc.sentinel in ready and self._server_gone(w)), None)
            if gone is not None:  # the fork server died, not a worker: no file is to blame
                yield from self._restart(gone, on_error, retry, source)
                continue
            for w in busy:
                if w.conn in ready or w.proc.sentinel in ready:
                    yield from self._collect(w, on_error, retry)
                elif self.timeout is not None and time.monotonic() - w.since >= self.timeout:
                    yield from self._expire(w, on_error, retry)

    def _replace(self, w: _Worker) -> None:
        if w.alive():
            w.send_signal(signal.SIGKILL)
        w.proc.join(5.0)
        w.release()
        self._workers[self._workers.index(w)] = self._start()

    def _server_gone(self, w: _Worker) -> bool:
        """Whether ``w``'s sentinel fired because the fork server that forked it died (its exit
        status then reads 255: the server's end of the pipe closed, not the worker's exit)."""
        if w.server is None or w.proc.exitcode != 255:
            return False
        end = time.monotonic() + SETTLE_S  # the server's files close just before its exit shows
        while server_death_reason(w.server) is None:
            if time.monotonic() > end:
                return False  # the server lives: the worker itself exited with status 255
            time.sleep(0.01)
        return True

    def _restart(self, w: _Worker, on_error: Callable[[T, str], Result], retry: deque[T], source: Iterator[T]
                 ) -> Iterator[Result]:
        """The fork server of ``w`` died: keep every answer already sent, stop the workers, put what
        was in flight back at the head of the queue, start a new server and workers (or, past
        :data:`RESTARTS`, raise :class:`ExecutorDied`)."""
        how = server_death_reason(w.server) or "unknown"
        for x in self._workers:  # answers already on the pipes are results like any other
            while x.held:
                try:
                    if not x.conn.poll():
                        break
                    res = x.conn.recv()
                except (EOFError, OSError):
                    break
                item = x.held.popleft()
                yield on_error(item, str(res["__error__"])) if "__error__" in res else res
        in_flight = [item for x in self._workers for item in x.held]
        retry.extendleft(reversed(in_flight))
        for x in self._workers:
            x.held.clear()
        workers, self._workers = self._workers, []
        self._stop(workers)
        self.restarts += 1
        what = f"the local executor's fork server died ({how})"
        if self.restarts > RESTARTS:
            self.events.append(f"{what} again: the run stopped")
            raise ExecutorDied(f"{what} again after a restart", list(retry), source)
        n = len(in_flight)
        self.events.append(f"{what}: its workers were restarted and the {n} file{'' if n == 1 else 's'} in "
                           "flight run again")
        # the new workers start as the loop of :meth:`map` hands them the files put back in ``retry``

    def _collect(self, w: _Worker, on_error: Callable[[T, str], Result], retry: deque[T]) -> Iterator[Result]:
        """Every answer ``w`` has sent; if it died, the error for its current item and a replacement."""
        dead = False
        while w.held:
            try:
                if not w.conn.poll():
                    dead = not w.proc.is_alive()
                    break
                res = w.conn.recv()
            except (EOFError, OSError):
                dead = True
                break
            item = w.held.popleft()
            w.since = time.monotonic()
            yield on_error(item, str(res["__error__"])) if "__error__" in res else res
        if not dead:
            return
        w.proc.join(5.0)
        reason = death_reason(w.proc.exitcode)
        self.workers_lost += 1
        lost = w.held.popleft() if w.held else None
        retry.extendleft(reversed(w.held))  # not started: they run on the others, in order
        w.held.clear()
        self._replace(w)
        if lost is not None:
            yield on_error(lost, reason)

    def _expire(self, w: _Worker, on_error: Callable[[T, str], Result], retry: deque[T]) -> Iterator[Result]:
        """``w`` gave no answer for its current item within the deadline (stopped, or hung): it is
        killed, that item gets the error, the items behind it go to the others."""
        assert self.timeout is not None
        yield from self._collect(w, on_error, retry)  # answers it sent meanwhile, or its death
        if w not in self._workers or not w.held or time.monotonic() - w.since < self.timeout:
            return  # it died (charged as such), or it answered and is on a new item
        w.send_signal(signal.SIGKILL)  # SIGKILL ends a stopped process too
        w.proc.join(5.0)
        self.workers_lost += 1
        lost = w.held.popleft() if w.held else None
        retry.extendleft(reversed(w.held))
        w.held.clear()
        self._replace(w)
        if lost is not None:
            yield on_error(lost, timeout_reason(self.timeout))
