"""The strip above a document that says which GGUF model it is read with, and offers the ones beside it.

The GGUF files beside the file are read with it in the background first (:func:`model_fit`): only the
ones it fits are offered, the others are named in the tooltip with why not. A model the file does not
fit says so in the strip (the window does not remember it for the file).
"""

from __future__ import annotations

import html
import os
from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QComboBox, QFrame, QHBoxLayout, QLabel, QPushButton, QWidget

from kvscope.app.base.tasks import CancelToken, Report, Task
from kvscope.app.document.document import Document
from kvscope.app.document.model_files import ModelFit, model_fit, suggest_models
from kvscope.core.analysis.verdict import plural

WITHOUT_MODEL = "token text, head split and sliding-window marks need a model"


def fits_job(state_path: str, models: list[str]) -> Any:
    """The background job that reads the file with each of ``models`` (see :func:`model_fit`)."""

    def job(token: CancelToken, report: Report) -> list[ModelFit]:
        out = []
        for i, m in enumerate(models):
            token.check()
            report(i / max(1, len(models)), f"does it fit {os.path.basename(m)}?")
            out.append(model_fit(state_path, m))
        return out

    return job


class ModelBanner(QFrame):
    """Shows the model in use, or suggests GGUFs found beside the file; the window applies the choice."""

    modelChosen = Signal(object)  # str path, or None to read without a model
    browseRequested = Signal()

    def __init__(self, doc: Document, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.doc = doc
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.suggestions = QComboBox()
        self.use_button = QPushButton("Use")
        self.browse_button = QPushButton("Other model…")
        self.remove_button = QPushButton("Read without model")
        lay = QHBoxLayout(self)
        lay.setContentsMargins(6, 3, 6, 3)
        lay.addWidget(self.label, 1)
        lay.addWidget(self.suggestions)
        lay.addWidget(self.use_button)
        lay.addWidget(self.browse_button)
        lay.addWidget(self.remove_button)
        self.use_button.clicked.connect(self._use)
        self.browse_button.clicked.connect(self.browseRequested)
        self.remove_button.clicked.connect(lambda: self.modelChosen.emit(None))
        self.fits: dict[str, ModelFit] = {}  # the GGUF beside the file, read with it (this parse)
        self._checking: Task | None = None
        doc.loaded.connect(self._on_loaded)
        self.refresh()

    def _on_loaded(self) -> None:
        self.fits = {}
        if self._checking is not None and not self._checking.done:
            self._checking.cancel()
        self._checking = None
        self.refresh()

    def _candidates(self) -> list[str]:
        return [p for p in suggest_models(self.doc.path) if p != self.doc.model_path]

    def _check(self, found: list[str]) -> bool:
        """Start reading the file with the candidates not read yet; True while that runs."""
        todo = [p for p in found if p not in self.fits]
        if self._checking is not None and not self._checking.done:
            return True
        if not todo or self.doc.result is None or self.doc.result.kind == "unknown":
            return False
        self._checking = self.doc.runner.submit(f"models for {self.doc.name}", fits_job(self.doc.path, todo),
                                                self._on_fits, lambda _msg: None)
        return True

    def _on_fits(self, fits: list[ModelFit]) -> None:
        self.fits.update({f.path: f for f in fits})
        self.refresh()

    def _mismatch(self) -> str | None:
        v = self.doc.verdict()
        return v.reason if v is not None and v.state == "model_mismatch" else None

    def refresh(self) -> None:
        doc = self.doc
        prof = doc.profile
        self.suggestions.clear()
        mismatch = self._mismatch() if prof is not None else None
        if prof is not None and mismatch is None:
            self.label.setText(f"Model: <b>{html.escape(os.path.basename(prof.path))}</b> ({html.escape(prof.arch)}, "
                               f"{plural(prof.n_layer, 'layer')}, "
                               f"{prof.memory_class} memory" + (f", SWA window {prof.n_swa}" if prof.n_swa else "")
                               + ")")
            self.label.setToolTip(prof.path)
            for w in (self.suggestions, self.use_button):
                w.hide()
            self.browse_button.setText("Change model…")
            self.remove_button.show()
            return
        unknown = doc.result is not None and doc.result.kind == "unknown"
        found = [] if unknown else self._candidates()
        checking = self._check(found)
        fit = [p for p in found if p in self.fits and self.fits[p].fits]
        unfit = [self.fits[p] for p in found if p in self.fits and not self.fits[p].fits]
        for p in fit:
            self.suggestions.addItem(os.path.basename(p), p)
        if checking:
            beside = f"reading the file with the {plural(len(found), 'GGUF')} beside it…"
        elif fit:
            beside = f"{plural(len(fit), 'GGUF')} beside the file fit{'s' if len(fit) == 1 else ''} it"
        elif found:
            beside = f"none of the {plural(len(found), 'GGUF')} beside the file fits it"
        else:
            beside = "no GGUF beside the file"
        if unfit and fit:
            beside += f" ({len(unfit)} other{'s do' if len(unfit) > 1 else ' does'} not)"
        tip = "\n".join(f"{os.path.basename(f.path)}: {f.why}" for f in unfit)
        if prof is not None:  # read with a model the file does not fit
            why = (f"<span style='color:#d62728'>Model <b>{html.escape(os.path.basename(prof.path))}</b> does not "
                   f"fit this file</span> (not remembered for it) · ")
            tip = f"{prof.path}: {mismatch}" + ("\n" + tip if tip else "")
            self.browse_button.setText("Change model…")
            self.remove_button.show()
        else:
            why = f"<span style='color:#d62728'>{html.escape(doc.model_error)}</span> · " if doc.model_error else ""
            self.browse_button.setText("Choose model…")
            self.remove_button.hide()
        head = "" if prof is not None else f"No model: {WITHOUT_MODEL}. "
        self.label.setText(f"{why}{head}{html.escape(beside[0].upper() + beside[1:])}.")
        self.label.setToolTip(tip or WITHOUT_MODEL)
        self.suggestions.setVisible(bool(fit))
        self.use_button.setVisible(bool(fit))

    def _use(self) -> None:
        path = self.suggestions.currentData()
        if isinstance(path, str):
            self.modelChosen.emit(path)
