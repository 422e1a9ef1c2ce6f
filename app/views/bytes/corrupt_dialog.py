"""The hex view's "Corrupt these bytes…" dialog: the mode, what it will do, and the copy's name.

The copy's name starts as ``<stem>.<mode>-<start>-<end><ext>`` beside the input (it follows the mode until
the user edits it); the Write button stays off while the name is the input itself, an existing file or
in no folder, and while the mode does not apply to the selection (NaN outside a payload). The work is
:mod:`kvscope.app.document.corrupt_copy`; the dialog only chooses.
"""

from __future__ import annotations

import os

from PySide6.QtWidgets import QButtonGroup, QFileDialog, QFormLayout, QHBoxLayout, QLineEdit, QRadioButton, QWidget

from kvscope.app.base.form_dialog import FormDialog, browse_button, path_row
from kvscope.app.base.widgets import plain_label
from kvscope.app.document.corrupt_copy import MODE_TITLES, MODES, copy_problem, default_copy_name, plan_text
from kvscope.core.reader.records import ParseResult


class CorruptDialog(FormDialog):
    """Chooses ``mode()`` and ``dest()`` for corrupting ``[start, end)`` of ``path`` into a copy."""

    def __init__(self, path: str, res: ParseResult, start: int, end: int, parent: QWidget | None = None) -> None:
        super().__init__("Corrupt into a copy", parent, ok_text="Write the copy")
        self.path, self.res, self.start, self.end = path, res, start, end
        self.group = QButtonGroup(self)
        self.radios: dict[str, QRadioButton] = {}
        modes = QHBoxLayout()
        for m in MODES:
            r = QRadioButton(MODE_TITLES[m])
            self.radios[m] = r
            self.group.addButton(r)
            modes.addWidget(r)
            r.toggled.connect(self._on_mode)
        modes.addStretch(1)
        self.plan = plain_label("", wrap=True)
        self.name_edit = QLineEdit()
        self.name_edit.textChanged.connect(self._update)
        self.pick = browse_button()
        self.pick.clicked.connect(self._browse)
        form = QFormLayout()
        form.addRow("Bytes", plain_label(f"[{start:,}, {end:,}) of {os.path.basename(path)}, {end - start:,} bytes"))
        form.addRow("Corrupt with", modes)
        form.addRow("", self.plan)
        form.addRow("Copy", path_row(self.name_edit, self.pick))
        self.finish_layout(form, plain_label("The file itself is never changed: the copy opens in a new tab, to "
                                             "verify or send to the Lab.", wrap=True))
        self._default = ""  # the name last given by the mode; any other name is the user's and stays
        self.radios["nan" if plan_text(res, start, end, "nan")[1] is None else "zero"].setChecked(True)

    def mode(self) -> str:
        return next(m for m, r in self.radios.items() if r.isChecked())

    def dest(self) -> str:
        return self.name_edit.text().strip()

    def set_mode(self, mode: str) -> None:
        self.radios[mode].setChecked(True)

    def _on_mode(self, on: bool) -> None:
        if not on:
            return
        if self.dest() in ("", self._default):
            self._default = default_copy_name(self.path, self.mode(), self.start, self.end)
            self.name_edit.setText(self._default)
        self._update()

    def _browse(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Name of the corrupted copy", self.dest(), "All files (*)")
        if path:
            self.name_edit.setText(path)

    def _update(self) -> None:
        text, why = plan_text(self.res, self.start, self.end, self.mode())
        self.plan.setText(text[:1].upper() + text[1:] + ".")
        self.set_problem(why or copy_problem(self.path, self.dest()))
