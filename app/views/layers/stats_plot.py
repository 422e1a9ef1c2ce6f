"""Per-layer statistics across layers (from ``kvscope.core.stats.scan_stats``): RMS, non-finite, zero rows."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QVBoxLayout, QWidget

from kvscope.app.base.theme import Theme
from kvscope.app.base.widgets import plain_label

if TYPE_CHECKING:
    from kvscope.core.stats import LayerStats, StatsReport

ROLE_COLORS = {"k": "#4e79a7", "v": "#59a14f", "r": "#b07aa1", "s": "#9c755f", "p": "#76b7b2"}
ROLE_LABEL = {"k": "K", "v": "V", "r": "r", "s": "s", "p": "p"}


def layer_x(ls: LayerStats) -> float:
    """Where a record sits on the layer axis: its model layer, else its record index."""
    return float(ls.il if ls.il is not None else ls.index)


def unit_stats(report: StatsReport | None, section_index: int, stream: int | None) -> dict[str, list[LayerStats]]:
    """Records of one section/stream grouped by role, in file order."""
    out: dict[str, list[LayerStats]] = {}
    if report is None:
        return out
    for ls in report.layers:
        if ls.section_index == section_index and ls.stream == stream:
            out.setdefault(ls.role, []).append(ls)
    return out


class StatsPlot(QWidget):
    """Two plots over layers: RMS per role (top), non-finite values and zero rows (bottom)."""

    layerClicked = Signal(str, int)  # role, record index

    def __init__(self, theme: Theme, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.theme = theme
        self.status = plain_label("")
        self.glw = pg.GraphicsLayoutWidget()
        self.rms_plot = self.glw.addPlot(row=0, col=0)
        self.bad_plot = self.glw.addPlot(row=1, col=0)
        self.bad_plot.setXLink(self.rms_plot)
        self.rms_plot.setLabel("left", "RMS")
        self.bad_plot.setLabel("left", "count")
        self.bad_plot.setLabel("bottom", "layer")
        self.rms_plot.addLegend(offset=(-10, 5), colCount=5)
        for p in (self.rms_plot, self.bad_plot):
            p.setMenuEnabled(False)
            p.showGrid(x=True, y=True, alpha=0.25)
        self.markers = [pg.InfiniteLine(angle=90, movable=False, pen=pg.mkPen("#3d8ee6", width=2)) for _ in range(2)]
        for p, c in zip((self.rms_plot, self.bad_plot), self.markers, strict=True):
            p.addItem(c, ignoreBounds=True)
            c.hide()
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.glw, 1)
        lay.addWidget(self.status)
        self.series: dict[str, list[LayerStats]] = {}
        theme.changed.connect(self.apply_theme)
        self.apply_theme(theme.dark)

    def apply_theme(self, _dark: bool) -> None:
        bg, fg = self.theme.plot_colors()
        self.glw.setBackground(bg)
        for p in (self.rms_plot, self.bad_plot):
            for name in ("left", "bottom"):
                p.getAxis(name).setPen(fg)
                p.getAxis(name).setTextPen(fg)
        if self.rms_plot.legend is not None:
            self.rms_plot.legend.setLabelTextColor(fg)

    def set_stats(self, series: dict[str, list[LayerStats]], note: str = "") -> None:
        """Plot ``series`` (role -> records of one section/stream)."""
        self.series = series
        for p, c in zip((self.rms_plot, self.bad_plot), self.markers, strict=True):
            p.clear()
            p.addItem(c, ignoreBounds=True)
        top = 0.0
        layers: set[float] = set()
        for role, items in series.items():
            color = ROLE_COLORS.get(role, "#888888")
            xs = [layer_x(ls) for ls in items]
            finite = [(x, ls.rms) for x, ls in zip(xs, items, strict=True) if math.isfinite(ls.rms)]
            label = ROLE_LABEL.get(role, role)
            if finite:  # records whose values are all NaN/Inf have no RMS
                curve = self.rms_plot.plot([x for x, _ in finite], [r for _, r in finite], pen=pg.mkPen(color, width=2),
                                           symbol="o", symbolSize=7, symbolBrush=color, name=label)
                curve.sigPointsClicked.connect(lambda _c, pts, _e=None, r=role: self._clicked(r, pts))
            nonfinite = [float(ls.n_nonfinite) for ls in items]
            zero = [float(ls.zero_rows) for ls in items]
            self.bad_plot.plot(xs, nonfinite, pen=pg.mkPen(color, width=2), symbol="x", symbolSize=10,
                               symbolBrush=color, symbolPen=color)
            self.bad_plot.plot(xs, zero, pen=pg.mkPen(color, width=1, style=Qt.PenStyle.DashLine),
                               symbol="t1", symbolSize=8, symbolBrush=color)
            top = max(top, *nonfinite, *zero)
            layers.update(xs)
        self.bad_plot.setYRange(0, max(1.0, top) * 1.15, padding=0)
        ticks = [(x, f"{x:g}") for x in sorted(layers)] if 0 < len(layers) <= 40 else None
        for p in (self.rms_plot, self.bad_plot):
            p.getAxis("bottom").setTicks([ticks] if ticks else None)
        if layers:
            self.rms_plot.setXRange(min(layers) - 0.5, max(layers) + 0.5, padding=0)
        total_nf = sum(ls.n_nonfinite for items in series.values() for ls in items)
        total_zero = sum(ls.zero_rows for items in series.values() for ls in items)
        text = note or (f"{sum(len(v) for v in series.values())} records · {total_nf} non-finite values (×) · "
                        f"{total_zero} zero rows (▲, dashed)" if series else "no statistics")
        self.status.setText(text)

    def _clicked(self, role: str, points: object) -> None:
        pts = list(points)  # type: ignore[call-overload]
        if not pts:
            return
        x = pts[0].pos().x()
        items = self.series.get(role, [])
        hit = next((ls for ls in items if layer_x(ls) == x), None)
        if hit is not None:
            self.layerClicked.emit(role, hit.index)

    def mark(self, x: float | None) -> None:
        for c in self.markers:
            if x is None:
                c.hide()
            else:
                c.setValue(x)
                c.show()
