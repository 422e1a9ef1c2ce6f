"""One open state file: its inspection (parse, verdict, statistics, compatibility), bytes, model, diff, selection.

What the app shows about the file is the core's one inspection pipeline
(:mod:`kvscope.core.analysis.inspection`), the same :class:`~kvscope.core.analysis.inspection.Inspection`
``kvscope inspect --json --stats`` prints: the load task parses and judges the file
(``inspect_source``), then the statistics (``Inspection.add_stats``) and which llama.cpp generations
load it (``Inspection.compat_table``) are added to that same object. The two run side by side; the
table reads only the error findings, so when the statistics add errors (non-finite values) it is
worked out again after them, and what the app ends up showing is what ``inspect_source`` gives.
Every piece of work (model loading, the inspection's steps, the diff against a second file) runs as
a background task; the document publishes the outcome with signals that the views listen to. The
file is only ever opened read-only and read with bounded ``pread``
(:class:`~kvscope.app.document.source.ViewSource`), never mapped.

A file that changes while it is read (llama-server rewrites slot files in place) or afterwards
(a ``QFileSystemWatcher`` on the file and its folder, checked against the file's size, mtime and
inode as opened) raises ``fileChanged(reason)``; the page then offers Reload, which reads it again.

A state blob carries no tokens: ``given_tokens`` holds the ones the user gave for it (Tools → Tokens for
this blob…, :mod:`~kvscope.app.document.given_tokens`), which Verify and Repair re-prefill, as
``--tokens`` does on the command line; ``tokensChanged`` says they were given or cleared. They are
forgotten when a reload reads the file as something they do not fit (not a blob, another sequence).

Verify and Repair are the document's two real-engine runs, ``verify_run`` and ``repair_run``, both
:class:`~kvscope.app.document.engine_job.EngineJob`: the same progress (``progressed``, which a view shows in
its progress widget; ``verifyProgress`` relays Verify's), the same Cancel (the work stopped where it is), the
same outcome path (Verify's result becomes ``verify``, its failure ``verify_error``; ``verifyChanged`` only
when a run starts or ends).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QFileSystemWatcher, QObject, QSettings, QTimer, Signal

from kvscope.app.base.tasks import CancelToken, Report, Task, TaskRunner
from kvscope.app.document.bookmarks import Bookmarks
from kvscope.app.document.doc_index import DocumentIndex
from kvscope.app.document.engine_job import EngineJob
from kvscope.app.document.given_tokens import GivenTokens, count_text, takes_tokens, tokens_problem
from kvscope.app.document.missing_records import refine_verdict
from kvscope.app.document.repair_job import RepairRun
from kvscope.app.document.selection import SelectionBus
from kvscope.app.document.source import ViewSource, describe_change, empty_source
from kvscope.app.document.verify_job import NEEDS_MODEL, EngineChoice, verify_job
from kvscope.core.analysis.verdict import Verdict, plural
from kvscope.core.reader.source import CHANGED_MESSAGE, FileChangedError
from kvscope.core.textsafe import safe_text

if TYPE_CHECKING:
    from kvscope.core.analysis.compat import GenCompat
    from kvscope.core.analysis.consumers import ConsumerAnswer
    from kvscope.core.analysis.diff import StateDiff
    from kvscope.core.analysis.inspection import Inspection
    from kvscope.core.analysis.reuse import ReusePrediction
    from kvscope.core.analysis.stats import StatsReport
    from kvscope.core.model.profile import ModelProfile
    from kvscope.core.reader.records import ParseResult

WATCH_DELAY_MS = 300  # a writer's burst of events becomes one check


@dataclass
class Loaded:
    """What a load task hands back to the GUI thread: the pipeline's inspection (parse and verdict; the
    statistics and the compatibility are added by the tasks that follow)."""

    inspection: Inspection
    model_error: str | None
    data: ViewSource
    index: DocumentIndex


@dataclass
class Changed:
    """What a task hands back when the file changed under it (instead of a result)."""

    detail: str


@dataclass
class DiffState:
    """A diff of this document (A) against another file (B)."""

    other_path: str
    other: ParseResult
    diff: StateDiff


def _load_profile(model_path: str | None) -> tuple[ModelProfile | None, str | None]:
    if not model_path:
        return None, None
    from kvscope.core.model.profile import ModelProfileError, load_model_profile

    try:
        return load_model_profile(model_path), None
    except ModelProfileError as e:
        return None, f"model {safe_text(os.path.basename(model_path))} not used: {e}"


def load_job(path: str, model_path: str | None) -> Any:
    """The load task: model profile (if any), the inspection's parse and verdict, the index, the open
    file kept for the views. Runs on a pool thread; a file that changed during the parse gives
    :class:`Changed`."""

    def job(token: CancelToken, report: Report) -> Loaded | Changed:
        from kvscope.core.analysis.inspection import inspect_source

        report(None, "reading model" if model_path else "parsing")
        profile, model_error = _load_profile(model_path)
        token.check()
        report(None, "parsing")
        try:
            src = ViewSource.open(path)
        except ValueError as e:  # not a regular file
            raise ValueError(f"{safe_text(os.path.basename(path))}: {e}") from None
        try:
            found = inspect_source(src, profile, compat=False)  # the pipeline; stats and compat follow
        except FileChangedError as e:
            src.close()
            return Changed(e.detail or str(e))
        except BaseException:
            src.close()
            raise
        token.check()
        return Loaded(found, model_error, src, DocumentIndex(found.result))

    return job


def diff_available() -> bool:
    """True when the core ships the diff (``kvscope.core.analysis.diff``)."""
    import importlib.util

    return importlib.util.find_spec("kvscope.core.analysis.diff") is not None


class Document(QObject):
    """A state file as the GUI sees it; all attributes are replaced together when a load finishes."""

    loaded = Signal()  # result/index/profile replaced
    statsReady = Signal()  # stats set (findings may have grown)
    compatReady = Signal()  # compat set: which llama.cpp generations load the file
    verifyChanged = Signal()  # verify set (a ``kvscope verify`` result) or cleared, a run started, failed or ended
    verifyProgress = Signal(object, str)  # fraction, step of the verification running
    diffReady = Signal()  # diff set
    failed = Signal(str)  # a load failed: the file could not be read at all
    fileChanged = Signal(str)  # the file changed on disk or while it was read (the reason): offer Reload
    message = Signal(str)  # one-line status text
    busyChanged = Signal(bool)
    tokensChanged = Signal()  # given_tokens set or cleared

    def __init__(self, path: str, runner: TaskRunner, model_path: str | None = None,
                 parent: QObject | None = None, settings: QSettings | None = None) -> None:
        super().__init__(parent)
        self.path = os.path.abspath(path)
        self.bookmarks = Bookmarks(self.path, 0, settings, self)  # settings None: kept in memory only
        self.runner = runner
        self.model_path = model_path
        self.bus = SelectionBus(self)
        self.inspection: Inspection | None = None  # the pipeline's: parse, verdict, then stats and compat
        self._errors_read = 0  # the inspection's error findings when its compatibility was last asked for
        self.model_error: str | None = None
        self.index: DocumentIndex | None = None
        self.data: ViewSource = empty_source()
        self.stats_error: str | None = None
        self.compat_error: str | None = None
        self.verify: dict[str, Any] | None = None
        self.verify_error: str | None = None  # why the last Verify could not run (no model, no engine ...)
        self.verify_engine: str = ""  # the engine the last (or running) Verify was asked for, in words
        self.verify_stale: str | None = None  # why ``verify`` is not the last run's result (that run was cancelled)
        self.diff: DiffState | None = None
        self.changed: str | None = None  # why the file on disk is no longer what is shown (None: it is)
        self.given_tokens: GivenTokens | None = None  # the tokens a blob was made of, as the user gave them
        self.given_tokens_text = ""  # the text they were given as (the dialog starts from it)
        self._tasks: dict[str, Task] = {}
        # Verify and Repair: the one job model (progress, Cancel, outcome), Verify's outcome kept in ``verify``
        self.verify_run = EngineJob(runner, "verify", self)
        self.verify_run.progressed.connect(self.verifyProgress)
        self.verify_run.succeeded.connect(self._on_verified)
        self.verify_run.failed.connect(self._on_verify_failed)
        self.verify_run.stopped.connect(self._on_verify_cancelled)
        self.verify_run.changed.connect(self._on_verify_changed)
        self.repair_run = RepairRun(runner, self)
        self._watcher = QFileSystemWatcher(self)
        self._watcher.fileChanged.connect(self._on_disk_event)
        self._watcher.directoryChanged.connect(self._on_disk_event)
        self._check_timer = QTimer(self)
        self._check_timer.setSingleShot(True)
        self._check_timer.setInterval(WATCH_DELAY_MS)
        self._check_timer.timeout.connect(self.check_disk)

    # -- state -----------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """The file's base name as shown (tabs, title, messages): escaped, so a bidi control or a newline in
        it cannot reorder or split what is drawn around it."""
        return safe_text(os.path.basename(self.path))

    @property
    def busy(self) -> bool:
        return any(not t.done for t in self._tasks.values())

    @property
    def result(self) -> ParseResult | None:
        """The parse (the inspection's); None before one."""
        return self.inspection.result if self.inspection is not None else None

    @property
    def profile(self) -> ModelProfile | None:
        """The model the file was read with (None: without one, or it could not be used)."""
        return self.inspection.profile if self.inspection is not None else None

    @property
    def stats(self) -> StatsReport | None:
        """The inspection's payload statistics; None until they are in (or when they failed: ``stats_error``)."""
        return self.inspection.stats if self.inspection is not None else None

    @property
    def compat(self) -> list[GenCompat] | None:
        """The inspection's answer per layout generation; None until it is in (or when it failed:
        ``compat_error``), empty for a file that is not a state file."""
        return self.inspection.compatibility if self.inspection is not None else None

    def verdict(self) -> Verdict | None:
        """The inspection's verdict (judged again when the statistics added findings), with the layer a
        Verify result names for a dropped record; None before a parse."""
        if self.inspection is None:
            return None
        return refine_verdict(self.inspection.verdict, self.inspection.result, self.verify)

    def consumers(self) -> list[ConsumerAnswer]:
        """What each consumer (llama.cpp builds, llama-server) does with the file: the inspection's
        (``inspect --json``'s ``consumers``); empty before a parse."""
        return self.inspection.consumers() if self.inspection is not None else []

    def reuse_prediction(self) -> list[ReusePrediction]:
        """What each pinned llama-server does with the slot on a prompt that continues it: the
        inspection's (``inspect --json``'s ``reuse_prediction``); empty before a parse."""
        return self.inspection.reuse_prediction() if self.inspection is not None and self.inspection.is_state else []

    def set_verify(self, result: dict[str, Any] | None) -> None:
        """Show a ``kvscope verify`` result (keys ``verdict``, ``engine``, ``restore``, ``next_token``,
        ``records``), or None for "not verified"."""
        self.verify = dict(result) if result is not None else None
        self.verify_error = None
        self.verify_stale = None
        self.verifyChanged.emit()

    # -- tokens given for a blob -------------------------------------------------------------------------
    def takes_tokens(self) -> bool:
        """A state blob with no tokens of its own: Verify and Repair need the ones it was made of."""
        return takes_tokens(self.result)

    def set_given_tokens(self, tokens: GivenTokens | None, text: str = "") -> None:
        """Give the tokens the blob was made of (``text``: as typed), or None to clear them; ValueError (one
        line) when they cannot be used for this file or a Verify is running with the ones given before."""
        if self.verifying:
            raise ValueError("a Verify is running with the tokens given before: cancel it or let it finish")
        if tokens is not None:
            why = tokens_problem(self.result, self.profile, tokens)
            if why is not None:
                raise ValueError(why)
        if tokens == self.given_tokens and (tokens is None or text == self.given_tokens_text):
            return
        self.given_tokens = tokens
        self.given_tokens_text = text if tokens is not None else ""
        if self.verify is not None:  # it re-prefilled other tokens (or none)
            self.verify_stale = "the tokens given changed since it ran: verify again"
            self.verifyChanged.emit()
        self.tokensChanged.emit()
        self.message.emit(f"{self.name}: " + (f"{count_text(tokens)} given" if tokens is not None
                                               else "the tokens given are cleared"))

    # -- verify --------------------------------------------------------------------------------------
    @property
    def verifying(self) -> bool:
        return self.verify_run.running

    @property
    def verify_step(self) -> tuple[float | None, str] | None:
        """(fraction, step) while a Verify runs, else None."""
        return self.verify_run.step

    def verify_problem(self) -> str | None:
        """Why Verify cannot run on this file with this model (one line; the core's check, the one ``kvscope
        verify`` makes before any engine starts: an empty or random file, a model the file does not fit, tokens
        given that cannot be re-prefilled), None when it can or when only the model is missing (Verify then
        says so and offers the model chooser)."""
        if self.result is None or self.profile is None:
            return None
        from kvscope.core.verify.preconditions import verify_problem

        return verify_problem(self.result, self.profile, self.given_tokens)

    def start_verify(self, choice: EngineChoice) -> Task | None:
        """Verify the file in ``choice``'s engine in the background (None, and ``verify_error`` set, when it
        cannot start: no parse yet, no model, :meth:`verify_problem`)."""
        if self.result is None:
            return None
        self.verify_engine = choice.describe()
        if self.profile is None or not self.model_path:
            self.verify_error = NEEDS_MODEL if not self.model_error else f"{NEEDS_MODEL} ({self.model_error})"
            self.verifyChanged.emit()
            return None
        why = self.verify_problem()
        if why is not None:
            self.verify_error = why
            self.verifyChanged.emit()
            return None
        self.verify_error = None
        task = self.verify_run.submit(f"verify {self.name}", verify_job(self.path, self.model_path, choice,
                                                                        self.profile, self.given_tokens),
                                      step=f"starting {self.verify_engine}")
        self._track("verify", task)
        return task

    def cancel_verify(self) -> None:
        """Stop a running Verify (the engine call in flight is killed)."""
        self.verify_run.cancel()

    def _on_verified(self, result: dict[str, Any]) -> None:
        self.verify = result
        self.verify_stale = None
        v = result.get("verdict")
        eng = result.get("engine") or {}
        self.message.emit(f"{self.name}: verified in {eng.get('kind')} {eng.get('build') or ''}".rstrip()
                          + f": {v}")

    def _on_verify_failed(self, message: str) -> None:
        self.verify_error = message
        self.message.emit(f"verify failed: {message}")

    def _on_verify_cancelled(self) -> None:
        if self.verify is not None:
            self.verify_stale = (f"the run in {self.verify_engine} was cancelled: the result shown is the earlier "
                                 "run's")
        self.message.emit(f"{self.name}: verification cancelled")

    def _on_verify_changed(self) -> None:  # a run started or ended (not a progress tick)
        self.verifyChanged.emit()

    def _start(self, kind: str, label: str, job: Any, on_success: Any, on_failure: Any = None) -> Task:
        """Run ``job`` as the document's ``kind`` task (one that was running is stopped)."""
        old = self._tasks.pop(kind, None)
        if old is not None and not old.done:
            old.cancel()
        task = self.runner.submit(label, job, on_success, on_failure)
        self._track(kind, task)
        return task

    def _track(self, kind: str, task: Task) -> None:
        """Count ``task`` as the document's ``kind`` work (``busy``; cancelled with the document)."""
        self._tasks[kind] = task
        task.finished.connect(lambda: self.busyChanged.emit(self.busy))
        self.busyChanged.emit(True)

    def cancel(self) -> None:
        for t in self._tasks.values():
            t.cancel()
        self.repair_run.cancel()  # a page closed while its repair runs stops the run (nothing is written)

    def close(self) -> None:
        """Stop the work, the watching, and close the file."""
        self.cancel()
        self._check_timer.stop()
        paths = self._watcher.files() + self._watcher.directories()
        if paths:
            self._watcher.removePaths(paths)
        self.data.close()

    # -- changes on disk ---------------------------------------------------------------------------
    def _watch(self) -> None:
        """Watch the file and its folder (a file replaced by rename keeps being watched)."""
        want = [p for p in (self.path, os.path.dirname(self.path)) if os.path.exists(p)]
        have = set(self._watcher.files() + self._watcher.directories())
        missing = [p for p in want if p not in have]
        if missing:
            self._watcher.addPaths(missing)

    def _on_disk_event(self, _path: str) -> None:
        self._check_timer.start()

    def check_disk(self) -> bool:
        """Compare the file on disk with the one read; True (and ``fileChanged``) when it changed."""
        self._watch()
        if self.result is None or self.changed is not None:
            return self.changed is not None
        why = describe_change(self.data.identity, self.path)
        if why is not None:
            self._set_changed(why)
        return why is not None

    def _set_changed(self, why: str) -> None:
        self.changed = why
        self.fileChanged.emit(why)
        self.message.emit(f"{self.name}: {CHANGED_MESSAGE if why.startswith('short read') else why}")

    def reload(self) -> Task:
        """Read the file again (the same model)."""
        return self.load()

    # -- loading ---------------------------------------------------------------------------------
    def load(self) -> Task:
        """Parse (again) with the current model; statistics follow when the parse is in."""
        for kind in ("stats", "compat", "verify"):
            old = self._tasks.pop(kind, None)
            if old is not None and not old.done:
                old.cancel()
        return self._start("load", f"open {self.name}", load_job(self.path, self.model_path),
                           self._on_loaded, self._on_load_failed)

    def set_model(self, model_path: str | None) -> Task:
        """Use another model (or none) and parse again."""
        self.model_path = model_path
        return self.load()

    def _on_loaded(self, out: Loaded | Changed) -> None:
        self._watch()
        if isinstance(out, Changed):
            self._set_changed(f"{CHANGED_MESSAGE} ({out.detail})")
            if self.result is None:
                self.failed.emit(f"{CHANGED_MESSAGE}: reload it once the writer is done")
            return
        old = self.data
        self.inspection, self.model_error = out.inspection, out.model_error
        self._errors_read = out.inspection.result.n_errors  # before the statistics add theirs
        self.data, self.index = out.data, out.index
        self.data.on_changed = self._on_read_changed
        self.stats_error, self.compat_error = None, None
        self.diff = None
        self.changed = None
        if self.verify is not None or self.verify_error is not None:  # about the bytes or model read before
            self.verify, self.verify_error, self.verify_stale = None, None, None
            self.verifyChanged.emit()
        self.bus.clear()
        if old is not self.data:
            old.close()
        self.bookmarks.set_size(self.result.size if self.result is not None else 0)
        self.loaded.emit()
        found = out.inspection
        res = found.result
        self.message.emit(out.model_error or f"{self.name}: read, {plural(len(res.findings), 'finding')}")
        forget = tokens_problem(res, self.profile, self.given_tokens) if self.given_tokens is not None else None
        if forget is not None:  # the file now reads as something the tokens do not fit
            self.given_tokens, self.given_tokens_text = None, ""
            self.tokensChanged.emit()
            self.message.emit(f"{self.name}: the tokens given are forgotten: {forget}")
        if not found.is_state:  # no llama.cpp generation reads it: nothing to work out
            found.compatibility = []
            self.compatReady.emit()
        else:
            self._start_compat(found)
            self._start("stats", f"statistics of {self.name}", self._stats_job(found, out.data), self._on_stats,
                        self._on_stats_failed)
        QTimer.singleShot(0, self.check_disk)  # a change between the parse and now

    def _on_read_changed(self, detail: str) -> None:
        """A view's read of the open file came up short (called on the GUI thread)."""
        def report() -> None:
            if self.changed is None:
                self._set_changed(f"{CHANGED_MESSAGE} ({detail})")

        QTimer.singleShot(0, report)

    def _on_load_failed(self, message: str) -> None:
        self.failed.emit(message)

    # -- statistics -------------------------------------------------------------------------------
    @staticmethod
    def _stats_job(found: Inspection, data: ViewSource) -> Any:
        def job(token: CancelToken, report: Report) -> StatsReport | Changed:
            report(None, "scanning payloads")
            try:
                return found.add_stats(data)
            except FileChangedError as e:
                return Changed(e.detail or str(e))

        return job


    def _on_stats(self, report: StatsReport | Changed) -> None:
        if isinstance(report, Changed):
            self._on_stats_failed(CHANGED_MESSAGE)
            if self.changed is None:
                self._set_changed(f"{CHANGED_MESSAGE} ({report.detail})")
            return
        self.statsReady.emit()
        found = self.inspection
        if found is not None and found.result.n_errors != self._errors_read:
            # errors the statistics found (non-finite values) change the generations' answers: the table
            # worked out beside the scan is worked out again, after it, as inspect_source orders the steps
            self._errors_read = found.result.n_errors
            self._start_compat(found)
        n = sum(1 for ls in report.layers if ls.n_nonfinite or ls.zero_rows)
        self.message.emit(f"{self.name}: statistics of {plural(len(report.layers), 'record')}"
                          + (f", {n} with non-finite values or zero rows" if n else ""))

    def _on_stats_failed(self, message: str) -> None:
        self.stats_error = message
        self.message.emit(f"statistics failed: {message}")
        self.statsReady.emit()

    # -- compatibility --------------------------------------------------------------------------------
    def _start_compat(self, found: Inspection) -> None:
        """Work out the inspection's compatibility (``Inspection.compat_table``) in the background; it is set on
        the GUI thread, so a run a newer one replaced cannot overwrite that one's answer."""
        data = self.data

        def job(token: CancelToken, report: Report) -> list[GenCompat] | Changed:
            report(None, "which llama.cpp builds load it")
            try:
                return found.compat_table(data)
            except FileChangedError as e:
                return Changed(e.detail or str(e))

        task = self._start("compat", f"compatibility of {self.name}", job,
                           lambda out: self._on_compat(found, out), self._on_compat_failed)
        task.cancelled.connect(lambda t=task: self._on_compat_cancelled(t))

    def _on_compat(self, found: Inspection, compat: list[GenCompat] | Changed) -> None:
        if found is not self.inspection:  # a parse since replaced it
            return
        if isinstance(compat, Changed):
            self._on_compat_failed(CHANGED_MESSAGE)
            return
        found.compatibility, self.compat_error = compat, None
        self.compatReady.emit()

    def _on_compat_cancelled(self, task: Task) -> None:
        if self._tasks.get("compat") is task and self.compat is None:  # not replaced by a new parse's
            self._on_compat_failed("cancelled; reload the file to work it out")

    def _on_compat_failed(self, message: str) -> None:
        if self.inspection is not None:
            self.inspection.compatibility = None
        self.compat_error = message
        self.compatReady.emit()

    # -- diff --------------------------------------------------------------------------------------
    def compare_with(self, other_path: str) -> Task | None:
        """Parse ``other_path`` with this document's model and diff it against this one."""
        res = self.result
        if res is None:
            return None
        profile = self.profile

        def job(token: CancelToken, report: Report) -> DiffState:
            from kvscope.core.analysis.diff import diff_states
            from kvscope.core.analysis.inspection import inspect_file

            report(None, f"parsing {safe_text(os.path.basename(other_path))}")
            other = inspect_file(other_path, profile, compat=False)  # the pipeline's parse of B
            if not other.is_state:
                raise ValueError(f"{safe_text(os.path.basename(other_path))}: {other.not_state_reason()}")
            token.check()
            report(None, "comparing")
            return DiffState(os.path.abspath(other_path), other.result, diff_states(res, other.result))

        return self._start("diff", f"diff {self.name}", job, self._on_diff, self._on_diff_failed)

    def _on_diff(self, state: DiffState) -> None:
        self.diff = state
        self.diffReady.emit()
        n = len(state.diff.differences)
        self.message.emit(f"diff against {safe_text(os.path.basename(state.other_path))}: "
                          + (plural(n, "difference") if n else "identical"))

    def _on_diff_failed(self, message: str) -> None:
        self.message.emit(f"diff failed: {message}")
