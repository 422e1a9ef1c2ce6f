"""A labelled colour bar for the heatmap: the colour map's gradient beside a value axis.

Built from a bare ViewBox, an ImageItem and an axis (a few ms), not pyqtgraph's ``ColorBarItem``, which
is a whole PlotItem with its option menus (15 ms and more on the GUI thread).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyqtgraph as pg
from PySide6.QtCore import QRectF

from kvscope.app.views.plot_axes import ValueAxis

WIDTH = 16


class ColourBar(pg.GraphicsLayout):
    """The gradient of ``cmap`` from ``lo`` (bottom) to ``hi`` (top), its axis labelled ``label``."""

    def __init__(self, cmap: pg.ColorMap, label: str = "value") -> None:
        super().__init__()
        self.cmap = cmap
        self.lut: npt.NDArray[np.uint8] = cmap.getLookupTable(nPts=256)
        self.vb = pg.ViewBox(enableMenu=False)
        self.vb.setMouseEnabled(x=False, y=False)
        self.vb.setFixedWidth(WIDTH)
        self.vb.setDefaultPadding(0)
        self.gradient = pg.ImageItem(np.arange(256, dtype=np.float32).reshape(256, 1), axisOrder="row-major")
        self.gradient.setLookupTable(self.lut)
        self.gradient.setLevels((0, 255))
        self.vb.addItem(self.gradient)
        self.axis = ValueAxis("right")
        self.axis.linkToView(self.vb)
        self.axis.setLabel(label)
        self.addItem(self.vb, 0, 0)
        self.addItem(self.axis, 0, 1)
        self._levels = (-1.0, 1.0)
        self.set_levels(-1.0, 1.0)

    def levels(self) -> tuple[float, float]:
        return self._levels

    def set_levels(self, lo: float, hi: float) -> None:
        self._levels = (lo, hi)
        self.gradient.setRect(QRectF(0, lo, 1, hi - lo))
        self.vb.setRange(xRange=(0, 1), yRange=(lo, hi), padding=0)

    def set_colors(self, fg: str) -> None:
        self.axis.setPen(fg)
        self.axis.setTextPen(fg)
        self.axis.labelStyle = {**self.axis.labelStyle, "color": fg}
        self.axis._updateLabel()
