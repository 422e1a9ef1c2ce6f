"""The report's pictures, drawn for the page with QPainter into fixed-size images (no widget grabs).

Every figure is :data:`WIDTH` pixels wide (what a GitHub issue shows at 100 %), has a title
naming the file, axes with their units and integer ticks where the quantity is an integer, and a
legend outside the data. Nothing interactive is drawn: no combo box, slider or check box.

- :func:`byte_map`: the file as a bar coloured by structure, the missing bytes of a truncated file
  cross-hatched past its end, and a zoom on the first problem.
- :func:`cell_map`: one cell table: which sequence each cell holds, and its positions.
- :func:`stats_plot`: per-layer RMS and the non-finite values and zero rows of one section/stream.
- :func:`heatmap`: one layer record as cells × channels with a labelled colour bar.

GUI thread only (QPainter on QImage needs a QGuiApplication, any platform, offscreen included).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt
from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QBrush, QColor, QFont, QFontMetrics, QImage, QPainter, QPen

from kvscope.app.base.theme import NONFINITE_RGB, SEQ_COLORS, UNTRUSTED_HATCH, WARNING_COLOR, kind_color
from kvscope.core.analysis.stats import LayerStats
from kvscope.core.analysis.verdict import MissingBytes, plural
from kvscope.core.reader.records import CellTable
from kvscope.core.reader.tree import Node
from kvscope.core.textsafe import safe_text

WIDTH = 900
MARGIN = 16
TITLE_PX, TEXT_PX, TICK_PX = 17, 13, 12
TEXT = QColor("#202020")
MUTED = QColor("#606060")
GRID = QColor("#e4e4e4")
EMPTY_CELL = QColor("#d0d0d0")
NONFINITE = QColor("#ff00ff")
ROLE_COLORS = {"k": "#4e79a7", "v": "#59a14f", "r": "#b07aa1", "s": "#9c755f", "p": "#76b7b2"}
ROLE_LABEL = {"k": "K", "v": "V", "r": "r (conv / shift)", "s": "s (ssm / wkv)", "p": "p"}
Fmt = Callable[[float], str]


def font(px: int, bold: bool = False) -> QFont:
    f = QFont()
    f.setPixelSize(px)
    f.setBold(bold)
    return f


def nice_ticks(lo: float, hi: float, n: int = 6, integer: bool = False) -> list[float]:
    """About ``n`` round tick values covering ``[lo, hi]`` (whole numbers only with ``integer``)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / max(1, n)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    if integer:
        step = max(1.0, float(math.ceil(step)))
    first = math.ceil(lo / step - 1e-9) * step
    out, t = [], first
    while t <= hi + 1e-9 * step:
        out.append(0.0 if abs(t) < 1e-12 * step else t)
        t += step
    return out


def int_fmt(v: float) -> str:
    return f"{int(round(v)):,}"


def num_fmt(v: float) -> str:
    return f"{v:.4g}"


def byte_unit(total: float) -> tuple[str, float]:
    """The unit a byte axis of ``total`` bytes counts in (ticks stay below 10,000 of it)."""
    for unit, scale in (("bytes", 1.0), ("KiB", 1024.0), ("MiB", float(1 << 20)), ("GiB", float(1 << 30))):
        if total / scale < 10000:
            return unit, scale
    return "GiB", float(1 << 30)


def byte_axis(c: Canvas, rect: QRectF, lo: float, hi: float) -> None:
    """An offset axis under ``rect`` showing bytes ``[lo, hi)`` in one unit."""
    unit, scale = byte_unit(hi)
    c.axes(rect, (lo / scale, hi / scale), (0.0, 1.0), f"offset ({unit})", "", int_fmt if scale == 1 else num_fmt,
           num_fmt, xint=scale == 1, grid=False, ny=0)


