"""Layer view: one K/V/r/s record as a heatmap (cells × channels), scrubbed with a slider, plus stats."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QCheckBox, QComboBox, QHBoxLayout, QSlider, QSplitter, QVBoxLayout, QWidget

from kvscope.app.base.tasks import CancelToken, Report, Task
from kvscope.app.base.theme import Theme
from kvscope.app.base.widgets import plain_label
from kvscope.app.document.doc_index import Selection
from kvscope.app.document.document import Document
from kvscope.app.views.layers.stats_plot import ROLE_LABEL, StatsPlot, unit_stats
from kvscope.core.reader.records import LayerRecord

ROLE_ORDER = ("k", "v", "r", "s", "p")


@dataclass(frozen=True)
class Unit:
    """A section (and stream) whose records the slider scrubs through."""

    section_index: int
    stream: int | None
    label: str
    records: dict[str, list[LayerRecord]]


def screen_caps() -> tuple[int, int]:
    """(max rows, max cols) for heatmaps: the primary screen's size (at least 256)."""
    screen = QGuiApplication.primaryScreen()
    if screen is None:
        return 1024, 1024
    g = screen.availableGeometry()
    return max(256, g.height()), max(256, g.width())


class LayerView(QWidget):
    """Heatmap of the selected record (dequantized, downsampled by ``layer_matrix``) and per-layer stats."""

    def __init__(self, doc: Document, theme: Theme, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.doc, self.theme = doc, theme
        self.units: list[Unit] = []
        self.record: LayerRecord | None = None
        self.matrix: npt.NDArray[np.float32] | None = None
        self.matrix_record: LayerRecord | None = None  # the record ``matrix`` shows
        self.max_rows, self.max_cols = screen_caps()
        self._task: Task | None = None
        self.unit_combo = QComboBox()
        self.role_combo = QComboBox()
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.setPageStep(1)
        self.layer_label = plain_label()
        self.heads_check = QCheckBox("split heads")
        self.info = plain_label(" ")
        self.info.setWordWrap(True)
        self.glw = pg.GraphicsLayoutWidget()
        self.plot = self.glw.addPlot(row=0, col=0)
        self.plot.invertY(True)
        self.plot.setMenuEnabled(False)
        self.plot.setLabel("left", "cell")
        self.plot.setLabel("bottom", "channel")
        self.img = pg.ImageItem(axisOrder="row-major")
        self.bad = pg.ImageItem(axisOrder="row-major")
        self.plot.addItem(self.img)
        self.plot.addItem(self.bad)
        self.hist = pg.HistogramLUTItem()
        self.hist.setImageItem(self.img)
        self.hist.gradient.setColorMap(pg.colormap.get("CET-D1"))
        self.glw.addItem(self.hist, row=0, col=1)
        self.head_lines: list[pg.InfiniteLine] = []
        self.stats = StatsPlot(theme)
        self.stats.layerClicked.connect(self._on_stats_click)
        top = QHBoxLayout()
        top.addWidget(self.unit_combo, 1)
        top.addWidget(self.role_combo)
        top.addWidget(self.slider, 2)
        top.addWidget(self.layer_label)
        top.addWidget(self.heads_check)
        upper = QWidget()
        ul = QVBoxLayout(upper)
        ul.setContentsMargins(0, 0, 0, 0)
        ul.addLayout(top)
        ul.addWidget(self.glw, 1)
        ul.addWidget(self.info)
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(upper)
        split.addWidget(self.stats)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        split.setSizes([520, 330])
        lay = QVBoxLayout(self)
        lay.setContentsMargins(2, 2, 2, 2)
        lay.addWidget(split)
        self.unit_combo.currentIndexChanged.connect(self._on_unit)
        self.role_combo.currentIndexChanged.connect(self._on_role)
        self.slider.valueChanged.connect(self._on_slider)
        self.heads_check.toggled.connect(self._draw_heads)
        doc.loaded.connect(self._reload)
        doc.statsReady.connect(self._update_stats)
        doc.bus.changed.connect(self._on_selection)
        theme.changed.connect(self.apply_theme)
        self.apply_theme(theme.dark)
        self._reload()

    # -- navigation -------------------------------------------------------------------------------
    def _reload(self) -> None:
        self.units = []
        idx = self.doc.index
        if idx is not None:
            grouped: dict[tuple[int, int | None], dict[str, list[LayerRecord]]] = {}
            labels: dict[tuple[int, int | None], str] = {}
            for si, sec, stream, rec in idx.records:
                key = (si, stream.index if stream is not None else None)
                grouped.setdefault(key, {}).setdefault(rec.role, []).append(rec)
                labels[key] = sec.role if stream is None else f"{sec.role} · stream {stream.index}"
            self.units = [Unit(k[0], k[1], labels[k], v) for k, v in grouped.items()]
        self.unit_combo.blockSignals(True)
        self.unit_combo.clear()
        self.unit_combo.addItems([u.label for u in self.units])
        self.unit_combo.blockSignals(False)
        if not self.units:
            self.info.setText("This file holds no layer records." if self.doc.result is not None else " ")
            self.record = None
            self.matrix = None
            self.img.clear()
            self.bad.clear()
        self._on_unit()

    @property
    def unit(self) -> Unit | None:
        i = self.unit_combo.currentIndex()
        return self.units[i] if 0 <= i < len(self.units) else None

    def _roles(self) -> list[str]:
        u = self.unit
        return [r for r in ROLE_ORDER if u is not None and r in u.records]

    def _on_unit(self) -> None:
        self.role_combo.blockSignals(True)
        self.role_combo.clear()
        for r in self._roles():
            self.role_combo.addItem(ROLE_LABEL.get(r, r), r)
        self.role_combo.blockSignals(False)
        self._update_stats()
        self._on_role()

    def _records(self) -> list[LayerRecord]:
        u, role = self.unit, self.role_combo.currentData()
        return u.records.get(role, []) if u is not None and isinstance(role, str) else []

    def _on_role(self) -> None:
        recs = self._records()
        self.slider.blockSignals(True)
        self.slider.setRange(0, max(0, len(recs) - 1))
        self.slider.setValue(0)
        self.slider.setEnabled(len(recs) > 1)
        self.slider.blockSignals(False)
        self._on_slider(0, publish=False)

    def _on_slider(self, value: int, publish: bool = True) -> None:
        recs = self._records()
        if not recs:
            return
        rec = recs[min(value, len(recs) - 1)]
        self.show_record(rec)
        if publish and self.doc.index is not None:
            self.doc.bus.select(self.doc.index.for_record(rec), origin=self)

    def _on_stats_click(self, role: str, index: int) -> None:
        u = self.unit
        if u is None:
            return
        rec = next((r for r in u.records.get(role, []) if r.index == index), None)
        if rec is not None:
            self.select_record(rec, publish=True)

    def select_record(self, rec: LayerRecord, publish: bool = False) -> None:
        """Switch the unit, role and slider to ``rec``."""
        for ui, u in enumerate(self.units):
            recs = u.records.get(rec.role, [])
            if any(r is rec for r in recs):
                if self.unit_combo.currentIndex() != ui:
                    self.unit_combo.setCurrentIndex(ui)
                ri = self.role_combo.findData(rec.role)
                if ri >= 0 and self.role_combo.currentIndex() != ri:
                    self.role_combo.setCurrentIndex(ri)
                pos = next(i for i, r in enumerate(recs) if r is rec)
                self.slider.blockSignals(True)
                self.slider.setValue(pos)
                self.slider.blockSignals(False)
                self._on_slider(pos, publish=publish)
                return

    def _on_selection(self, sel: Selection) -> None:
        if sel.origin is not self and sel.record is not None and sel.record is not self.record:
            self.select_record(sel.record)

    # -- heatmap ----------------------------------------------------------------------------------
    def head_dim(self, rec: LayerRecord) -> tuple[int, str]:
        """(head dim, reason when 0) for splitting ``rec``'s channels by head."""
        prof = self.doc.profile
        if prof is None:
            return 0, "needs a model: the head size comes from the GGUF (File → Model…)"
        if rec.role not in ("k", "v"):
            return 0, "recurrent state has no attention heads"
        swa = rec.il is not None and rec.il in prof.swa_layers
        if rec.role == "k":
            hd = prof.head_dim_k_swa if swa and prof.head_dim_k_swa else prof.head_dim_k
        else:
            hd = prof.head_dim_v_swa if swa and prof.head_dim_v_swa else prof.head_dim_v
        return (hd, "") if hd > 0 else (0, "the model gives no head size")

    def show_record(self, rec: LayerRecord) -> None:
        """Compute ``rec``'s matrix in the background and show it."""
        self.record = rec
        label = ROLE_LABEL.get(rec.role, rec.role)
        self.layer_label.setText(f"{label} layer {'?' if rec.il is None else rec.il}")
        hd, why = self.head_dim(rec)
        self.heads_check.setEnabled(hd > 0)
        self.heads_check.setToolTip(f"separate heads of {hd} channels" if hd else why)
        self.stats.mark(float(rec.il if rec.il is not None else rec.index))
        res = self.doc.result
        if res is None:
            return
        if self._task is not None and not self._task.done:
            self._task.cancel()
        max_rows, max_cols = self.max_rows, self.max_cols

        def job(token: CancelToken, report: Report) -> tuple[LayerRecord, Any]:
            from kvscope.core.stats import layer_matrix

            return rec, layer_matrix(res, rec, max_rows=max_rows, max_cols=max_cols)

        self.info.setText(f"{self._describe(rec)} · decoding…")
        self._task = self.doc.runner.submit(f"layer {rec.role}{rec.il}", job, self._on_matrix, self._on_matrix_failed)

    def _describe(self, rec: LayerRecord) -> str:
        shape = f"{rec.n_rows} cells × {rec.n_embd_v_gqa}" if rec.transposed else f"{rec.n_rows} cells"
        extra = " · transposed V" if rec.transposed else f" · {rec.row_bytes} bytes/row"
        trust = "" if rec.trusted else " · UNTRUSTED"
        return f"{rec.type} · {shape}{extra} · data @{rec.data_offset:,} ({rec.data_size:,} bytes){trust}"

    def _on_matrix(self, out: tuple[LayerRecord, npt.NDArray[np.float32]]) -> None:
        rec, m = out
        if rec is not self.record:
            return
        self.matrix, self.matrix_record = m, rec
        self._draw(m)
        n_bad = int(m.size - np.count_nonzero(np.isfinite(m)))
        note = f" · shown {m.shape[0]}×{m.shape[1]}"
        if rec.n_rows and m.shape[0] < rec.n_rows:
            note += " (downsampled)"
        self.info.setText(self._describe(rec) + note + (f" · {n_bad} non-finite values (red)" if n_bad else ""))

    def _on_matrix_failed(self, message: str) -> None:
        self.matrix, self.matrix_record = None, None
        self.img.clear()
        self.bad.clear()
        self.info.setText(f"{self._describe(self.record) if self.record else ''} · cannot show values: {message}")

    def _draw(self, m: npt.NDArray[np.float32]) -> None:
        finite = np.isfinite(m)
        vals = m[finite]
        # non-finite values are transparent here and painted red by the overlay
        shown = np.where(finite, m, np.nan if vals.size else 0.0).astype(np.float32)
        lim = float(np.max(np.abs(vals))) if vals.size else 1.0
        lim = lim if lim > 0 else 1.0
        self.img.setImage(shown, autoLevels=False, levels=(-lim, lim))
        self.hist.setLevels(-lim, lim)
        if m.size and not finite.all():
            over = np.zeros((*m.shape, 4), np.uint8)
            over[~finite] = (230, 20, 20, 255)
            self.bad.setImage(over, autoLevels=False, levels=(0, 255))
        else:
            self.bad.clear()
        self.plot.setXRange(0, max(1, m.shape[1]), padding=0)
        self.plot.setYRange(0, max(1, m.shape[0]), padding=0)
        self._draw_heads()

    def _draw_heads(self) -> None:
        for line in self.head_lines:
            self.plot.removeItem(line)
        self.head_lines = []
        rec, m = self.record, self.matrix
        if rec is None or m is None or not self.heads_check.isChecked():
            return
        hd, _ = self.head_dim(rec)
        if hd <= 0:
            return
        from kvscope.core.stats import record_shape

        dim = record_shape(rec)[1] or m.shape[1]
        stride = -(-dim // m.shape[1]) if m.shape[1] else 1
        pen = pg.mkPen("#111111", width=1.5, style=Qt.PenStyle.DashLine)  # the colour map is white around 0
        for h in range(1, max(1, dim // hd)):
            line = pg.InfiniteLine(pos=h * hd / stride, angle=90, movable=False, pen=pen)
            line.setZValue(10)
            self.plot.addItem(line)
            self.head_lines.append(line)

    # -- stats ------------------------------------------------------------------------------------
    def _update_stats(self) -> None:
        u = self.unit
        note = ""
        if self.doc.stats is None:
            note = f"statistics failed: {self.doc.stats_error}" if self.doc.stats_error else "scanning payloads…"
        series = unit_stats(self.doc.stats, u.section_index, u.stream) if u is not None else {}
        self.stats.set_stats(series, note)
        if self.record is not None:
            self.stats.mark(float(self.record.il if self.record.il is not None else self.record.index))

    def apply_theme(self, _dark: bool) -> None:
        bg, fg = self.theme.plot_colors()
        self.glw.setBackground(bg)
        for name in ("left", "bottom"):
            self.plot.getAxis(name).setPen(fg)
            self.plot.getAxis(name).setTextPen(fg)
