"""One open state file: its parse result, bytes, model, statistics, diff and selection bus.

Every piece of work (model loading, parsing, payload statistics, the diff against a second file)
runs as a background task; the document publishes the outcome with signals that the views
listen to. The file is only ever opened read-only (a read-only memory map).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
from PySide6.QtCore import QObject, Signal

from kvscope.app.base.tasks import CancelToken, Report, Task, TaskRunner
from kvscope.app.document.doc_index import DocumentIndex
from kvscope.app.document.selection import SelectionBus

if TYPE_CHECKING:
    from kvscope.core.diff import StateDiff
    from kvscope.core.model_profile import ModelProfile
    from kvscope.core.reader.records import ParseResult
    from kvscope.core.stats import StatsReport


@dataclass
class Loaded:
    """What a load task hands back to the GUI thread."""

    result: ParseResult
    profile: ModelProfile | None
    model_error: str | None
    data: npt.NDArray[np.uint8]
    index: DocumentIndex


@dataclass
class DiffState:
    """A diff of this document (A) against another file (B)."""

    other_path: str
    other: ParseResult
    diff: StateDiff


def _load_profile(model_path: str | None) -> tuple[ModelProfile | None, str | None]:
    if not model_path:
        return None, None
    from kvscope.core.model_profile import ModelProfileError, load_model_profile

    try:
        return load_model_profile(model_path), None
    except ModelProfileError as e:
        return None, f"model {os.path.basename(model_path)} not used: {e}"


def load_job(path: str, model_path: str | None) -> Any:
    """The load task: model profile (if any), parse, bytes and index. Runs on a pool thread."""

    def job(token: CancelToken, report: Report) -> Loaded:
        from kvscope.core.reader.parse import read_state
        from kvscope.core.reader.source import ByteSource

        report(None, "reading model" if model_path else "parsing")
        profile, model_error = _load_profile(model_path)
        token.check()
        report(None, "parsing")
        res = read_state(path, profile=profile)
        token.check()
        data = ByteSource.open(path).bytes_all()
        return Loaded(res, profile, model_error, data, DocumentIndex(res))

    return job


def diff_available() -> bool:
    """True when the core ships the diff (``kvscope.core.diff``)."""
    import importlib.util

    return importlib.util.find_spec("kvscope.core.diff") is not None


class Document(QObject):
    """A state file as the GUI sees it; all attributes are replaced together when a load finishes."""

    loaded = Signal()  # result/index/profile replaced
    statsReady = Signal()  # stats set (findings may have grown)
    diffReady = Signal()  # diff set
    failed = Signal(str)  # a load failed: the file could not be read at all
    message = Signal(str)  # one-line status text
    busyChanged = Signal(bool)

    def __init__(self, path: str, runner: TaskRunner, model_path: str | None = None,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.path = os.path.abspath(path)
        self.runner = runner
        self.model_path = model_path
        self.bus = SelectionBus(self)
        self.result: ParseResult | None = None
        self.profile: ModelProfile | None = None
        self.model_error: str | None = None
        self.index: DocumentIndex | None = None
        self.data: npt.NDArray[np.uint8] = np.zeros(0, np.uint8)
        self.stats: StatsReport | None = None
        self.stats_error: str | None = None
        self.diff: DiffState | None = None
        self._tasks: dict[str, Task] = {}

    # -- state -----------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    @property
    def busy(self) -> bool:
        return any(not t.done for t in self._tasks.values())

    def _start(self, kind: str, label: str, job: Any, on_success: Any, on_failure: Any = None) -> Task:
        old = self._tasks.pop(kind, None)
        if old is not None and not old.done:
            old.cancel()
        task = self.runner.submit(label, job, on_success, on_failure)
        self._tasks[kind] = task
        task.finished.connect(lambda: self.busyChanged.emit(self.busy))
        self.busyChanged.emit(True)
        return task

    def cancel(self) -> None:
        for t in self._tasks.values():
            t.cancel()

    # -- loading ---------------------------------------------------------------------------------
    def load(self) -> Task:
        """Parse (again) with the current model; statistics follow when the parse is in."""
        self._tasks.pop("stats", None)
        return self._start("load", f"open {self.name}", load_job(self.path, self.model_path),
                           self._on_loaded, self._on_load_failed)

    def set_model(self, model_path: str | None) -> Task:
        """Use another model (or none) and parse again."""
        self.model_path = model_path
        return self.load()

    def _on_loaded(self, out: Loaded) -> None:
        self.result, self.profile, self.model_error = out.result, out.profile, out.model_error
        self.data, self.index = out.data, out.index
        self.stats, self.stats_error = None, None
        self.diff = None
        self.bus.clear()
        self.loaded.emit()
        res = out.result
        text = f"{self.name}: {res.kind}, layout {res.layout.name}, {len(res.findings)} findings"
        self.message.emit(out.model_error or text)
        if res.kind != "unknown" and res.sections:
            self._start("stats", f"statistics of {self.name}", self._stats_job(res), self._on_stats,
                        self._on_stats_failed)

    def _on_load_failed(self, message: str) -> None:
        self.failed.emit(message)

    # -- statistics -------------------------------------------------------------------------------
    @staticmethod
    def _stats_job(res: ParseResult) -> Any:
        def job(token: CancelToken, report: Report) -> StatsReport:
            from kvscope.core.stats import scan_stats

            report(None, "scanning payloads")
            return scan_stats(res)

        return job

    def _on_stats(self, report: StatsReport) -> None:
        self.stats = report
        self.statsReady.emit()
        n = sum(1 for ls in report.layers if ls.n_nonfinite or ls.zero_rows)
        self.message.emit(f"{self.name}: statistics of {len(report.layers)} records"
                          + (f", {n} with non-finite values or zero rows" if n else ""))

    def _on_stats_failed(self, message: str) -> None:
        self.stats_error = message
        self.message.emit(f"statistics failed: {message}")
        self.statsReady.emit()

    # -- diff --------------------------------------------------------------------------------------
    def compare_with(self, other_path: str) -> Task | None:
        """Parse ``other_path`` with this document's model and diff it against this one."""
        res = self.result
        if res is None:
            return None
        profile = self.profile

        def job(token: CancelToken, report: Report) -> DiffState:
            from kvscope.core.diff import diff_states
            from kvscope.core.reader.parse import read_state

            report(None, f"parsing {os.path.basename(other_path)}")
            other = read_state(other_path, profile=profile)
            if other.kind == "unknown":
                why = other.findings[0].message if other.findings else "not a llama.cpp state file"
                raise ValueError(f"{os.path.basename(other_path)}: {why}")
            token.check()
            report(None, "comparing")
            return DiffState(os.path.abspath(other_path), other, diff_states(res, other))

        return self._start("diff", f"diff {self.name}", job, self._on_diff, self._on_diff_failed)

    def _on_diff(self, state: DiffState) -> None:
        self.diff = state
        self.diffReady.emit()
        n = len(state.diff.differences)
        self.message.emit(f"diff against {os.path.basename(state.other_path)}: "
                          + (f"{n} differences" if n else "identical"))

    def _on_diff_failed(self, message: str) -> None:
        self.message.emit(f"diff failed: {message}")
