"""The strip above a document that says which GGUF model it is read with, and offers the ones beside it
and the model last used with a file of each architecture.

The candidates are read with the file in the background first (:func:`model_fit`): only the ones it fits
are offered, the others are named in the tooltip with why not. The models used before come first (the
window's :attr:`ModelBanner.recall`: the last model of each architecture a file fitted; a file that names
its architecture, a session file or context blob, is offered that architecture's only). A model the file
does not fit says so in the strip (the window does not remember it for the file).
"""

from __future__ import annotations

import html
import os
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QComboBox, QFrame, QHBoxLayout, QLabel, QPushButton, QWidget

from kvscope.app.base.tasks import CancelToken, Report, Task
from kvscope.app.document.document import Document
from kvscope.app.document.model_files import ModelFit, model_fit, suggest_models
from kvscope.core.analysis.verdict import plural

WITHOUT_MODEL = "token text, head split and sliding-window marks need a model"
RECALL_MAX = 4  # models used before (one per architecture, the most recent) read with a new file at most


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
        # (architecture, GGUF): the model last used with a file of each architecture (the window's settings)
        self.recall: Callable[[], list[tuple[str, str]]] = list
        self._checking: Task | None = None
        doc.loaded.connect(self._on_loaded)
        self.refresh()

    def _on_loaded(self) -> None:
        self.fits = {}
        if self._checking is not None and not self._checking.done:
            self._checking.cancel()
        self._checking = None
        self.refresh()

    def recalled(self) -> dict[str, str]:
        """GGUF -> architecture: the models last used with a file of an architecture, to read this file with
        (where the file names its architecture, that one's only)."""
        res = self.doc.result
        if res is None or res.kind == "unknown":
            return {}
        arch = res.header.get("arch")
        out: dict[str, str] = {}
        for a, m in self.recall():
            if (arch is None or a == arch) and m != self.doc.model_path and m not in out:
                out[m] = a
            if len(out) >= RECALL_MAX:
                break
        return out

    def _candidates(self) -> list[str]:
        used = list(self.recalled())
        return used + [p for p in suggest_models(self.doc.path) if p != self.doc.model_path and p not in used]

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
        used = {} if unknown else self.recalled()
        found = [] if unknown else self._candidates()
        checking = self._check(found)
        fit = [p for p in found if p in self.fits and self.fits[p].fits]
        unfit = [self.fits[p] for p in found if p in self.fits and not self.fits[p].fits]
        for p in fit:
            self.suggestions.addItem(os.path.basename(p) + (f" (used before with {used[p]})" if p in used else ""), p)
            self.suggestions.setItemData(self.suggestions.count() - 1, p, Qt.ItemDataRole.ToolTipRole)
        before = next((p for p in fit if p in used), None)
        found = [p for p in found if p not in used]  # the GGUF beside the file
        fit = [p for p in fit if p not in used]
        unfit = [f for f in unfit if f.path not in used]
        if checking:
            what = [f"the {plural(len(found), 'GGUF')} beside it"] if found else []
            what += [f"the {plural(len(used), 'model')} used before"] if used else []
            beside = f"reading the file with {' and '.join(what)}…"
        elif before is not None:
            beside = (f"{os.path.basename(before)}, the model last used with a {used[before]} file, fits it"
                      + (f" (and {plural(len(fit), 'GGUF')} beside it)" if fit else ""))
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
        if before is None or checking:  # a sentence of ours; a file name starts as it is spelt
            beside = beside[0].upper() + beside[1:]
        self.label.setText(f"{why}{head}{html.escape(beside)}.")
        self.label.setToolTip(tip or WITHOUT_MODEL)
        self.suggestions.setVisible(self.suggestions.count() > 0)
        self.use_button.setVisible(self.suggestions.count() > 0)

    def _use(self) -> None:
        path = self.suggestions.currentData()
        if isinstance(path, str):
            self.modelChosen.emit(path)
