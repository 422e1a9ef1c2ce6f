"""Cell map view: per cell table, cells × sequences with positions (pyqtgraph image + position plot).

Axes are in real units: cell indices (file order) or the position of each row (sorted by position), whole
numbers only. The id-less cell of a per-sequence file's recurrent state is drawn as the state of the file's
sequence (:mod:`~kvscope.app.document.seq_owner`), never as an empty cell.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, Qt
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import QCheckBox, QComboBox, QHBoxLayout, QVBoxLayout, QWidget

from kvscope.app.base.lazy import LazyParts
from kvscope.app.base.tasks import CancelToken, Report, Task
from kvscope.app.base.theme import SEQ_COLORS, Theme
from kvscope.app.base.widgets import plain_label
from kvscope.app.document.doc_index import Selection, TableRef
from kvscope.app.document.document import Document
from kvscope.app.document.seq_owner import SeqOwner
from kvscope.app.views.cells.cellmap_image import CellImage
from kvscope.app.views.cells.picture import CellPicture, draw_picture, seq_label
from kvscope.app.views.export import CsvTable, doc_export_button
from kvscope.app.views.plot_axes import IntegerAxis, style_plot
from kvscope.core.analysis.verdict import plural
from kvscope.core.reader.records import CellTable

BUILD_MS = 40  # the plots are made this long after the view (kvscope.app.base.lazy)
ASYNC_CELLS = 32_768  # a bigger table's picture is computed on a pool thread


class CellMapView(LazyParts, QWidget):
    """Rows are cells, columns sequence ids (plus a 'shared' column); a line plot shows each row's position."""

    export_name = "cells"
    lazy_parts = frozenset({"glw", "row_axis", "pos_axis", "plot", "pos_plot", "img", "pos_curves", "marks"})

    def __init__(self, doc: Document, theme: Theme, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.defer_build(BUILD_MS)  # the plots: see build_parts
        self.doc, self.theme = doc, theme
        self.image: CellImage | None = None
        self.owner: SeqOwner | None = None  # whose state the id-less cells of the shown table hold
        self.shown: CellTable | None = None  # the table as drawn (id-less cells filed under ``owner``)
        self._dirty = True
        self._pending: Task | None = None  # the picture being computed; a redraw cancels it (its result is dropped)
        self._picture_ref: TableRef | None = None  # the table of the picture on screen
        self.table_combo = QComboBox()
        self.order_combo = QComboBox()
        self.order_combo.addItems(["file order", "by position"])
        self.swa_check = QCheckBox("SWA window")
        self.summary = plain_label()
        self.summary.setWordWrap(True)
        self.hover = plain_label(" ")
        self.hover.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.legend = plain_label("colour = sequence, lighter = earlier position · last column dark = cell shared by "
                                  "several sequences · grey row = empty cell · faded = outside the sliding window")
        self.legend.setWordWrap(True)
        self.export_button = doc_export_button(self, doc)
        top = QHBoxLayout()
        top.addWidget(plain_label("cells of"))
        top.addWidget(self.table_combo, 1)
        top.addWidget(self.order_combo)
        top.addWidget(self.swa_check)
        top.addWidget(self.export_button)
        self.picture = QWidget()
        self.picture_layout = pl = QVBoxLayout(self.picture)
        pl.setContentsMargins(0, 0, 0, 0)
        pl.addWidget(self.summary)
        pl.addWidget(self.hover)
        pl.addWidget(self.legend)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(2, 2, 2, 2)
        lay.addLayout(top)
        lay.addWidget(self.picture, 1)
        self.table_combo.currentIndexChanged.connect(self._redraw)
        self.order_combo.currentIndexChanged.connect(self._redraw)
        self.swa_check.toggled.connect(self._redraw)
        doc.loaded.connect(self._reload)
        doc.bus.changed.connect(self._on_selection)
        theme.changed.connect(self.apply_theme)
        self._reload()

    def build_steps(self) -> Iterator[None]:
        """The plots, one per step (deferred: see :mod:`kvscope.app.base.lazy`)."""
        self.glw = pg.GraphicsLayoutWidget()
        self.row_axis = IntegerAxis("left", centred=True)
        self.pos_axis = IntegerAxis("bottom")
        self.plot = self.glw.addPlot(row=0, col=0, axisItems={"left": self.row_axis})
        yield
        self.pos_plot = self.glw.addPlot(row=0, col=1, axisItems={"bottom": self.pos_axis})
        self.glw.ci.layout.setColumnStretchFactor(0, 3)
        self.glw.ci.layout.setColumnStretchFactor(1, 2)
        for p in (self.plot, self.pos_plot):
            p.invertY(True)
            p.setMenuEnabled(False)
        self.plot.setLabel("left", "cell")
        self.plot.setLabel("bottom", "sequence")
        self.pos_plot.setLabel("bottom", "position")
        self.pos_plot.setYLink(self.plot)
        self.pos_plot.hideAxis("left")
        self.img = pg.ImageItem(axisOrder="row-major", autoDownsample=True)
        self.plot.addItem(self.img)
        # one curve per colour of short vertical strokes, one per row at its position, drawn as one path
        # (a ScatterPlotItem costs ~50 us a point in Python on the GUI thread)
        self.pos_curves: list[pg.PlotCurveItem] = []
        self.marks = [pg.InfiniteLine(angle=0, movable=False, pen=pg.mkPen("#3d8ee6", width=2)) for _ in range(2)]
        for p, m in zip((self.plot, self.pos_plot), self.marks, strict=True):
            p.addItem(m)
            m.hide()
        self.picture_layout.insertWidget(1, self.glw, 1)
        self.glw.scene().sigMouseMoved.connect(self._on_move)
        self.glw.scene().sigMouseClicked.connect(self._on_click)
        self.finish()
        self.apply_theme(self.theme.dark)
        self._dirty = True
        if self.isVisible():
            self._redraw()

    # -- data --------------------------------------------------------------------------------------
    @property
    def ref(self) -> TableRef | None:
        idx = self.doc.index
        key = self.table_combo.currentData()
        return idx.tables[key] if idx is not None and isinstance(key, int) and key < len(idx.tables) else None

    def _reload(self) -> None:
        self.table_combo.blockSignals(True)
        self.table_combo.clear()
        idx = self.doc.index
        for t in idx.tables if idx is not None else []:
            self.table_combo.addItem(f"{t.label} ({plural(t.table.count, 'cell')})", t.key)
        self.table_combo.blockSignals(False)
        has = idx is not None and bool(idx.tables)
        for w in (self.table_combo, self.order_combo):
            w.setEnabled(has)
        if not has:
            self.summary.setText(self.no_cells_text())
        self._redraw()

    def no_cells_text(self) -> str:
        """What the view says instead of a map when the file holds no cells (empty axes said nothing)."""
        res = self.doc.result
        if res is None:
            return ""
        if res.kind == "unknown":
            return "No cells: this is not a llama.cpp state file, so there is no cell map to draw."
        return "No cells: this file holds no cell tables, so there is no cell map to draw."

    def swa_state(self, ref: TableRef | None) -> tuple[bool, str]:
        """(available, reason) for the sliding-window marks on ``ref``."""
        prof = self.doc.profile
        if prof is None:
            return False, "needs a model: the sliding window comes from the GGUF (File → Model…)"
        if prof.n_swa <= 0 or not prof.swa_layers:
            return False, f"model {prof.arch} has no sliding-window layers"
        if ref is None:
            return False, "no cell table"
        swa = set(prof.swa_layers)
        if ref.section.role != "kv_swa" and not any(r.il in swa for r in ref.records):
            return False, f"section {ref.section.role} holds no sliding-window layers"
        return True, f"fade cells more than {prof.n_swa} positions behind their sequence's latest position"

    def showEvent(self, e: QShowEvent) -> None:
        super().showEvent(e)
        self.ensure_built()
        if self._dirty:
            self._redraw()

    def seq_label(self, s: int) -> str:
        """The column label of sequence id ``s`` (the file's unnamed sequence has no id)."""
        return seq_label(self.owner, s)

    def _redraw(self) -> None:
        """Rebuild the picture now when shown, else when next shown.

        A table of more than ``ASYNC_CELLS`` cells has its picture computed on a pool thread (a few
        100 ms for 262,144 cells on a loaded machine) and shown when it is in; a smaller one at once.
        """
        ref = self.ref
        ok, why = self.swa_state(ref)
        self.swa_check.setEnabled(ok)
        self.swa_check.setToolTip(why)
        if not self.isVisible() or not self.built:
            self._dirty = True
            return
        self._dirty = False
        if self._pending is not None and not self._pending.done:
            self._pending.cancel()
        self._pending = None
        for w in (self.glw, self.hover, self.legend):  # no empty axes: the summary says there are no cells
            w.setVisible(ref is not None)
        if ref is None:
            self.image = self.shown = self.owner = self._picture_ref = None
            self.img.clear()
            self._set_positions([])
            self.summary.setText(self.no_cells_text())
            return
        prof = self.doc.profile
        swa = (prof.n_swa, prof.arch == "llama4") if ok and self.swa_check.isChecked() and prof is not None else None
        args = (self.doc.result, ref, swa, self.order_combo.currentIndex() == 1, self.theme.dark, SEQ_COLORS)
        if ref.table.count <= ASYNC_CELLS:
            self._show_picture(draw_picture(*args))
            return
        if self._picture_ref is not ref:  # another table's picture must not stand for this one meanwhile
            self.image = self.shown = self.owner = self._picture_ref = None
            self.img.clear()
            self._set_positions([])
        self.summary.setText(f"{ref.label}: drawing the map of {plural(ref.table.count, 'cell')}…")

        def job(token: CancelToken, report: Report) -> CellPicture:
            return draw_picture(*args)

        # bound methods: Qt drops the connection when the view is deleted before the picture is in
        self._pending = self.doc.runner.submit(f"cell map of {ref.label}", job, self._show_picture,
                                               self._on_picture_failed)

    def _on_picture_failed(self, message: str) -> None:  # a redraw since cancelled this task: no call
        ref = self.ref
        if ref is not None:
            self.summary.setText(f"{ref.label}: the cell map could not be drawn: {message}")

    def _show_picture(self, pic: CellPicture) -> None:
        """Put a computed picture on screen (GUI thread: pyqtgraph calls only)."""
        im, t = pic.image, pic.shown
        self.owner, self.shown, self.image, self._picture_ref = pic.owner, t, im, pic.ref
        self.img.setImage(im.rgba, autoLevels=False, levels=(0, 255))
        self.img.setRect(0, 0, im.rgba.shape[1], max(1, im.rgba.shape[0]))
        self._set_positions(pic.positions)
        ticks = [(j + 0.5, self.seq_label(s)) for j, s in enumerate(im.seqs)] + [(len(im.seqs) + 0.5, "shared")]
        self.plot.getAxis("bottom").setTicks([ticks])
        pos = im.pos
        self.row_axis.set_labeler((lambda r: f"{int(pos[r]):,}" if 0 <= r < pos.size else "")
                                  if pic.by_position else None)
        self.plot.setLabel("left", "position (rows sorted by position)" if pic.by_position else "cell (file order)")
        pad = 0.02 * max(1, t.count)  # one range update (two calls would lay the view out twice)
        self.plot.vb.setRange(xRange=(0, len(im.seqs) + 1), yRange=(-pad, max(1, t.count) + pad), padding=0)
        self.summary.setText(pic.summary)
        self._mark(self.doc.bus.current)

    def _set_positions(self, groups: list[tuple[str, np.ndarray, np.ndarray, int]]) -> None:
        """One curve per colour (created on demand, emptied when unused): a stroke across each row at its position,
        at least a pixel and a half tall however many rows share a pixel."""
        rows = self.image.order.size if self.image is not None else 0
        half = max(0.42, 0.75 * rows / max(100.0, self.plot.vb.height()))
        while len(self.pos_curves) < len(groups):
            curve = pg.PlotCurveItem([], [], connect="pairs")
            self.pos_plot.addItem(curve)
            self.pos_curves.append(curve)
        for curve, (color, xs, ys, size) in zip(self.pos_curves, groups, strict=False):
            pen = pg.mkPen(color, width=size)
            pen.setCapStyle(Qt.PenCapStyle.FlatCap)
            strokes = np.empty(2 * ys.size)
            strokes[0::2], strokes[1::2] = ys - half, ys + half
            curve.setData(np.repeat(xs, 2), strokes, pen=pen, connect="pairs")
        for curve in self.pos_curves[len(groups):]:
            curve.setData([], [])

    def apply_theme(self, dark: bool) -> None:
        if not self.built:
            return
        bg, fg = self.theme.plot_colors()
        self.glw.setBackground(bg)
        for p in (self.plot, self.pos_plot):
            style_plot(p, fg)
        if self.image is not None:
            self._redraw()

    # -- export -------------------------------------------------------------------------------------
    def export_widget(self) -> QWidget:
        return self.picture

    def csv_table(self) -> CsvTable | None:
        """One row per cell in file order: index, position, sequence ids, extension, outside the window."""
        ref, t, im = self.ref, self.shown, self.image
        if ref is None or t is None:
            return None
        starts, ids = t.seq_start, t.seq_ids
        ext = t.ext
        names = ("x", "y", "tok")[: ext.shape[1]] if ext is not None and ext.ndim == 2 else ()
        masked = np.asarray(im.masked.any(axis=1))[im.row_of_cell] if im is not None and im.masked.size else None
        header = ["cell", "pos", "n_seq", "seq_ids", *names] + (["outside_window"] if masked is not None else [])
        pos, n_seq = t.pos.tolist(), t.n_seq.tolist()
        implied = self.owner is not None

        def rows() -> Iterator[list[object]]:
            for i in range(t.count):
                seqs = " ".join(self.seq_label(int(s)) if implied else str(int(s))
                                for s in ids[starts[i] : starts[i + 1]])
                row: list[object] = [i, pos[i], 0 if implied else n_seq[i], seqs]
                if names and ext is not None:
                    row += [int(v) for v in ext[i]]
                if masked is not None:
                    row.append(int(bool(masked[i])))
                yield row

        return header, rows()

    # -- interaction -------------------------------------------------------------------------------
    def row_at(self, scene_pos: QPointF) -> int | None:
        if self.image is None or not self.plot.sceneBoundingRect().contains(scene_pos) and \
                not self.pos_plot.sceneBoundingRect().contains(scene_pos):
            return None
        y = self.plot.vb.mapSceneToView(scene_pos).y()
        row = int(np.floor(y))
        return row if 0 <= row < self.image.order.size else None

    def describe_row(self, row: int) -> str:
        ref, im, t = self.ref, self.image, self.shown
        if ref is None or im is None or t is None:
            return ""
        i = int(im.order[row])
        seqs = t.seqs_of(i)
        who = ", ".join(self.seq_label(s) for s in seqs) if seqs else "empty"
        text = f"cell {i:,} · pos {int(t.pos[i]):,} · {who}"
        if self.owner is not None:
            text += " (the sequence of this per-sequence file)"
        if t.ext is not None and i < len(t.ext):
            names = ("x", "y", "tok")
            text += " · " + ", ".join(f"{names[k]}={int(v)}" for k, v in enumerate(t.ext[i]))
        if im.masked[row].any():
            text += " · outside the sliding window"
        if self.doc.index is not None:
            tok = self.doc.index.token_of_cell(ref.key, i)
            if tok is not None:
                text += f" · token {tok:,}"
        return text

    def _on_move(self, scene_pos: QPointF) -> None:
        row = self.row_at(scene_pos)
        self.hover.setText(self.describe_row(row) if row is not None else " ")

    def _on_click(self, event: object) -> None:
        scene_pos = event.scenePos()  # type: ignore[attr-defined]
        row = self.row_at(scene_pos)
        if row is not None:
            self.select_row(row)

    def select_row(self, row: int) -> None:
        """Select the cell shown in ``row`` everywhere."""
        ref, im, idx = self.ref, self.image, self.doc.index
        if ref is None or im is None or idx is None:
            return
        sel = idx.for_cell(ref.key, int(im.order[row]))
        self.doc.bus.select(sel, origin=self)
        self._mark(sel)

    def _mark(self, sel: Selection | None) -> None:
        if not self.built:
            return
        ref, im = self.ref, self.image
        if sel is None or im is None or ref is None or sel.table != ref.key or sel.cell is None \
                or sel.cell >= im.row_of_cell.size:
            for m in self.marks:
                m.hide()
            return
        row = int(im.row_of_cell[sel.cell])
        for m in self.marks:
            m.setValue(row + 0.5)
            m.show()
        self.hover.setText(self.describe_row(row))

    def _on_selection(self, sel: Selection) -> None:
        if sel.origin is self:
            return
        if sel.table is not None and sel.cell is not None and self.table_combo.currentData() != sel.table:
            i = self.table_combo.findData(sel.table)
            if i >= 0:
                self.table_combo.setCurrentIndex(i)
        self._mark(sel)
