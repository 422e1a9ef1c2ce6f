"""Diff view: this file (A) against a second one (B): the list of differences, the bytes side by side
(:mod:`kvscope.app.views.diff.hex_diff`: aligned by structure, scroll-locked, differences highlighted,
F3 to the next one; they take the view's height, the plots folding away while they are in front),
per-layer plots.

Layer and count axes tick at whole numbers; the legend sits below the plots. Ctrl+C copies the selected
differences; Export saves them as CSV or the view as PNG.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pyqtgraph as pg
from PySide6.QtCore import QModelIndex, QPersistentModelIndex, Qt, Signal
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QMenu,
    QPushButton,
    QSplitter,
    QTableView,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from kvscope.app.base.lazy import LazyParts
from kvscope.app.base.tasks import CancelToken, Report, Task
from kvscope.app.base.theme import Theme
from kvscope.app.base.widgets import plain_label
from kvscope.app.document.document import Document, diff_available
from kvscope.app.document.hex_align import Alignment
from kvscope.app.document.source import ViewSource
from kvscope.app.views.diff.hex_diff import HexDiffView
from kvscope.app.views.export import CsvTable, doc_export_button
from kvscope.app.views.layers.stats_plot import ROLE_COLORS, ROLE_LABEL
from kvscope.app.views.plot_axes import IntegerAxis, ValueAxis, place_legend, side_legend, style_legend, style_plot
from kvscope.app.views.row_model import RIGHT, RowTableModel
from kvscope.app.views.table_tools import (
    copy_text,
    install_copy,
    install_menu,
    rows_text,
    selected_rows,
    step_row,
)
from kvscope.core.analysis.verdict import plural

if TYPE_CHECKING:
    from kvscope.core.analysis.diff import DiffItem, StateDiff

Index = QModelIndex | QPersistentModelIndex
COLUMNS = ("kind", "offset A", "offset B", "layer", "description")
BUILD_MS = 120  # the plots are made this long after the view (kvscope.app.base.lazy)

NAN_TITLE = "NaN values: A ●, B ▲"  # A circles, B triangles; the line styles are the series' (legend)
NAN_B_SYMBOL = "t1"  # pyqtgraph's upward triangle


class DiffModel(RowTableModel["DiffItem"]):
    """Rows are ``StateDiff.differences`` in the core's order."""

    columns = COLUMNS

    @property
    def items(self) -> list[DiffItem]:
        return self.rows

    def set_items(self, items: list[DiffItem]) -> None:
        self.set_rows(items)

    def cell(self, d: DiffItem, col: str, role: int) -> Any:
        if role == Qt.ItemDataRole.DisplayRole:
            def off(v: int | None) -> str:
                return "—" if v is None else f"{v:,}"

            return {"kind": d.kind, "offset A": off(d.offset_a), "offset B": off(d.offset_b),
                    "layer": "" if d.layer is None else str(d.layer), "description": d.description}[col]
        if role == Qt.ItemDataRole.ToolTipRole:
            return d.description
        if role == Qt.ItemDataRole.TextAlignmentRole and col in ("offset A", "offset B", "layer"):
            return RIGHT
        return None