def bytes_fmt(v: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(v) >= scale:
            return f"{v / scale:.3g} {unit}"
    return f"{int(v):,} B"


class Canvas:
    """A white image with a title and a subtitle; ``top`` is where the figure's body starts."""

    def __init__(self, height: int, title: str, subtitle: str = "", width: int = WIDTH) -> None:
        self.image = QImage(width, height, QImage.Format.Format_ARGB32)
        self.image.setDevicePixelRatio(1.0)
        self.image.fill(QColor("white"))
        self.p = QPainter(self.image)
        self.p.setRenderHint(QPainter.RenderHint.Antialiasing)
        self.p.setRenderHint(QPainter.RenderHint.TextAntialiasing)
        self.width, self.height = width, height
        y: float = MARGIN
        y = self.text(MARGIN, y, title, font(TITLE_PX, True), TEXT, width - 2 * MARGIN)
        if subtitle:
            y = self.text(MARGIN, y + 2, subtitle, font(TEXT_PX), MUTED, width - 2 * MARGIN)
        self.top = y + 10

    def text(self, x: float, y: float, s: str, f: QFont, color: QColor, width: float,
             align: Qt.AlignmentFlag = Qt.AlignmentFlag.AlignLeft) -> float:
        """Draw wrapped text from (x, y); return the y below it. Each line is escaped (a file name's bidi
        control would reverse the text drawn after it)."""
        s = "\n".join(safe_text(line) for line in s.split("\n"))
        self.p.setFont(f)
        self.p.setPen(color)
        r = self.p.boundingRect(QRectF(x, y, width, 10000), int(align | Qt.TextFlag.TextWordWrap), s)
        self.p.drawText(r, int(align | Qt.TextFlag.TextWordWrap), s)
        return r.bottom()

    def axes(self, rect: QRectF, x: tuple[float, float], y: tuple[float, float], xlabel: str, ylabel: str,
             xfmt: Fmt = num_fmt, yfmt: Fmt = num_fmt, xint: bool = False, yint: bool = False,
             grid: bool = True, ny: int = 5) -> None:
        """Frame, ticks, tick labels, grid lines and axis labels around the plot ``rect``."""
        p = self.p
        p.setFont(font(TICK_PX))
        fm = QFontMetrics(p.font())
        for t in nice_ticks(x[0], x[1], 8, xint):
            px = rect.left() + (t - x[0]) / max(1e-12, x[1] - x[0]) * rect.width()
            if grid:
                p.setPen(QPen(GRID, 1))
                p.drawLine(QPointF(px, rect.top()), QPointF(px, rect.bottom()))
            p.setPen(QPen(TEXT, 1))
            p.drawLine(QPointF(px, rect.bottom()), QPointF(px, rect.bottom() + 4))
            s = xfmt(t)
            p.drawText(QPointF(px - fm.horizontalAdvance(s) / 2, rect.bottom() + 5 + fm.ascent()), s)
        for t in nice_ticks(y[0], y[1], ny, yint) if ny > 0 else []:
            py = rect.bottom() - (t - y[0]) / max(1e-12, y[1] - y[0]) * rect.height()
            if grid:
                p.setPen(QPen(GRID, 1))
                p.drawLine(QPointF(rect.left(), py), QPointF(rect.right(), py))
            p.setPen(QPen(TEXT, 1))
            p.drawLine(QPointF(rect.left() - 4, py), QPointF(rect.left(), py))
            s = yfmt(t)
            p.drawText(QPointF(rect.left() - 6 - fm.horizontalAdvance(s), py + fm.ascent() / 2 - 1), s)
        p.setPen(QPen(TEXT, 1))
        p.setBrush(Qt.BrushStyle.NoBrush)
        p.drawRect(rect)
        p.setFont(font(TEXT_PX))
        fm = QFontMetrics(p.font())
        p.drawText(QPointF(rect.center().x() - fm.horizontalAdvance(xlabel) / 2, rect.bottom() + 22 + fm.ascent()),
                   xlabel)
        if ylabel:
            p.save()
            p.translate(MARGIN + fm.ascent(), rect.center().y() + fm.horizontalAdvance(ylabel) / 2)
            p.rotate(-90)
            p.drawText(QPointF(0, 0), ylabel)
            p.restore()

    def legend(self, x: float, y: float, items: Sequence[tuple[str, QColor, str]], width: float) -> float:
        """A flowing legend (``style``: ``box``, ``hatch``, ``cross``, ``line``); return the y below it."""
        p = self.p
        p.setFont(font(TEXT_PX))
        fm = QFontMetrics(p.font())
        cx, cy = x, y
        for label, color, style in items:
            w = 16 + fm.horizontalAdvance(label) + 16
            if cx + w > x + width and cx > x:
                cx, cy = x, cy + fm.height() + 4
            sw = QRectF(cx, cy + (fm.height() - 11) / 2, 11, 11)
            if style == "line":
                p.setPen(QPen(color, 2.5))
                p.drawLine(QPointF(sw.left(), sw.center().y()), QPointF(sw.right(), sw.center().y()))
            else:
                p.fillRect(sw, QColor("white") if style in ("hatch", "cross") else color)
                if style in ("hatch", "cross"):
                    pattern = Qt.BrushStyle.DiagCrossPattern if style == "cross" else Qt.BrushStyle.BDiagPattern
                    p.fillRect(sw, QBrush(color, pattern))
                p.setPen(QPen(MUTED, 1))
                p.drawRect(sw)
            p.setPen(TEXT)
            p.drawText(QPointF(cx + 15, cy + fm.ascent()), label)
            cx += w
        return cy + fm.height()

    def finish(self) -> QImage:
        self.p.end()
        return self.image


# -- byte map -------------------------------------------------------------------------------------------
def _leaf_bar(p: QPainter, rect: QRectF, leaves: list[Node], lo: float, hi: float) -> None:
    """The leaves over bytes ``[lo, hi)`` (one sample per pixel column; problem ranges at least 2 px)."""
    starts = np.array([n.offset for n in leaves], np.int64)
    ends = np.array([n.end for n in leaves], np.int64)
    width = max(1, int(rect.width()))
    centres = lo + (np.arange(width) + 0.5) / width * (hi - lo)
    idx = np.searchsorted(starts, centres, side="right") - 1
    ok = (idx >= 0) & (centres < ends[np.clip(idx, 0, None)])
    idx = np.where(ok, idx, -1)

    def fill(r: QRectF, n: Node) -> None:
        color = QColor(WARNING_COLOR) if n.status == "unparsed" else kind_color(
            "trailing" if n.status == "trailing" else n.kind)
        p.fillRect(r, color)
        if n.status == "untrusted":
            p.fillRect(r, QBrush(QColor(UNTRUSTED_HATCH), Qt.BrushStyle.BDiagPattern))

    start = 0
    for xcol in range(1, width + 1):
        if xcol < width and idx[xcol] == idx[start]:
            continue
        if idx[start] >= 0:
            fill(QRectF(rect.left() + start, rect.top(), xcol - start, rect.height()), leaves[int(idx[start])])
        start = xcol
    span = max(1e-9, hi - lo)
    for n in leaves:
        if n.status != "parsed" and n.end >= lo and n.offset <= hi:
            xa = rect.left() + (max(lo, n.offset) - lo) / span * rect.width()
            xb = rect.left() + (min(hi, n.end) - lo) / span * rect.width()
            fill(QRectF(xa, rect.top(), max(2.0, xb - xa), rect.height()), n)


def _missing_bar(p: QPainter, rect: QRectF, m: MissingBytes, lo: float, hi: float, to_file: Callable[[float], float]
                 ) -> None:
    """The cross-hatched region past the end of the file, split at the records it should hold."""
    span = max(1e-9, hi - lo)
    xa = rect.left() + (max(lo, m.file_end) - lo) / span * rect.width()
    xb = rect.right()
    if xb <= xa:
        return
    region = QRectF(xa, rect.top(), xb - xa, rect.height())
    p.fillRect(region, QColor("white"))
    p.fillRect(region, QBrush(QColor(WARNING_COLOR), Qt.BrushStyle.DiagCrossPattern))
    p.setPen(QPen(QColor(WARNING_COLOR), 1, Qt.PenStyle.DashLine))
    for r in m.records[1:]:
        x = rect.left() + (to_file(r.offset) - lo) / span * rect.width()
        if xa < x < xb:
            p.drawLine(QPointF(x, rect.top()), QPointF(x, rect.bottom()))
    p.setPen(QPen(QColor(WARNING_COLOR), 2.5))
    p.drawLine(QPointF(xa, rect.top() - 4), QPointF(xa, rect.bottom() + 4))
    label = f"missing: {'≥ ' if m.more_may_follow else ''}{bytes_fmt(m.missing)}"
    p.setFont(font(TEXT_PX, True))
    fm = QFontMetrics(p.font())
    if fm.horizontalAdvance(label) + 10 < region.width():
        back = QRectF(0, 0, fm.horizontalAdvance(label) + 8, fm.height() + 2)
        back.moveCenter(region.center())
        p.fillRect(back, QColor("white"))
        p.setPen(QColor("#8e1414"))
        p.drawText(back, int(Qt.AlignmentFlag.AlignCenter), label)


def byte_map(name: str, size: int, leaves: list[Node], missing: MissingBytes | None,
             zoom: tuple[int, int, str] | None) -> QImage:
    """The byte map of a file; ``zoom``: (offset, length, what) of a range to show enlarged below."""
    cap = 2.0 * max(1, size)  # a huge missing tail is drawn at twice the file's width, not to scale
    shown = min(float(missing.missing), cap) if missing is not None else 0.0
    scale = (missing.missing / shown) if missing is not None and shown else 1.0
    total = size + shown

    def to_file(off: float) -> float:
        return off if off <= size else size + (off - size) / scale

    sub = f"{size:,} bytes, coloured by structure."
    if missing is not None:
        sub += f" Cross-hatched: {missing.text()}" + ("" if scale <= 1 else " (drawn not to scale)") + "."
    c = Canvas(330 if zoom else 220, f"Byte map of {name}", sub)
    p = c.p
    left, right = MARGIN + 8, c.width - MARGIN - 8
    bar = QRectF(left, c.top + 4, right - left, 34)
    _leaf_bar(p, bar, leaves, 0.0, total)
    if missing is not None:
        _missing_bar(p, bar, missing, 0.0, total, to_file)
    byte_axis(c, bar, 0.0, total)
    y = bar.bottom() + 50
    if zoom is not None:
        off, length, what = zoom
        pad = max(64.0, length * 2.0, size / 200)
        lo, hi = max(0.0, off - pad), min(float(size), off + length + pad)
        if missing is not None and off + length >= size:
            hi = min(total, max(hi, size + pad))
        zr = QRectF(left, y + 18, right - left, 34)
        c.text(left, y, f"Zoom on {what}: bytes {int(lo):,} to {int(hi):,}", font(TEXT_PX), TEXT, right - left)
        _leaf_bar(p, zr, leaves, lo, min(hi, float(size)) if hi <= size else hi)
        if missing is not None and hi > size:
            _missing_bar(p, zr, missing, lo, hi, to_file)
        p.setPen(QPen(QColor("#1f5fa8"), 2.5))
        span = max(1e-9, hi - lo)
        xa = zr.left() + (off - lo) / span * zr.width()
        xb = zr.left() + (off + max(1, length) - lo) / span * zr.width()
        p.drawRect(QRectF(xa - 1, zr.top() - 3, max(3.0, xb - xa + 2), zr.height() + 6))
        byte_axis(c, zr, lo, hi)
        y = zr.bottom() + 50
    kinds = list(dict.fromkeys(n.kind for n in leaves if n.status == "parsed" or n.status == "untrusted"))
    items = [(k.replace("_", " "), kind_color(k), "box") for k in kinds if k not in ("unparsed", "trailing")]
    statuses = {n.status for n in leaves}
    if "untrusted" in statuses:
        items.append(("untrusted", QColor(UNTRUSTED_HATCH), "hatch"))
    if "unparsed" in statuses:
        items.append(("unparsed", QColor(WARNING_COLOR), "box"))
    if "trailing" in statuses:
        items.append(("trailing", kind_color("trailing"), "box"))
    if missing is not None:
        items.append(("missing past the end", QColor(WARNING_COLOR), "cross"))
    if zoom is not None:
        items.append(("zoomed range (outlined)", QColor("#1f5fa8"), "line"))
    c.legend(left, y, items, right - left)
    return c.finish()


# -- cell map ---------------------------------------------------------------------------------------
def _seq_rgb(seq: int) -> QColor:
    return QColor(SEQ_COLORS[max(seq, 0) % len(SEQ_COLORS)])


def cell_map(name: str, label: str, table: CellTable, recurrent: bool,
             seq_labels: dict[int, str] | None = None) -> QImage:
    """Which sequences each cell of ``table`` holds (top) and the positions they hold (bottom); ``seq_labels``
    names sequences other than ``seq N`` (a per-sequence file's unnamed sequence)."""

    def seq_name(s: int) -> str:
        return (seq_labels or {}).get(s, f"seq {s}")

    n = table.count
    seqs = table.seq_set()
    empty = int((table.n_seq == 0).sum())
    sub = f"{plural(n, 'cell')}, {plural(len(seqs), 'sequence')}" + (f", {empty:,} empty" if empty else "") + "."
    if recurrent:
        sub += " A recurrent state: each cell holds one sequence's state as of its last position."
    rows: list[int | str] = [*seqs, *(["empty"] if empty else [])]  # a sequence id, or "empty"
    band = max(14, min(26, 160 // max(1, len(rows))))
    top_h = band * len(rows)
    c = Canvas(150 + top_h + 240 + 60, f"Cells of {label} in {name}", sub)
    p = c.p
    p.setFont(font(TICK_PX))
    fm = QFontMetrics(p.font())
    left = MARGIN + 30 + max(fm.horizontalAdvance(seq_name(s)) for s in [*seqs, 0]) + 10
    right = c.width - MARGIN - 8
    occ = QRectF(left, c.top + 4, right - left, top_h)
    width = max(1, int(occ.width()))
    cols = (np.arange(n, dtype=np.int64) * width // max(1, n)) if n else np.zeros(0, np.int64)
    cell_of = np.repeat(np.arange(n, dtype=np.int64), np.maximum(table.n_seq, 0))[: table.seq_ids.size]
    for r, key in enumerate(rows):
        y0 = occ.top() + r * band
        if isinstance(key, str):
            hit = cols[table.n_seq == 0]
            color = EMPTY_CELL
        else:
            hit = cols[cell_of[table.seq_ids[: cell_of.size] == key]]
            color = _seq_rgb(key)
        mark = np.zeros(width, bool)
        mark[np.clip(hit, 0, width - 1)] = True
        step = max(1.0, occ.width() / max(1, n))
        for x in np.nonzero(mark)[0]:
            p.fillRect(QRectF(occ.left() + float(x), y0 + 1, max(1.0, step - (1 if step > 3 else 0)), band - 2), color)
        p.setPen(TEXT)
        p.setFont(font(TICK_PX))
        text = "empty" if isinstance(key, str) else seq_name(key)
        p.drawText(QPointF(occ.left() - 6 - fm.horizontalAdvance(text), y0 + band / 2 + fm.ascent() / 2 - 1), text)
    p.setPen(QPen(TEXT, 1))
    p.setBrush(Qt.BrushStyle.NoBrush)
    p.drawRect(occ)
    pos_rect = QRectF(left, occ.bottom() + 44, right - left, 220)
    pmin = int(table.pos.min()) if n else 0
    pmax = int(table.pos.max()) if n else 1
    if pmax <= pmin:
        pmax = pmin + 1
    c.axes(pos_rect, (-0.5, max(0.5, n - 0.5)), (pmin, pmax), "cell index", "position", int_fmt, int_fmt,
           xint=True, yint=True)
    c.text(left, occ.bottom() + 6, "cell index →  (top: the sequences each cell holds; bottom: its position)",
           font(TICK_PX), MUTED, right - left)
    for s in seqs:
        idx = cell_of[table.seq_ids[: cell_of.size] == s]
        xs = pos_rect.left() + (idx + 0.5) / max(1, n) * pos_rect.width()
        ys = pos_rect.bottom() - (table.pos[idx] - pmin) / (pmax - pmin) * pos_rect.height()
        p.setPen(Qt.PenStyle.NoPen)
        p.setBrush(_seq_rgb(s))
        rad = 3.0 if idx.size < 2000 else 1.5
        for xv, yv in zip(xs.tolist(), ys.tolist(), strict=True):
            p.drawEllipse(QPointF(xv, yv), rad, rad)
    items = [(seq_name(s), _seq_rgb(s), "box") for s in seqs] + ([("empty cell", EMPTY_CELL, "box")] if empty else [])
    c.legend(left, pos_rect.bottom() + 46, items, right - left)
    return c.finish()


# -- per-layer statistics -------------------------------------------------------------------------------
def stats_plot(name: str, label: str, layers: list[LayerStats]) -> QImage:
    """RMS of the finite values per layer (top); non-finite values and zero rows per layer (bottom)."""
    roles = list(dict.fromkeys(ls.role for ls in layers))
    bad = sum(ls.n_nonfinite for ls in layers)
    zero = sum(ls.zero_rows for ls in layers)
    sub = f"{plural(len(layers), 'record')}; {bad:,} non-finite values, {plural(zero, 'zero row')} in all."
    c = Canvas(560, f"Per-layer statistics of {label} in {name}", sub)
    p = c.p
    left, right = MARGIN + 78, c.width - MARGIN - 8

    def layer_of(ls: LayerStats) -> float:
        return float(ls.il if ls.il is not None else ls.index)

    xs = [layer_of(ls) for ls in layers] or [0.0]
    xr = (min(xs) - 0.5, max(xs) + 0.5)
    rms = [ls.rms for ls in layers if math.isfinite(ls.rms)]
    lo, hi = (min(rms), max(rms)) if rms else (0.0, 1.0)
    if hi - lo < 1e-9 * max(1.0, abs(hi)):
        lo, hi = lo - max(1e-3, abs(lo) * 0.05), hi + max(1e-3, abs(hi) * 0.05)
    pad = (hi - lo) * 0.08
    top = QRectF(left, c.top + 6, right - left, 200)
    c.axes(top, xr, (lo - pad, hi + pad), "", "RMS (finite values)", int_fmt, num_fmt, xint=True)
    for role in roles:
        pts = [(layer_of(ls), ls.rms) for ls in layers if ls.role == role and math.isfinite(ls.rms)]
        color = QColor(ROLE_COLORS.get(role, "#888888"))
        path = [QPointF(top.left() + (x - xr[0]) / (xr[1] - xr[0]) * top.width(),
                        top.bottom() - (y - lo + pad) / (hi - lo + 2 * pad) * top.height()) for x, y in pts]
        p.setPen(QPen(color, 2))
        for a, b in zip(path, path[1:], strict=False):
            p.drawLine(a, b)
        p.setBrush(color)
        for q in path:
            p.drawEllipse(q, 3.5, 3.5)
    if not rms:
        c.text(top.left(), top.center().y() - 8, "no finite values in any record", font(TEXT_PX), MUTED, top.width(),
               Qt.AlignmentFlag.AlignHCenter)
    bottom = QRectF(left, top.bottom() + 40, right - left, 150)
    counts = [max(ls.n_nonfinite, ls.zero_rows) for ls in layers]
    cmax = max([1, *counts])
    c.axes(bottom, xr, (0, cmax * 1.1), "model layer", "non-finite / zero rows", int_fmt, int_fmt, xint=True,
           yint=True, ny=min(5, cmax))
    nrole = max(1, len(roles))
    bw = bottom.width() / max(1.0, xr[1] - xr[0]) * 0.8 / (2 * nrole)
    for ls in layers:
        k = roles.index(ls.role)
        x0 = bottom.left() + (layer_of(ls) - xr[0]) / (xr[1] - xr[0]) * bottom.width() - bw * nrole + 2 * k * bw
        color = QColor(ROLE_COLORS.get(ls.role, "#888888"))
        for j, (v, fill) in enumerate(((ls.n_nonfinite, NONFINITE), (ls.zero_rows, color))):
            if v:
                h = v / (cmax * 1.1) * bottom.height()
                p.fillRect(QRectF(x0 + j * bw, bottom.bottom() - h, bw - 1, h), fill)
    if not bad and not zero:
        c.text(bottom.left(), bottom.center().y() - 8, "no non-finite values and no zero rows", font(TEXT_PX), MUTED,
               bottom.width(), Qt.AlignmentFlag.AlignHCenter)
    items = [(f"{ROLE_LABEL.get(r, r)} RMS / zero rows", QColor(ROLE_COLORS.get(r, "#888888")), "line") for r in roles]
    items.append(("non-finite values", NONFINITE, "box"))
    c.legend(left, bottom.bottom() + 46, items, right - left)
    return c.finish()


# -- heatmap --------------------------------------------------------------------------------------------
def _colormap() -> npt.NDArray[np.uint8]:
    import pyqtgraph as pg

    lut = pg.colormap.get("viridis").getLookupTable(0.0, 1.0, 256, alpha=False)
    return np.asarray(lut, np.uint8)


def heatmap(name: str, title: str, matrix: npt.NDArray[np.float32], n_cells: int, n_dims: int, note: str) -> QImage:
    """``matrix`` ([cell, channel], maybe every k-th of each) as colours, NaN/Inf magenta, with a colour bar."""
    rows, cols = matrix.shape
    finite = np.isfinite(matrix)
    vals = matrix[finite]
    lo, hi = (float(vals.min()), float(vals.max())) if vals.size else (0.0, 1.0)
    if hi <= lo:
        hi = lo + 1.0
    sub = (f"{plural(n_cells, 'cell')} × {plural(n_dims, 'channel')}" + (f" (every {math.ceil(n_cells / rows)}th "
           f"cell, every {math.ceil(n_dims / cols)}th channel shown)" if (rows, cols) != (n_cells, n_dims) else "")
           + f"; {int((~finite).sum()):,} non-finite values shown in magenta. {note}")
    c = Canvas(600, f"{title} in {name}", sub)
    p = c.p
    left, right = MARGIN + 70, c.width - MARGIN - 110
    plot = QRectF(left, c.top + 6, right - left, 600 - c.top - 80)
    lut = _colormap()
    norm = np.clip((np.nan_to_num(matrix, nan=lo, posinf=hi, neginf=lo) - lo) / (hi - lo), 0, 1)
    rgb = lut[(norm * 255).astype(np.int64)]
    rgb[~finite] = NONFINITE_RGB
    argb = np.empty((rows, cols, 4), np.uint8)
    argb[..., 0], argb[..., 1], argb[..., 2], argb[..., 3] = rgb[..., 2], rgb[..., 1], rgb[..., 0], 255
    img = QImage(argb.tobytes(), cols, rows, cols * 4, QImage.Format.Format_ARGB32).copy()
    p.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform, False)
    # cell 0 at the bottom, as the axis counts (QImage.flipped is Qt 6.9+, mirrored() is deprecated there)
    p.drawImage(plot, img.flipped(Qt.Orientation.Vertical) if hasattr(img, "flipped") else img.mirrored(False, True))
    c.axes(plot, (-0.5, n_dims - 0.5), (-0.5, n_cells - 0.5), "channel",
           "cell (file order)", int_fmt, int_fmt, xint=True, yint=True, grid=False)
    bar = QRectF(right + 24, plot.top(), 18, plot.height())
    grad = np.linspace(1.0, 0.0, max(2, int(bar.height())))
    g = lut[(grad * 255).astype(np.int64)]
    gimg = np.empty((g.shape[0], 1, 4), np.uint8)
    gimg[:, 0, 0], gimg[:, 0, 1], gimg[:, 0, 2], gimg[:, 0, 3] = g[:, 2], g[:, 1], g[:, 0], 255
    p.drawImage(bar, QImage(gimg.tobytes(), 1, g.shape[0], 4, QImage.Format.Format_ARGB32).copy())
    p.setPen(QPen(TEXT, 1))
    p.drawRect(bar)
    p.setFont(font(TICK_PX))
    fm = QFontMetrics(p.font())
    for t in nice_ticks(lo, hi, 6):
        y = bar.bottom() - (t - lo) / (hi - lo) * bar.height()
        p.drawLine(QPointF(bar.right(), y), QPointF(bar.right() + 4, y))
        p.drawText(QPointF(bar.right() + 6, y + fm.ascent() / 2 - 1), num_fmt(t))
    p.save()
    p.setFont(font(TEXT_PX))
    p.translate(bar.left() - 6, bar.center().y() + QFontMetrics(p.font()).horizontalAdvance("value") / 2)
    p.rotate(-90)
    p.drawText(QPointF(0, 0), "value")
    p.restore()
    return c.finish()
