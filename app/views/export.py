"""Exporting a view: a PNG of what it shows and, where it holds numbers, a CSV of them.

Every view offers an :class:`ExportButton` (PNG image…, CSV table…). A view says what it exports by
having ``export_widget()`` (the part pictured: its plots or table, not its controls) and, when it holds
numbers, ``csv_table()`` (header and rows, built from numpy arrays on the GUI thread and formatted on a
pool thread; a view without one, the Overview, exports PNG only); a view with more than one table names
them in ``extra_csv`` (label -> method name). Files are written atomically (``kvscope.core.fsutil.write_atomic``).
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from PySide6.QtCore import QBuffer, QByteArray, QIODevice
from PySide6.QtWidgets import QFileDialog, QMenu, QToolButton, QWidget

from kvscope.app.base.tasks import CancelToken, Report, Task, TaskRunner
from kvscope.core.fsutil import write_atomic

if TYPE_CHECKING:
    from kvscope.app.document.document import Document

CsvTable = tuple[Sequence[str], Iterable[Sequence[Any]]]


class ExportableView(Protocol):
    """What a view provides to be exported."""

    export_name: str  # short name for default file names: "layers", "cells", ...

    def export_widget(self) -> QWidget: ...
    # optional: ``csv_table() -> CsvTable | None`` (the view's numbers), and ``extra_csv``: more CSV tables
    # than ``csv_table``, menu label -> (file name suffix, method name)


def png_bytes(widget: QWidget) -> bytes:
    """``widget`` as it is shown, encoded as PNG."""
    pix = widget.grab()
    data = QByteArray()
    buf = QBuffer(data)
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    if not pix.save(buf, "PNG"):
        raise OSError("cannot encode a PNG")
    buf.close()
    return bytes(data.data())


def save_png(widget: QWidget, path: str) -> None:
    """Write ``widget``'s picture to ``path`` as PNG, atomically."""
    write_atomic(path, png_bytes(widget), prefix=".kvscope-png-")


def csv_text(header: Sequence[str], rows: Iterable[Sequence[Any]], token: CancelToken | None = None) -> str:
    """``header`` and ``rows`` as CSV text (floats with repr precision; NaN/Inf spelled out)."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(header)
    for n, row in enumerate(rows):
        if token is not None and n % 4096 == 0:
            token.check()
        w.writerow(row)
    return out.getvalue()


def write_csv(path: str, table: CsvTable, token: CancelToken | None = None) -> None:
    header, rows = table
    write_atomic(path, csv_text(header, rows, token), prefix=".kvscope-csv-")


def csv_job(path: str, table: CsvTable) -> Callable[[CancelToken, Report], str]:
    def job(token: CancelToken, report: Report) -> str:
        report(None, f"writing {os.path.basename(path)}")
        write_csv(path, table, token)
        return path

    return job


def export_csv(view: ExportableView, path: str, runner: TaskRunner,
               done: Callable[[str], None] | None = None, failed: Callable[[str], None] | None = None,
               method: str = "csv_table") -> Task | None:
    """Write ``view``'s numbers (``method``'s table) to ``path`` on ``runner`` (None when there are none now)."""
    fn = getattr(view, method, None)
    table = fn() if fn is not None else None
    if table is None:
        return None
    return runner.submit(f"export {os.path.basename(path)}", csv_job(path, table), done, failed)


class ExportButton(QToolButton):
    """"Export ▾": PNG image… and (when the view has numbers) CSV table…, asking for the file name."""

    def __init__(self, view: ExportableView, runner: Callable[[], TaskRunner], start_dir: Callable[[], str],
                 notify: Callable[[str], None], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.view = view
        self._runner, self._start_dir, self._notify = runner, start_dir, notify
        self.setText("Export")
        self.setToolTip("save this view as a PNG picture, or its numbers as CSV")
        self.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        menu = QMenu(self)
        self.png_action = menu.addAction("PNG image…", self.ask_png)
        self.csv_actions = {"csv_table": menu.addAction("CSV table…", self.ask_csv)} if hasattr(view, "csv_table") \
            else {}
        extra: dict[str, tuple[str, str]] = getattr(view, "extra_csv", {})
        for label, (suffix, method) in extra.items():
            self.csv_actions[method] = menu.addAction(f"{label}…", self._csv_asker(method, suffix))
        menu.aboutToShow.connect(self._enable)
        self.setMenu(menu)
        self.setMinimumWidth(self.fontMetrics().horizontalAdvance("Export") + 28)

    def _csv_asker(self, method: str, suffix: str) -> Callable[[], None]:
        return lambda: self.ask_csv(method, suffix)

    def _enable(self) -> None:
        for method, action in self.csv_actions.items():
            action.setEnabled(getattr(self.view, method)() is not None)

    def _default(self, ext: str, suffix: str = "") -> str:
        return os.path.join(self._start_dir(), f"{self.view.export_name}{suffix}.{ext}")

    def ask_png(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export a PNG picture", self._default("png"), "PNG image (*.png)")
        if path:
            self.export_png(path if path.lower().endswith(".png") else path + ".png")

    def ask_csv(self, method: str = "csv_table", suffix: str = "") -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export a CSV table", self._default("csv", suffix),
                                              "CSV table (*.csv)")
        if path:
            self.export_csv(path if path.lower().endswith(".csv") else path + ".csv", method)

    def export_png(self, path: str) -> bool:
        try:
            save_png(self.view.export_widget(), path)
        except OSError as e:
            self._notify(f"Cannot write {os.path.basename(path)}: {e.strerror or e}")
            return False
        self._notify(f"saved {os.path.basename(path)}")
        return True

    def export_csv(self, path: str, method: str = "csv_table") -> Task | None:
        task = export_csv(self.view, path, self._runner(), lambda p: self._notify(f"saved {os.path.basename(p)}"),
                          lambda m: self._notify(f"Cannot write {os.path.basename(path)}: {m}"), method)
        if task is None:
            self._notify("this view holds no numbers to export yet")
        return task


def doc_export_button(view: ExportableView, doc: Document) -> ExportButton:
    """An export button for a view of ``doc``: its runner, its folder, its status messages."""
    return ExportButton(view, lambda: doc.runner, lambda: os.path.dirname(doc.path), doc.message.emit)
