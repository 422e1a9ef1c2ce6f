"""Step 2 of a report: the pictures, drawn for the page by :mod:`kvscope.app.report.figures` (GUI thread).

Each picture is painted into an image of a fixed size (no widget is grabbed, so no control of the
app ends up in a report): the byte map (with the missing bytes of a truncated file), one cell map
per cell table, the per-layer statistics of every section/stream and a heatmap of each flagged
record. Titles name the file as the report does (its base name unless ``--full-paths``). The lab
matrix is drawn by :mod:`kvscope.app.report.lab_matrix`.
"""

from __future__ import annotations

import re

from PySide6.QtGui import QImage

from kvscope.app.base.tasks import TaskRunner
from kvscope.app.document.doc_index import DocumentIndex
from kvscope.app.document.seq_owner import implied_owner
from kvscope.app.report import figures
from kvscope.app.report.snapshot import png_bytes
from kvscope.app.views.cells.cellmap_image import with_owner
from kvscope.core.analysis.verdict import plural
from kvscope.core.report.model import MAX_CELL_TABLES, Progress, ReportData, ReportImage, layer_records, no_progress

HEATMAP_CAP = 512  # rows and columns a heatmap shows at most (fixed, not the screen's size)


def _image(img: QImage, file: str, title: str, caption: str) -> ReportImage:
    return ReportImage(file, title, caption, png_bytes(img), img.width(), img.height())


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "x"


def report_index(data: ReportData, index: DocumentIndex | None = None) -> DocumentIndex:
    """``index`` when it is the index of the report's parse (the document's, on export), else a new one."""
    return index if index is not None and index.res is data.result else DocumentIndex(data.result)


def byte_map(data: ReportData, index: DocumentIndex | None = None) -> ReportImage:
    """The byte map; the zoom shows the first unparsed/untrusted range, else the first error."""
    res, idx = data.result, report_index(data, index)
    missing = data.overview.verdict.missing
    hole = next((n for n in idx.leaves if n.status != "parsed"), None)
    err = next((f for f in res.findings if f.severity == "error"), None)
    zoom: tuple[int, int, str] | None = None
    if hole is not None:
        zoom = (hole.offset, hole.size, f"the first {hole.status} range, {hole.path}")
        text = f"the zoom shows the {hole.status} range {hole.path} ({hole.size:,} bytes at {hole.offset:,})"
    elif err is not None:
        zoom = (err.offset, err.length, f"the first error ({err.code})")
        text = f"the zoom shows the first error, {err.code} at offset {err.offset:,}"
    else:
        text = "every byte parsed"
    img = figures.byte_map(data.name, res.size, idx.leaves, missing, zoom)
    caption = (f"The whole file ({res.size:,} bytes) coloured by structure"
               + (f", then the bytes it is missing ({missing.text()}), cross-hatched" if missing else "")
               + f"; {text}.")
    return _image(img, "bytemap.png", "Byte map", caption)


def cell_maps(data: ReportData, index: DocumentIndex | None = None) -> list[ReportImage]:
    """One cell map per cell table (at most :data:`MAX_CELL_TABLES`)."""
    out = []
    for i, ref in enumerate(report_index(data, index).tables[:MAX_CELL_TABLES]):
        recurrent = ref.section.kind == "recurrent"
        owner = implied_owner(data.result, ref.section, ref.table)  # a per-sequence file's recurrent state
        table = with_owner(ref.table, owner.column) if owner is not None else ref.table
        img = figures.cell_map(data.name, ref.label, table, recurrent,
                               {owner.column: owner.label} if owner is not None else None)
        seqs = [owner.label if owner.seq is None else str(owner.seq)] if owner is not None else \
            [str(s) for s in table.seq_set()]
        caption = (f"{ref.label}: top, the sequences each of its {plural(ref.table.count, 'cell')} holds (one row per "
                   f"sequence: {', '.join(seqs) or 'none'}); bottom, each cell's position.")
        if owner is not None:
            caption += (f" A per-sequence file names no sequence in its recurrent cells: the cell is the state of "
                        f"{owner.label} ({owner.why}).")
        out.append(_image(img, f"cells-{i + 1}.png", f"Cell map: {ref.label}", caption))
    return out


