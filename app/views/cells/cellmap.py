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
from kvscope.app.base.theme import SEQ_COLORS, Theme
from kvscope.app.base.widgets import plain_label
from kvscope.app.document.doc_index import Selection, TableRef
from kvscope.app.document.document import Document
from kvscope.app.document.seq_owner import UNNAMED_SEQ, SeqOwner, implied_owner
from kvscope.app.views.cells.cellmap_image import CellImage, build_cell_image, hex_rgb, with_owner
from kvscope.app.views.cells.swa import swa_masked_pairs
from kvscope.app.views.export import CsvTable, doc_export_button
from kvscope.app.views.plot_axes import IntegerAxis, style_plot
from kvscope.core.reader.records import CellTable

POS_POINTS = 8192  # at most this many points in the position plot
BUILD_MS = 40  # the plots are made this long after the view (kvscope.app.base.lazy)
EMPTY_BRUSH = "#969696"


def plural(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


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
        pl = QVBoxLayout(self.picture)
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
        self.picture.layout().insertWidget(1, self.glw, 1)
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
        if idx is not None and not idx.tables:
            self.summary.setText("This file holds no cell tables." if self.doc.result is not None else "")
        self._redraw()

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
        owner = self.owner
        return owner.label if s == UNNAMED_SEQ and owner is not None else f"seq {s}"

    def _redraw(self) -> None:
        """Rebuild the picture now when shown, else when next shown (a big table costs a few 100 ms)."""
        ref = self.ref
        ok, why = self.swa_state(ref)
        self.swa_check.setEnabled(ok)
        self.swa_check.setToolTip(why)
        if not self.isVisible() or not self.built:
            self._dirty = True
            return
        self._dirty = False
        if ref is None:
            self.image = self.shown = self.owner = None
            self.img.clear()
            self._set_positions([])
            return
        self.owner = implied_owner(self.doc.result, ref.section, ref.table)
        t = self.shown = with_owner(ref.table, self.owner.column) if self.owner is not None else ref.table
        masked = None
        if ok and self.swa_check.isChecked() and self.doc.profile is not None:
            prof = self.doc.profile
            masked = swa_masked_pairs(t.pos, t.seq_start, t.seq_ids, prof.n_swa, chunked=prof.arch == "llama4")
        colors = [hex_rgb(c) for c in SEQ_COLORS]
        by_pos = self.order_combo.currentIndex() == 1
        self.image = build_cell_image(t, colors, by_pos, masked, self.theme.dark)
        im = self.image
        self.img.setImage(im.rgba, autoLevels=False, levels=(0, 255))
        self.img.setRect(0, 0, im.rgba.shape[1], max(1, im.rgba.shape[0]))
        step = max(1, t.count // POS_POINTS)  # a 100,000-cell table plots every k-th row
        rows = np.arange(0, t.count, step) + 0.5
        shown = im.order[::step]
        first = t.seq_ids[np.minimum(t.seq_start[shown], max(0, t.seq_ids.size - 1))] if t.seq_ids.size else None
        palette = [*SEQ_COLORS, EMPTY_BRUSH]
        color = np.full(shown.size, len(SEQ_COLORS), dtype=np.int64)  # empty cells: the last colour
        if first is not None:
            filled = t.n_seq[shown] > 0
            color[filled] = np.maximum(first[filled].astype(np.int64), 0) % len(SEQ_COLORS)
        xs = im.pos[::step].astype(np.float64)
        size = 7 if t.count <= 256 else 4 if t.count <= 4096 else 2
        self._set_positions([(palette[k], xs[color == k], rows[color == k], size) for k in np.unique(color)])
        ticks = [(j + 0.5, self.seq_label(s)) for j, s in enumerate(im.seqs)] + [(len(im.seqs) + 0.5, "shared")]
        self.plot.getAxis("bottom").setTicks([ticks])
        pos = im.pos
        self.row_axis.set_labeler((lambda r: f"{int(pos[r]):,}" if 0 <= r < pos.size else "") if by_pos else None)
        self.plot.setLabel("left", "position (rows sorted by position)" if by_pos else "cell (file order)")
        pad = 0.02 * max(1, t.count)  # one range update (two calls would lay the view out twice)
        self.plot.vb.setRange(xRange=(0, len(im.seqs) + 1), yRange=(-pad, max(1, t.count) + pad), padding=0)
        self.summary.setText(self._summary(ref, t, im, masked is not None))
        self._mark(self.doc.bus.current)

    def _summary(self, ref: TableRef, t: CellTable, im: CellImage, masked: bool) -> str:
        if self.owner is not None:
            pos = sorted({int(p) for p in t.pos})
            at = f"position {pos[0]:,}" if len(pos) == 1 else f"positions {pos[0]:,}..{pos[-1]:,}"
            return (f"{ref.label}: {plural(t.count, 'cell')}: the state of {self.owner.label} at {at}. A per-sequence "
                    f"file names no sequence in its recurrent cells; the sequence is {self.owner.why}.")
        parts = []
        for j, s in enumerate(im.seqs):
            p = im.pos[im.occupancy[:, j]]
            parts.append(f"{self.seq_label(s)}: {plural(p.size, 'cell')}, pos {int(p.min()):,}..{int(p.max()):,}")
        n_empty = int((t.n_seq == 0).sum())
        n_shared = int((t.n_seq > 1).sum())
        extra = [f"{n_empty:,} empty"] if n_empty else []
        extra += [f"{n_shared:,} shared"] if n_shared else []
        if masked and self.doc.profile is not None:
            extra.append(f"{int(im.masked.any(axis=1).sum()):,} outside the window (n_swa={self.doc.profile.n_swa})")
        return (f"{ref.label}: {plural(t.count, 'cell')}" + (f" ({', '.join(extra)})" if extra else "")
                + ("; " + "; ".join(parts) if parts else ""))

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
        masked = im.masked.any(axis=1)[im.row_of_cell] if im is not None and im.masked.size else None
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
