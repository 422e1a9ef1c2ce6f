"""The strips above every view of a document: "this file is damaged", "this file changed: Reload", "Verify
could not run".

:class:`DamageBanner` is shown whatever view is in front while the file has error findings (or
is not a state file, or a llama.cpp newer than kvscope wrote it: the verdict ``newer``, in its own
colour): the verdict in one line, a button to the overview and one that selects the
first error's bytes (disabled, the reason in its tooltip, where there are none to show: an empty or random
file; :func:`kvscope.core.verify.preconditions.show_damage_problem`).
:class:`ChangedBanner` appears when the file changed on disk or while it was
read (``Document.fileChanged``) and offers Reload. :class:`VerifyBanner` says why the last Verify could
not run (no model, no engine installed: the verifier's message says how to install it) and offers the
model chooser or the engine settings. :class:`CorruptedBanner` heads a corrupted copy the hex view wrote:
what was done, Verify, Send to the Lab.
"""

from __future__ import annotations

import os

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QWidget

from kvscope.app.base.theme import Theme, verdict_color
from kvscope.app.document.document import Document
from kvscope.app.document.verify_job import NEEDS_MODEL
from kvscope.core.verify.preconditions import damage_finding, show_damage_problem

SHOW_TIP = "select the bytes of the first error"


class _Strip(QFrame):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.row = QHBoxLayout(self)
        self.row.setContentsMargins(6, 3, 6, 3)
        self.row.addWidget(self.label, 1)

    def button(self, text: str, tip: str = "") -> QPushButton:
        b = QPushButton(text)
        b.setToolTip(tip)
        self.row.addWidget(b)
        return b


class DamageBanner(_Strip):
    """"Damaged: <reason>" on every view of a file with error findings; ``jumpRequested(view)``."""

    jumpRequested = Signal(str)

    def __init__(self, doc: Document, theme: Theme, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.doc, self.theme = doc, theme
        self.label.setTextFormat(Qt.TextFormat.PlainText)
        self.overview_button = self.button("Overview", "the verdict, the findings and what the file is")
        self.show_button = self.button("Show the damage", SHOW_TIP)
        self.overview_button.clicked.connect(lambda: self.jumpRequested.emit("overview"))
        self.show_button.clicked.connect(self.show_damage)
        for sig in (doc.loaded, doc.statsReady, doc.verifyChanged):
            sig.connect(self.refresh)
        theme.changed.connect(lambda _dark: self.refresh())
        self.refresh()

    def refresh(self) -> None:
        v, res = self.doc.verdict(), self.doc.result
        if v is None or res is None or not (res.n_errors or v.level in ("not_state", "newer")):
            self.hide()
            return
        self.label.setText(v.line())
        self.label.setToolTip(v.line())
        self.label.setStyleSheet(f"color: {verdict_color(v.level, self.theme.dark).name()}; font-weight: 600")
        self.show_button.setText("Show the mismatch" if v.state == "model_mismatch" else "Show the damage")
        self.show_button.setVisible(any(f.severity == "error" for f in v.top_findings))
        why = show_damage_problem(res, v)  # the core's check: an empty or random file has no damaged bytes
        self.show_button.setEnabled(why is None)
        self.show_button.setToolTip(SHOW_TIP + (f": not possible: {why}" if why else ""))
        self.show()

    def show_damage(self) -> None:
        v, idx, res = self.doc.verdict(), self.doc.index, self.doc.result
        if v is None or idx is None or res is None or show_damage_problem(res, v) is not None:
            return
        f = damage_finding(v)
        if f is not None:
            self.doc.bus.select(idx.for_finding(f), origin=self)
            self.jumpRequested.emit("hex")


class ChangedBanner(_Strip):
    """"The file changed on disk: <what>" with Reload; hidden again once the file is read anew."""

    def __init__(self, doc: Document, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.doc = doc
        self.label.setTextFormat(Qt.TextFormat.PlainText)
        self.reload_button = self.button("Reload", "read the file again")
        self.dismiss_button = self.button("Dismiss", "keep showing the file as it was read")
        self.reload_button.clicked.connect(self.reload)
        self.dismiss_button.clicked.connect(self.hide)
        doc.fileChanged.connect(self.on_changed)
        doc.loaded.connect(lambda: self.setVisible(doc.changed is not None))
        self.hide()

    def on_changed(self, why: str) -> None:
        self.label.setText(f"The file changed: {why}. What is shown is the file as it was read.")
        self.show()

    def reload(self) -> None:
        self.hide()
        self.doc.reload()


class VerifyBanner(_Strip):
    """"Verify could not run: <why>" with the way out: Choose model… (``modelRequested``) or Engine
    settings… (``settingsRequested``); hidden when the next Verify starts or the file is read again."""

    modelRequested = Signal()
    settingsRequested = Signal()

    def __init__(self, doc: Document, theme: Theme, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.doc, self.theme = doc, theme
        self.label.setTextFormat(Qt.TextFormat.PlainText)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.model_button = self.button("Choose model…", "the GGUF model the file was written with")
        self.settings_button = self.button("Engine settings…", "the engine Verify runs in: llama.cpp build, "
                                           "your own libllama, llama-server")
        self.dismiss_button = self.button("Dismiss")
        self.model_button.clicked.connect(self.modelRequested)
        self.settings_button.clicked.connect(self.settingsRequested)
        self.dismiss_button.clicked.connect(self.hide)
        doc.verifyChanged.connect(self.refresh)
        theme.changed.connect(lambda _dark: self.refresh())
        self.refresh()

    @property
    def text(self) -> str:
        return self.label.text()

    def refresh(self) -> None:
        why = self.doc.verify_error
        if not why:
            self.hide()
            return
        needs_model = why.startswith(NEEDS_MODEL)
        self.label.setText(why if needs_model else f"Verify could not run ({self.doc.verify_engine}): {why}")
        self.label.setToolTip(self.label.text())
        self.label.setStyleSheet(f"color: {verdict_color('suspicious', self.theme.dark).name()}; font-weight: 600")
        self.model_button.setVisible(needs_model)
        self.settings_button.setVisible(not needs_model)
        self.show()


class CorruptedBanner(_Strip):
    """"Corrupted copy of <file>: <what was done>" on a copy the hex view wrote, with one click to Verify it
    (``verifyRequested``) or restore it in the Lab (``labRequested``); hidden until :meth:`show_copy`."""

    verifyRequested = Signal()
    labRequested = Signal()

    def __init__(self, doc: Document, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.doc = doc
        self.label.setTextFormat(Qt.TextFormat.PlainText)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.verify_button = self.button("Verify", "restore this copy in real llama.cpp and compare (Tools → Verify)")
        self.lab_button = self.button("Send to the Lab", "restore this copy into the Lab's live context under every "
                                      "policy and reader")
        self.dismiss_button = self.button("Dismiss")
        self.verify_button.clicked.connect(self.verifyRequested)
        self.lab_button.clicked.connect(self.labRequested)
        self.dismiss_button.clicked.connect(self.hide)
        self.source = ""
        self.hide()

    def show_copy(self, source: str, what: str) -> None:
        """Say this document is a corrupted copy of ``source`` and what was done to it."""
        from kvscope.core.textsafe import safe_text

        self.source = source
        self.label.setText(f"Corrupted copy of {safe_text(os.path.basename(source))}: {safe_text(what)}")
        self.label.setToolTip(f"{safe_text(source)}\n{safe_text(what)}")
        self.show()
