"""The layer heatmap: one record's ``[cell, channel]`` values with axes in real units at every zoom.

The whole record is drawn from a coarse :func:`~kvscope.app.views.layers.lod.overview` window; when the view
is zoomed or panned, a finer window of just the part in view is read in the background and drawn on top
(level of detail), down to every cell and channel. The y axis names cells (file order) or positions (rows
sorted by sequence and position), the x axis channels or head·dim; non-finite values are painted magenta (as
in the report: a colour of no map); the colour bar is labelled; the hover read-out names value, cell,
position, sequence and channel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF, Qt, QTimer, Signal
from PySide6.QtWidgets import QVBoxLayout, QWidget

from kvscope.app.base.tasks import CancelToken, Report, Task
from kvscope.app.base.theme import NONFINITE_RGB, Theme
from kvscope.app.base.widgets import plain_label
from kvscope.app.document.document import Document
from kvscope.app.document.seq_owner import SeqOwner, implied_owner
from kvscope.app.views.layers.colour_bar import ColourBar
from kvscope.app.views.layers.lod import I64A, Window, display_order, overview, plan, read_window, record_size
from kvscope.app.views.plot_axes import IntegerAxis, style_plot, value_text
from kvscope.core.reader.records import CellTable, LayerRecord
from kvscope.core.reader.source import CHANGED_MESSAGE, FileChangedError

if TYPE_CHECKING:
    from kvscope.app.document.doc_index import TableRef

F32A = npt.NDArray[np.float32]
NONFINITE_RGBA = (*NONFINITE_RGB, 255)  # not CET-D1's top red: NaN never reads as a large value
REFINE_MS = 120


@dataclass
class Layer:
    """One drawn window: its samples and the image items showing them."""

    window: Window | None
    matrix: F32A | None
    img: pg.ImageItem
    bad: pg.ImageItem


class Heatmap(QWidget):
    """Heatmap of one record; ``show_record`` starts it, ``drawn`` fires when a window is on screen."""

    drawn = Signal()  # the overview or a finer window was drawn
    failed = Signal(str)

    def __init__(self, doc: Document, theme: Theme, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.doc, self.theme = doc, theme
        self.record: LayerRecord | None = None
        self.n_rows = self.n_cols = 0
        self.by_position = False
        self.order: I64A | None = None
        self.ref: TableRef | None = None
        self.owner: SeqOwner | None = None
        self.head_dim = 0
        self.max_rows, self.max_cols = 1024, 1024
        self._tasks: dict[str, Task] = {}
        self.glw = pg.GraphicsLayoutWidget()
        self.row_axis = IntegerAxis("left", centred=True)
        self.col_axis = IntegerAxis("bottom", centred=True)
        self.plot = self.glw.addPlot(row=0, col=0, axisItems={"left": self.row_axis, "bottom": self.col_axis})
        self.plot.invertY(True)
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        self.layers = {name: Layer(None, None, pg.ImageItem(axisOrder="row-major"), pg.ImageItem(axisOrder="row-major"))
                       for name in ("base", "detail")}
        for z, layer in enumerate(self.layers.values()):
            layer.img.setZValue(2 * z)
            layer.bad.setZValue(2 * z + 1)
            self.plot.addItem(layer.img)
            self.plot.addItem(layer.bad)
        self.bar = ColourBar(pg.colormap.get("CET-D1"), "value")
        self.glw.addItem(self.bar, row=0, col=1)
        self.head_lines: list[pg.InfiniteLine] = []
        self.hover = plain_label(" ")
        self.hover.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(2)
        lay.addWidget(self.glw, 1)
        lay.addWidget(self.hover)
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(REFINE_MS)
        self._timer.timeout.connect(self.refine)
        self.plot.vb.sigRangeChanged.connect(lambda *_: self._timer.start())
        self.glw.scene().sigMouseMoved.connect(self._on_move)
        theme.changed.connect(self.apply_theme)
        self.apply_theme(theme.dark)

    # -- what is shown ------------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        """True while a window is being decoded."""
        return any(not t.done for t in self._tasks.values())

    @property
    def base(self) -> Layer:
        return self.layers["base"]

    @property
    def detail(self) -> Layer:
        return self.layers["detail"]

    def show_record(self, rec: LayerRecord, by_position: bool = False, head_dim: int = 0) -> Task | None:
        """Draw ``rec`` (the overview first); None when the document has no parse."""
        res = self.doc.result
        if res is None:
            return None
        self.record, self.by_position, self.head_dim = rec, by_position, head_dim
        idx = self.doc.index
        self.ref = idx.table_of(rec) if idx is not None else None
        table = self.ref.table if self.ref is not None else None
        self.owner = implied_owner(res, self.ref.section if self.ref is not None else None, table)
        try:
            self.n_rows, self.n_cols = record_size(res, rec, self.doc.data if self.doc.data.size else None)
        except FileChangedError:  # the document notices it too and offers Reload
            self.failed.emit(CHANGED_MESSAGE)
            return None
        self.order = display_order(table, self.n_rows, by_position)
        self._set_axes()
        for layer in self.layers.values():
            layer.window, layer.matrix = None, None
            layer.img.clear()
            layer.bad.clear()
        self._clear_heads()
        for t in self._tasks.values():
            t.cancel()
        self._tasks.clear()
        vb = self.plot.vb
        vb.blockSignals(True)
        vb.setLimits(xMin=0, xMax=max(1, self.n_cols), yMin=0, yMax=max(1, self.n_rows),
                     minXRange=min(4, max(1, self.n_cols)), minYRange=min(4, max(1, self.n_rows)))
        vb.setRange(xRange=(0, max(1, self.n_cols)), yRange=(0, max(1, self.n_rows)), padding=0)
        vb.blockSignals(False)
        if self.n_rows == 0 or self.n_cols == 0:
            return None
        return self._fetch("base", overview(self.n_rows, self.n_cols, self.max_rows, self.max_cols))

    def clear(self) -> None:
        """Show nothing (no record)."""
        self.record = None
        self.n_rows = self.n_cols = 0
        for t in self._tasks.values():
            t.cancel()
        self._tasks.clear()
        for layer in self.layers.values():
            layer.window, layer.matrix = None, None
            layer.img.clear()
            layer.bad.clear()
        self._clear_heads()
        self.hover.setText(" ")

    def _fetch(self, name: str, win: Window) -> Task:
        res, rec, order = self.doc.result, self.record, self.order
        assert res is not None and rec is not None
        old = self._tasks.pop(name, None)
        if old is not None and not old.done:
            old.cancel()
        data = self.doc.data if self.doc.data.size else None

        def job(token: CancelToken, report: Report) -> tuple[LayerRecord, Window, F32A]:
            return rec, win, read_window(res, rec, win, order, data)  # quick: no progress to show

        def on_window(out: tuple[LayerRecord, Window, F32A]) -> None:
            self._on_window(name, out)

        task = self.doc.runner.submit(f"layer {rec.role}{'' if rec.il is None else rec.il}", job, on_window,
                                      self._on_failed)
        self._tasks[name] = task
        return task

    def _on_failed(self, message: str) -> None:
        self.failed.emit(message)

    def _on_window(self, name: str, out: tuple[LayerRecord, Window, F32A]) -> None:
        rec, win, m = out
        if rec is not self.record:
            return
        layer = self.layers[name]
        layer.window, layer.matrix = win, m
        if name == "base":
            with np.errstate(all="ignore"):
                mags = np.abs(m)
                lim = float(np.max(mags, initial=0.0, where=np.isfinite(mags)))
            lim = lim if lim > 0 else 1.0
            self.bar.set_levels(-lim, lim)
            if self.detail.matrix is not None:  # drawn before the overview: the levels changed
                self._paint(self.detail)
        self._paint(layer)
        if name == "base":
            self._draw_heads()
            self._timer.start()
        self.drawn.emit()

    def _paint(self, layer: Layer) -> None:
        m, win = layer.matrix, layer.window
        if m is None or win is None:
            return
        finite = np.isfinite(m)
        # non-finite: see-through here, magenta on top (the bad layer)
        shown = m if finite.all() else np.where(finite, m, np.float32(np.nan))
        lo, hi = self.bar.levels()
        layer.img.setImage(shown, autoLevels=False, levels=(lo, hi))
        layer.img.setLookupTable(self.bar.lut)
        x, y, w, h = win.rect()
        layer.img.setRect(QRectF(x, y, w, h))
        if m.size and not finite.all():
            over = np.zeros((*m.shape, 4), np.uint8)
            over[~finite] = NONFINITE_RGBA
            layer.bad.setImage(over, autoLevels=False, levels=(0, 255))
            layer.bad.setRect(QRectF(x, y, w, h))
        else:
            layer.bad.clear()
        layer.img.setVisible(True)
        layer.bad.setVisible(True)

    # -- level of detail ----------------------------------------------------------------------------
    def view_window(self, margin: float = 0.25) -> Window | None:
        """The window that shows what is in view about one sample per pixel (``margin``: extra around it)."""
        if self.record is None or self.n_rows == 0 or self.n_cols == 0:
            return None
        (x0, x1), (y0, y1) = self.plot.vb.viewRange()
        r = self.plot.vb.boundingRect()
        return plan(self.n_rows, self.n_cols, (x0, x1), (y0, y1), max(1.0, r.width()), max(1.0, r.height()), margin)

    def refine(self) -> Task | None:
        """Read a finer window for the part in view when what is drawn there is coarser than the screen."""
        need = self.view_window(margin=0.0)
        base, detail = self.base.window, self.detail.window
        if need is None or base is None:
            return None
        if base.row_step <= need.row_step and base.col_step <= need.col_step:
            self._show_detail(False)
            return None
        if detail is not None and detail.covers(need):
            self._show_detail(True)
            return None
        want = self.view_window()
        assert want is not None
        return self._fetch("detail", want)

    def _show_detail(self, on: bool) -> None:
        self.detail.img.setVisible(on)
        self.detail.bad.setVisible(on)

    # -- axes ------------------------------------------------------------------------------------------
    def _set_axes(self) -> None:
        rec = self.record
        order, table = self.order, self.ref.table if self.ref is not None else None
        if order is not None and table is not None:
            pos, seqs = table.pos, self._first_seqs(table)
            multi = len({int(s) for s in np.unique(seqs)}) > 1 if seqs.size else False

            def row_label(r: int) -> str:
                if not 0 <= r < order.size:
                    return ""
                i = int(order[r])
                return f"s{int(seqs[i])}:{int(pos[i]):,}" if multi else f"{int(pos[i]):,}"

            self.row_axis.set_labeler(row_label, min_px=32)
            self.plot.setLabel("left", "sequence:position" if multi else "position")
        else:
            self.row_axis.set_labeler(None)
            kind = "recurrent cell" if rec is not None and rec.role in ("r", "s", "p") else "cell"
            self.plot.setLabel("left", f"{kind} (file order)")
        hd = self.head_dim
        if hd > 0:
            self.col_axis.set_labeler(lambda c: f"h{c // hd}" if c % hd == 0 else f"h{c // hd}·{c % hd}", unit=hd,
                                      min_px=64)
            self.plot.setLabel("bottom", f"head · dim (head size {hd})")
        else:
            self.col_axis.set_labeler(None, min_px=60)
            self.plot.setLabel("bottom", "channel")

    @staticmethod
    def _first_seqs(table: CellTable) -> npt.NDArray[np.int64]:
        if table.seq_ids.size == 0:
            return np.full(table.count, -1, np.int64)
        first = table.seq_ids[np.minimum(table.seq_start[:-1], table.seq_ids.size - 1)].astype(np.int64)
        return np.where(table.n_seq > 0, first, -1)

    def set_head_dim(self, hd: int) -> None:
        """Split channels into heads of ``hd`` (0: plain channels)."""
        self.head_dim = hd
        self._set_axes()
        self._draw_heads()

    def _clear_heads(self) -> None:
        for line in self.head_lines:
            self.plot.removeItem(line)
        self.head_lines = []

    def _draw_heads(self) -> None:
        self._clear_heads()
        hd, dim = self.head_dim, self.n_cols
        if hd <= 0 or self.base.window is None:
            return
        # on the data, whose colours do not change with the palette: dark on the colour map's white middle
        pen = pg.mkPen("#111111", width=1.5, style=Qt.PenStyle.DashLine)
        for h in range(1, max(1, dim // hd)):
            line = pg.InfiniteLine(pos=h * hd, angle=90, movable=False, pen=pen)
            line.setZValue(10)
            self.plot.addItem(line)
            self.head_lines.append(line)

    # -- read-out ----------------------------------------------------------------------------------------
    def sample_at(self, x: float, y: float) -> tuple[int, int, float] | None:
        """(display row, channel, value) of the sample drawn at heatmap point ``(x, y)``, finest first."""
        row, col = int(np.floor(y)), int(np.floor(x))
        if not (0 <= row < self.n_rows and 0 <= col < self.n_cols):
            return None
        for layer in (self.detail, self.base):
            win, m = layer.window, layer.matrix
            if win is None or m is None or (layer is self.detail and not layer.img.isVisible()):
                continue
            hit = win.sample(row, col)
            if hit is not None:
                k, j = hit
                return win.sampled_row(k), win.sampled_col(j), float(m[k, j])
        return None

    def cell_of_row(self, row: int) -> int:
        return int(self.order[row]) if self.order is not None else row

    def describe(self, x: float, y: float) -> str:
        """The hover read-out at heatmap point ``(x, y)``: value, cell, position, sequence, channel."""
        hit = self.sample_at(x, y)
        if hit is None:
            return " "
        row, col, v = hit
        cell = self.cell_of_row(row)
        parts = [f"value {value_text(v, abs(v) * 1e-4 if v else 1e-4) if np.isfinite(v) else v}", f"cell {cell:,}"]
        table = self.ref.table if self.ref is not None else None
        if table is not None and cell < table.count:
            parts.append(f"pos {int(table.pos[cell]):,}")
            seqs = table.seqs_of(cell)
            if seqs:
                parts.append("seq " + ", ".join(map(str, seqs)))
            elif self.owner is not None:
                parts.append(self.owner.label + " (this per-sequence file's)")
            else:
                parts.append("empty cell")
        hd = self.head_dim
        parts.append(f"channel {col:,}" + (f" (head {col // hd}, dim {col % hd})" if hd > 0 else ""))
        layer = self.detail if self.detail.img.isVisible() and self.detail.window is not None else self.base
        if layer.window is not None and not layer.window.full_resolution:
            parts.append(f"sampled every {layer.window.row_step:,} rows × {layer.window.col_step:,} channels: "
                         "zoom in for every value")
        return " · ".join(parts)

    def _on_move(self, scene_pos: QPointF) -> None:
        if not self.plot.vb.sceneBoundingRect().contains(scene_pos):
            self.hover.setText(" ")
            return
        p = self.plot.vb.mapSceneToView(scene_pos)
        self.hover.setText(self.describe(p.x(), p.y()))

    def shown_window(self) -> Window | None:
        """The finest window drawn now."""
        if self.detail.window is not None and self.detail.img.isVisible():
            return self.detail.window
        return self.base.window

    def apply_theme(self, dark: bool) -> None:
        bg, fg = self.theme.plot_colors()
        self.glw.setBackground(bg)
        style_plot(self.plot, fg)
        self.bar.set_colors(fg)
        if self.head_lines:
            self._draw_heads()
