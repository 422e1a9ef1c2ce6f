"""The one job model of the app's real-engine runs, Verify and Repair (no widgets here).

An :class:`EngineJob` is one document's run of one kind: it starts the work as a background task
(:mod:`kvscope.app.base.tasks`), holds what is running (``step``: the stage text and the fraction done, None
for "busy") and what came of the last run (``result``, ``error``, ``cancelled``), and says so with the same
signals whatever the work is: ``progressed(fraction, text)`` on every progress tick (a view updates its
progress widget from it, nothing else), ``changed`` only when a run starts or ends or its outcome is
dismissed (a view re-renders from it), and the outcome as ``succeeded(result)``, ``failed(line)`` or
``stopped()`` before that last ``changed``. :meth:`EngineJob.cancel` cancels the task's token, and the
token's hooks stop the work where it is:

- work on a pool thread (Verify: :class:`kvscope.core.verify.run.Verifier`) registers the call that stops
  it with ``token.on_cancel`` (``Verifier.cancel`` kills the engine call in flight) and ends by raising the
  core's :class:`~kvscope.core.errors.Cancelled`;
- work in a child process (Repair runs ``kvscope repair``, so that Cancel stops it whatever engine call it is
  in and the app's process never holds its engines) runs it with :func:`run_command`, whose cancel sends the
  command SIGINT (it unwinds: its engines closed, its temporary files removed), kills its process group
  after :data:`KILL_AFTER_S`, and kills what is left of the group once the command has ended, so no child
  of it outlives the run.

Work that finished before the cancel reached it (a file written and verified) can leave its result in the
``late`` dict it was given; the job then reports that result instead of "cancelled".
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from typing import Any

from PySide6.QtCore import QObject, Signal

from kvscope.app.base.tasks import CancelToken, Job, Report, Task, TaskRunner

KILL_AFTER_S = 10.0  # after SIGINT, a command has this long to unwind before its process group is killed

Step = tuple[float | None, str]  # (fraction done, None: busy; the stage text)


class EngineJob(QObject):
    """One document's Verify or Repair: the run in progress (``step``), Cancel, and the last run's outcome."""

    changed = Signal()  # a run started or ended (after its outcome signal), or its outcome was dismissed
    progressed = Signal(object, str)  # fraction (float, or None: busy), stage text: only while running
    succeeded = Signal(object)  # the work's result (also a late one, that came in as it was cancelled)
    failed = Signal(str)  # why the run gave nothing (one line)
    stopped = Signal()  # cancelled, nothing came of it

    def __init__(self, runner: TaskRunner, kind: str, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.runner = runner
        self.kind = kind  # "verify", "repair": the task's label starts with it
        self.task: Task | None = None
        self.step: Step | None = None  # while running
        self.result: Any = None  # the last run's result
        self.error: str | None = None  # why the last run gave nothing (one line)
        self.cancelled = False  # the last run was cancelled (and gave nothing)
        self.late: dict[str, Any] = {}  # a result that came in as the run was cancelled ("result")
        self.ticks = 0  # progress ticks of the runs so far

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done

    def submit(self, label: str, job: Job, step: str = "starting", late: dict[str, Any] | None = None) -> Task:
        """Run ``job`` (``job(token, report)``) in the background as this job's run; one already running is
        returned instead. ``late``: the dict the work puts a result in that it had when cancelled."""
        if self.task is not None and not self.task.done:
            return self.task
        self.result, self.error, self.cancelled = None, None, False
        self.late = late if late is not None else {}
        self.step = (None, step)
        task = self.runner.submit(label, job, self._on_done, self._on_failed)
        task.progressed.connect(self._on_progress)
        task.cancelled.connect(self._on_cancelled)
        task.finished.connect(self._on_finished)
        self.task = task
        self.changed.emit()
        return task

    def cancel(self) -> None:
        """Stop the run in progress (the work is stopped where it is; its result, if any, dropped)."""
        if self.task is not None and not self.task.done:
            self.task.cancel()

    def dismiss(self) -> None:
        """Forget the last run's outcome (not a run in progress)."""
        if not self.running:
            self.result, self.error, self.cancelled = None, None, False
            self.changed.emit()

    def _on_progress(self, fraction: object, text: str) -> None:
        self.step = (float(fraction) if isinstance(fraction, (int, float)) else None, text)
        self.ticks += 1
        self.progressed.emit(self.step[0], text)

    def _on_done(self, result: object) -> None:
        self.result = result
        self.succeeded.emit(result)

    def _on_failed(self, message: str) -> None:
        self.error = message
        self.failed.emit(message)

    def _on_cancelled(self) -> None:
        late = self.late.get("result")
        if late is not None:  # the work had finished when the cancel reached it: what it did stays done
            self.result = late
            self.succeeded.emit(late)
            return
        self.cancelled = True
        self.stopped.emit()

    def _on_finished(self) -> None:
        self.task = None
        self.step = None
        self.changed.emit()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGINT (the command unwinds and cleans up), then the process group's SIGKILL if it does not end."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGINT)

    def kill() -> None:
        try:
            proc.wait(KILL_AFTER_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)

    threading.Thread(target=kill, name="kvscope-job-stop", daemon=True).start()


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL to what is left of ``proc``'s process group (its id is not reused while a member lives)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def run_command(cmd: list[str], token: CancelToken, report: Report, step: str, env: dict[str, str] | None = None,
                tick_s: float = 1.0) -> tuple[int, bytes, bytes]:
    """Run ``cmd`` in a process group of its own as a job's work: ``step`` reported with the seconds elapsed
    every ``tick_s``; the token's cancel stops it (SIGINT, then SIGKILL to its group), and once it has ended
    after a cancel what is left of its group is killed (a child that outlives it, holding its pipes, would
    otherwise keep the run going). Returns its status, stdout and stderr (a negative
    status: killed by that signal)."""
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, env=env, close_fds=True)
    token.on_cancel(lambda: _stop(proc))
    stdout, stderr = b"", b""
    try:
        while True:
            try:
                stdout, stderr = proc.communicate(timeout=tick_s)
                break
            except subprocess.TimeoutExpired:
                if token.cancelled and proc.poll() is not None:  # it ended; what it started still holds its pipes
                    _kill_group(proc)
                else:
                    report(None, f"{step} · {time.time() - t0:.0f} s")
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if token.cancelled:  # its children too
            _kill_group(proc)
    assert proc.returncode is not None
    return proc.returncode, stdout, stderr

