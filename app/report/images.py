"""Step 2 of a report: the pictures, drawn by the app's own views (GUI thread only).

Each picture is a view class of the app (:class:`~kvscope.app.views.bytes.bytemap.ByteMap`,
:class:`~kvscope.app.views.cells.cellmap.CellMapView`, :class:`~kvscope.app.views.layers.stats_plot.StatsPlot`,
:class:`~kvscope.app.views.layers.layer_view.LayerView`) on a private :class:`~kvscope.app.document.document.Document`
filled with the collected data, rendered off screen in the light theme at a fixed size; the lab
matrix is painted by :mod:`kvscope.app.report.lab_matrix`.
"""

from __future__ import annotations

import re

from PySide6.QtWidgets import QWidget

from kvscope.app.base.tasks import TaskRunner
from kvscope.app.base.theme import Theme
from kvscope.app.document.document import Document
from kvscope.app.report.model import MAX_CELL_TABLES, Progress, ReportData, ReportImage, no_progress
from kvscope.app.report.snapshot import dispose, grab, png_bytes, prepare, settle
from kvscope.app.views.bytes.bytemap import ByteMap, fmt_size
from kvscope.app.views.cells.cellmap import CellMapView
from kvscope.app.views.layers.layer_view import LayerView
from kvscope.app.views.layers.stats_plot import ROLE_COLORS, ROLE_LABEL, StatsPlot, unit_stats

WIDTH = 1200
CELLS_HEIGHT = 560
STATS_HEIGHT = 420
LAYER_HEIGHT = 820
COLOR_NAMES = {"#4e79a7": "blue", "#59a14f": "green", "#b07aa1": "purple", "#9c755f": "brown", "#76b7b2": "teal"}
HEATMAP_CAP = 512  # rows and columns a heatmap shows at most (fixed, not the screen's size)


def report_document(data: ReportData, runner: TaskRunner) -> Document:
    """A document holding the collected data (no load task: the views see a finished document)."""
    doc = Document(data.result.path, runner, data.profile.path if data.profile is not None else None)
    doc.result, doc.profile, doc.index = data.result, data.profile, data.index
    doc.stats, doc.stats_error = data.stats, data.stats_error
    return doc


def _image(widget: QWidget, file: str, title: str, caption: str, runner: TaskRunner) -> ReportImage:
    settle(runner)
    img = grab(widget)
    return ReportImage(file, title, caption, png_bytes(img), img.width(), img.height())


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "x"


def byte_map(doc: Document, runner: TaskRunner) -> ReportImage:
    """The byte map; the zoomed strip shows the first unparsed/untrusted range, else the first error."""
    view = ByteMap(doc)
    prepare(view, WIDTH, view.height())
    idx, res = doc.index, doc.result
    assert idx is not None and res is not None
    hole = next((n for n in idx.leaves if n.status != "parsed"), None)
    err = next((f for f in res.findings if f.severity == "error"), None)
    zoom = ""
    if hole is not None:
        doc.bus.select(idx.for_node(hole))
        zoom = f"the zoomed strip shows the {hole.status} range {hole.path} ({hole.size:,} bytes at {hole.offset:,})"
    elif err is not None:
        doc.bus.select(idx.for_finding(err))
        zoom = f"the zoomed strip shows the first error, {err.code} at offset {err.offset:,}"
    sel = doc.bus.current
    if sel is not None:
        span = max(256.0, res.size / 6)
        view.set_range(sel.offset - span / 2, sel.offset + span / 2)
    caption = (f"The whole file ({fmt_size(res.size)}, top strip) coloured by structure; "
               + (zoom + " (outlined)." if zoom else "the lower strip shows it all again: every byte parsed."))
    out = _image(view, "bytemap.png", "Byte map", caption, runner)
    dispose(view)
    return out


