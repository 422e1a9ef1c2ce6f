"""Layer view: one K/V/r/s record as a heatmap (cells × channels), scrubbed with a slider, plus stats.

The heatmap (:class:`~kvscope.app.views.layers.heatmap.Heatmap`) keeps its axes in real units at every
zoom; the title names the record, its type and shape, and whether the values shown were de-rotated
(records llama.cpp stores Hadamard-rotated). The view follows the document's selection: a finding,
node or byte of another record moves it to that record. Until a record is chosen it opens on the flagged
one, the layer the verdict's finding names (the NaN layer, the dropped record), not on layer 0. Once
``kvscope verify`` has run (Tools → Verify), every record's status is drawn in a strip under the
per-layer plots (with a legend; a click selects the record) and the selected record's status ends the
title.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QCheckBox, QComboBox, QHBoxLayout, QSlider, QSplitter, QVBoxLayout, QWidget

from kvscope.app.base.lazy import LazyParts
from kvscope.app.base.theme import Theme
from kvscope.app.base.widgets import plain_label
from kvscope.app.document.doc_index import Selection
from kvscope.app.document.document import Document
from kvscope.app.document.verify_marks import RecordMark, mark_of, verify_marks
from kvscope.app.views.export import CsvTable, doc_export_button
from kvscope.app.views.layers.heatmap import Heatmap
from kvscope.app.views.layers.lod import rotation_block
from kvscope.app.views.layers.stats_plot import ROLE_LABEL, StatsPlot, stats_csv, unit_stats
from kvscope.core.reader.record_names import label_of
from kvscope.core.reader.records import KvStream, LayerRecord
from kvscope.core.textsafe import plural

if TYPE_CHECKING:
    from kvscope.core.reader.tree import Node

ROLE_ORDER = ("k", "v", "r", "s", "p")
BUILD_MS = 80  # the plots are made this long after the view (kvscope.app.base.lazy)


@dataclass(frozen=True)
class Unit:
    """A section (and stream) whose records the slider scrubs through."""

    section_index: int
    stream: int | None
    label: str
    records: dict[str, list[LayerRecord]]


def screen_caps() -> tuple[int, int]:
    """(max rows, max cols) for the heatmap overview: the primary screen's size (at least 256)."""
    screen = QGuiApplication.primaryScreen()
    if screen is None:
        return 1024, 1024
    g = screen.availableGeometry()
    return max(256, g.height()), max(256, g.width())


def rotation_note(rec: LayerRecord, stream: KvStream | None, n_cols: int) -> str:
    """How the values shown relate to the stored bytes: de-rotated, possibly rotated, or as stored ("")."""
    if rec.role not in ("k", "v"):
        return ""
    block = rotation_block(rec, n_cols)
    inferred = stream is not None and stream.n_rot_inferred
    if block:
        return f"de-rotated (Hadamard, block {block}" + (", inferred" if inferred else "") + ")"
    if rec.rotated:
        return f"stored Hadamard-rotated (block {rec.rot_block}), shown as stored: the rows are not whole blocks"
    if rec.rotated is None:
        return "may be stored Hadamard-rotated (needs the model to tell), shown as stored"
    return ""