class DiffView(LazyParts, QWidget):
    """Open a second file against the current one; step through differences; plot per-layer numbers."""

    compareRequested = Signal()  # the window asks for a file and calls ``doc.compare_with``
    export_name = "diff"
    lazy_parts = frozenset({"glw", "abs_plot", "cells_plot", "nan_plot", "legend"})

    def __init__(self, doc: Document, theme: Theme, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.defer_build(BUILD_MS)  # the plots: see build_parts
        self.doc, self.theme = doc, theme
        self.model = DiffModel(self)
        self.table = QTableView()
        self.table.setModel(self.model)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.verticalHeader().hide()
        self.table.verticalHeader().setDefaultSectionSize(self.table.fontMetrics().height() + 6)
        self.table.setWordWrap(False)
        install_copy(self.table, self.copy_rows)
        install_menu(self.table, self.build_menu)
        hh = self.table.horizontalHeader()
        hh.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        hh.setSectionResizeMode(len(COLUMNS) - 1, QHeaderView.ResizeMode.Stretch)
        self.open_button = QPushButton("Compare with…")
        self.prev_button = QPushButton("◀ Previous")
        self.next_button = QPushButton("Next ▶")
        self.header = plain_label("Compare this file with a second state file (File → Compare with…, Ctrl+D).")
        self.header.setWordWrap(True)
        self.detail = plain_label(" ")
        self.detail.setWordWrap(True)
        if not diff_available():
            self.open_button.setEnabled(False)
            self.open_button.setToolTip("needs kvscope.core.analysis.diff")
        top = QHBoxLayout()
        top.addWidget(self.open_button)
        top.addWidget(self.prev_button)
        top.addWidget(self.next_button)
        top.addWidget(self.header, 1)
        self.export_button = doc_export_button(self, doc)
        top.addWidget(self.export_button)
        listing = QWidget()
        ll = QVBoxLayout(listing)
        ll.setContentsMargins(0, 0, 0, 0)
        ll.addWidget(self.table, 1)
        ll.addWidget(self.detail)
        self.hexdiff = HexDiffView()
        self._aligned_for: object | None = None  # the DiffState the side-by-side rows were made for
        self._align_task: Task | None = None
        self._other_bytes: ViewSource | None = None
        self.pages = QTabWidget()
        self.pages.setDocumentMode(True)
        self.pages.addTab(listing, "Differences")
        self.pages.addTab(self.hexdiff, "Bytes side by side")
        self.pages.setTabToolTip(1, "A's and B's bytes in one table, the same record on the same row; F3: next "
                                 "difference")
        self.pages.currentChanged.connect(lambda _i: self._ensure_alignment())
        self.pages.currentChanged.connect(lambda _i: self._fold_plots())
        upper = QWidget()
        ul = QVBoxLayout(upper)
        ul.setContentsMargins(0, 0, 0, 0)
        ul.addLayout(top)
        ul.addWidget(self.pages, 1)
        self._split_fitted = False
        self._plot_sizes: list[int] | None = None  # the split before the side-by-side bytes folded the plots
        self.split = split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(upper)
        split.addWidget(QWidget())  # the plots' place until they are built
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(2, 2, 2, 2)
        lay.addWidget(split)
        self.open_button.clicked.connect(self.compareRequested)
        self.prev_button.clicked.connect(lambda: self.step(-1))
        self.next_button.clicked.connect(lambda: self.step(1))
        self.table.selectionModel().currentRowChanged.connect(self._on_current)
        self.table.clicked.connect(self._activate)
        doc.diffReady.connect(self._reload)
        doc.loaded.connect(self._reload)
        theme.changed.connect(self.apply_theme)
        self._reload()

    def build_steps(self) -> Iterator[None]:
        """The per-layer plots, one per step (deferred: see :mod:`kvscope.app.base.lazy`)."""
        self.glw = pg.GraphicsLayoutWidget()
        self.abs_plot = self.glw.addPlot(row=0, col=0, axisItems={"left": ValueAxis("left"),
                                                                   "bottom": IntegerAxis("bottom")})
        yield
        self.cells_plot = self.glw.addPlot(row=0, col=1, axisItems={"left": IntegerAxis("left"),
                                                                     "bottom": IntegerAxis("bottom")})
        yield
        self.nan_plot = self.glw.addPlot(row=0, col=2, axisItems={"left": IntegerAxis("left"),
                                                                   "bottom": IntegerAxis("bottom")})
        self.legend = side_legend(columns=6)
        place_legend(self.glw, self.legend, 1, 0, 3)
        self.abs_plot.setTitle("max |A − B| (finite values)")
        self.cells_plot.setTitle("cells that differ")
        self.nan_plot.setTitle(NAN_TITLE)
        for p in self.plots:
            p.setLabel("bottom", "layer")
            p.setMenuEnabled(False)
            p.showGrid(x=True, y=True, alpha=0.25)
        placeholder = self.split.replaceWidget(1, self.glw)
        if placeholder is not None:
            placeholder.deleteLater()
        self.glw.setMinimumHeight(240)
        self._fit_split()

    def _fit_split(self) -> None:
        """Table over plots, half and half of the height the view has (once it has one)."""
        h = self.split.height()
        if h > 100 and not self._split_fitted:
            self._split_fitted = True
            self.split.setSizes([h // 2, h - h // 2])
            self._plot_sizes = None
            self._fold_plots()

    def _fold_plots(self) -> None:
        """The side-by-side bytes take the whole height (at 1280x800 half of it showed 6 rows): the per-layer
        plots fold away while they are in front and come back as they were with the list of differences."""
        bytes_page = self.pages.currentWidget() is self.hexdiff
        sizes = self.split.sizes()
        if len(sizes) != 2 or not self._split_fitted:
            return
        if bytes_page and self._plot_sizes is None:
            self._plot_sizes = sizes
            self.split.setSizes([sum(sizes), 0])
        elif not bytes_page and self._plot_sizes is not None:
            if sizes[1] == 0:  # not opened again by hand meanwhile
                self.split.setSizes(self._plot_sizes)
            self._plot_sizes = None

    def showEvent(self, e: QShowEvent) -> None:
        super().showEvent(e)
        self.ensure_built()
        self._fit_split()
        self.finish()
        self.apply_theme(self.theme.dark)
        self._plot(self.diff)

    @property
    def plots(self) -> tuple[pg.PlotItem, pg.PlotItem, pg.PlotItem]:
        return self.abs_plot, self.cells_plot, self.nan_plot

    @property
    def diff(self) -> StateDiff | None:
        return self.doc.diff.diff if self.doc.diff is not None else None

    def _reload(self) -> None:
        state = self.doc.diff
        d = self.diff
        if state is not self._aligned_for:
            self._aligned_for = None
            self.hexdiff.set_alignment(None)
            self._ensure_alignment()
        self.model.set_items(d.differences if d is not None else [])
        has = d is not None and bool(d.differences)
        self.prev_button.setEnabled(has)
        self.next_button.setEnabled(has)
        if state is None or d is None:
            self.header.setText("Compare this file with a second state file (File → Compare with…, Ctrl+D).")
            self.detail.setText(" ")
        else:
            b = state.other
            first = "" if d.first_byte is None else f"; first differing byte @{d.first_byte:,}"
            self.header.setText(f"A: {self.doc.name} ({d.size_a:,} bytes) · B: {os.path.basename(state.other_path)} "
                                f"({b.kind}, {d.size_b:,} bytes) · "
                                + (f"{plural(len(d.differences), 'difference')}{first}" if d.differences
                                   else "identical"))
        self._plot(d)

    # -- side by side --------------------------------------------------------------------------------
    def show_side_by_side(self) -> Task | None:
        """Bring the side-by-side bytes in front (aligning them first when the diff is new)."""
        self.pages.setCurrentWidget(self.hexdiff)
        return self._ensure_alignment()

    def _ensure_alignment(self) -> Task | None:
        """Align the two files by structure in the background, once per diff, when the bytes tab is shown."""
        state = self.doc.diff
        if self.pages.currentWidget() is not self.hexdiff or state is None or self.doc.index is None:
            return None
        if self._aligned_for is state:
            return self._align_task
        self._aligned_for = state
        if self._align_task is not None and not self._align_task.done:
            self._align_task.cancel()
        leaves_a, data_a = self.doc.index.leaves, self.doc.data
        other_path, other = state.other_path, state.other
        self.hexdiff.set_alignment(None)
        self.hexdiff.status.setText("aligning the two files by structure…")

        def job(token: CancelToken, report: Report) -> tuple[Alignment, ViewSource]:
            data_b = ViewSource.open(other_path)
            leaves_b = [n for n in other.root.leaves() if n is not other.root]
            return Alignment.of(leaves_a, data_a, leaves_b, data_b), data_b

        self._align_task = self.doc.runner.submit("align the files side by side", job, self._on_aligned,
                                                  lambda m: self.hexdiff.status.setText(f"cannot align: {m}"))
        return self._align_task

    def _on_aligned(self, out: tuple[Alignment, ViewSource]) -> None:
        al, data_b = out
        if self._other_bytes is not None:
            self._other_bytes.close()
        self._other_bytes = data_b
        self.hexdiff.set_alignment(al)
        item = self._current_item()
        if item is not None:
            self._show_item_bytes(item)

    def _current_item(self) -> DiffItem | None:
        cur = self.table.currentIndex()
        return self.model.items[cur.row()] if cur.isValid() and cur.row() < len(self.model.items) else None

    def _show_item_bytes(self, item: DiffItem) -> None:
        if item.offset_a is not None:
            self.hexdiff.show_offset(item.offset_a, "a")
        elif item.offset_b is not None:
            self.hexdiff.show_offset(item.offset_b, "b")

    def _plot(self, d: StateDiff | None) -> None:
        if not self.built:
            return
        for p in self.plots:
            p.clear()
        self.legend.clear()
        if d is None:
            return
        series: dict[str, tuple[list[float], list[list[float]], str]] = {}
        for sd in d.sections:
            for ld in sd.layers:
                stream = "" if ld.stream_a is None else f" s{ld.stream_a}"
                key = f"{sd.role}{stream} {ROLE_LABEL.get(ld.role, ld.role)}"
                xs, ys, role = series.setdefault(key, ([], [[], [], [], []], ld.role))
                xs.append(float(ld.il if ld.il is not None else ld.index))
                for col, v in zip(ys, (ld.max_abs, ld.cells_differ, ld.nan_a, ld.nan_b), strict=True):
                    col.append(float(v) if math.isfinite(float(v)) else math.nan)
        styles = (Qt.PenStyle.SolidLine, Qt.PenStyle.DotLine, Qt.PenStyle.DashDotLine)
        layers: set[float] = set()
        for n, (key, (xs, ys, role)) in enumerate(series.items()):
            color = ROLE_COLORS.get(role, "#888888")
            pen = pg.mkPen(color, width=2, style=styles[(n // 2) % len(styles)])
            kw = {"symbol": "o", "symbolSize": 6, "symbolBrush": color}
            fin = [(x, y) for x, y in zip(xs, ys[0], strict=True) if math.isfinite(y)]
            self.legend.addItem(self.abs_plot.plot([x for x, _ in fin], [y for _, y in fin], pen=pen, **kw), key)
            self.cells_plot.plot(xs, ys[1], pen=pen, **kw)
            # A and B by their markers (A a circle, B a triangle on a thinner line of the series' own style): a
            # line style of their own would read as one of the series' (the dotted ones are other streams)
            self.nan_plot.plot(xs, ys[2], pen=pen, **kw)
            self.nan_plot.plot(xs, ys[3], pen=pg.mkPen(color, width=1, style=pen.style()), symbol=NAN_B_SYMBOL,
                               symbolSize=8, symbolBrush=color)
            layers.update(xs)
        ticks = [(x, f"{x:g}") for x in sorted(layers)] if 0 < len(layers) <= 40 else None
        tops = self._tops(series)
        for p, top in zip(self.plots, tops, strict=True):
            p.getAxis("bottom").setTicks([ticks] if ticks else None)
            t = top * 1.15 if top > 0 else 1.0
            p.setYRange(-0.1 * t, t, padding=0)  # counts and distances start at 0 (labelled: a hair below)
        style_legend(self.legend, self.theme.plot_colors()[1])

    @staticmethod
    def _tops(series: dict[str, tuple[list[float], list[list[float]], str]]) -> list[float]:
        """The largest finite value each of the three plots shows."""
        def top(cols: tuple[int, ...]) -> float:
            vals = [v for _, ys, _ in series.values() for c in cols for v in ys[c] if math.isfinite(v)]
            return max(vals, default=0.0)

        return [top((0,)), top((1,)), top((2, 3))]

    def apply_theme(self, _dark: bool) -> None:
        if not self.built:
            return
        bg, fg = self.theme.plot_colors()
        self.glw.setBackground(bg)
        for p in self.plots:
            style_plot(p, fg)
            p.titleLabel.setAttr("color", fg)
            p.setTitle(p.titleLabel.text)
        style_legend(self.legend, fg)

    # -- stepping and selection ---------------------------------------------------------------------
    def step(self, delta: int) -> DiffItem | None:
        """Select the next (1) or previous (-1) difference, wrapping."""
        row = step_row(self.table, delta)
        return None if row is None else self.model.items[row]

    def _on_current(self, current: QModelIndex, _prev: QModelIndex) -> None:
        if current.isValid():
            self._activate(current)

    def _activate(self, index: QModelIndex) -> None:
        item = self.model.items[index.row()]
        self._show_item_bytes(item)
        where_b = "" if item.offset_b is None else f" · in B at {item.offset_b:,} (0x{item.offset_b:x})"
        if item.offset_a is None:
            self.detail.setText(f"only in B{where_b}: {item.description}")
            return
        self.detail.setText(f"A at {item.offset_a:,} (0x{item.offset_a:x}){where_b}: {item.description}")
        if self.doc.index is not None and item.offset_a < self.doc.data.size:
            self.doc.bus.select(self.doc.index.for_offset(item.offset_a), origin=self)

    # -- copy, menu, export ------------------------------------------------------------------------
    def copy_rows(self) -> str:
        """Copy the selected differences as tab-separated lines (the columns as shown)."""
        return copy_text(rows_text(self.model, selected_rows(self.table)))

    def build_menu(self) -> QMenu:
        menu = QMenu(self)
        menu.addAction("Copy", self.copy_rows)
        menu.addSeparator()
        menu.addAction("Export as CSV…", self.export_button.ask_csv)
        menu.addAction("Export view as PNG…", self.export_button.ask_png)
        return menu

    def export_widget(self) -> QWidget:
        return self

    def csv_table(self) -> CsvTable | None:
        """Every difference: kind, offsets in A and B, layer, description."""
        d = self.diff
        if d is None:
            return None
        return (["kind", "offset_a", "offset_b", "layer", "description"],
                [[x.kind, "" if x.offset_a is None else x.offset_a, "" if x.offset_b is None else x.offset_b,
                  "" if x.layer is None else x.layer, x.description] for x in d.differences])
