"""The strip above the Overview that follows a Repair (the document's
:class:`~kvscope.app.document.engine_job.EngineJob` ``repair_run``): in progress (its step, a busy bar, Cancel; a
progress tick updates the label only), written
(what was written and verified, Open it), refused or failed (the one line why nothing was written), or
cancelled. Hidden while there is nothing to say; Dismiss hides an outcome.
"""

from __future__ import annotations

import os

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QProgressBar, QPushButton, QWidget

from kvscope.app.base.theme import Theme, verdict_color
from kvscope.app.document.repair_job import RepairRun
from kvscope.core.textsafe import safe_text


def written_text(result: dict[str, object]) -> str:
    """``Repaired: x.repaired.bin written (6,436 bytes): rebuilt in llama.cpp b11434 by ..., verified ok``
    (from the tokens given for a blob where the result says ``tokens_given``)."""
    verify = result.get("verify")
    verdict = verify.get("verdict") if isinstance(verify, dict) else None
    size = result.get("size")
    out = safe_text(os.path.basename(str(result.get("output") or "")))
    late = "Cancel came after the repair had finished. " if result.get("finished_before_cancel") else ""
    given = result.get("tokens_given")
    source = f"the {given:,} tokens given" if isinstance(given, int) else "the file's own tokens"
    return late + (f"Repaired: {out} written ({size:,} bytes): rebuilt in llama.cpp {result.get('build')} by "
            f"{result.get('writer')} from {source}, verified {verdict or 'not run'}. The input is "
            "unchanged." if isinstance(size, int) else f"Repaired: {out} written.")


class RepairBanner(QFrame):
    """Shows :class:`RepairRun`'s state; ``openRequested(path)`` asks to open the repaired file."""

    openRequested = Signal(str)

    def __init__(self, run: RepairRun, theme: Theme, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.run, self.theme = run, theme
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.label.setTextFormat(Qt.TextFormat.PlainText)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.bar = QProgressBar()
        self.bar.setRange(0, 0)  # busy: the command does not say how far it is
        self.bar.setMaximumWidth(120)
        self.bar.setTextVisible(False)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setToolTip("stop the repair: the engine is stopped and nothing is written")
        self.open_button = QPushButton("Open repaired file")
        self.open_button.setToolTip("open the repaired file in a new tab, with the same model")
        self.dismiss_button = QPushButton("Dismiss")
        row = QHBoxLayout(self)
        row.setContentsMargins(6, 3, 6, 3)
        row.addWidget(self.label, 1)
        for w in (self.bar, self.cancel_button, self.open_button, self.dismiss_button):
            row.addWidget(w)
        self.cancel_button.clicked.connect(run.cancel)
        self.dismiss_button.clicked.connect(run.dismiss)
        self.open_button.clicked.connect(self._open)
        run.changed.connect(self.refresh)  # a run started or ended
        run.progressed.connect(self._on_step)  # a progress tick: the label only
        theme.changed.connect(lambda _dark: self.refresh())
        self.refresh()

    def _open(self) -> None:
        out = (self.run.result or {}).get("output") or self.run.output
        if out:
            self.openRequested.emit(str(out))

    def _running_text(self) -> str:
        return f"Repairing into {safe_text(os.path.basename(self.run.output or ''))}… {self.run.step_text}"

    def _on_step(self, _fraction: object, _text: str) -> None:
        if self.run.running:
            text = self._running_text()
            self.label.setText(text)
            self.label.setToolTip(text)

    def refresh(self) -> None:
        run = self.run
        running, written = run.running, run.result is not None
        self.bar.setVisible(running)
        self.cancel_button.setVisible(running)
        self.open_button.setVisible(written and not running)
        self.dismiss_button.setVisible(not running)
        name = safe_text(os.path.basename(run.output or ""))
        level = ""
        if running:
            text = self._running_text()
        elif written:
            text, level = written_text(run.result or {}), "healthy"
        elif run.error:
            text, level = f"Repair wrote nothing: {run.error}", "damaged"
        elif run.cancelled:
            text, level = f"Repair cancelled: {name} was not written.", "suspicious"
        else:
            self.hide()
            return
        self.label.setText(text)
        self.label.setToolTip(text)
        col = verdict_color(level, self.theme.dark).name() if level else ""
        self.label.setStyleSheet(f"color: {col}; font-weight: 600" if col else "")
        self.show()