class LayerView(LazyParts, QWidget):
    """Heatmap of the selected record and per-layer stats."""

    export_name = "layers"
    lazy_parts = frozenset({"heatmap", "stats"})
    extra_csv = {"Statistics CSV": ("-stats", "stats_csv_table")}

    def __init__(self, doc: Document, theme: Theme, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.defer_build(BUILD_MS)  # the plots: see build_parts
        self.doc, self.theme = doc, theme
        self.units: list[Unit] = []
        self.record: LayerRecord | None = None
        self.streams: dict[int, KvStream | None] = {}
        self.marks: list[RecordMark] = []  # the verify result's statuses, tied to the file's records
        self.unread_layer: int | None = None  # the layer show_unread names (a record the file lacks)
        self.chosen = False  # a record was chosen (here, or by a selection elsewhere): the flagged one no longer
        self.unit_combo = QComboBox()
        self.unit_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.role_combo = QComboBox()
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.setPageStep(1)
        self.slider.setMinimumWidth(60)
        self.layer_label = plain_label()
        self.rows_combo = QComboBox()
        self.rows_combo.addItems(["file order", "by position"])
        self.rows_combo.setToolTip("the heatmap's rows: cells as stored, or sorted by sequence and position")
        self.heads_check = QCheckBox("split heads")
        self.title = plain_label(" ")
        font = self.title.font()
        font.setBold(True)
        self.title.setFont(font)
        self.title.setWordWrap(True)
        self.info = plain_label(" ")
        self.info.setWordWrap(True)
        self._caps = screen_caps()
        self.export_button = doc_export_button(self, doc)
        top = QHBoxLayout()
        top.addWidget(self.unit_combo, 1)
        top.addWidget(self.role_combo)
        top.addWidget(self.slider, 2)
        top.addWidget(self.layer_label)
        top.addWidget(self.rows_combo)
        top.addWidget(self.heads_check)
        top.addWidget(self.export_button)
        self.upper = QWidget()
        ul = QVBoxLayout(self.upper)
        ul.setContentsMargins(0, 0, 0, 0)
        ul.setSpacing(2)
        ul.addWidget(self.title)
        ul.addWidget(self.info)
        self.split = QSplitter(Qt.Orientation.Vertical)
        self.split.addWidget(self.upper)
        self.split.addWidget(QWidget())  # the statistics plot's place until it is built
        self.split.setStretchFactor(0, 3)
        self.split.setStretchFactor(1, 2)
        self.split.setSizes([520, 330])
        lay = QVBoxLayout(self)
        lay.setContentsMargins(2, 2, 2, 2)
        lay.addLayout(top)
        lay.addWidget(self.split, 1)
        self.unit_combo.currentIndexChanged.connect(self._on_unit)
        self.role_combo.currentIndexChanged.connect(self._on_role)
        self.slider.valueChanged.connect(self._on_slider)
        self.heads_check.toggled.connect(self._on_heads)
        self.rows_combo.currentIndexChanged.connect(lambda _i: self._redraw())
        doc.loaded.connect(self._reload)
        doc.statsReady.connect(self._update_stats)
        doc.statsReady.connect(self.show_flagged)  # the statistics' findings (NaN layers) can flag one
        doc.verifyChanged.connect(self._on_verify)
        doc.verifyChanged.connect(self.show_flagged)  # Verify can name the layer of a dropped record
        doc.bus.changed.connect(self._on_selection)
        for combo in (self.unit_combo, self.role_combo):
            combo.activated.connect(self._on_chosen)
        self._reload()

    def build_steps(self) -> Iterator[None]:
        """The heatmap, then the statistics plot (deferred: see :mod:`kvscope.app.base.lazy`). Both are
        published on the last step, so that code touching either before then builds the rest at once."""
        heatmap = Heatmap(self.doc, self.theme)
        heatmap.max_rows, heatmap.max_cols = self._caps
        heatmap.drawn.connect(self._on_drawn)
        heatmap.failed.connect(self._on_failed)
        yield
        stats = StatsPlot(self.theme, deferred=True)
        yield from stats.build_steps()
        self.heatmap, self.stats = heatmap, stats
        self.stats.layerClicked.connect(self._on_stats_click)
        layout = self.upper.layout()
        assert isinstance(layout, QVBoxLayout)
        layout.insertWidget(1, self.heatmap, 1)
        old = self.split.replaceWidget(1, self.stats)
        if old is not None:
            old.deleteLater()
        self.split.setSizes([620, 240])
        self.finish()
        self._update_stats()
        if self.record is not None:
            self.stats.mark(float(self.record.il if self.record.il is not None else self.record.index))
            self._redraw()
        elif self.unread_layer is not None:  # the layer of a record the file lacks (show_unread)
            self.stats.mark(float(self.unread_layer))

    # compatibility with callers that size the overview (reports)
    @property
    def max_rows(self) -> int:
        return self.heatmap.max_rows

    @max_rows.setter
    def max_rows(self, v: int) -> None:
        self.heatmap.max_rows = v

    @property
    def max_cols(self) -> int:
        return self.heatmap.max_cols

    @max_cols.setter
    def max_cols(self, v: int) -> None:
        self.heatmap.max_cols = v

    @property
    def matrix(self) -> np.ndarray | None:
        """The overview samples drawn for the current record (None until decoded)."""
        return self.heatmap.base.matrix

    # -- navigation -------------------------------------------------------------------------------
    def _on_chosen(self, *_args: object) -> None:
        self.chosen = True

    def flagged(self) -> Selection | None:
        """The selection of the layer the verdict points at: its first top finding that names a layer or a
        record (None when none does, as for a healthy file)."""
        v, idx = self.doc.verdict(), self.doc.index
        if v is None or idx is None:
            return None
        for f in v.top_findings:
            sel = idx.for_finding(f)
            if sel.record is None:
                sel = replace(sel, record=self.record_of_selection(sel)) if f.layer_text() else sel
            if sel.record is not None or f.layer_text():
                return sel
        return None

    def show_flagged(self) -> bool:
        """Open on the flagged layer (the one the verdict's finding names) rather than layer 0, until a
        record is chosen; True when there was one. Publishes no selection (the other views stay put)."""
        if self.chosen:
            return False
        sel = self.flagged()
        if sel is None:
            return False
        f = sel.finding
        rec = sel.record
        if rec is not None and (f is None or f.layer is None or rec.il in (None, f.layer)):
            if rec is not self.record:
                self.select_record(rec)
            return True
        self.show_unread(sel)
        return True

    def _on_verify(self) -> None:
        marks = verify_marks(self.doc.result, self.doc.verify)
        if not marks and not self.marks:
            return
        self.marks = marks
        self._update_stats()
        rec = self.record
        if rec is not None and self.built and self.heatmap.n_rows:
            self.title.setText(self.heading(rec))

    def unit_marks(self) -> list[RecordMark]:
        """The verify statuses of the records of the unit shown."""
        u = self.unit
        if u is None:
            return []
        return [m for m in self.marks if m.section_index == u.section_index and m.stream == u.stream]

    def verify_text(self, rec: LayerRecord) -> str:
        """``verify: match (max |Δ| 0; bitwise equal)`` for a verified record, else ""."""
        m = mark_of(self.marks, rec)
        return f"verify: {m.text()}" if m is not None else ""

    def _reload(self) -> None:
        self.units = []
        self.streams = {}
        self.marks = verify_marks(self.doc.result, self.doc.verify)
        idx = self.doc.index
        if idx is not None:
            grouped: dict[tuple[int, int | None], dict[str, list[LayerRecord]]] = {}
            labels: dict[tuple[int, int | None], str] = {}
            for si, sec, stream, rec in idx.records:
                key = (si, stream.index if stream is not None else None)
                grouped.setdefault(key, {}).setdefault(rec.role, []).append(rec)
                labels[key] = sec.role if stream is None else f"{sec.role} · stream {stream.index}"
                self.streams[id(rec)] = stream
            self.units = [Unit(k[0], k[1], labels[k], v) for k, v in grouped.items()]
        self.unit_combo.blockSignals(True)
        self.unit_combo.clear()
        self.unit_combo.addItems([u.label for u in self.units])
        self.unit_combo.blockSignals(False)
        if not self.units:
            self.title.setText(" ")
            self.info.setText("This file holds no layer records." if self.doc.result is not None else " ")
            self.record = None
        self.chosen = False
        self._on_unit()
        self.show_flagged()

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
        if publish:
            self.chosen = True
        if publish and self.doc.index is not None:
            self.doc.bus.select(self.doc.index.for_record(rec), origin=self)

    def _on_stats_click(self, role: str, index: int) -> None:
        u = self.unit
        if u is None:
            return
        rec = next((r for r in u.records.get(role, []) if r.index == index), None)
        if rec is not None:
            self.select_record(rec, publish=True)

    def select_record(self, rec: LayerRecord, publish: bool = False) -> bool:
        """Switch the unit, role and slider to ``rec``; False when no unit holds it."""
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
                return True
        return False

    def record_of_selection(self, sel: Selection) -> LayerRecord | None:
        """The record a selection points into: its own, else the record whose bytes hold its node or offset."""
        if sel.record is not None:
            return sel.record
        idx = self.doc.index
        if idx is None:
            return None
        node: Node | None = sel.node
        while node is not None:
            rec = idx.record_of(node)
            if rec is not None:
                return rec
            node = node.parent
        for _, _, _, rec in idx.records:
            if rec.header_offset <= sel.at < rec.data_offset + rec.data_size:
                return rec
        return None

    def _on_selection(self, sel: Selection) -> None:
        if sel.origin is self:
            return
        rec = self.record_of_selection(sel)
        if rec is not None or sel.finding is not None:
            self.chosen = True
        if rec is not None and rec is not self.record:
            self.select_record(rec)
        elif rec is None and sel.finding is not None:
            self.show_unread(sel)

    def show_unread(self, sel: Selection) -> None:
        """A finding about a layer that has no record (the parse stopped at it): show its section and say so."""
        f, idx = sel.finding, self.doc.index
        if f is None or idx is None or self.doc.result is None:
            return
        sections = self.doc.result.sections
        si = next((i for i, sec in enumerate(sections) if sec.offset <= f.offset < sec.offset + max(1, sec.size)),
                  None)
        ui = next((i for i, u in enumerate(self.units) if u.section_index == si), None)
        if ui is None:
            return
        if self.unit_combo.currentIndex() != ui:
            self.unit_combo.setCurrentIndex(ui)
        self.record = None
        self.unread_layer = f.layer
        if self.built:
            self.heatmap.clear()
            self.stats.mark(float(f.layer) if f.layer is not None else None)
        where = sel.node.path if sel.node is not None else f.path
        role = f.extra.get("role")
        if isinstance(role, str) and f.layer is not None:  # the dropped record's own name: "K layer 3"
            where = f"{ROLE_LABEL.get(role, role)} layer {f.layer} · {where}"
        self.layer_label.setText(f"layer {f.layer}" if f.layer is not None else "")
        self.title.setText(f"{where}: no values to show (the record was not read)")
        self.info.setText(f"{f.severity} {f.code} at {f.offset:,}: {f.message}")

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

    def _split(self, rec: LayerRecord) -> int:
        hd, _ = self.head_dim(rec)
        return hd if hd > 0 and self.heads_check.isChecked() else 0

    def show_record(self, rec: LayerRecord) -> None:
        """Show ``rec``: the overview is decoded in the background."""
        self.record = rec
        self.unread_layer = None
        self.layer_label.setText(self.record_label(rec))
        hd, why = self.head_dim(rec)
        self.heads_check.setEnabled(hd > 0)
        self.heads_check.setToolTip(f"separate heads of {hd} channels" if hd else why)
        if self.built:
            self.stats.mark(float(rec.il if rec.il is not None else rec.index))
        self._redraw()

    def _redraw(self) -> None:
        rec = self.record
        if rec is None:
            return
        if not self.built:  # drawn when the heatmap is built
            self.title.setText(self.record_label(rec))
            return
        task = self.heatmap.show_record(rec, self.rows_combo.currentIndex() == 1, self._split(rec))
        self.title.setText(self.heading(rec))
        self.info.setText(f"{self._describe(rec)} · " + ("decoding…" if task is not None else "no values to show"))

    def _on_heads(self, _on: bool) -> None:
        if self.record is not None and self.built:
            self.heatmap.set_head_dim(self._split(self.record))

    def record_label(self, rec: LayerRecord) -> str:
        """``kv_swa K layer 6``, or ``kv_swa K #5`` where the model layer is not known (one naming with the tree)."""
        res, index = self.doc.result, self.doc.index
        sec = next((s for _, s, _, r in index.records if r is rec), None) if index is not None else None
        if res is None or sec is None:
            return f"{ROLE_LABEL.get(rec.role, rec.role)} #{rec.index}"
        return label_of(res, sec, rec)

    def heading(self, rec: LayerRecord) -> str:
        """The heatmap's title: record, section, type, shape and how the values relate to the bytes."""
        hm = self.heatmap
        u = self.unit
        where = f" · {u.label}" if u is not None else ""
        kind = "recurrent cell" if rec.role in ("r", "s", "p") else "cell"
        text = (f"{self.record_label(rec)}{where} · {rec.type} · "
                f"{plural(hm.n_rows, kind)} × {plural(hm.n_cols, 'channel')}")
        note = rotation_note(rec, self.streams.get(id(rec)), hm.n_cols)
        status = self.verify_text(rec)
        return text + (f" · {note}" if note else "") + (f" · {status}" if status else "")

    def _describe(self, rec: LayerRecord) -> str:
        extra = "transposed V" if rec.transposed else f"{rec.row_bytes:,} bytes/row"
        trust = " · UNTRUSTED" if not rec.trusted else ""
        return f"{extra} · data @{rec.data_offset:,} ({rec.data_size:,} bytes){trust}"

    def sampling_note(self) -> str:
        """What the drawn samples are: every value, or every k-th row and channel (zoom in for more)."""
        win = self.heatmap.shown_window()
        if win is None:
            return ""
        if win.full_resolution:
            return "every value shown"
        return (f"shown every {win.row_step:,} rows × {win.col_step:,} channels ({win.shape[0]:,} × {win.shape[1]:,} "
                "samples): zoom in for every value")

    def _on_drawn(self) -> None:
        rec = self.record
        m = self.heatmap.base.matrix
        if rec is None or m is None:
            return
        n_bad = int(m.size - np.count_nonzero(np.isfinite(m)))
        self.info.setText(f"{self._describe(rec)} · {self.sampling_note()}"
                          + (f" · {n_bad:,} non-finite values in the overview (magenta)" if n_bad else ""))

    def _on_failed(self, message: str) -> None:
        rec = self.record
        self.info.setText(f"{self._describe(rec) if rec else ''} · cannot show values: {message}")

    # -- stats ------------------------------------------------------------------------------------
    def _update_stats(self) -> None:
        if not self.built:
            return
        u = self.unit
        note = ""
        if self.doc.stats is None:
            note = f"statistics failed: {self.doc.stats_error}" if self.doc.stats_error else "scanning payloads…"
        series = unit_stats(self.doc.stats, u.section_index, u.stream) if u is not None else {}
        self.stats.set_stats(series, note)
        eng = (self.doc.verify or {}).get("engine") or {}
        self.stats.set_verify(self.unit_marks(), " ".join(str(eng[k]) for k in ("kind", "build") if eng.get(k)))
        if self.record is not None:
            self.stats.mark(float(self.record.il if self.record.il is not None else self.record.index))
        elif self.unread_layer is not None:
            self.stats.mark(float(self.unread_layer))

    # -- export -------------------------------------------------------------------------------------
    def export_widget(self) -> QWidget:
        return self.split

    def csv_table(self) -> CsvTable | None:
        """The heatmap samples drawn (finest window in view): one row per cell, one column per channel."""
        hm = self.heatmap
        layer = hm.detail if hm.detail.window is not None and hm.detail.img.isVisible() else hm.base
        win, m = layer.window, layer.matrix
        if win is None or m is None:
            return None
        table = hm.ref.table if hm.ref is not None else None
        cols = [win.sampled_col(j) for j in range(m.shape[1])]
        header = ["row", "cell", "pos", "seq_ids", *(f"ch{c}" for c in cols)]
        values = m.tolist()

        def rows() -> Iterator[list[object]]:
            for k, vals in enumerate(values):
                r = win.sampled_row(k)
                cell = hm.cell_of_row(r)
                pos = int(table.pos[cell]) if table is not None and cell < table.count else ""
                seqs = " ".join(map(str, table.seqs_of(cell))) if table is not None and cell < table.count else ""
                yield [r, cell, pos, seqs, *vals]

        return header, rows()

    def stats_csv_table(self) -> CsvTable | None:
        return stats_csv(self.doc.stats)
