"""The Lab view's detail pane for one matrix cell: the restore outcome and target per component (text),
the target stream's cell maps before and after the restore side by side in one plot (the cell map's picture
code), and the probe divergence of every other sequence for both kernels (bars; a non-finite read-out is a
hatched red bar). Until a cell is selected the pane shows a hint, not empty axes; no plot is narrower than
:data:`PLOT_MIN` pixels (the pane scrolls in the Lab view below its minimum size)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QPlainTextEdit, QSplitter, QStackedWidget, QVBoxLayout, QWidget

from kvscope.app.base.lazy import LazyParts
from kvscope.app.base.theme import SEQ_COLORS, Theme
from kvscope.app.base.widgets import plain_label
from kvscope.app.lab.jobs import ScenarioReady, TargetUnit, unit_table
from kvscope.app.lab.model import detail_text
from kvscope.app.views.cells.cellmap_image import CellImage, build_cell_image, hex_rgb
from kvscope.app.views.plot_axes import IntegerAxis, ValueAxis, style_plot
from kvscope.core.reader.records import CellTable, ParseResult

if TYPE_CHECKING:
    from kvscope.core.lab.report import CellResult

KERNEL_COLORS = {"dense": "#4e79a7", "skip-masked": "#59a14f", "logits": "#b07aa1"}  # logits: a real engine's
PLOT_MIN = 250  # px: no plot of the pane is narrower
PLOT_MIN_H = 190
TEXT_MIN = 220
DETAIL_HINT = ("Select a cell of the matrix to see its restore: the outcome per component, the target stream's "
               "cells before and after, and how far the other sequences' probes moved.")
NONFINITE_COLOR = "#d62728"
BAR_WIDTH = 0.38
TITLE_SIZE = "9pt"
LEGEND = ("cells of the target's stream before and after the restore: colour = sequence, lighter = earlier "
          "position, grey = empty cell, last column = shared · bars: dense (blue) and skip-masked (green) kernels or "
          "a real engine's next-token logits (purple), "
          "max |Δ| against the clean baseline; hatched red = non-finite read-out, '=' identical")
GAP = 1.0  # columns between the before and the after picture
BUILD_MS = 160  # the plots are made this long after the pane (kvscope.app.base.lazy)


class LabDetail(LazyParts, QWidget):
    """Text, the before → after cell maps and the probe bars of the selected matrix cell."""

    lazy_parts = frozenset({"glw", "maps_plot", "probe_plot", "img"})

    def __init__(self, theme: Theme, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.defer_build(BUILD_MS)  # the plots: see build_parts
        self.theme = theme
        self.ready: ScenarioReady | None = None
        self.result: CellResult | None = None
        self.after: ParseResult | None = None
        self.images: dict[str, CellImage | None] = {"before": None, "after": None}
        self.before_counts: dict[int, int] = {}  # sequence -> cells in the target's stream, before
        self.after_counts: dict[int, int] = {}  # ... and right after the restore
        self.probe_values: dict[int, dict[str, float]] = {}  # other sequence -> kernel -> difference
        self._after_cache: dict[int, ParseResult | None] = {}
        self.text = QPlainTextEdit()
        self.text.setReadOnly(True)
        self.text.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)
        self.text.setPlaceholderText("Select a cell of the matrix.")
        self.text.setMinimumWidth(TEXT_MIN)
        self.unit_combo = QComboBox()
        self.unit_combo.setToolTip("memory component (and KV stream) of the target sequence")
        self.maps_label = plain_label(" ", wrap=True)
        self._bar_items: list[pg.GraphicsObject] = []
        self.legend = plain_label(LEGEND, wrap=True)
        self.plots = QWidget()
        rl = QVBoxLayout(self.plots)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.setSpacing(2)
        self.unit_row = QWidget()
        top = QHBoxLayout(self.unit_row)
        top.setContentsMargins(0, 0, 0, 0)
        top.addWidget(plain_label("cells of"))
        top.addWidget(self.unit_combo, 1)
        rl.addWidget(self.unit_row)
        rl.addWidget(self.maps_label)
        rl.addWidget(self.legend)
        self.hint = plain_label(DETAIL_HINT, wrap=True)
        self.hint.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.stack = QStackedWidget()  # a hint instead of empty plots until a cell is selected
        self.stack.addWidget(self.hint)
        self.stack.addWidget(self.plots)
        self.split = QSplitter(Qt.Orientation.Horizontal)
        self.split.addWidget(self.text)
        self.split.addWidget(self.stack)
        self.split.setStretchFactor(1, 1)
        self.split.setSizes([300, 900])
        self.split.setChildrenCollapsible(False)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.split)
        self.unit_combo.currentIndexChanged.connect(self._draw_maps)
        theme.changed.connect(self.apply_theme)

    def build_steps(self) -> Iterator[None]:
        """The cell maps, then the probe bars (deferred: see :mod:`kvscope.app.base.lazy`)."""
        self.glw = pg.GraphicsLayoutWidget()
        self.maps_plot = self.glw.addPlot(row=0, col=0, axisItems={"left": IntegerAxis("left", centred=True)})
        yield
        self.probe_plot = self.glw.addPlot(row=0, col=1, axisItems={"left": ValueAxis("left")})
        self.glw.ci.layout.setColumnStretchFactor(0, 1)
        self.glw.ci.layout.setColumnStretchFactor(1, 1)
        self.glw.setMinimumSize(2 * PLOT_MIN + 40, PLOT_MIN_H)
        self.img = {"before": pg.ImageItem(axisOrder="row-major"), "after": pg.ImageItem(axisOrder="row-major")}
        p = self.maps_plot
        p.invertY(True)
        p.setMenuEnabled(False)
        p.setMouseEnabled(x=False, y=True)
        p.showAxis("top")
        for item in self.img.values():
            p.addItem(item)
        p.setLabel("left", "cell record")
        self.probe_plot.setMenuEnabled(False)
        self.probe_plot.setMouseEnabled(x=False, y=False)
        self.probe_plot.setLabel("left", "max |Δ| vs clean")
        self.probe_plot.setLabel("bottom", "other sequence")
        self.probe_plot.getAxis("bottom").enableAutoSIPrefix(False)
        self.maps_plot.getAxis("bottom").enableAutoSIPrefix(False)
        layout = self.plots.layout()
        assert isinstance(layout, QVBoxLayout)
        layout.insertWidget(1, self.glw, 1)
        self.finish()
        self.apply_theme(self.theme.dark)

    # -- content -----------------------------------------------------------------------------------
    def set_ready(self, ready: ScenarioReady | None) -> None:
        """The scenario of the matrix shown (its live parse is the "before" picture)."""
        self.ready = ready
        self._after_cache.clear()
        self.unit_combo.blockSignals(True)
        self.unit_combo.clear()
        for u in ready.units if ready is not None else []:
            self.unit_combo.addItem(u.label)
        self.unit_combo.blockSignals(False)
        self.unit_row.setVisible(self.unit_combo.count() > 1)
        self.show_cell(None)

    @property
    def unit(self) -> TargetUnit | None:
        i = self.unit_combo.currentIndex()
        return self.ready.units[i] if self.ready is not None and 0 <= i < len(self.ready.units) else None

    def show_cell(self, r: CellResult | None, extra: str = "") -> None:
        """Fill the pane for ``r`` (None: clear it); ``extra``: lines an engine run adds (a crash, the
        poisoned-slot check, the disagreements with the core)."""
        self.result = r
        self.stack.setCurrentWidget(self.plots if r is not None else self.hint)
        self.after = self._after_state(r)
        if r is None:
            self.text.setPlainText("")
        else:
            before = None
            if self.ready is not None:
                before = {u.role: _cells_of(unit_table(self.ready.before, u), self.ready.target)
                          for u in self.ready.units}
            self.text.setPlainText(detail_text(r, before) + (f"\n\n{extra}" if extra.strip() else ""))
        self._draw_maps()
        self._draw_probes()

    def _after_state(self, r: CellResult | None) -> ParseResult | None:
        if r is None or r.after_state is None or self.ready is None:
            return None
        key = id(r)
        if key not in self._after_cache:
            from kvscope.core.reader.parse import read_state

            self._after_cache[key] = read_state(data=r.after_state, profile=self.ready.scenario.profile)
        return self._after_cache[key]

    # -- drawing -----------------------------------------------------------------------------------
    def _draw_maps(self) -> None:
        """Before and after side by side: before in columns ``[0, n)``, after from ``n + GAP``."""
        self.ensure_built()
        unit, ready = self.unit, self.ready
        before = unit_table(ready.before, unit) if ready is not None and unit is not None else None
        after = unit_table(self.after, unit) if unit is not None else None
        target = ready.target if ready is not None else 0
        ticks: list[tuple[float, str]] = []
        heads: list[tuple[float, str]] = []
        x, rows, counts = 0.0, 1, []
        for key, table in (("before", before), ("after", after)):
            im = self._draw_one(key, table, x)
            cps = im.cells_per_seq() if im is not None else {}
            if key == "before":
                self.before_counts = cps
            else:
                self.after_counts = cps
            n = cps.get(target, 0)
            counts.append(n)
            width = float(im.rgba.shape[1]) if im is not None else 1.0
            if im is not None:
                ticks += [(x + j + 0.5, f"s{s}") for j, s in enumerate(im.seqs)] + [(x + len(im.seqs) + 0.5, "sh")]
                rows = max(rows, im.rgba.shape[0])
            known = table is not None or (key == "after" and self.after is not None)
            heads.append((x + width / 2, f"{key}: {n}" if known else f"{key}: –"))
            x += width + GAP
        p = self.maps_plot
        p.getAxis("bottom").setTicks([ticks])
        p.getAxis("top").setTicks([heads])
        p.setXRange(0, max(1.0, x - GAP), padding=0)
        p.setYRange(0, rows, padding=0.02)
        self._title(p, f"cells of seq {target}: before → after")
        r = self.result
        if r is None:
            self.maps_label.setText(" ")
        elif r.after_state is None:
            self.maps_label.setText("no after-state: the restore's outcome is undefined (short read)" if r.hazard
                                    else "no after-state recorded for this cell")
        else:
            label = unit.label if unit is not None else ""
            self.maps_label.setText(f"{label}: target seq {target} in {counts[0]} → {counts[1]} cells "
                                    "(columns s<N>: sequence N, sh: shared)")

    def _draw_one(self, key: str, table: object, x: float) -> CellImage | None:
        item = self.img[key]
        if not isinstance(table, CellTable) or table.count == 0:
            self.images[key] = None
            item.clear()
            return None
        colors = [hex_rgb(c) for c in SEQ_COLORS]
        im = build_cell_image(table, colors, by_position=False, dark=self.theme.dark)
        self.images[key] = im
        item.setImage(im.rgba, autoLevels=False, levels=(0, 255))
        item.setRect(x, 0, im.rgba.shape[1], max(1, im.rgba.shape[0]))
        return im

    def _draw_probes(self) -> None:
        self.ensure_built()
        for it in self._bar_items:
            self.probe_plot.removeItem(it)
        self._bar_items = []
        r = self.result
        self.probe_values = {s: dict(o.probe_diff) for s, o in r.others.items()} if r is not None else {}
        if not self.probe_values:
            self.probe_plot.getAxis("bottom").setTicks([[]])
            return
        seqs = sorted(self.probe_values)
        finite = [v for d in self.probe_values.values() for v in d.values() if math.isfinite(v)]
        top = max([*finite, 0.0]) or 1.0
        _, fg = self.theme.plot_colors()
        kernels = [(n, c) for n, c in KERNEL_COLORS.items() if any(n in d for d in self.probe_values.values())]
        for k, (kernel, color) in enumerate(kernels):
            xs, hs, brushes, pens = [], [], [], []
            for j, s in enumerate(seqs):
                v = self.probe_values[s].get(kernel)
                if v is None:
                    continue
                x = j + (k - (len(kernels) - 1) / 2) * BAR_WIDTH
                bad = not math.isfinite(v)
                xs.append(x)
                hs.append(top * 1.15 if bad else v)
                brushes.append(QBrush(QColor(NONFINITE_COLOR), Qt.BrushStyle.BDiagPattern) if bad
                               else pg.mkBrush(color))
                pens.append(pg.mkPen(NONFINITE_COLOR if bad else color, width=1.5))
                label = "NaN/Inf" if bad else ("=" if v == 0.0 else f"{v:.3g}")
                t = pg.TextItem(label, color=NONFINITE_COLOR if bad else fg, anchor=(0.5, 1.0))
                t.setPos(x, (top * 1.15 if bad else v))
                self.probe_plot.addItem(t)
                self._bar_items.append(t)
            if xs:
                bars = pg.BarGraphItem(x=np.array(xs), height=np.array(hs), width=BAR_WIDTH, brushes=brushes,
                                       pens=pens)
                self.probe_plot.addItem(bars)
                self._bar_items.append(bars)
        self.probe_plot.getAxis("bottom").setTicks([[(j, f"seq {s}") for j, s in enumerate(seqs)]])
        self.probe_plot.setXRange(-0.7, len(seqs) - 0.3, padding=0)
        self.probe_plot.setYRange(0, top * 1.35, padding=0)

    def _title(self, plot: pg.PlotItem, text: str) -> None:
        plot.setTitle(text, size=TITLE_SIZE, color=self.theme.plot_colors()[1])

    def apply_theme(self, dark: bool) -> None:
        if not self.built:
            return
        bg, fg = self.theme.plot_colors()
        self.glw.setBackground(bg)
        self._title(self.probe_plot, "probes of the other sequences")
        for p in (self.maps_plot, self.probe_plot):
            style_plot(p, fg, ("left", "bottom", "top"))
        if self.result is not None or self.ready is not None:
            self._draw_maps()
            self._draw_probes()


def _cells_of(table: object, seq: int) -> int:
    return int(table.cells_of_seq(seq).size) if isinstance(table, CellTable) else 0
