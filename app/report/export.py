"""File → Export report: the ``kvscope report`` of the current document, built off the GUI thread.

The window's task runner collects the data in the background (reusing the document's parse,
statistics and diff when they are in; the status bar shows progress and can cancel), the GUI
thread draws the pictures (the views must live there), and a second background task writes the
folder atomically. The result is the same report as ``kvscope report FILE --model GGUF
[--compare OTHER] [--lab ...]`` gives for the document.

The exporter gets what it needs from the window as arguments (the task runner, a status-bar
callback, the parent widget), so this module never imports the window.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLineEdit,
    QMessageBox,
    QPushButton,
    QWidget,
)

from kvscope.app.base.tasks import CancelToken, Report, Task, TaskRunner
from kvscope.app.report.html_page import render_html
from kvscope.app.report.images import render_images
from kvscope.core.report.atomic import check_destination, report_inputs
from kvscope.core.report.collect import Preloaded, collect, verify_for_report
from kvscope.core.report.lab import lab_context, memory_core_available
from kvscope.core.report.model import ReportData, ReportError, ReportImage, ReportOptions
from kvscope.core.report.summary import summary_line
from kvscope.core.report.writer import write_report

if TYPE_CHECKING:
    from pathlib import Path

    from kvscope.app.document.doc_index import DocumentIndex
    from kvscope.app.document.document import Document

ShowStatus = Callable[[str, int], None]  # (text, milliseconds): a status-bar message


def report_options(doc: Document, compare: bool = True, lab: bool = False, context: str | None = None,
                   into: int = 0) -> ReportOptions:
    """The options ``kvscope report`` would get for ``doc`` (its model, its diff partner)."""
    model = doc.model_path if doc.profile is not None else None
    other = doc.diff.other_path if compare and doc.diff is not None else None
    return ReportOptions(doc.path, model, other, lab, context or None, into, bookmarks=tuple(doc.bookmarks.items))


def preloaded(doc: Document, options: ReportOptions) -> Preloaded | None:
    """What the document has already computed, when all of it is in (its inspection with the statistics and the
    compatibility; else the report inspects the file again)."""
    if doc.inspection is None or doc.stats is None or doc.compat is None or doc.busy:
        return None
    diff = doc.diff.diff if doc.diff is not None and options.compare == doc.diff.other_path else None
    return Preloaded(doc.inspection, diff, verify_for_report(doc.verify))


class ReportExporter(QObject):
    """Runs one export at a time on ``runner``; ``finished(summary line)`` or ``failed(message)`` ends it.

    ``show_status`` shows progress and the outcome (the window's status bar); ``last_message`` holds
    the last failure as shown.
    """

    finished = Signal(str)
    failed = Signal(str)

    def __init__(self, runner: TaskRunner, show_status: ShowStatus, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.runner = runner
        self.show_status = show_status
        self.task: Task | None = None
        self.dest = ""
        self.index: DocumentIndex | None = None  # the document's, reused for the pictures when the parse is its
        self.last_message = ""

    @property
    def busy(self) -> bool:
        return self.task is not None and not self.task.done

    def start(self, doc: Document, dest: str, options: ReportOptions) -> Task | None:
        """Export ``doc``'s report to ``dest``; None (and ``failed``) when it cannot start."""
        if self.busy:
            self._fail("a report is being written already")
            return None
        try:
            check_destination(_abs(dest), report_inputs(options))
        except ReportError as e:
            self._fail(str(e))
            return None
        self.dest = dest
        pre = preloaded(doc, options)
        self.index = doc.index if pre is not None else None

        def job(token: CancelToken, report: Report) -> ReportData:
            return collect(options, report, lambda: token.cancelled, pre)

        self.task = self.runner.submit(f"report of {doc.name}", job, self._draw, self._fail)
        self.task.cancelled.connect(lambda: self._fail("cancelled"))
        return self.task

    def _draw(self, data: ReportData) -> None:
        try:
            images = render_images(data, lambda _f, text: self.show_status(f"report: {text}", 4000), self.index)
        except Exception as e:  # a slot must not raise into Qt: the failure is reported instead
            self._fail(str(e) or type(e).__name__)
            return

        def job(token: CancelToken, report: Report) -> Path:
            report(None, "writing")
            return write_report(data, images, self.dest, render_html)

        self.task = self.runner.submit("write report", job, lambda _p: self._done(data, images), self._fail)
        self.task.cancelled.connect(lambda: self._fail("cancelled"))

    def _done(self, data: ReportData, _images: list[ReportImage]) -> None:
        line = summary_line(data, self.dest)
        if data.lab is not None and data.lab.run is None:
            line += f" (the lab did not run: {data.lab.reason})"
        self.show_status(line, 10000)
        self.finished.emit(line)

    def _fail(self, message: str) -> None:
        text = f"Cannot write the report: {message}"
        self.show_status(text, 10000)
        self.last_message = text
        self.failed.emit(message)


def _abs(path: str) -> Path:
    from pathlib import Path

    return Path(os.path.abspath(path))


class ExportDialog(QDialog):
    """Asks for the report folder, whether to include the diff, and whether to run the lab."""

    def __init__(self, doc: Document, start_dir: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle(f"Export report of {doc.name}")
        self.doc = doc
        stem = doc.name.split(".")[0] or "state"
        self.folder = QLineEdit(os.path.join(start_dir, f"{stem}-report"))
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        row = QHBoxLayout()
        row.addWidget(self.folder, 1)
        row.addWidget(browse)
        self.diff_check = QCheckBox(f"Include the diff against {os.path.basename(doc.diff.other_path)}"
                                    if doc.diff is not None else "Include a diff (compare the file first)")
        self.diff_check.setEnabled(doc.diff is not None)
        self.diff_check.setChecked(doc.diff is not None)
        self.lab_check = QCheckBox("Run the lab: restore this file, as is and corrupted, into a live context")
        self.context = QLineEdit(lab_context(report_options(doc)) or "")
        self.context.setPlaceholderText("live context: a lab scenario folder or a whole-context state")
        ok = memory_core_available()
        self.lab_check.setEnabled(ok)
        self.lab_check.setToolTip("" if ok else "needs kvscope's memory core (pip install 'kvscope[memory]')")
        self.context.setEnabled(ok)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form = QFormLayout(self)
        form.addRow("Folder", row)
        form.addRow(self.diff_check)
        form.addRow(self.lab_check)
        form.addRow("Live context", self.context)
        form.addRow(buttons)
        self.resize(640, self.sizeHint().height())

    def _browse(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Report folder", self.folder.text(), "",
                                              options=QFileDialog.Option.DontConfirmOverwrite)
        if path:
            self.folder.setText(path)

    def options(self) -> ReportOptions:
        return report_options(self.doc, self.diff_check.isChecked(), self.lab_check.isChecked(),
                              self.context.text().strip() or None)


def export_document(exporter: ReportExporter, doc: Document, parent: QWidget, start_dir: str,
                    dest: str | None = None, options: ReportOptions | None = None) -> Task | None:
    """Export ``doc``'s report; asks for the folder and options (starting in ``start_dir``) when ``dest`` is None."""
    if doc.result is None:
        return None
    if dest is None:
        dlg = ExportDialog(doc, start_dir, parent)
        if dlg.exec() != QDialog.DialogCode.Accepted:
            return None
        dest, options = dlg.folder.text().strip(), dlg.options()
        if not dest:
            return None
    task = exporter.start(doc, dest, options or report_options(doc))
    if task is None:
        box = QMessageBox(QMessageBox.Icon.Warning, "kvscope", exporter.last_message, QMessageBox.StandardButton.Ok,
                          parent)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.setModal(False)
        box.show()
    return task