def _units(data: ReportData) -> list[tuple[int, int | None, str]]:
    """(section index, stream, label) of every section/stream holding records, in file order."""
    units: dict[tuple[int, int | None], str] = {}
    for si, sec, stream, _ in layer_records(data.result):
        key = (si, stream.index if stream is not None else None)
        units.setdefault(key, sec.role if stream is None else f"{sec.role} · stream {stream.index}")
    return [(si, st, label) for (si, st), label in units.items()]


def stats_plots(data: ReportData) -> list[ReportImage]:
    """The per-layer statistics plot of every section/stream."""
    if data.stats is None:
        return []
    out = []
    for n, (si, stream, label) in enumerate(_units(data), start=1):
        layers = [ls for ls in data.stats.layers if ls.section_index == si and ls.stream == stream]
        if not layers:
            continue
        img = figures.stats_plot(data.name, label, layers)
        caption = ("Top: RMS of the finite values per model layer, one line per record role; bottom: non-finite "
                   "values (magenta) and zero rows (the role's colour) per layer.")
        out.append(_image(img, f"stats-{n}.png", f"Per-layer statistics: {label}", caption))
    return out


def heatmaps(data: ReportData, index: DocumentIndex | None = None) -> list[ReportImage]:
    """A heatmap of each flagged record (cells × channels, at most :data:`HEATMAP_CAP` of each)."""
    from kvscope.core.analysis.record_values import layer_matrix, record_shape

    out = []
    idx = report_index(data, index)
    for n, fl in enumerate(data.flagged, start=1):
        rec = fl.record
        ref = idx.table_of(rec)
        where = ref.label if ref is not None else "the file"
        role = figures.ROLE_LABEL.get(rec.role, rec.role).split(" ")[0]
        name = f"{role} layer {'?' if rec.il is None else rec.il}"
        try:
            matrix = layer_matrix(data.result, rec, HEATMAP_CAP, HEATMAP_CAP)
        except ValueError as e:
            out_note = f"cannot be pictured: {e}"
            matrix = None
        else:
            out_note = ""
        if matrix is None or matrix.size == 0:
            continue
        cells, dims = record_shape(rec, data.result.size - rec.data_offset)
        img = figures.heatmap(data.name, f"{name} ({where}, {rec.type})", matrix, cells, dims, out_note)
        file = f"heatmap-{n}-{_slug(rec.role + ('' if rec.il is None else str(rec.il)))}.png"
        caption = f"{fl.why[:1].upper()}{fl.why[1:]}. Rows are cells in file order, columns the record's channels."
        out.append(_image(img, file, f"Layer heatmap: {name} ({where})", caption))
    return out


def render_images(data: ReportData, progress: Progress = no_progress,
                  index: DocumentIndex | None = None) -> list[ReportImage]:
    """Every picture of the report, in report order (``index``: the document's index of the same parse, if
    there is one). Needs a QGuiApplication; GUI thread only."""
    from kvscope.app.report.lab_matrix import lab_matrix_image

    index = report_index(data, index)
    progress(None, "drawing the byte map")
    images = [byte_map(data, index)]
    progress(None, "drawing the cell maps")
    images += cell_maps(data, index)
    progress(None, "drawing the per-layer statistics")
    images += stats_plots(data)
    progress(None, "drawing layer heatmaps")
    images += heatmaps(data, index)
    if data.lab is not None and data.lab.run is not None:
        progress(None, "drawing the lab matrix")
        runner = TaskRunner()
        try:
            images.append(lab_matrix_image(data.lab.run, runner))
        finally:
            runner.shutdown()
            runner.deleteLater()
    return images
