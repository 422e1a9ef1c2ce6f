"""Background work on a QThreadPool, in the style of Anki's ``QueryOp``.

``runner.submit(label, fn)`` runs ``fn(token, report)`` on a pool thread and hands back a
:class:`Task` living on the GUI thread. ``report(fraction, text)`` posts progress (fraction None
for "busy"); ``token.cancelled`` tells the job to stop early, and ``token.on_cancel(fn)`` has ``fn``
called (on the thread that cancels) the moment the task is cancelled, for a job blocked in a call
that has its own way to be stopped (``Verifier.cancel``). Results, failures and progress come
back through queued signals, so every callback runs on the GUI thread. A cancelled task's result
is dropped even when the job could not stop early.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, QRunnable, QThreadPool, Signal, Slot

from kvscope.core import errors

Cancelled = errors.Cancelled  # what a job's ``token.check()`` raises: the core's one Cancelled


class CancelToken:
    """Thread-safe cancellation flag shared by a task and its job."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._hooks: list[Callable[[], None]] = []

    def cancel(self) -> None:
        with self._lock:
            self._event.set()
            hooks, self._hooks = self._hooks, []
        for fn in hooks:
            fn()

    def on_cancel(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` when the token is cancelled (at once when it already is); any thread."""
        with self._lock:
            if not self._event.is_set():
                self._hooks.append(fn)
                return
        fn()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def check(self) -> None:
        if self._event.is_set():
            raise Cancelled()


Report = Callable[[float | None, str], None]
Job = Callable[[CancelToken, Report], Any]


def one_line(e: BaseException) -> str:
    """A user-facing one-line description of an exception."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return text or type(e).__name__


class _Relay(QObject):
    """Carries a job's events from the pool thread to the GUI thread (queued connections)."""

    progress = Signal(object, str)
    done = Signal(object)
    error = Signal(str, str)
    stopped = Signal()


class _Runnable(QRunnable):
    def __init__(self, job: Job, relay: _Relay, token: CancelToken) -> None:
        super().__init__()
        self.setAutoDelete(False)  # the Task keeps the Python object alive until it has finished
        self._job, self._relay, self._token = job, relay, token

    def run(self) -> None:
        def report(fraction: float | None, text: str) -> None:
            if not self._token.cancelled:
                self._relay.progress.emit(fraction, text)

        try:
            result = self._job(self._token, report)
        except Cancelled:
            self._relay.stopped.emit()
        except MemoryError:
            self._relay.error.emit("out of memory", "")
        except Exception as e:  # a job's failure must reach the GUI as a message, never kill the app
            self._relay.error.emit(one_line(e), traceback.format_exc())
        else:
            if self._token.cancelled:
                self._relay.stopped.emit()
            else:
                self._relay.done.emit(result)


class Task(QObject):
    """GUI-thread handle of one background job; ``finished`` always comes last."""

    progressed = Signal(object, str)  # fraction (float or None), text
    succeeded = Signal(object)
    failed = Signal(str)
    cancelled = Signal()
    finished = Signal()

    def __init__(self, label: str, job: Job, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.label = label
        self.token = CancelToken()
        self.done = False
        self.result: Any = None
        self.error: str | None = None
        self.details = ""
        self._relay = _Relay()
        self._relay.progress.connect(self._on_progress)
        self._relay.done.connect(self._on_done)
        self._relay.error.connect(self._on_error)
        self._relay.stopped.connect(self._on_stopped)
        self.runnable = _Runnable(job, self._relay, self.token)

    def cancel(self) -> None:
        """Ask the job to stop; its result will be dropped either way."""
        self.token.cancel()

    @Slot(object, str)
    def _on_progress(self, fraction: object, text: str) -> None:
        if not self.done and not self.token.cancelled:
            self.progressed.emit(fraction, text)

    @Slot(object)
    def _on_done(self, result: object) -> None:
        if self.token.cancelled:
            self._on_stopped()
            return
        self.result = result
        self._finish()
        self.succeeded.emit(result)
        self.finished.emit()

    @Slot(str, str)
    def _on_error(self, message: str, details: str) -> None:
        self.error, self.details = message, details
        self._finish()
        if self.token.cancelled:
            self.cancelled.emit()
        else:
            self.failed.emit(message)
        self.finished.emit()

    @Slot()
    def _on_stopped(self) -> None:
        self._finish()
        self.cancelled.emit()
        self.finished.emit()

    def _finish(self) -> None:
        self.done = True


class TaskRunner(QObject):
    """Owns the thread pool and the tasks in flight; ``activeChanged(n)`` tracks how many."""

    activeChanged = Signal(int)
    progressed = Signal(str, object, str)  # label, fraction, text

    def __init__(self, parent: QObject | None = None, max_threads: int | None = None) -> None:
        super().__init__(parent)
        self.pool = QThreadPool(self)
        if max_threads is not None:
            self.pool.setMaxThreadCount(max_threads)
        self._tasks: list[Task] = []

    @property
    def active(self) -> list[Task]:
        return list(self._tasks)

    def submit(
        self,
        label: str,
        job: Job,
        on_success: Callable[[Any], None] | None = None,
        on_failure: Callable[[str], None] | None = None,
    ) -> Task:
        """Start ``job`` on the pool; callbacks run on the GUI thread."""
        task = Task(label, job, self)
        if on_success is not None:
            task.succeeded.connect(on_success)
        if on_failure is not None:
            task.failed.connect(on_failure)
        task.progressed.connect(lambda f, t, lab=label: self.progressed.emit(lab, f, t))
        task.finished.connect(lambda t=task: self._forget(t))
        self._tasks.append(task)
        self.activeChanged.emit(len(self._tasks))
        self.pool.start(task.runnable)
        return task

    def _forget(self, task: Task) -> None:
        if task in self._tasks:
            self._tasks.remove(task)
        task.deleteLater()
        self.activeChanged.emit(len(self._tasks))

    def cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    def shutdown(self, wait_ms: int = 3000) -> None:
        """Cancel everything and wait (bounded) for the pool threads to return."""
        self.cancel_all()
        self.pool.waitForDone(wait_ms)