def cell_maps(doc: Document, theme: Theme, runner: TaskRunner) -> list[ReportImage]:
    """One cell map per cell table (at most :data:`MAX_CELL_TABLES`), sliding-window fading on when it applies."""
    idx = doc.index
    if idx is None or not idx.tables:
        return []
    view = CellMapView(doc, theme)
    prepare(view, WIDTH, CELLS_HEIGHT)
    out = []
    for i, ref in enumerate(idx.tables[:MAX_CELL_TABLES]):
        view.table_combo.setCurrentIndex(i)
        if view.swa_check.isEnabled():
            view.swa_check.setChecked(True)
        out.append(_image(view, f"cells-{i + 1}.png", f"Cell map: {ref.label}", view.summary.text(), runner))
    dispose(view)
    return out


def _units(doc: Document) -> list[tuple[int, int | None, str]]:
    """(section index, stream, label) of every section/stream holding records, in file order."""
    idx = doc.index
    units: dict[tuple[int, int | None], str] = {}
    for si, sec, stream, _ in idx.records if idx is not None else []:
        key = (si, stream.index if stream is not None else None)
        units.setdefault(key, sec.role if stream is None else f"{sec.role} · stream {stream.index}")
    return [(si, st, label) for (si, st), label in units.items()]


def stats_plots(doc: Document, theme: Theme, runner: TaskRunner) -> list[ReportImage]:
    """The per-layer statistics plot of every section/stream."""
    if doc.stats is None:
        return []
    out = []
    for n, (si, stream, label) in enumerate(_units(doc), start=1):
        view = StatsPlot(theme)
        view.set_stats(unit_stats(doc.stats, si, stream))
        prepare(view, WIDTH, STATS_HEIGHT)
        roles = ", ".join(f"{ROLE_LABEL.get(r, r)} {COLOR_NAMES.get(ROLE_COLORS.get(r, ''), 'grey')}"
                          for r in view.series)
        caption = (f"{view.status.text()}. Top: RMS of the finite values per layer; bottom: non-finite values (×) "
                   f"and zero rows (▲, dashed) per layer. Colours: {roles}.")
        out.append(_image(view, f"stats-{n}.png", f"Per-layer statistics: {label}", caption, runner))
        dispose(view)
    return out


def heatmaps(data: ReportData, doc: Document, theme: Theme, runner: TaskRunner) -> list[ReportImage]:
    """The layer view on each flagged record (heads split when the model gives the head size)."""
    if not data.flagged:
        return []
    view = LayerView(doc, theme)
    view.max_rows = view.max_cols = HEATMAP_CAP
    prepare(view, WIDTH, LAYER_HEIGHT)
    out = []
    for n, fl in enumerate(data.flagged, start=1):
        rec = fl.record
        view.select_record(rec)
        if view.heads_check.isEnabled():
            view.heads_check.setChecked(True)
        settle(runner)
        unit = view.unit.label if view.unit is not None else ""
        name = f"{ROLE_LABEL.get(rec.role, rec.role)} layer {'?' if rec.il is None else rec.il}"
        file = f"heatmap-{n}-{_slug(rec.role + ('' if rec.il is None else str(rec.il)))}.png"
        caption = f"{fl.why[:1].upper()}{fl.why[1:]}. {view.info.text()}"
        out.append(_image(view, file, f"Layer heatmap: {name} ({unit})", caption, runner))
    dispose(view)
    return out


def render_images(data: ReportData, progress: Progress = no_progress) -> list[ReportImage]:
    """Every picture of the report, in report order. Needs a QApplication; GUI thread only."""
    from kvscope.app.report.lab_matrix import lab_matrix_image

    runner = TaskRunner()
    theme = Theme("light")
    doc = report_document(data, runner)
    try:
        progress(None, "drawing the byte map")
        images = [byte_map(doc, runner)]
        progress(None, "drawing the cell maps")
        images += cell_maps(doc, theme, runner)
        progress(None, "drawing the per-layer statistics")
        images += stats_plots(doc, theme, runner)
        progress(None, "drawing layer heatmaps")
        images += heatmaps(data, doc, theme, runner)
        if data.lab is not None and data.lab.run is not None:
            progress(None, "drawing the lab matrix")
            images.append(lab_matrix_image(data.lab.run, runner))
    finally:
        runner.shutdown()
        doc.deleteLater()
        theme.deleteLater()
        runner.deleteLater()
    return images
