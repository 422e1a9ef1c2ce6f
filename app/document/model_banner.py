"""The strip above a document that says which GGUF model it is read with, and offers the ones beside it."""

from __future__ import annotations

import html
import os

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QComboBox, QFrame, QHBoxLayout, QLabel, QPushButton, QWidget

from kvscope.app.document.document import Document
from kvscope.app.document.model_files import suggest_models
from kvscope.core.analysis.verdict import plural

WITHOUT_MODEL = "token text, head split and sliding-window marks need a model"


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
        doc.loaded.connect(self.refresh)
        self.refresh()

    def refresh(self) -> None:
        doc = self.doc
        prof = doc.profile
        self.suggestions.clear()
        if prof is not None:
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
        found = [p for p in suggest_models(doc.path) if p != doc.model_path]
        for p in found:
            self.suggestions.addItem(os.path.basename(p), p)
        why = f"<span style='color:#d62728'>{html.escape(doc.model_error)}</span> · " if doc.model_error else ""
        beside = f"{len(found)} GGUF beside the file" if found else "no GGUF beside the file"
        self.label.setText(f"{why}No model: {WITHOUT_MODEL}. {beside}.")
        self.label.setToolTip(WITHOUT_MODEL)
        self.suggestions.setVisible(bool(found))
        self.use_button.setVisible(bool(found))
        self.browse_button.setText("Choose model…")
        self.remove_button.hide()

    def _use(self) -> None:
        path = self.suggestions.currentData()
        if isinstance(path, str):
            self.modelChosen.emit(path)
