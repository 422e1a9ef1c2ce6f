"""Per-layer statistics across layers (from ``kvscope.core.analysis.stats.scan_stats``): RMS, non-finite, zero rows,
and once ``kvscope verify`` has run, each record's status (match / differs / nonfinite / missing / extra)
in a strip below them, one row per role, with its own legend.

The layer and count axes tick at whole numbers only; the RMS axis starts at 0 with plain decimal labels;
the legends sit in their own column beside the plots, in the plot's foreground colour.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import QVBoxLayout, QWidget

from kvscope.app.base.theme import VERIFY_STATUS_COLORS, Theme
from kvscope.app.base.widgets import plain_label
from kvscope.app.document.verify_marks import STATUSES, RecordMark
from kvscope.app.views.export import CsvTable
from kvscope.app.views.plot_axes import IntegerAxis, ValueAxis, place_legend, side_legend, style_legend, style_plot

if TYPE_CHECKING:
    from kvscope.core.analysis.stats import LayerStats, StatsReport

ROLE_COLORS = {"k": "#4e79a7", "v": "#59a14f", "r": "#b07aa1", "s": "#9c755f", "p": "#76b7b2"}
ROLE_LABEL = {"k": "K", "v": "V", "r": "r", "s": "s", "p": "p"}
STRIP_ROLES = ("k", "v", "r", "s", "p")  # top to bottom in the verify strip
HATCHED = frozenset({"missing", "extra"})  # statuses of a record only one state holds: hatched squares


def status_brush(status: str) -> QBrush:
    """The fill of a verify status square: solid, hatched for a record only one of the two states holds."""
    color = QColor(VERIFY_STATUS_COLORS.get(status, "#888888"))
    return QBrush(color, Qt.BrushStyle.DiagCrossPattern if status in HATCHED else Qt.BrushStyle.SolidPattern)


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

    def __init__(self, theme: Theme, parent: QWidget | None = None, *, deferred: bool = False) -> None:
        """``deferred``: the caller runs :meth:`build_steps` (one plot per step), else it is built here."""
        super().__init__(parent)
        self.theme = theme
        self.status = plain_label("")
        self._steps = self._build()
        if not deferred:
            for _ in self._steps:
                pass

    def build_steps(self) -> Iterator[None]:
        """The plots, one per step (see :mod:`kvscope.app.base.lazy`)."""
        return self._steps

    def _build(self) -> Iterator[None]:
        self.glw = pg.GraphicsLayoutWidget()
        self.rms_plot = self.glw.addPlot(row=0, col=0, axisItems={"left": ValueAxis("left"),
                                                                   "bottom": IntegerAxis("bottom")})
        yield
        self.bad_plot = self.glw.addPlot(row=1, col=0, axisItems={"left": IntegerAxis("left", min_px=24),
                                                                   "bottom": IntegerAxis("bottom")})
        self.legend = side_legend(columns=1)
        place_legend(self.glw, self.legend, 0, 1)
        yield
        self.verify_plot = pg.PlotItem(axisItems={"left": pg.AxisItem("left")})
        self.verify_plot.setMenuEnabled(False)
        self.verify_plot.setMouseEnabled(x=True, y=False)
        self.verify_plot.hideButtons()
        self.verify_plot.getAxis("left").setWidth(56)
        self.verify_plot.setLabel("left", "verify")
        self.verify_plot.hideAxis("bottom")  # the layer axis is the count plot's, right above
        self.verify_plot.setFixedHeight(54)
        self.verify_legend = side_legend(columns=2)
        self.verify_shown = False
        self.marks: list[RecordMark] = []
        self.verify_note = ""  # the engine, for the status line
        self._stats_text = ""
        self.verify_points: pg.ScatterPlotItem | None = None
        self.glw.ci.layout.setRowStretchFactor(0, 3)
        self.glw.ci.layout.setRowStretchFactor(1, 2)
        self.rms_plot.setMinimumHeight(75)  # room for three labelled ticks each
        self.bad_plot.setMinimumHeight(75)
        self.setMinimumHeight(210)
        self.glw.ci.layout.setColumnStretchFactor(0, 1)
        self.glw.ci.layout.setColumnStretchFactor(1, 0)
        self.bad_plot.setXLink(self.rms_plot)
        self.verify_plot.setXLink(self.rms_plot)
        self.rms_plot.setLabel("left", "RMS")
        self.bad_plot.setLabel("left", "count")
        self.bad_plot.setLabel("bottom", "layer")
        self.rms_plot.getAxis("left").setWidth(56)
        self.bad_plot.getAxis("left").setWidth(56)
        for p in (self.rms_plot, self.bad_plot):
            p.setMenuEnabled(False)
            p.showGrid(x=True, y=True, alpha=0.25)
        self.markers = [pg.InfiniteLine(angle=90, movable=False, pen=pg.mkPen("#3d8ee6", width=2)) for _ in range(3)]
        for p, c in zip((self.rms_plot, self.bad_plot, self.verify_plot), self.markers, strict=True):
            p.addItem(c, ignoreBounds=True)
            c.hide()
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.glw, 1)
        lay.addWidget(self.status)
        self.series: dict[str, list[LayerStats]] = {}
        self.theme.changed.connect(self.apply_theme)
        self.apply_theme(self.theme.dark)

    def apply_theme(self, _dark: bool) -> None:
        bg, fg = self.theme.plot_colors()
        self.glw.setBackground(bg)
        for p in (self.rms_plot, self.bad_plot, self.verify_plot):
            style_plot(p, fg)
        style_legend(self.legend, fg)
        style_legend(self.verify_legend, fg)
        if self.marks:
            self.set_verify(self.marks, self.verify_note)

    def set_stats(self, series: dict[str, list[LayerStats]], note: str = "") -> None:
        """Plot ``series`` (role -> records of one section/stream)."""
        self.series = series
        for p, c in zip((self.rms_plot, self.bad_plot), self.markers[:2], strict=True):
            p.clear()
            p.addItem(c, ignoreBounds=True)
        self.legend.clear()
        top = 0.0
        top_rms = 0.0
        layers: set[float] = set()
        for role, items in series.items():
            color = ROLE_COLORS.get(role, "#888888")
            xs = [layer_x(ls) for ls in items]
            finite = [(x, ls.rms) for x, ls in zip(xs, items, strict=True) if math.isfinite(ls.rms)]
            label = ROLE_LABEL.get(role, role)
            if finite:  # records whose values are all NaN/Inf have no RMS
                curve = self.rms_plot.plot([x for x, _ in finite], [r for _, r in finite], pen=pg.mkPen(color, width=2),
                                           symbol="o", symbolSize=7, symbolBrush=color)
                curve.sigPointsClicked.connect(lambda _c, pts, _e=None, r=role: self._clicked(r, pts))
                self.legend.addItem(curve, label)
                top_rms = max(top_rms, *(r for _, r in finite))
            nonfinite = [float(ls.n_nonfinite) for ls in items]
            zero = [float(ls.zero_rows) for ls in items]
            self.bad_plot.plot(xs, nonfinite, pen=pg.mkPen(color, width=2), symbol="x", symbolSize=10,
                               symbolBrush=color, symbolPen=color)
            self.bad_plot.plot(xs, zero, pen=pg.mkPen(color, width=1, style=Qt.PenStyle.DashLine),
                               symbol="t1", symbolSize=8, symbolBrush=color)
            top = max(top, *nonfinite, *zero)
            layers.update(xs)
        # counts and RMS are >= 0: from 0 (a hair below, so the 0 tick keeps its label)
        count_top = max(1.0, top) * 1.15
        self.bad_plot.setYRange(-0.14 * count_top, count_top, padding=0)
        rms_top = top_rms * 1.15 if top_rms > 0 else 1.0
        self.rms_plot.setYRange(-0.1 * rms_top, rms_top, padding=0)
        style_legend(self.legend, self.theme.plot_colors()[1])
        # read without the model an iSWA half's or a hybrid's records are known by their index, not a layer
        by_index = any(ls.il is None for items in series.values() for ls in items)
        self.bad_plot.setLabel("bottom", "record # (the layer needs the model)" if by_index else "layer")
        mark = "#" if by_index else ""
        ticks = [(x, f"{mark}{x:g}") for x in sorted(layers)] if 0 < len(layers) <= 40 else None  # every one named
        for p in (self.rms_plot, self.bad_plot):
            p.getAxis("bottom").setTicks([ticks] if ticks else None)
        if layers:
            self.rms_plot.setXRange(min(layers) - 0.5, max(layers) + 0.5, padding=0)
        total_nf = sum(ls.n_nonfinite for items in series.values() for ls in items)
        total_zero = sum(ls.zero_rows for items in series.values() for ls in items)
        self._stats_text = note or (f"{sum(len(v) for v in series.values())} records · {total_nf} non-finite values "
                                    f"(×) · {total_zero} zero rows (▲, dashed)" if series else "no statistics")
        self._show_status()

    def _show_status(self) -> None:
        text = self._stats_text
        if self.marks:
            text += f" · verify{' (' + self.verify_note + ')' if self.verify_note else ''}: " + ", ".join(
                f"{n} {s}" for s, n in _counts(self.marks).items())
        self.status.setText(text)

    # -- verify -------------------------------------------------------------------------------------
    def set_verify(self, marks: list[RecordMark], note: str = "") -> None:
        """Draw the verify statuses of one section/stream's records (an empty list hides the strip)."""
        self.marks, self.verify_note = list(marks), note
        p = self.verify_plot
        p.clear()
        p.addItem(self.markers[2], ignoreBounds=True)
        self.verify_legend.clear()
        self.verify_points = None
        if not marks:
            if self.verify_shown:
                self.glw.removeItem(self.verify_plot)
                self.glw.removeItem(self.verify_legend)
                self.verify_shown = False
            self.setMinimumHeight(210)
            self._show_status()
            return
        if not self.verify_shown:
            self.glw.addItem(self.verify_plot, row=2, col=0)
            place_legend(self.glw, self.verify_legend, 2, 1)
            self.verify_shown = True
            self.setMinimumHeight(275)
        roles = [r for r in STRIP_ROLES if any(m.role == r for m in marks)]
        row = {r: len(roles) - 1 - i for i, r in enumerate(roles)}
        fg = self.theme.plot_colors()[1]
        spots = [{"pos": (m.x, row[m.role]), "brush": status_brush(m.status), "pen": pg.mkPen(fg, width=1),
                  "symbol": "s", "size": 14, "data": m} for m in marks if m.role in row]
        self.verify_points = pg.ScatterPlotItem(spots=spots, hoverable=True, tip=self._tip, pxMode=True)
        self.verify_points.sigClicked.connect(self._strip_clicked)
        p.addItem(self.verify_points)
        p.getAxis("left").setTicks([[(row[r], ROLE_LABEL.get(r, r)) for r in roles]])
        p.setYRange(-0.7, len(roles) - 0.3, padding=0)
        for status in [s for s in STATUSES if any(m.status == s for m in marks)]:
            sample = pg.ScatterPlotItem(symbol="s", size=12, brush=status_brush(status), pen=pg.mkPen(fg, width=1))
            n = sum(1 for m in marks if m.status == status)
            self.verify_legend.addItem(sample, f"{status} {n}")
        style_legend(self.verify_legend, fg)
        self._show_status()

    @staticmethod
    def _tip(x: float, y: float, data: object) -> str:
        return f"{data.where()}: {data.text()}" if isinstance(data, RecordMark) else ""

    def _strip_clicked(self, _item: object, points: object) -> None:
        pts = list(points)  # type: ignore[call-overload]
        m = pts[0].data() if pts else None
        if isinstance(m, RecordMark) and m.record is not None:
            self.layerClicked.emit(m.record.role, m.record.index)

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


def _counts(marks: list[RecordMark]) -> dict[str, int]:
    """Records per status, in :data:`STATUSES` order."""
    out = {s: sum(1 for m in marks if m.status == s) for s in STATUSES}
    return {s: n for s, n in out.items() if n}


def stats_csv(report: StatsReport | None) -> CsvTable | None:
    """Every record's statistics as a table (one row per record, the ``LayerStats`` fields as columns)."""
    if report is None or not report.layers:
        return None
    header = list(report.layers[0].to_json())
    return header, [[("" if v is None else v) for v in ls.to_json().values()] for ls in report.layers]
