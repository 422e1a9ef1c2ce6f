"""Tools → Tokens for this blob… (and the Overview's link): the tokens a state blob was made of.

A blob carries no tokens, so Verify can only restore it and Repair cannot rebuild it; on the command line
``--tokens IDS`` gives them. :func:`tokens_document` opens a window-modal input dialog (``open()``, never a
blocking loop) that takes the same syntax, comma-separated ids or ``@FILE`` of a JSON list or an object
of sequence -> list (a relative FILE is taken beside the blob), read by the core's own parser
(:func:`~kvscope.app.document.given_tokens.parse_given`). OK gives them to the document
(:meth:`~kvscope.app.document.document.Document.set_given_tokens`); text that gives none, or tokens the
file cannot take (an id outside the model's vocabulary, a sequence the blob does not hold), is refused
with one line in the status bar and the dialog stays open with its text. The Overview then says how many
were given, with a link that clears them.
"""

from __future__ import annotations

import os
from typing import Protocol

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QInputDialog, QLineEdit, QStatusBar, QWidget

from kvscope.app.document.document import Document
from kvscope.app.document.given_tokens import parse_given
from kvscope.app.shell.document_widget import DocumentWidget

LABEL = ("The tokens this blob was made of, as kvscope repair and verify take them with --tokens:\n"
         "comma-separated ids (1, 15043, 3186), or @FILE holding a JSON list of ids or an object of\n"
         'sequence -> list ({"0": [1, 15043]}); a relative FILE is taken beside the blob.')
REFUSED_MS = 15000


class TokensHost(Protocol):
    """What the dialog needs from the window: its top-level widget, status bar and current page."""

    def window(self) -> QWidget: ...
    def statusBar(self) -> QStatusBar: ...
    def current(self) -> DocumentWidget | None: ...


class TokensDialog(QInputDialog):
    """The input dialog; OK gives the tokens to ``doc``, or says in the status bar why not and stays open."""

    def __init__(self, doc: Document, status: QStatusBar, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.doc, self.status = doc, status
        self.refused = ""  # the last refusal (one line)
        self.setWindowTitle(f"Tokens for {doc.name}")
        self.setInputMode(QInputDialog.InputMode.TextInput)
        self.setLabelText(LABEL)
        self.setTextEchoMode(QLineEdit.EchoMode.Normal)
        self.setOkButtonText("Give")
        self.setTextValue(doc.given_tokens_text)
        self.setWindowModality(Qt.WindowModality.WindowModal)
        self.resize(max(self.width(), 620), self.height())

    def accept(self) -> None:
        text = self.textValue().strip()
        try:
            tokens = parse_given(text, os.path.dirname(self.doc.path))
            self.doc.set_given_tokens(tokens, text)
        except ValueError as e:
            self.refused = f"Tokens for {self.doc.name} refused: {e}"
            self.status.showMessage(self.refused, REFUSED_MS)
            return  # stays open with the text, to be corrected
        self.refused = ""
        super().accept()


def tokens_document(win: TokensHost, w: DocumentWidget | None = None) -> TokensDialog | None:
    """Ask for the tokens of ``w``'s blob (default: the current page's); the dialog, or None when the file
    is not a blob without tokens (the status bar says so)."""
    w = w or win.current()
    if w is None:
        return None
    doc = w.doc
    if not doc.takes_tokens():
        kind = doc.result.kind if doc.result is not None else "file still being read"
        win.statusBar().showMessage(f"Tokens: only a state blob, which carries none, takes them ({doc.name} is a "
                                    f"{kind})", 10000)
        return None
    dlg = TokensDialog(doc, win.statusBar(), win.window())
    dlg.finished.connect(dlg.deleteLater)
    w.destroyed.connect(dlg.reject)  # the page closed: nothing to give the tokens to
    dlg.open()
    return dlg
