"""The Qt layer's part of ``kvscope report``: the pictures and report.html (:func:`draw`), and a whole report in
one call (:func:`build_report`). ``kvscope report`` (:mod:`kvscope.core.cli.report_command`) loads
:func:`draw` from here when the gui extra is installed."""

from __future__ import annotations

import os
from pathlib import Path

from kvscope.app.report.html_page import render_html
from kvscope.app.report.images import render_images
from kvscope.core.report import build
from kvscope.core.report.model import Progress, ReportData, ReportImage, ReportOptions, no_progress
from kvscope.core.report.writer import HtmlPage


def ensure_report_app() -> None:
    """A QApplication with the Fusion style the app uses (pictures look the same from the CLI and the app)."""
    from kvscope.app.base.application import ensure_app

    app = ensure_app()
    if app.style().name().lower() != "fusion":
        app.setStyle("Fusion")


def draw(data: ReportData, progress: Progress = no_progress) -> tuple[list[ReportImage], HtmlPage]:
    """The report's pictures and report.html's renderer (a QApplication is made if there is none; GUI thread)."""
    ensure_report_app()
    return render_images(data, progress), render_html


def build_report(options: ReportOptions, dest: str | os.PathLike[str],
                 progress: Progress = no_progress) -> tuple[ReportData, Path]:
    """Write the whole report of ``options.file`` (pictures and report.html included) into ``dest``; ReportError
    on bad input or an unusable ``dest``."""
    return build.build_report(options, dest, progress, draw)
