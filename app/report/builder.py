"""A whole report in one call (the command line): collect, draw, write."""

from __future__ import annotations

import os
from pathlib import Path

from kvscope.app.report.html_page import render_html
from kvscope.app.report.images import render_images
from kvscope.core.report.atomic import check_destination, report_inputs
from kvscope.core.report.collect import collect
from kvscope.core.report.model import Progress, ReportData, ReportOptions, no_progress
from kvscope.core.report.writer import write_report


def ensure_report_app() -> None:
    """A QApplication with the Fusion style the app uses (pictures look the same from the CLI and the app)."""
    from kvscope.app.base.application import ensure_app

    app = ensure_app()
    if app.style().name().lower() != "fusion":
        app.setStyle("Fusion")


def build_report(options: ReportOptions, dest: str | os.PathLike[str],
                 progress: Progress = no_progress) -> tuple[ReportData, Path]:
    """Write the report of ``options.file`` into ``dest``; ReportError on bad input or an unusable ``dest``."""
    check_destination(Path(os.path.abspath(dest)), report_inputs(options))  # before the work, not after it
    ensure_report_app()
    data = collect(options, progress)
    images = render_images(data, progress)
    progress(None, "writing")
    return data, write_report(data, images, dest, render_html)
