"""Step 3 of a report: ``report.md``, ``report.json``, the PNGs and ``report.html``, written atomically (no Qt).

The pictures and the HTML page come from the Qt layer (:mod:`kvscope.app.report`): the caller passes
them in (``images``, ``html``); without them the folder holds ``report.md`` and ``report.json`` only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from kvscope.core.report.atomic import REPORT_FILES, replace_folder, report_inputs
from kvscope.core.report.markdown import render_markdown
from kvscope.core.report.model import ReportData, ReportError, ReportImage
from kvscope.core.report.summary import report_json

__all__ = ["REPORT_FILES", "HtmlPage", "fill_folder", "write_report"]

HtmlPage = Callable[[ReportData, list[ReportImage]], str]  # report.html's text (kvscope.app.report.html_page)


def fill_folder(folder: Path, data: ReportData, images: list[ReportImage], html: HtmlPage | None = None) -> None:
    """Write every file of the report into ``folder`` (pictures first, report.html last, when ``html`` is given)."""
    for im in images:
        (folder / im.file).write_bytes(im.png)
    (folder / "report.json").write_text(json.dumps(report_json(data, images), indent=1) + "\n", encoding="utf-8")
    (folder / "report.md").write_text(render_markdown(data, images), encoding="utf-8")
    if html is not None:
        (folder / "report.html").write_text(html(data, images), encoding="utf-8")


def write_report(data: ReportData, images: list[ReportImage], dest: str | os.PathLike[str],
                 html: HtmlPage | None = None) -> Path:
    """Build the report in a temporary folder and put it in place (only its own files in ``dest`` replaced)."""
    try:
        return replace_folder(dest, lambda tmp: fill_folder(tmp, data, images, html), report_inputs(data.options))
    except OSError as e:
        raise ReportError(f"cannot write {dest}: {e.strerror or e}") from None
