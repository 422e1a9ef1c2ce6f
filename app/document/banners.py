"""The strips above every view of a document: "this file is damaged", "this file changed: Reload".

:class:`DamageBanner` is shown whatever view is in front while the file has error findings (or
is not a state file): the verdict in one line, a button to the overview and one that selects the
first error's bytes. :class:`ChangedBanner` appears when the file changed on disk or while it was
read (``Document.fileChanged``) and offers Reload.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QWidget

from kvscope.app.base.theme import Theme, verdict_color
from kvscope.app.document.document import Document


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
        self.show_button = self.button("Show the damage", "select the bytes of the first error")
        self.overview_button.clicked.connect(lambda: self.jumpRequested.emit("overview"))
        self.show_button.clicked.connect(self.show_damage)
        for sig in (doc.loaded, doc.statsReady):
            sig.connect(self.refresh)
        theme.changed.connect(lambda _dark: self.refresh())
        self.refresh()

    def refresh(self) -> None:
        v, res = self.doc.verdict(), self.doc.result
        if v is None or res is None or not (res.n_errors or v.level == "not_state"):
            self.hide()
            return
        self.label.setText(v.line())
        self.label.setToolTip(v.line())
        self.label.setStyleSheet(f"color: {verdict_color(v.level, self.theme.dark).name()}; font-weight: 600")
        self.show_button.setVisible(any(f.severity == "error" for f in v.top_findings))
        self.show()

    def show_damage(self) -> None:
        v, idx = self.doc.verdict(), self.doc.index
        if v is None or idx is None:
            return
        f = v.missing.finding if v.missing is not None else next((f for f in v.top_findings
                                                                   if f.severity == "error"), None)
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
