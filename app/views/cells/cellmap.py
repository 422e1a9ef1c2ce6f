"""Cell map view: per cell table, cells × sequences with positions (pyqtgraph image + position plot)."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, Qt
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import QCheckBox, QComboBox, QHBoxLayout, QVBoxLayout, QWidget

from kvscope.app.base.theme import SEQ_COLORS, Theme
from kvscope.app.base.widgets import plain_label
from kvscope.app.document.doc_index import Selection, TableRef
from kvscope.app.document.document import Document
from kvscope.app.views.cells.cellmap_image import CellImage, build_cell_image, hex_rgb
from kvscope.app.views.cells.swa import swa_masked_pairs

POS_POINTS = 8192  # at most this many points in the position plot
EMPTY_BRUSH = "#969696"


class CellMapView(QWidget):
    """Rows are cells, columns sequence ids (plus a 'shared' column); a line plot shows each row's position."""

    def __init__(self, doc: Document, theme: Theme, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.doc, self.theme = doc, theme
        self.image: CellImage | None = None
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
        self.glw = pg.GraphicsLayoutWidget()
        self.plot = self.glw.addPlot(row=0, col=0)
        self.pos_plot = self.glw.addPlot(row=0, col=1)
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
        # one scatter per colour: per-point brushes cost pyqtgraph ~50 us a point on the GUI thread
        self.pos_curves: list[pg.PlotDataItem] = []
        self.marks = [pg.InfiniteLine(angle=0, movable=False, pen=pg.mkPen("#3d8ee6", width=2)) for _ in range(2)]
        for p, m in zip((self.plot, self.pos_plot), self.marks, strict=True):
            p.addItem(m)
            m.hide()
        top = QHBoxLayout()
        top.addWidget(plain_label("cells of"))
        top.addWidget(self.table_combo, 1)
        top.addWidget(self.order_combo)
        top.addWidget(self.swa_check)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(2, 2, 2, 2)
        lay.addLayout(top)
        lay.addWidget(self.summary)
        lay.addWidget(self.glw, 1)
        lay.addWidget(self.hover)
        lay.addWidget(self.legend)
        self.table_combo.currentIndexChanged.connect(self._redraw)
        self.order_combo.currentIndexChanged.connect(self._redraw)
        self.swa_check.toggled.connect(self._redraw)
        self.glw.scene().sigMouseMoved.connect(self._on_move)
        self.glw.scene().sigMouseClicked.connect(self._on_click)
        doc.loaded.connect(self._reload)
        doc.bus.changed.connect(self._on_selection)
        theme.changed.connect(self.apply_theme)
        self.apply_theme(theme.dark)
        self._reload()

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
            self.table_combo.addItem(f"{t.label} ({t.table.count} cells)", t.key)
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
        if self._dirty:
            self._redraw()

    def _redraw(self) -> None:
        """Rebuild the picture now when shown, else when next shown (a big table costs a few 100 ms)."""
        ref = self.ref
        ok, why = self.swa_state(ref)
        self.swa_check.setEnabled(ok)
        self.swa_check.setToolTip(why)
        if not self.isVisible():
            self._dirty = True
            return
        self._dirty = False
        if ref is None:
            self.image = None
            self.img.clear()
            self._set_positions([])
            return
        t = ref.table
        masked = None
        if ok and self.swa_check.isChecked() and self.doc.profile is not None:
            prof = self.doc.profile
            masked = swa_masked_pairs(t.pos, t.seq_start, t.seq_ids, prof.n_swa, chunked=prof.arch == "llama4")
        colors = [hex_rgb(c) for c in SEQ_COLORS]
        self.image = build_cell_image(t, colors, self.order_combo.currentIndex() == 1, masked, self.theme.dark)
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
            color[filled] = first[filled].astype(np.int64) % len(SEQ_COLORS)
        xs = im.pos[::step].astype(np.float64)
        size = 7 if t.count <= 256 else 4 if t.count <= 4096 else 2
        self._set_positions([(palette[k], xs[color == k], rows[color == k], size) for k in np.unique(color)])
        ticks = [(j + 0.5, f"seq {s}") for j, s in enumerate(im.seqs)] + [(len(im.seqs) + 0.5, "shared")]
        self.plot.getAxis("bottom").setTicks([ticks])
        pad = 0.02 * max(1, t.count)  # one range update (two calls would lay the view out twice)
        self.plot.vb.setRange(xRange=(0, len(im.seqs) + 1), yRange=(-pad, max(1, t.count) + pad), padding=0)
        parts = []
        for j, s in enumerate(im.seqs):
            p = im.pos[im.occupancy[:, j]]
            parts.append(f"seq {s}: {p.size} cells, pos {int(p.min())}..{int(p.max())}")
        n_empty = int((t.n_seq == 0).sum())
        n_shared = int((t.n_seq > 1).sum())
        extra = [f"{n_empty} empty"] if n_empty else []
        extra += [f"{n_shared} shared"] if n_shared else []
        if masked is not None:
            extra.append(f"{int(im.masked.any(axis=1).sum())} outside the window (n_swa={self.doc.profile.n_swa})"
                         if self.doc.profile else "")
        self.summary.setText(f"{ref.label}: {t.count} cells" + (f" ({', '.join(extra)})" if extra else "")
                             + ("; " + "; ".join(parts) if parts else ""))
        self._mark(self.doc.bus.current)

    def _set_positions(self, groups: list[tuple[str, np.ndarray, np.ndarray, int]]) -> None:
        """One scatter item per colour (created on demand, emptied when unused)."""
        while len(self.pos_curves) < len(groups):
            self.pos_curves.append(self.pos_plot.plot([], [], pen=None, symbol="s", symbolPen=None))
        for curve, (color, xs, ys, size) in zip(self.pos_curves, groups, strict=False):
            curve.setData(xs, ys, symbolBrush=pg.mkBrush(color), symbolSize=size)
        for curve in self.pos_curves[len(groups):]:
            curve.setData([], [])

    def apply_theme(self, dark: bool) -> None:
        bg, fg = self.theme.plot_colors()
        self.glw.setBackground(bg)
        for p in (self.plot, self.pos_plot):
            for name in ("left", "bottom"):
                p.getAxis(name).setPen(fg)
                p.getAxis(name).setTextPen(fg)
        for curve in self.pos_curves:
            curve.setSymbolPen(None)
        if self.image is not None:
            self._redraw()

    # -- interaction -------------------------------------------------------------------------------
    def row_at(self, scene_pos: QPointF) -> int | None:
        if self.image is None or not self.plot.sceneBoundingRect().contains(scene_pos) and \
                not self.pos_plot.sceneBoundingRect().contains(scene_pos):
            return None
        y = self.plot.vb.mapSceneToView(scene_pos).y()
        row = int(np.floor(y))
        return row if 0 <= row < self.image.order.size else None

    def describe_row(self, row: int) -> str:
        ref, im = self.ref, self.image
        if ref is None or im is None:
            return ""
        i = int(im.order[row])
        t = ref.table
        seqs = t.seqs_of(i)
        text = f"cell {i} · pos {int(t.pos[i])} · " + (f"seq {', '.join(map(str, seqs))}" if seqs else "empty")
        if t.ext is not None and i < len(t.ext):
            names = ("x", "y", "tok")
            text += " · " + ", ".join(f"{names[k]}={int(v)}" for k, v in enumerate(t.ext[i]))
        if im.masked[row].any():
            text += " · outside the sliding window"
        if self.doc.index is not None:
            tok = self.doc.index.token_of_cell(ref.key, i)
            if tok is not None:
                text += f" · token {tok}"
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
