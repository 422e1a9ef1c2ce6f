"""The Lab view's control panel: the scenario (live context, state to restore, destination sequence,
model), the engine (the torch core, llama.cpp, llama-server, or both the core and llama.cpp), the
corruptions (the catalog entries that apply, free-text specs), policies and reader kinds (the core's
only: a real engine restores with its own code), and the Run / Cancel / Export buttons with the run's
progress.

The panel only holds choices; :class:`~kvscope.app.lab.view.LabView` loads scenarios and runs matrices.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFormLayout,
    QHBoxLayout,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from kvscope.app.base.theme import WARNING_COLOR
from kvscope.app.base.widgets import plain_label
from kvscope.app.lab.engine_jobs import ENGINE_TITLES
from kvscope.app.lab.jobs import (
    WHOLE_KINDS,
    Choice,
    ScenarioReady,
    check_specs,
    live_choices,
    restore_choices,
    scenario_folder,
)
from kvscope.core.engine.choices import LAB_ENGINES

if TYPE_CHECKING:
    from kvscope.core.lab.runner import LabCase

POLICIES = ("contained", "legacy", "transactional")  # kvscope.core.lab.runner's, without importing torch
READERS = ("buffer", "file")
CASE_ROLE = Qt.ItemDataRole.UserRole + 1
Files = Callable[[], list[tuple[str, str | None]]]  # (path, state kind) of the open files, this document first


class RefreshingCombo(QComboBox):
    """A combo box that refills itself (``refresh()``) right before its list opens."""

    def __init__(self, refresh: Callable[[], None]) -> None:
        super().__init__()
        self._refresh = refresh
        self.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.setMinimumContentsLength(10)

    def showPopup(self) -> None:
        self._refresh()
        super().showPopup()


def fill_combo(combo: QComboBox, choices: list[Choice], default: str | None) -> None:
    """Refill ``combo``, keeping its current path when it is still offered (else ``default``, else the
    first); ``currentIndexChanged`` fires once when the current path changed."""
    current = combo.currentData()
    if [combo.itemData(i) for i in range(combo.count())] == [c.path for c in choices]:
        return
    combo.blockSignals(True)
    combo.clear()
    for c in choices:
        combo.addItem(c.label, c.path)
        combo.setItemData(combo.count() - 1, c.tooltip, Qt.ItemDataRole.ToolTipRole)
    want = current if current in [c.path for c in choices] else default
    i = combo.findData(want) if want is not None else -1
    combo.setCurrentIndex(i if i >= 0 else (0 if choices else -1))
    combo.blockSignals(False)
    if combo.currentData() != current:
        combo.currentIndexChanged.emit(combo.currentIndex())


class LabControls(QWidget):
    """Scenario and matrix choices. ``inputsChanged``: the scenario to load changed; ``choicesChanged``:
    the cases, policies or readers changed."""

    inputsChanged = Signal()
    choicesChanged = Signal()

    def __init__(self, doc_path: str, files: Files, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.doc_path = doc_path
        self.files = files
        self.folders: list[str] = []  # scenario folders chosen with the button
        self.inputs: list[str] = []  # files to restore chosen with the button (not open in the window)
        self.live_combo = RefreshingCombo(self.refresh_choices)
        self.folder_button = QToolButton()
        self.folder_button.setText("Folder…")
        self.folder_button.setToolTip("use a lab scenario folder (context.json + context.state.bin) as the live "
                                      "context")
        self.restore_combo = RefreshingCombo(self.refresh_choices)
        self.input_button = QToolButton()
        self.input_button.setText("File…")
        self.input_button.setToolTip("restore a state file that is not open")
        self.into_spin = QSpinBox()
        self.into_spin.setRange(0, 255)
        self.into_spin.setToolTip("destination sequence of the restore")
        self.model_label = plain_label()
        self.engine_combo = QComboBox()
        for name in LAB_ENGINES:
            self.engine_combo.addItem(ENGINE_TITLES[name], name)
        self.engine_combo.setToolTip("where the cases run: the torch memory core under the chosen policies; "
                                     "real llama.cpp or a llama-server (build and server: Tools → Engine "
                                     "Settings); both: the core and llama.cpp, every disagreement highlighted")
        self.case_list = QListWidget()
        self.case_list.setToolTip("the catalog entries that apply to the scenario's input and memory")
        self.all_button, self.none_button = QPushButton("All"), QPushButton("None")
        self.spec_edit = QLineEdit()
        self.spec_edit.setPlaceholderText("more: truncate:at=half …")
        self.spec_edit.setToolTip("corruption specs separated by spaces: a catalog name, KIND:key=value,... (e.g. "
                                  "fill:value=nan,role=k,index=0,cells=0-3), NAME_then_seq_rm or SPEC+seq_rm")
        self.spec_error = plain_label("", wrap=True)
        self.spec_error.setStyleSheet(f"color: {WARNING_COLOR};")
        self.spec_error.hide()
        self.policy_checks = {p: QCheckBox(p) for p in POLICIES}
        self.reader_checks = {r: QCheckBox(r) for r in READERS}
        for c in (*self.policy_checks.values(), *self.reader_checks.values()):
            c.setChecked(True)
        self.run_button, self.cancel_button = QPushButton("Run"), QPushButton("Cancel")
        self.export_button = QPushButton("Export…")
        self.export_button.setToolTip("save the matrix as Markdown (.md) or JSON (.json), as kvscope lab prints it")
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.status = plain_label(" ", wrap=True)
        self._layout()
        self.live_combo.currentIndexChanged.connect(self._on_live_changed)
        self.restore_combo.currentIndexChanged.connect(lambda _i: self.inputsChanged.emit())
        self.into_spin.valueChanged.connect(lambda _v: self.inputsChanged.emit())
        self.engine_combo.currentIndexChanged.connect(lambda _i: self.choicesChanged.emit())
        self.all_button.clicked.connect(lambda: self.check_cases(None))
        self.none_button.clicked.connect(lambda: self.check_cases([]))
        self.case_list.itemChanged.connect(lambda _item: self.choicesChanged.emit())
        self.spec_edit.textChanged.connect(lambda _text: self.choicesChanged.emit())
        for c in (*self.policy_checks.values(), *self.reader_checks.values()):
            c.toggled.connect(lambda _on: self.choicesChanged.emit())

    def _layout(self) -> None:
        form = QFormLayout()
        form.setContentsMargins(0, 0, 0, 0)
        live_row = QHBoxLayout()
        live_row.addWidget(self.live_combo, 1)
        live_row.addWidget(self.folder_button)
        form.addRow("Live context", live_row)
        restore_row = QHBoxLayout()
        restore_row.addWidget(self.restore_combo, 1)
        restore_row.addWidget(self.input_button)
        form.addRow("Restore", restore_row)
        form.addRow("into sequence", self.into_spin)
        form.addRow("Model", self.model_label)
        form.addRow("Engine", self.engine_combo)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(2, 2, 2, 2)
        lay.addLayout(form)
        head = QHBoxLayout()
        head.addWidget(plain_label("Corruptions"), 1)
        head.addWidget(self.all_button)
        head.addWidget(self.none_button)
        lay.addLayout(head)
        lay.addWidget(self.case_list, 1)
        lay.addWidget(self.spec_edit)
        lay.addWidget(self.spec_error)
        for title, checks in (("Policies", self.policy_checks), ("Readers", self.reader_checks)):
            row = QHBoxLayout()
            row.addWidget(plain_label(title))
            for c in checks.values():
                row.addWidget(c)
            row.addStretch(1)
            lay.addLayout(row)
        buttons = QHBoxLayout()
        for b in (self.run_button, self.cancel_button, self.export_button):
            buttons.addWidget(b)
        lay.addLayout(buttons)
        lay.addWidget(self.progress)
        lay.addWidget(self.status)

    # -- the scenario's files ------------------------------------------------------------------------
    def refresh_choices(self) -> None:
        """Offer the open files (and scenario folders) again; defaults: this document as the live context
        when it is a whole-context state, else the scenario folder it sits in."""
        files = self.files()
        own = dict(files).get(self.doc_path)
        folder = scenario_folder(self.doc_path)
        auto = [folder] if folder and not any(k in WHOLE_KINDS for _, k in files) else []
        lives = live_choices(files, [*self.folders, *auto])
        default = self.doc_path if own in WHOLE_KINDS else (auto[0] if auto else None)
        fill_combo(self.live_combo, lives, default)
        self._refresh_restore()

    def _refresh_restore(self) -> None:
        live = self.live_path
        choices = restore_choices(self.files(), live)
        for p in self.inputs:
            if p != live and all(c.path != p for c in choices):
                choices.append(Choice(p, os.path.basename(p), "file"))
        paths = [c.path for c in choices]
        default = self.doc_path if self.doc_path in paths else None
        folder = scenario_folder(live) if live else None
        if default is None and folder:
            clean = os.path.join(folder, f"seq{self.into_spin.value()}.clean.seqdata.bin")
            default = clean if clean in paths else None
        if default is None:  # a file beside the live context: its own sequence first (seq<N> of the destination)
            beside = [c.path for c in choices if c.origin == "beside"]
            want = f"seq{self.into_spin.value()}."
            default = next((p for p in beside if want in os.path.basename(p)), beside[0] if beside else None)
        fill_combo(self.restore_combo, choices, default)

    def _on_live_changed(self) -> None:
        self._refresh_restore()
        self.inputsChanged.emit()

    @property
    def live_path(self) -> str | None:
        d = self.live_combo.currentData()
        return d if isinstance(d, str) else None

    @property
    def restore_path(self) -> str | None:
        d = self.restore_combo.currentData()
        return d if isinstance(d, str) else None

    def add_folder(self, folder: str) -> None:
        """Offer a lab scenario folder as the live context and select it."""
        folder = os.path.abspath(folder)
        if folder not in self.folders:
            self.folders.append(folder)
        self.refresh_choices()
        self.live_combo.setCurrentIndex(max(0, self.live_combo.findData(folder)))

    def set_restore(self, path: str) -> None:
        """Select ``path`` as the state to restore (offered from now on when it is not open)."""
        path = os.path.abspath(path)
        if path not in self.inputs:
            self.inputs.append(path)
        self.refresh_choices()
        self.restore_combo.setCurrentIndex(max(0, self.restore_combo.findData(path)))

    # -- cases, policies, readers --------------------------------------------------------------------
    def set_cases(self, ready: ScenarioReady | None) -> None:
        """List the scenario's applicable catalog entries (checked as before; new ones checked) and the
        skipped ones, greyed out with the reason."""
        previous = {self.case_list.item(i).text(): self.case_list.item(i).checkState()
                    for i in range(self.case_list.count())}
        self.case_list.blockSignals(True)
        self.case_list.clear()
        for case in ready.cases if ready is not None else []:
            item = QListWidgetItem(case.name)
            item.setData(CASE_ROLE, case)
            item.setToolTip(case.description)
            item.setFlags(Qt.ItemFlag.ItemIsUserCheckable | Qt.ItemFlag.ItemIsEnabled)
            item.setCheckState(previous.get(case.name, Qt.CheckState.Checked))
            self.case_list.addItem(item)
        for name, why in ready.skipped if ready is not None else []:
            item = QListWidgetItem(f"{name} — {why}")
            item.setToolTip(f"not applicable: {why}")
            item.setFlags(Qt.ItemFlag.NoItemFlags)
            self.case_list.addItem(item)
        self.case_list.blockSignals(False)
        if ready is not None:
            self.into_spin.blockSignals(True)
            self.into_spin.setMaximum(max(0, ready.scenario.params.n_seq_max - 1))
            self.into_spin.blockSignals(False)
        self.choicesChanged.emit()

    def check_cases(self, names: list[str] | None) -> None:
        """Check exactly the catalog entries named (None: all of them)."""
        self.case_list.blockSignals(True)
        for i in range(self.case_list.count()):
            item = self.case_list.item(i)
            if item.flags() & Qt.ItemFlag.ItemIsUserCheckable:
                on = names is None or item.text() in names
                item.setCheckState(Qt.CheckState.Checked if on else Qt.CheckState.Unchecked)
        self.case_list.blockSignals(False)
        self.choicesChanged.emit()

    def selected_cases(self) -> tuple[list[LabCase], list[str], str]:
        """The checked catalog cases, the free-text specs, and the first problem with them ("" when none)."""
        cases: list[LabCase] = []
        for i in range(self.case_list.count()):
            item = self.case_list.item(i)
            if item.checkState() == Qt.CheckState.Checked and item.data(CASE_ROLE) is not None:
                cases.append(item.data(CASE_ROLE))
        specs, err = check_specs(self.spec_edit.text())
        names = {c.name for c in cases}
        for s in specs if not err else []:
            if s in names:
                return cases, specs, f"{s} is already in the list"
            names.add(s)
        return cases, specs, err

    @property
    def engine(self) -> str:
        """torch, llama.cpp, server or both."""
        d = self.engine_combo.currentData()
        return d if isinstance(d, str) else "torch"

    def set_engine(self, name: str) -> None:
        self.engine_combo.setCurrentIndex(max(0, self.engine_combo.findData(name)))

    def policies(self) -> tuple[str, ...]:
        return tuple(name for name, c in self.policy_checks.items() if c.isChecked())

    def readers(self) -> tuple[str, ...]:
        return tuple(name for name, c in self.reader_checks.items() if c.isChecked())

    def set_state(self, why: str | None, running: bool, can_run: bool, can_export: bool) -> str:
        """Enable what can be used now (``why``: the lab cannot run at all); returns the spec error shown."""
        for w in (self.live_combo, self.folder_button, self.restore_combo, self.input_button, self.into_spin,
                  self.engine_combo, self.case_list, self.all_button, self.none_button, self.spec_edit):
            w.setEnabled(why is None and not running)
        core = self.engine == "torch"
        tip = "" if core else ("a real engine restores with its own code and reader: the policies and readers "
                               "choose the core's cells (with both, the core runs the policy contained)")
        for c in (*self.policy_checks.values(), *self.reader_checks.values()):
            c.setEnabled(why is None and not running and core)
            c.setToolTip(tip)
        err = self.selected_cases()[2] if why is None else ""
        self.spec_error.setText(err)
        self.spec_error.setVisible(bool(err))
        self.run_button.setEnabled(can_run and not err)
        self.run_button.setToolTip(why or ("" if can_run else "choose a scenario, corruptions, policies and "
                                           "readers"))
        self.cancel_button.setEnabled(running)
        self.export_button.setEnabled(can_export and not running)
        self.progress.setVisible(running)
        return err

