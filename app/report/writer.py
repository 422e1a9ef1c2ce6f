"""Step 3 of a report: ``report.html``, ``report.md``, ``report.json`` and the PNGs, written atomically (no Qt)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from kvscope.app.report.atomic import REPORT_FILES, replace_folder, report_inputs
from kvscope.app.report.html_page import render_html
from kvscope.app.report.markdown import render_markdown
from kvscope.app.report.model import ReportData, ReportError, ReportImage
from kvscope.app.report.summary import report_json

__all__ = ["REPORT_FILES", "fill_folder", "write_report"]


def fill_folder(folder: Path, data: ReportData, images: list[ReportImage]) -> None:
    """Write every file of the report into ``folder`` (pictures first, report.html last)."""
    for im in images:
        (folder / im.file).write_bytes(im.png)
    (folder / "report.json").write_text(json.dumps(report_json(data, images), indent=1) + "\n", encoding="utf-8")
    (folder / "report.md").write_text(render_markdown(data, images), encoding="utf-8")
    (folder / "report.html").write_text(render_html(data, images), encoding="utf-8")


def write_report(data: ReportData, images: list[ReportImage], dest: str | os.PathLike[str]) -> Path:
    """Build the report in a temporary folder and put it in place (only its own files in ``dest`` replaced)."""
    try:
        return replace_folder(dest, lambda tmp: fill_folder(tmp, data, images), report_inputs(data.options))
    except OSError as e:
        raise ReportError(f"cannot write {dest}: {e.strerror or e}") from None
