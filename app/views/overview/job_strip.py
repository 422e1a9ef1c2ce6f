"""The strip above the Overview that follows a run of an :class:`~kvscope.app.document.engine_job.EngineJob`
(Verify's): its title, stage text and fraction done (a busy bar when the work does not say), and Cancel.
A progress tick updates this strip only (its label and bar), never the page under it; the page re-renders
when the run starts and when it ends. Hidden while nothing runs.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QProgressBar, QPushButton, QWidget

from kvscope.app.document.engine_job import EngineJob

STEPS = 1000  # the bar's resolution


def step_text(title: str, fraction: float | None, text: str) -> str:
    """``Verifying in llama.cpp, build b11434… 40% · restoring the state``."""
    pct = f"{100 * fraction:.0f}% · " if fraction is not None else ""
    return f"{title}… {pct}{text}"


class JobStrip(QFrame):
    """Shows ``job``'s run in progress: ``title()`` (read when a run starts), the step, a bar and Cancel
    (``cancel``, the job's own by default)."""

    def __init__(self, job: EngineJob, title: Callable[[], str], cancel: Callable[[], None] | None = None,
                 cancel_tip: str = "stop the run", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.job, self.title = job, title
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.label.setTextFormat(Qt.TextFormat.PlainText)
        self.bar = QProgressBar()
        self.bar.setMaximumWidth(160)
        self.bar.setTextVisible(False)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setToolTip(cancel_tip)
        self.cancel_button.clicked.connect(cancel or job.cancel)
        row = QHBoxLayout(self)
        row.setContentsMargins(6, 3, 6, 3)
        row.addWidget(self.label, 1)
        row.addWidget(self.bar)
        row.addWidget(self.cancel_button)
        self._title = ""
        self.updates = 0  # progress ticks shown (tests)
        job.changed.connect(self.refresh)
        job.progressed.connect(self.show_step)
        self.refresh()

    def refresh(self) -> None:
        """Shown while the job runs, from its current step; hidden otherwise."""
        step = self.job.step
        if not self.job.running or step is None:
            self.hide()
            return
        self._title = self.title()
        self.show_step(*step)
        self.show()

    def show_step(self, fraction: object, text: str) -> None:
        """One progress tick: the label and the bar, nothing else."""
        frac = float(fraction) if isinstance(fraction, (int, float)) else None
        self.updates += 1
        line = step_text(self._title or self.title(), frac, text)
        self.label.setText(line)
        self.label.setToolTip(line)
        if frac is None:
            self.bar.setRange(0, 0)  # busy
        else:
            self.bar.setRange(0, STEPS)
            self.bar.setValue(round(max(0.0, min(1.0, frac)) * STEPS))
