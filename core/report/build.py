"""A whole report in one call (``kvscope report``, the app's ``build_report``): check, collect, draw, write.

The pictures and report.html are drawn by the Qt layer: ``draw`` is
:func:`kvscope.app.report.builder.draw` where the gui extra is installed; without it (None) the
report is report.md and report.json (no Qt).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvscope.core.report.atomic import check_destination, report_inputs
from kvscope.core.report.collect import collect
from kvscope.core.report.model import Progress, ReportData, ReportImage, ReportOptions, no_progress
from kvscope.core.report.writer import HtmlPage, write_report

Draw = Callable[[ReportData, Progress], tuple[list[ReportImage], HtmlPage | None]]  # the pictures, report.html


def build_report(options: ReportOptions, dest: str | os.PathLike[str], progress: Progress = no_progress,
                 draw: Draw | None = None, verify: dict[str, Any] | None = None) -> tuple[ReportData, Path]:
    """Write the report of ``options.file`` into ``dest``; ReportError on bad input or an unusable ``dest``.
    ``verify``: a Verify result of the file to lead the report with (:func:`~kvscope.core.report.collect.collect`)."""
    check_destination(Path(os.path.abspath(dest)), report_inputs(options))  # before the work, not after it
    data = collect(options, progress, verify=verify)
    images, html = draw(data, progress) if draw is not None else ([], None)
    progress(None, "writing")
    return data, write_report(data, images, dest, html)
