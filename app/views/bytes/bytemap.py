"""The byte map: the whole file as a zoomable strip, one colour per leaf kind.

Top: an overview of the whole file with the zoomed window marked. Middle: the zoomed strip
(mouse wheel zooms around the pointer, drag pans, double-click shows everything). Unparsed and
trailing bytes are painted in the warning colour, untrusted ranges hatched; the selected range
is outlined. Painting samples one leaf per pixel column, and draws warning ranges on top at
least 2 px wide, so a 4-byte hole in a 2 GiB file stays visible.

A truncated file is drawn on to the size it should have: the missing bytes past its end
(:func:`kvscope.core.analysis.verdict.missing_bytes`) are a cross-hatched region labelled with how much is
missing, split at the records that should be there. When far more is missing than the file holds,
the region is drawn at twice the file's width and marked "not to scale".

Export (the button beside the map, or its context menu) saves the map as drawn (PNG) or its regions as
CSV: one row per leaf (offset, end, size, kind, status, path) and one per record missing past the end.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
from PySide6.QtCore import QPoint, QRectF, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QContextMenuEvent, QMouseEvent, QPainter, QPaintEvent, QPen, QWheelEvent
from PySide6.QtWidgets import QMenu, QSizePolicy, QToolTip, QWidget

from kvscope.app.base.theme import UNTRUSTED_HATCH, WARNING_COLOR, kind_color
from kvscope.app.document.doc_index import Selection
from kvscope.app.document.document import Document
from kvscope.app.views.export import CsvTable, ExportButton
from kvscope.core.analysis.verdict import MissingBytes, MissingRecord, plural
from kvscope.core.reader.tree import Node

_OVERVIEW_H = 14
_STRIP_H = 34
_LEGEND_H = 18
_PAD = 6
MISSING_SCALE_CAP = 2.0  # the missing region is drawn at most this many times the file's width


def fmt_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


class ByteMap(QWidget):
    """Paints the leaves of the document's structure tree over the file's byte range."""

    nodeClicked = Signal(object)  # Node
    export_name = "bytemap"
    CSV_HEADER = ("offset", "end", "size", "kind", "status", "path", "note")

    def __init__(self, doc: Document, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.doc = doc
        self.exporter: ExportButton | None = None  # the page's Export button (the context menu offers its actions)
        self.setMouseTracking(True)
        self.setFixedHeight(_PAD * 3 + _OVERVIEW_H + _STRIP_H + _LEGEND_H + 14)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.lo, self.hi = 0.0, 1.0
        self.size_bytes = 0
        self.missing: MissingBytes | None = None
        self.total = 0.0  # the drawn extent: the file, then the missing bytes (maybe compressed)
        self._missing_scale = 1.0  # missing bytes per drawn byte past the end (1: to scale)
        self._starts: npt.NDArray[np.int64] = np.zeros(0, np.int64)
        self._ends: npt.NDArray[np.int64] = np.zeros(0, np.int64)
        self._nodes: list[Node] = []
        self._warn_idx: list[int] = []
        self._sel: tuple[int, int] | None = None
        self._drag: tuple[float, float, float] | None = None
        self._press_x = -1.0
        doc.loaded.connect(self._reload)
        doc.bus.changed.connect(self._on_selection)
        self._reload()

    # -- data ---------------------------------------------------------------------------------
    def _reload(self) -> None:
        idx = self.doc.index
        leaves = idx.leaves if idx is not None else []
        self._nodes = list(leaves)
        self._starts = np.array([n.offset for n in leaves], dtype=np.int64)
        self._ends = np.array([n.end for n in leaves], dtype=np.int64)
        self._warn_idx = [i for i, n in enumerate(leaves) if n.status != "parsed"]
        self.size_bytes = self.doc.result.size if self.doc.result is not None else 0
        verdict = self.doc.verdict()
        self.missing = verdict.missing if verdict is not None and verdict.missing is not None \
            and verdict.missing.missing > 0 else None
        shown = 0.0
        self._missing_scale = 1.0
        if self.missing is not None:
            shown = float(min(self.missing.missing, MISSING_SCALE_CAP * max(1, self.size_bytes)))
            self._missing_scale = self.missing.missing / shown
        self.total = float(max(1, self.size_bytes)) + shown
        self.lo, self.hi = 0.0, self.total
        self._sel = None
        self.update()

    def leaf_at(self, offset: float) -> Node | None:
        if not self._nodes:
            return None
        i = int(np.searchsorted(self._starts, offset, side="right")) - 1
        if 0 <= i < len(self._nodes) and self._starts[i] <= offset < self._ends[i]:
            return self._nodes[i]
        return None

    def kinds_present(self) -> list[str]:
        return list(dict.fromkeys(n.kind for n in self._nodes))

    # -- the bytes past the end ---------------------------------------------------------------
    @property
    def to_scale(self) -> bool:
        return self._missing_scale <= 1.0

    def drawn_offset(self, offset: float) -> float:
        """Where byte ``offset`` is drawn (past the end, missing bytes may be compressed)."""
        end = float(self.size_bytes)
        return offset if offset <= end else end + (offset - end) / self._missing_scale

    def missing_at(self, drawn: float) -> tuple[int, MissingRecord | None] | None:
        """(offset, missing record) drawn at ``drawn`` past the end of the file, or None."""
        if self.missing is None or drawn < self.size_bytes or drawn > self.total:
            return None
        off = int(self.size_bytes + (drawn - self.size_bytes) * self._missing_scale)
        rec = next((r for r in self.missing.records if r.offset <= off < r.offset + r.size), None)
        return off, rec

    def missing_text(self) -> str:
        m = self.missing
        if m is None:
            return ""
        return m.text() + ("" if self.to_scale else " (drawn not to scale)")

    # -- geometry -----------------------------------------------------------------------------
    def _strip_rect(self) -> QRectF:
        return QRectF(_PAD, _PAD * 2 + _OVERVIEW_H, self.width() - 2 * _PAD, _STRIP_H)

    def _overview_rect(self) -> QRectF:
        return QRectF(_PAD, _PAD, self.width() - 2 * _PAD, _OVERVIEW_H)

    def offset_at_x(self, x: float) -> float:
        r = self._strip_rect()
        return self.lo + (x - r.left()) / max(1.0, r.width()) * (self.hi - self.lo)

    def x_of(self, offset: float, rect: QRectF, lo: float, hi: float) -> float:
        return rect.left() + (offset - lo) / max(1e-9, hi - lo) * rect.width()

    def set_range(self, lo: float, hi: float) -> None:
        """Show bytes ``[lo, hi)`` (clamped to the file and its missing bytes, at least 16 bytes wide)."""
        size = float(max(1.0, self.total))
        span = min(size, max(16.0, hi - lo))
        lo = min(max(0.0, lo), size - span)
        self.lo, self.hi = lo, lo + span
        self.update()

    def zoom(self, factor: float, at: float | None = None) -> None:
        at = (self.lo + self.hi) / 2 if at is None else at
        self.set_range(at - (at - self.lo) * factor, at + (self.hi - at) * factor)

    # -- painting -----------------------------------------------------------------------------
    def paintEvent(self, _event: QPaintEvent) -> None:
        p = QPainter(self)
        pal = self.palette()
        p.fillRect(self.rect(), pal.window())
        if not self._nodes:
            p.setPen(pal.text().color())
            p.drawText(self.rect(), Qt.AlignmentFlag.AlignCenter, "no structure")
            return
        size = float(max(1.0, self.total))
        ov, strip = self._overview_rect(), self._strip_rect()
        self._paint_strip(p, ov, 0.0, size)
        self._paint_strip(p, strip, self.lo, self.hi)
        # zoom window on the overview
        p.setPen(QPen(pal.text().color(), 1.5))
        p.setBrush(Qt.BrushStyle.NoBrush)
        x0, x1 = self.x_of(self.lo, ov, 0, size), self.x_of(self.hi, ov, 0, size)
        p.drawRect(QRectF(x0, ov.top() - 1, max(2.0, x1 - x0), ov.height() + 2))
        if self._sel is not None:
            pen = QPen(pal.highlight().color(), 2.5)
            p.setPen(pen)
            for rect, lo, hi in ((ov, 0.0, size), (strip, self.lo, self.hi)):
                a, b = self._sel
                if b < lo or a > hi:
                    continue
                xa = max(rect.left(), self.x_of(a, rect, lo, hi))
                xb = min(rect.right(), self.x_of(max(b, a + 1), rect, lo, hi))
                p.drawRect(QRectF(xa - 1, rect.top() - 2, max(3.0, xb - xa + 2), rect.height() + 4))
        # axis labels
        p.setPen(pal.text().color())
        f = p.font()
        f.setPointSizeF(max(7.0, f.pointSizeF() - 1))
        p.setFont(f)
        y = strip.bottom() + 12
        p.drawText(QPoint(int(strip.left()), int(y)), f"{int(self.lo):,}")
        shown_end = min(self.hi, float(self.size_bytes))
        right = f"{int(shown_end):,}   ({fmt_size(max(0.0, shown_end - self.lo))} of {fmt_size(self.size_bytes)})"
        if self.missing is not None:
            m = self.missing
            at_least = "≥ " if m.more_may_follow else ""
            right = (f"{at_least}{fmt_size(m.missing)} missing past the end: the file should be {at_least}"
                     f"{m.expected_end:,} bytes" + ("" if self.to_scale else " (not to scale)") + "   |   " + right)
        w = p.fontMetrics().horizontalAdvance(right)
        p.drawText(QPoint(int(strip.right() - w), int(y)), right)
        self._paint_legend(p, y + 6)

    def _paint_strip(self, p: QPainter, rect: QRectF, lo: float, hi: float) -> None:
        width = max(1, int(rect.width()))
        # one sample per pixel column: the leaf under its centre
        centres = lo + (np.arange(width) + 0.5) / width * (hi - lo)
        idx = np.searchsorted(self._starts, centres, side="right") - 1
        valid = (idx >= 0) & (centres < self._ends[np.clip(idx, 0, None)])
        idx = np.where(valid, idx, -1)
        start = 0
        p.setPen(Qt.PenStyle.NoPen)
        for x in range(1, width + 1):
            if x < width and idx[x] == idx[start]:
                continue
            i = int(idx[start])
            if i >= 0:
                self._fill(p, QRectF(rect.left() + start, rect.top(), x - start, rect.height()), self._nodes[i])
            start = x
        # warning ranges on top, at least 2 px wide
        for i in self._warn_idx:
            n = self._nodes[i]
            if n.end < lo or n.offset > hi:
                continue
            xa, xb = self.x_of(n.offset, rect, lo, hi), self.x_of(n.end, rect, lo, hi)
            xa, xb = max(rect.left(), xa), min(rect.right(), max(xb, xa + 2))
            self._fill(p, QRectF(xa, rect.top(), xb - xa, rect.height()), n)
        self._paint_missing(p, rect, lo, hi)
        p.setPen(QPen(self.palette().mid().color(), 1))
        p.setBrush(Qt.BrushStyle.NoBrush)
        p.drawRect(rect)

    def _paint_missing(self, p: QPainter, rect: QRectF, lo: float, hi: float) -> None:
        """The cross-hatched bytes past the end, split at the records they should hold."""
        m = self.missing
        if m is None or hi <= self.size_bytes:
            return
        xa = max(rect.left(), self.x_of(self.size_bytes, rect, lo, hi))
        xb = min(rect.right(), self.x_of(self.total, rect, lo, hi))
        if xb <= xa:
            return
        region = QRectF(xa, rect.top(), max(2.0, xb - xa), rect.height())
        p.fillRect(region, self.palette().base())
        p.fillRect(region, QBrush(QColor(WARNING_COLOR), Qt.BrushStyle.DiagCrossPattern))
        p.setPen(QPen(QColor(WARNING_COLOR), 1, Qt.PenStyle.DashLine))
        for r in m.records[1:]:
            x = self.x_of(self.drawn_offset(r.offset), rect, lo, hi)
            if xa < x < xb:
                p.drawLine(int(x), int(rect.top()), int(x), int(rect.bottom()))
        p.setPen(QPen(QColor(WARNING_COLOR), 2))
        x_end = self.x_of(self.size_bytes, rect, lo, hi)
        if rect.left() <= x_end <= rect.right():
            p.drawLine(int(x_end), int(rect.top() - 2), int(x_end), int(rect.bottom() + 2))
        if rect.height() >= 20:
            label = f"missing: {'≥ ' if m.more_may_follow else ''}{fmt_size(m.missing)}" \
                    + ("" if self.to_scale else " (not to scale)")
            fm = p.fontMetrics()
            if fm.horizontalAdvance(label) + 8 < region.width():
                back = QRectF(0, 0, fm.horizontalAdvance(label) + 6, fm.height())
                back.moveCenter(region.center())
                p.fillRect(back, self.palette().base())
                p.setPen(self.palette().text().color())
                p.drawText(back, Qt.AlignmentFlag.AlignCenter, label)

    @staticmethod
    def _fill(p: QPainter, r: QRectF, n: Node) -> None:
        if n.status in ("unparsed", "trailing"):
            color = QColor(WARNING_COLOR) if n.status == "unparsed" else kind_color("trailing")
        else:
            color = kind_color(n.kind)
        p.fillRect(r, color)
        if n.status == "untrusted":
            p.fillRect(r, QBrush(QColor(UNTRUSTED_HATCH), Qt.BrushStyle.BDiagPattern))

    def _paint_legend(self, p: QPainter, y: float) -> None:
        x = float(_PAD)
        fm = p.fontMetrics()
        items = [(k, kind_color(k), False) for k in self.kinds_present() if k not in ("unparsed", "trailing")]
        statuses = {n.status for n in self._nodes}
        if "untrusted" in statuses:
            items.append(("untrusted", QColor("#ffffff"), True))
        if "unparsed" in statuses:
            items.append(("unparsed", QColor(WARNING_COLOR), False))
        if "trailing" in statuses:
            items.append(("trailing", kind_color("trailing"), False))
        if self.missing is not None:
            items.append(("missing (past the end)", self.palette().base().color(), True))
        for label, color, hatch in items:
            p.fillRect(QRectF(x, y, 10, 10), color)
            if hatch:
                style = Qt.BrushStyle.DiagCrossPattern if label.startswith("missing") else Qt.BrushStyle.BDiagPattern
                p.fillRect(QRectF(x, y, 10, 10), QBrush(QColor(UNTRUSTED_HATCH), style))
            p.setPen(self.palette().text().color())
            p.drawText(QPoint(int(x + 13), int(y + 9)), label)
            x += 13 + fm.horizontalAdvance(label) + 12

    # -- interaction --------------------------------------------------------------------------
    def pick(self, x: float, rect: QRectF, lo: float, hi: float) -> Node | None:
        """The leaf painted at ``x``: a warning range drawn there (at least 2 px wide) wins."""
        for i in self._warn_idx:
            n = self._nodes[i]
            xa = self.x_of(n.offset, rect, lo, hi)
            xb = max(self.x_of(n.end, rect, lo, hi), xa + 2)
            if xa - 1 <= x <= xb + 1:  # a pixel of slack: these ranges are what one looks for
                return n
        return self.leaf_at(lo + (x - rect.left()) / max(1.0, rect.width()) * (hi - lo))

    def tooltip_at(self, pos: QPoint) -> str:
        """What the pointer is over: node path, kind, status, offset and size."""
        if self._overview_rect().adjusted(0, -2, 0, 2).contains(pos):
            rect, lo, hi = self._overview_rect(), 0.0, float(max(1.0, self.total))
        elif self._strip_rect().contains(pos):
            rect, lo, hi = self._strip_rect(), self.lo, self.hi
        else:
            return ""
        hit = self.missing_at(lo + (pos.x() - rect.left()) / max(1.0, rect.width()) * (hi - lo))
        if hit is not None:
            off, rec = hit
            where = f"{rec.name}: {plural(rec.size, 'byte')} at {rec.offset:,}" + (" (estimated)" if rec.estimated
                                                                                     else "") if rec else ""
            return f"missing past the end of the file\n{self.missing_text()}\noffset {off:,}" + \
                (f"\n{where}" if where else "")
        n = self.pick(pos.x(), rect, lo, hi)
        if n is None:
            return ""
        text = f"{n.path}\n{n.kind} · {n.status}\noffset {n.offset:,} (0x{n.offset:x}) · size {n.size:,}"
        return text + (f"\n{n.note}" if n.note else "")

    def x_to_overview(self, x: float) -> float:
        r = self._overview_rect()
        return (x - r.left()) / max(1.0, r.width()) * max(1.0, self.total)

    def mouseMoveEvent(self, e: QMouseEvent) -> None:
        pos = e.position()
        if self._drag is not None:
            x0, lo, hi = self._drag
            shift = (pos.x() - x0) / max(1.0, self._strip_rect().width()) * (hi - lo)
            self.set_range(lo - shift, hi - shift)
            return
        tip = self.tooltip_at(pos.toPoint())
        if tip:
            QToolTip.showText(e.globalPosition().toPoint(), tip, self)
        else:
            QToolTip.hideText()

    def mousePressEvent(self, e: QMouseEvent) -> None:
        if e.button() != Qt.MouseButton.LeftButton:
            return
        pos = e.position()
        if self._strip_rect().contains(pos):
            self._drag = (pos.x(), self.lo, self.hi)
            self._press_x = pos.x()
        elif self._overview_rect().adjusted(0, -2, 0, 2).contains(pos):
            centre = self.x_to_overview(pos.x())
            span = self.hi - self.lo
            self.set_range(centre - span / 2, centre + span / 2)

    def mouseReleaseEvent(self, e: QMouseEvent) -> None:
        if self._drag is not None and abs(e.position().x() - self._press_x) < 3:
            self.click_at(e.position().x())
        self._drag = None

    def click_at(self, x: float) -> Node | None:
        """Select the leaf at x in the zoomed strip (the bytes past the end: the finding that says so)."""
        if self.missing is not None and self.missing_at(self.offset_at_x(x)) is not None and self.doc.index:
            self.doc.bus.select(self.doc.index.for_finding(self.missing.finding), origin=self)
            return None
        n = self.pick(x, self._strip_rect(), self.lo, self.hi)
        if n is not None and self.doc.index is not None:
            self.nodeClicked.emit(n)
            self.doc.bus.select(self.doc.index.for_node(n), origin=self)
        return n

    def mouseDoubleClickEvent(self, _e: QMouseEvent) -> None:
        self.set_range(0, self.total)

    def wheelEvent(self, e: QWheelEvent) -> None:
        steps = e.angleDelta().y() / 120.0
        if steps:
            self.zoom(0.8**steps, self.offset_at_x(e.position().x()))

    def contextMenuEvent(self, e: QContextMenuEvent) -> None:
        menu = QMenu(self)
        menu.addAction("Show the whole file", lambda: self.set_range(0, self.total))
        if self.exporter is not None:
            menu.addSeparator()
            menu.addAction("Export PNG image…", self.exporter.ask_png)
            menu.addAction("Export CSV table…", self.exporter.ask_csv).setEnabled(bool(self._nodes))
        menu.exec(e.globalPos())

    # -- export ---------------------------------------------------------------------------------------
    def export_widget(self) -> QWidget:
        return self

    def csv_table(self) -> CsvTable | None:
        """The regions the map paints: every leaf in file order, then the records missing past the end."""
        if not self._nodes:
            return None
        nodes, missing = list(self._nodes), self.missing

        def rows() -> Iterator[list[Any]]:
            for n in nodes:
                yield [n.offset, n.end, n.size, n.kind, n.status, n.path, n.note or ""]
            if missing is not None:
                for r in missing.records:
                    yield [r.offset, r.offset + r.size, r.size, "missing", "missing", r.name,
                           "past the end of the file" + (" (estimated size)" if r.estimated else "")]

        return self.CSV_HEADER, rows()

    def _on_selection(self, sel: Selection) -> None:
        self._sel = (sel.offset, sel.offset + max(1, sel.length))
        a, b = self._sel
        if sel.origin is not self and (b < self.lo or a > self.hi):
            span = self.hi - self.lo
            self.set_range((a + b) / 2 - span / 2, (a + b) / 2 + span / 2)
        self.update()
