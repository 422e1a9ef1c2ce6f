"""Plot axes and legends that explain themselves: integer ticks for integer quantities, readable value ticks,
labels in real units, and legends that sit beside the data in the plot's own colours.

* :class:`IntegerAxis` ticks only at whole numbers (cells, positions, layers, counts, channels), never
  0.5; a ``labeler`` names a tick (``h2·13`` for a head·dim channel, ``s1:40`` for a sequence position),
  ``centred`` puts a tick in the middle of the pixel it names (heatmap rows and columns).
* :class:`ValueAxis` labels floats with the precision their spacing needs and no SI scaling (never
  "RMS (x0.001)" with ticks 440.8 / 440.9).
* :func:`side_legend` builds a legend that lives in its own layout cell, never on top of the data.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QSizePolicy

Labeler = Callable[[int], str]


def nice_step(raw: float, unit: int = 1) -> int:
    """The smallest whole step >= ``raw``: 1, 2, 5 × 10^k; with a ``unit`` (a head size), a divisor of the unit
    below it and whole multiples of it above, so ticks fall on unit boundaries."""
    if raw <= 1:
        return 1
    if unit > 1:
        if raw <= unit:
            return next((d for d in range(2, unit + 1) if unit % d == 0 and d >= raw and _round(d)), unit)
        return unit * nice_step(raw / unit)
    exp = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * exp >= raw:
            return int(m * exp)
    return int(10 * exp)


def _round(d: int) -> bool:
    """A step worth labelling: a power of two or 1, 2, 5 × 10^k."""
    return d & (d - 1) == 0 or str(d).rstrip("0") in ("1", "2", "5")


def integer_ticks(lo: float, hi: float, pixels: float, min_px: float = 60.0, unit: int = 1,
                  centred: bool = False) -> tuple[int, list[float]]:
    """(step, tick positions) of whole numbers in ``[lo, hi]``, about one per ``min_px`` pixels.

    With ``centred`` a tick names pixel ``[i, i + 1)`` and sits at ``i + 0.5``.
    """
    lo, hi = sorted((lo, hi))
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return 1, []
    count = max(1.0, pixels / max(1.0, min_px))
    step = nice_step((hi - lo) / count, unit)
    shift = 0.5 if centred else 0.0
    first = math.ceil((lo - shift) / step) * step
    n = int((hi - shift - first) // step) + 1
    if n > 10_000:  # a degenerate range (a huge span on a few pixels): no ticks rather than a stall
        return step, []
    return step, [first + k * step + shift for k in range(max(0, n))]


class IntegerAxis(pg.AxisItem):
    """An axis of whole numbers: ticks at integers only, labelled with thousands separators or ``labeler``."""

    def __init__(self, orientation: str, labeler: Labeler | None = None, centred: bool = False, unit: int = 1,
                 min_px: float | None = None, **kwargs: object) -> None:
        super().__init__(orientation, **kwargs)
        self.enableAutoSIPrefix(False)
        self.labeler = labeler
        self.centred = centred
        self.unit = unit
        self.min_px = min_px if min_px is not None else (70.0 if orientation in ("bottom", "top") else 32.0)

    def set_labeler(self, labeler: Labeler | None, unit: int = 1, min_px: float | None = None) -> None:
        self.labeler = labeler
        self.unit = max(1, unit)
        if min_px is not None:
            self.min_px = min_px
        self.picture = None
        self.update()

    def tickValues(self, minVal: float, maxVal: float, size: float) -> list[tuple[float, list[float]]]:
        if self._tickLevels is not None:  # explicit ticks (setTicks) win
            return super().tickValues(minVal, maxVal, size)  # type: ignore[no-any-return]
        step, values = integer_ticks(minVal, maxVal, size, self.min_px, self.unit, self.centred)
        return [(float(step), values)]

    def label_of(self, value: float) -> str:
        i = int(math.floor(value)) if self.centred else int(round(value))
        return self.labeler(i) if self.labeler is not None else f"{i:,}"

    def tickStrings(self, values: list[float], scale: float, spacing: float) -> list[str]:
        return [self.label_of(v) for v in values]


def value_text(v: float, spacing: float) -> str:
    """``v`` with as many decimals as a tick ``spacing`` needs (scientific for very small or large numbers)."""
    if not math.isfinite(v):
        return str(v)
    if abs(v) < spacing * 1e-6:
        v = 0.0
    if spacing <= 0 or not math.isfinite(spacing):
        return f"{v:.6g}"
    if spacing < 1e-4 or max(abs(v), spacing) >= 1e6:
        digits = max(2, int(math.ceil(math.log10(max(abs(v), spacing) / spacing))) + 2)
        return f"{v:.{min(digits, 12)}g}"
    decimals = max(0, int(math.ceil(-math.log10(spacing) - 1e-9)))
    return f"{v:.{decimals}f}"


def value_ticks(lo: float, hi: float, pixels: float, min_px: float) -> tuple[float, list[float]]:
    """(step, ticks) at 1, 2, 5 × 10^k in ``[lo, hi]``, at most one per ``min_px`` pixels."""
    lo, hi = sorted((lo, hi))
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return 1.0, []
    raw = (hi - lo) / max(3.0 if pixels >= 45 else 2.0, pixels / max(1.0, min_px))  # a few labelled ticks
    exp = 10.0 ** math.floor(math.log10(raw))
    step = next(m * exp for m in (1, 2, 5, 10) if m * exp >= raw * (1 - 1e-9))
    first = math.ceil(lo / step - 1e-9)
    n = int(math.floor(hi / step + 1e-9)) - first + 1
    return step, [(first + k) * step for k in range(max(0, min(n, 1000)))]


class ValueAxis(pg.AxisItem):
    """A float axis without SI-prefix scaling whose labels carry the precision the tick spacing needs."""

    def __init__(self, orientation: str, min_px: float | None = None, **kwargs: object) -> None:
        super().__init__(orientation, **kwargs)
        self.enableAutoSIPrefix(False)
        self.min_px = min_px if min_px is not None else (80.0 if orientation in ("bottom", "top") else 24.0)

    def tickValues(self, minVal: float, maxVal: float, size: float) -> list[tuple[float, list[float]]]:
        if self._tickLevels is not None or self.logMode:
            return super().tickValues(minVal, maxVal, size)  # type: ignore[no-any-return]
        step, values = value_ticks(minVal, maxVal, size, self.min_px)
        return [(step, values)]

    def tickStrings(self, values: list[float], scale: float, spacing: float) -> list[str]:
        return [value_text(v * scale, spacing * scale) for v in values]


def side_legend(columns: int = 6) -> pg.LegendItem:
    """A legend meant for its own cell of a GraphicsLayout (above or beside the plots, never over data): as
    wide as its entries, not stretched over the cell (:func:`place_legend` adds it to the layout)."""
    legend = pg.LegendItem(colCount=columns, frame=False, horSpacing=14)
    legend.setParentItem(None)
    legend.setSizePolicy(QSizePolicy.Policy.Fixed, QSizePolicy.Policy.Fixed)
    return legend


def place_legend(glw: pg.GraphicsLayoutWidget, legend: pg.LegendItem, row: int, col: int, colspan: int = 1) -> None:
    """Add ``legend`` to ``glw``'s layout at ``(row, col)``, aligned to the left of its cell."""
    glw.addItem(legend, row=row, col=col, colspan=colspan)
    glw.ci.layout.setAlignment(legend, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)


def style_plot(plot: pg.PlotItem, fg: str, axes: tuple[str, ...] = ("left", "bottom")) -> None:
    """Axis lines, tick labels and axis titles of ``plot`` in the foreground colour ``fg``."""
    for name in axes:
        ax = plot.getAxis(name)
        ax.setPen(fg)
        ax.setTextPen(fg)
        ax.labelStyle = {**ax.labelStyle, "color": fg}
        ax._updateLabel()


def style_legend(legend: pg.LegendItem | None, fg: str) -> None:
    """Legend text in ``fg`` (the plot's foreground, readable on its background in both palettes)."""
    if legend is None:
        return
    legend.setLabelTextColor(fg)
    for _sample, label in legend.items:
        label.setText(label.text, color=fg)
