"""Lab view: restore corrupted copies of a state into a live context, under each failure policy and reader
kind, and see what happens (the ``kvscope lab`` matrix, interactive).

Pick the live context (an open whole-context state, or a lab scenario folder), the state to restore
(another open file, or the scenario's clean per-sequence blob) and the destination sequence; the model
is the document's. Choose corruptions (the catalog entries that apply, plus free-text specs), policies
and reader kinds (:class:`~kvscope.app.lab.controls.LabControls`); the matrix runs on the app's thread
pool with progress and Cancel, and fills in as cells finish. The engine choice runs the same cases in
real llama.cpp, a llama-server, or both llama.cpp and the core (:mod:`~kvscope.app.lab.engine_jobs`; the
build or server from the engine settings, ``engine_choice``): a case where the two disagree is framed
and marked ``≠`` in the matrix, and the detail pane says what differed. Selecting a cell shows its detail
(:class:`~kvscope.app.lab.detail.LabDetail`); Export saves what ``kvscope lab --markdown`` / ``--json``
prints (with ``--engine``, for an engine run).
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QModelIndex, Qt, QTimer, Signal
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFileDialog,
    QFrame,
    QHeaderView,
    QScrollArea,
    QSplitter,
    QStackedWidget,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from kvscope.app.base.tasks import Task
from kvscope.app.base.theme import WARNING_COLOR, Theme
from kvscope.app.base.widgets import plain_label
from kvscope.app.document.document import Document
from kvscope.app.document.verify_job import EngineChoice
from kvscope.app.lab.controls import LabControls
from kvscope.app.lab.detail import LabDetail
from kvscope.app.lab.engine_jobs import engine_run_job
from kvscope.app.lab.jobs import ScenarioReady, guess_kind, lab_unavailable, run_job, scenario_folder, scenario_job
from kvscope.app.lab.model import (
    DISAGREE_LEGEND,
    OUTCOME_LEGEND,
    LabMatrixModel,
    OutcomeDelegate,
    combined_run,
    export_run,
)
from kvscope.core.analysis.verdict import plural
from kvscope.core.lab.report import LabRun

if TYPE_CHECKING:
    from kvscope.core.lab.engine_lab import EngineRun
    from kvscope.core.lab.report import CellResult

COLUMN_WIDTH = 132  # the report's matrix picture uses fixed columns of this width
ROW_PAD = 3  # pixels above the text height of a matrix row
DETAIL_MIN = 130  # the selected cell's detail keeps at least this height below the matrix (it scrolls)
MATRIX_HINT = ("The matrix appears here: choose corruptions, policies and readers on the left and press Run. "
               "Each cell restores the file, corrupted that way, into the live context.")


class LabView(QWidget):
    """The Lab tab of one document (whose model the lab uses)."""

    runProgress = Signal(object, str)  # fraction (None: busy), text
    runFinished = Signal()  # a run ended: done, cancelled or failed
    scenarioChanged = Signal()  # a scenario loaded or failed to load

    def __init__(self, doc: Document, theme: Theme, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.doc, self.theme = doc, theme
        self.ready: ScenarioReady | None = None  # the scenario the controls describe
        self.run_ready: ScenarioReady | None = None  # the scenario of the matrix shown
        self.lab_run: LabRun | None = None  # the last finished (or cancelled) run
        self.engine_run: EngineRun | None = None  # ... when it ran in a real engine
        self.engine_choice: Callable[[], EngineChoice] = EngineChoice  # the window gives the settings' choice
        self.error = ""  # the last error shown (tests and scripts read it)
        self._load_task: Task | None = None
        self._run_task: Task | None = None
        self._load_error: str | None = None  # the document could not be read
        tasks: list[Task] = []  # every task started here; cancelled when the document closes
        self._tasks = tasks

        def cancel_tasks(*_: object) -> None:
            for t in tasks:
                if not t.done:
                    t.cancel()

        doc.destroyed.connect(cancel_tasks)
        self._stop = threading.Event()
        self._sink: deque[CellResult] = deque()
        self._dirty = True  # the choices changed since the scenario was last loaded
        self._load_timer = QTimer(self)
        self._load_timer.setSingleShot(True)
        self._load_timer.setInterval(150)
        self._load_timer.timeout.connect(self.load_scenario)

        self.reason = plain_label("", wrap=True)
        self.reason.setStyleSheet(f"color: {WARNING_COLOR};")
        self.controls = LabControls(doc.path, self.open_files)
        self.controls_area = QScrollArea()  # the controls keep their sizes on a small window and scroll
        self.controls_area.setWidget(self.controls)
        self.controls_area.setWidgetResizable(True)
        self.controls_area.setFrameShape(QFrame.Shape.NoFrame)
        self.controls_area.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.controls_area.setMinimumWidth(self.controls.minimumSizeHint().width() + 16)
        self.model = LabMatrixModel(self)
        self.model.set_dark(theme.dark)
        self.table = QTableView()
        self.table.setModel(self.model)
        self.table.setItemDelegate(OutcomeDelegate(self.table))
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setWordWrap(False)
        self.table.setTextElideMode(Qt.TextElideMode.ElideNone)
        hh, vh = self.table.horizontalHeader(), self.table.verticalHeader()
        hh.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)  # headers and texts never cut
        vh.setSectionResizeMode(QHeaderView.ResizeMode.Fixed)
        vh.setMinimumSectionSize(self.table.fontMetrics().height() + ROW_PAD)  # dense: 21 cases fit at 1280x800
        vh.setDefaultSectionSize(self.table.fontMetrics().height() + ROW_PAD)
        # the style's header margins would cut the case names' underscores off at this row height
        vh.setStyleSheet("QHeaderView::section { padding-top: 0px; padding-bottom: 0px; }")
        self.matrix_hint = plain_label(MATRIX_HINT, wrap=True)
        self.matrix_hint.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.matrix_stack = QStackedWidget()
        self.matrix_stack.addWidget(self.matrix_hint)
        self.matrix_stack.addWidget(self.table)
        self.summary = plain_label(" ", wrap=True)
        self.summary.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.legend = plain_label(OUTCOME_LEGEND, wrap=True)
        self.detail = LabDetail(theme)
        top = QWidget()
        tl = QVBoxLayout(top)
        tl.setContentsMargins(0, 0, 0, 0)
        tl.addWidget(self.summary)
        tl.addWidget(self.matrix_stack, 1)
        tl.addWidget(self.legend)
        self.detail_area = QScrollArea()  # below its minimum size the detail pane scrolls, never squeezes
        self.detail_area.setWidget(self.detail)
        self.detail_area.setWidgetResizable(True)
        self.detail_area.setFrameShape(QFrame.Shape.NoFrame)
        self.matrix_pane = top
        # the controls the whole height on the left; the matrix above the selected cell's detail on the right
        self.split = QSplitter(Qt.Orientation.Vertical)
        self.split.addWidget(top)
        self.split.addWidget(self.detail_area)
        self.split.setStretchFactor(0, 1)
        self.split.setStretchFactor(1, 1)
        self.split.setSizes([520, 420])
        self.split.setChildrenCollapsible(False)
        self.upper = QSplitter(Qt.Orientation.Horizontal)
        self.upper.addWidget(self.controls_area)
        self.upper.addWidget(self.split)
        self.upper.setStretchFactor(1, 1)
        self.upper.setSizes([280, 1000])
        self.upper.setChildrenCollapsible(False)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(2, 2, 2, 2)
        lay.addWidget(self.reason)
        lay.addWidget(self.upper, 1)
        self.model.modelReset.connect(self._on_matrix_reset)

        c = self.controls
        c.inputsChanged.connect(self._schedule_load)
        c.choicesChanged.connect(self._update_controls)
        c.folder_button.clicked.connect(self.choose_folder)
        c.input_button.clicked.connect(self.choose_input)
        c.run_button.clicked.connect(self.run_matrix)
        c.cancel_button.clicked.connect(self.cancel)
        c.export_button.clicked.connect(self.export_dialog)
        self.table.selectionModel().currentChanged.connect(self._on_current)
        doc.loaded.connect(self._on_doc_loaded)
        doc.failed.connect(self._on_doc_failed)
        theme.changed.connect(self.model.set_dark)
        self._update_controls()  # the file choices are looked up when the tab is first shown

    # -- inputs --------------------------------------------------------------------------------------
    def open_files(self) -> list[tuple[str, str | None]]:
        """(path, state kind) of the files open in the window, this document first."""
        docs = [self.doc]
        for w in getattr(self.window(), "documents", []):
            d = getattr(w, "doc", None)
            if isinstance(d, Document) and d is not self.doc:
                docs.append(d)
        return [(d.path, guess_kind(d.path, d.result.kind if d.result is not None else None)) for d in docs]

    def unavailable(self) -> str | None:
        """Why the lab cannot run for this document, else None."""
        why = lab_unavailable()
        if why is not None:
            return why
        if self.doc.result is None:
            return self._load_error or f"waiting for {self.doc.name} to load…"
        if self.doc.profile is None:
            detail = self.doc.model_error or "choose the GGUF it was written with: File → Model… (Ctrl+M)"
            return f"The lab needs the model the state was written with; {detail}"
        return None

    def choose_folder(self) -> None:
        start = scenario_folder(self.doc.path) or os.path.dirname(self.doc.path)
        folder = QFileDialog.getExistingDirectory(self, "Lab scenario folder", start)
        if not folder:
            return
        if scenario_folder(folder) is None:
            self._show_error(f"{folder} is not a lab scenario folder (it has no context.json)")
            return
        self.controls.add_folder(folder)

    def choose_input(self) -> None:
        start = os.path.dirname(self.controls.restore_path or self.doc.path)
        path, _ = QFileDialog.getOpenFileName(self, "State to restore", start, "llama.cpp state (*.seqdata.bin "
                                              "*.seqstate *.state.bin *.session *.bin *.slot);;All files (*)")
        if path:
            self.controls.set_restore(path)

    # -- scenario ------------------------------------------------------------------------------------
    def showEvent(self, e: QShowEvent) -> None:
        super().showEvent(e)
        self.controls.refresh_choices()
        if self._dirty:
            self._schedule_load()

    def _on_doc_failed(self, message: str) -> None:
        self._load_error = f"{self.doc.name} could not be read: {message}"
        self._update_controls()

    def _track(self, task: Task) -> Task:
        self._tasks[:] = [t for t in self._tasks if not t.done] + [task]
        return task

    def _on_doc_loaded(self) -> None:
        self._load_error = None
        self.ready = None
        if self.isVisible():  # else when shown (it lists the live context's folder)
            self.controls.refresh_choices()
        self._schedule_load()

    def _schedule_load(self) -> None:
        self._dirty = True
        self._update_controls()
        if self.isVisible():
            self._load_timer.start()

    def load_scenario(self) -> Task | None:
        """Build the scenario of the current choices in the background (None: nothing to load)."""
        self._load_timer.stop()
        self._dirty = False
        if self._load_task is not None and not self._load_task.done:
            self._load_task.cancel()
        self._load_task = None
        c, profile = self.controls, self.doc.profile
        live, restore = c.live_path, c.restore_path
        if self.unavailable() is not None or live is None or restore is None or profile is None:
            if self.unavailable() is None:
                self.summary.setText("Open a whole-context state (context.state.bin, a session file) or choose a lab "
                                     "scenario folder, and a state to restore.")
            self._update_controls()
            return None
        base = self.ready if self.ready is not None else self.run_ready
        job = scenario_job(live, restore, c.into_spin.value(), profile, base)
        self._load_task = task = self._track(self.doc.runner.submit(f"lab scenario of {self.doc.name}", job,
                                                                    self._on_ready, self._on_load_failed))
        task.finished.connect(self._update_controls)
        self.summary.setText("Loading the scenario…")
        self._update_controls()
        return task

    def _on_ready(self, ready: ScenarioReady) -> None:
        self.ready = ready
        self.error = ""
        self.controls.set_cases(ready)
        self.summary.setText(_summary(ready))
        self.scenarioChanged.emit()
        self._update_controls()

    def _on_load_failed(self, message: str) -> None:
        self.ready = None
        self.controls.set_cases(None)
        self.summary.setText(" ")
        self._show_error(f"Cannot build the scenario: {message}")
        self.scenarioChanged.emit()

    # -- state ---------------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._run_task is not None and not self._run_task.done

    def _update_controls(self) -> None:
        why = self.unavailable()
        c = self.controls
        loading = self._load_task is not None and not self._load_task.done
        self.reason.setText(why or self.error)
        self.reason.setVisible(bool(why or self.error))
        prof = self.doc.profile
        c.model_label.setText(os.path.basename(self.doc.model_path) if prof is not None and self.doc.model_path
                              else "none")
        cases, specs, _ = c.selected_cases() if why is None else ([], [], "")
        core_ok = c.engine != "torch" or (bool(c.policies()) and bool(c.readers()))
        can_run = (why is None and not self.running and not loading and not self._dirty and self.ready is not None
                   and bool(cases or specs) and core_ok)
        c.set_state(why, self.running, can_run, self.lab_run is not None)

    def _show_error(self, text: str) -> None:
        self.error = text
        self.controls.status.setText(text.splitlines()[0])
        self._update_controls()

    # -- running -------------------------------------------------------------------------------------
    def run_matrix(self) -> Task | None:
        """Start the matrix of the current choices (None: nothing to run; the reason is shown)."""
        if self.running:
            return None
        c, ready = self.controls, self.ready
        cases, specs, err = c.selected_cases()
        engine = c.engine
        policies, readers = c.policies(), c.readers()
        core = engine == "torch"
        if self.unavailable() or ready is None or err or not (cases or specs) or (core and not (policies and readers)):
            self._show_error(err or self.unavailable() or "nothing to run: choose a scenario, corruptions, "
                             "policies and readers")
            return None
        self.error = ""
        self._stop = threading.Event()
        self._sink = deque()
        self.lab_run, self.engine_run, self.run_ready = None, None, ready
        rows = [*((x.name, x.description) for x in cases), *((s, s) for s in specs)]
        self.model.set_layout(rows, policies if core else (), readers if core else (), grow=not core)
        self.legend.setText(OUTCOME_LEGEND)
        self.detail.set_ready(ready)
        if core:
            job = run_job(ready.scenario, cases, specs, policies, readers, self._stop, self._sink)
            n_cells = len(rows) * len(policies) * len(readers)
        else:
            job = engine_run_job(ready.scenario, cases, specs, engine, self.engine_choice(), self.doc.model_path,
                                 self._stop, self._sink)
            n_cells = len(rows) * (2 if engine == "both" else 1)
        self._run_task = task = self._track(self.doc.runner.submit(f"lab matrix of {self.doc.name}", job,
                                                                   self._on_run_done, self._on_run_failed))
        task.progressed.connect(self._on_progress)
        task.cancelled.connect(self._on_run_cancelled)
        task.finished.connect(self._on_run_finished)
        c.progress.setValue(0)
        cells = plural(n_cells, "cell")
        c.status.setText(f"running {cells}…" if core else f"starting {engine}: {cells}…")
        self._update_controls()
        return task

    def cancel(self) -> None:
        """Stop the run after the cell in progress; the cells that ran stay in the matrix."""
        if self.running:
            self._stop.set()
            self.controls.status.setText("cancelling…")

    def _drain(self) -> None:
        while self._sink:
            self.model.add_result(self._sink.popleft())

    def _on_progress(self, fraction: object, text: str) -> None:
        self._drain()
        if isinstance(fraction, float):
            self.controls.progress.setValue(int(fraction * 1000))
        self.controls.status.setText(text)
        self.runProgress.emit(fraction, text)

    def _on_run_done(self, out: LabRun | EngineRun) -> None:
        self._sink.clear()
        if not isinstance(out, LabRun):  # an EngineRun
            self.show_engine_run(out)
            return
        run = out
        self.lab_run = run
        self.model.set_run(run)
        total = len(run.cases) * len(run.policies) * len(run.readers)
        self.controls.status.setText(f"cancelled after {len(run.results):,} of {total:,} cells" if run.cancelled
                                     else f"{plural(len(run.results), 'cell')} in {run.seconds:.1f} s")

    def show_engine_run(self, er: EngineRun, disagreements: list[Any] | None = None) -> None:
        """Show a run in a real engine (``disagreements``: shown instead of the run's own, for a view test)."""
        self.engine_run = er
        self.lab_run = run = combined_run(er)
        self.model.set_engine_run(er, disagreements)
        n = len(self.model.disagreements)
        eng = " ".join(str(er.engine[k]) for k in ("kind", "build") if er.engine.get(k))
        text = f"{plural(len(run.results), 'cell')} in {er.run.seconds:.1f} s in {eng}"
        if run.cancelled:
            text = f"cancelled: {text}"
        if er.torch is not None:
            text += f" · {plural(n, 'case')} where the core and the engine disagree" if n else \
                " · the core and the engine agree on every case"
        self.controls.status.setText(text)
        self.summary.setText(_summary(self.run_ready) if self.run_ready is not None else self.summary.text())
        if er.notes:
            self.summary.setText(self.summary.text() + "".join(f"\nnote: {x}" for x in er.notes[:4]))
        self.legend.setText(OUTCOME_LEGEND + (" · " + DISAGREE_LEGEND if er.torch is not None else ""))

    def _on_run_failed(self, message: str) -> None:
        self._drain()
        self._show_error(f"The lab run failed: {message}")

    def _on_run_cancelled(self) -> None:
        self._drain()
        self.controls.status.setText(f"cancelled; {plural(len(self.model.cells), 'cell')} ran")

    def _on_run_finished(self) -> None:
        self._update_controls()
        self.runFinished.emit()

    # -- results -------------------------------------------------------------------------------------
    def _on_matrix_reset(self) -> None:
        """The table once it has rows; the hint before the first run. The matrix gets the height of all its rows
        (the detail pane below takes the rest, and scrolls)."""
        has = self.model.rowCount() > 0 and self.model.columnCount() > 0
        self.matrix_stack.setCurrentWidget(self.table if has else self.matrix_hint)
        if has:
            QTimer.singleShot(0, self.fit_matrix)

    def matrix_height(self) -> int:
        """The table's height with every row in view."""
        t = self.table
        t.horizontalHeader().resizeSections(QHeaderView.ResizeMode.ResizeToContents)
        hbar = t.horizontalScrollBar().sizeHint().height() if t.horizontalScrollBar().maximum() > 0 else 0
        return (t.horizontalHeader().height() + t.verticalHeader().length() + 2 * t.frameWidth() + hbar + 2)

    def fit_matrix(self) -> None:
        """Give the upper pane what the matrix needs to show every row, up to what leaves the detail pane
        its minimum."""
        total = sum(self.split.sizes())
        if total <= 0:
            return
        chrome = self.matrix_pane.height() - self.table.height() if self.table.isVisible() else 0
        want = self.matrix_height() + max(0, chrome)
        upper = min(want, total - min(DETAIL_MIN, total // 3))
        self.split.setSizes([upper, total - upper])

    def _on_current(self, current: QModelIndex, _prev: QModelIndex) -> None:
        r = self.model.cell(current.row(), current.column()) if current.isValid() else None
        self.detail.show_cell(r, self.model.detail_extra(r) if r is not None else "")

    def select_cell(self, case: str, policy: str, reader: str) -> CellResult | None:
        """Select a matrix cell and show its detail."""
        at = self.model.position(case, policy, reader)
        if at is None:
            return None
        self.table.setCurrentIndex(self.model.index(*at))
        return self.model.cell(*at)

    def export(self, path: str) -> bool:
        """Save the last run as Markdown or JSON (by ``path``'s extension), atomically."""
        if self.lab_run is None:
            return False
        try:
            fmt = export_run(self.lab_run, path, self.engine_run)
        except OSError as e:
            self._show_error(f"Cannot write {path}: {e.strerror or e}")
            return False
        self.controls.status.setText(f"saved the matrix as {fmt} to {os.path.basename(path)}")
        return True

    def export_name(self) -> str:
        """The export's default file name: the scenario's name (the document's when it has none) and
        ``-lab-matrix.md``."""
        name = str(self.lab_run.scenario.get("name") or "") if self.lab_run is not None else ""
        if not name.strip() or name.strip().lower() == "lab":
            name = self.doc.name.split(".")[0] or "state"
        return f"{name.strip().replace(os.sep, '-')}-lab-matrix.md"

    def export_dialog(self) -> None:
        if self.lab_run is None:
            return
        start = os.path.join(os.path.dirname(self.doc.path), self.export_name())
        path, chosen = QFileDialog.getSaveFileName(self, "Export the lab matrix", start,
                                                   "Markdown (*.md);;JSON (*.json)")
        if path:
            if "json" in chosen.lower() and not path.lower().endswith(".json"):
                path += ".json"
            self.export(path)


def _summary(ready: ScenarioReady) -> str:
    s: dict[str, Any] = ready.scenario.summary()
    r = s["restore"]
    text = (f"{s['name'] or s['arch']}: {s['arch']} ({s['memory_class']}: {', '.join(s['components'])}), "
            f"{s['n_stream']} stream(s), flash attention {'on' if s['flash_attn'] else 'off'}, layout {s['layout']} · "
            f"restore {r['name']} ({r['api']}, {r['size']:,} bytes) into seq {s['target']} · live sequences "
            f"{s['live_sequences']}")
    return text + "".join(f"\nnote: {n}" for n in s["notes"])
