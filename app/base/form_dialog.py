"""The scaffolding of kvscope's settings-style dialogs: a form, lines below it, a problem line and OK/Cancel.

:class:`FormDialog` is a window-modal ``QDialog`` whose OK button is off while :meth:`FormDialog.set_problem`
names a problem (shown in the warning colour under the form); :func:`path_row` is a line edit with its
"…" browse button. The hex view's Corrupt into a copy and Tools › Engine Settings are built on them.
"""

from __future__ import annotations

from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QLineEdit,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from kvscope.app.base.theme import WARNING_COLOR
from kvscope.app.base.widgets import plain_label

DIALOG_MIN_WIDTH = 560


def browse_button() -> QToolButton:
    """The "…" button beside a path."""
    pick = QToolButton()
    pick.setText("…")
    return pick


def path_row(edit: QLineEdit, pick: QToolButton) -> QWidget:
    """``edit`` with its browse button ``pick`` at its right, as one form field."""
    w = QWidget()
    row = QHBoxLayout(w)
    row.setContentsMargins(0, 0, 0, 0)
    row.addWidget(edit, 1)
    row.addWidget(pick)
    return w


class FormDialog(QDialog):
    """A dialog titled ``title`` with OK (``ok_text``) and Cancel; lay it out with :meth:`finish_layout`."""

    def __init__(self, title: str, parent: QWidget | None = None, ok_text: str | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle(title)
        self.problem = plain_label("", wrap=True)
        self.problem.setStyleSheet(f"color: {WARNING_COLOR};")
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        ok = self.ok_button
        if ok is not None and ok_text:
            ok.setText(ok_text)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)

    @property
    def ok_button(self) -> QPushButton | None:
        return self.buttons.button(QDialogButtonBox.StandardButton.Ok)

    def finish_layout(self, form: QFormLayout, *below: QWidget) -> QVBoxLayout:
        """The form, the widgets ``below`` it, the problem line and the buttons, top to bottom."""
        lay = QVBoxLayout(self)
        lay.addLayout(form)
        for w in below:
            lay.addWidget(w)
        lay.addWidget(self.problem)
        lay.addWidget(self.buttons)
        self.setMinimumWidth(DIALOG_MIN_WIDTH)
        return lay

    def set_problem(self, why: str | None) -> None:
        """Show ``why`` the settings cannot be used (OK off), or nothing (OK on) when it is None."""
        self.problem.setText(why or "")
        self.problem.setVisible(bool(why))
        ok = self.ok_button
        if ok is not None:
            ok.setEnabled(why is None)
