"""Tools → Repair… (and the Overview's "Repair…" link): where to write the rebuilt file, then the run.

:func:`repair_document` asks for the output with a save dialog (window-modal, never a blocking loop)
that starts beside the input as ``NAME.repaired.EXT`` and refuses the input itself, then starts the
document's :class:`~kvscope.app.document.repair_job.RepairRun` in the engine settings' build where it
writes the file's layout (as Verify restores it; else the build that does), with the tokens given for a
blob (Tools → Tokens for this blob…), which carries none. The Overview shows the run
and its outcome; Open there opens the repaired file with the same model (:func:`open_repaired`).
"""

from __future__ import annotations

import os
from typing import Protocol

from PySide6.QtWidgets import QFileDialog, QStatusBar, QWidget

from kvscope.app.document.repair_job import default_output, repair_build, repair_plan_text
from kvscope.app.shell.document_widget import DocumentWidget
from kvscope.app.shell.settings import AppSettings
from kvscope.core.fsutil import same_file
from kvscope.core.pinned_builds import build_writing
from kvscope.core.textsafe import safe_text


class RepairHost(Protocol):
    """What the repair needs from the window: its settings, status bar, and a way to open a file."""

    settings: AppSettings

    def window(self) -> QWidget: ...
    def statusBar(self) -> QStatusBar: ...
    def current(self) -> DocumentWidget | None: ...
    def open_file(self, path: str, model: str | None = None) -> DocumentWidget | None: ...


def start_repair(win: RepairHost, w: DocumentWidget, out: str) -> bool:
    """Repair ``w``'s file into ``out`` (True when the run started; else the Overview says why)."""
    doc, ov = w.doc, w.overview
    w.show_view("overview")
    why = ov.repair_problem()
    if why is not None or doc.result is None or doc.model_path is None:
        ov.repair.error = why or "the file cannot be repaired"
        ov.repair.output = os.path.abspath(out)
        ov.repair.changed.emit()
        return False
    build = repair_build(doc.result, win.settings.engine()) or build_writing(doc.result.layout.name)
    tokens = doc.given_tokens if doc.takes_tokens() else None
    task = ov.repair.start(doc.path, doc.model_path, out, build,
                           repair_plan_text(doc.result, build, tokens) if build else "", tokens=tokens)
    if task is not None:
        win.statusBar().showMessage(f"repairing {doc.name} into {safe_text(os.path.basename(out))}", 8000)
        task.finished.connect(lambda: win.statusBar().showMessage(ov.repair_banner.label.text(), 10000))
    return task is not None


def repair_document(win: RepairHost, w: DocumentWidget | None = None, out: str | None = None) -> QFileDialog | None:
    """Repair ``w``'s file (default: the current one): into ``out``, or where the dialog it opens says."""
    w = w or win.current()
    if w is None:
        return None
    if out is not None:
        start_repair(win, w, out)
        return None
    why = w.overview.repair_problem()
    if why is not None:
        w.show_view("overview")
        win.statusBar().showMessage(f"Repair: {why}", 10000)
        return None
    path = w.doc.path
    dlg = QFileDialog(win.window(), f"Write the repaired {w.doc.name} to", os.path.dirname(path))
    dlg.setAcceptMode(QFileDialog.AcceptMode.AcceptSave)
    dlg.setFileMode(QFileDialog.FileMode.AnyFile)
    dlg.selectFile(os.path.basename(default_output(path)))

    def chosen(target: str) -> None:
        if not target:
            return
        if same_file(path, target):  # never over the input: ask again
            win.statusBar().showMessage("Repair never overwrites the input: choose another file", 10000)
            again = repair_document(win, w)
            if again is not None:
                again.selectFile(os.path.basename(default_output(path)))
            return
        start_repair(win, w, target)

    dlg.fileSelected.connect(chosen)
    dlg.open()
    return dlg


def open_repaired(win: RepairHost, w: DocumentWidget, path: str) -> DocumentWidget | None:
    """Open the repaired ``path`` in a new tab with ``w``'s model."""
    return win.open_file(path, model=w.doc.model_path if w.doc.profile is not None else None)
