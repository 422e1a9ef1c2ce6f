"""Level of detail for the layer heatmap: which cells and channels of a record to read for what is in view.

No Qt here. A :class:`Window` is a strided block of a record's ``[row, channel]`` matrix: rows
``row0:row1:row_step`` of the display order (file order, or the cells sorted by sequence and position),
channels ``col0:col1:col_step``. The whole record is shown as one coarse window (at most a screen's
pixels); zooming in reads a finer window of just the part in view, down to every cell and channel.
Heatmap coordinates are real units throughout: display row ``r`` covers ``[r, r + 1)`` on the y axis,
channel ``c`` covers ``[c, c + 1)`` on the x axis, whatever the stride.

Records stored Hadamard-rotated (``LayerRecord.rotated``) come back de-rotated from
:func:`kvscope.core.analysis.record_values.record_rows` (whole rows are de-rotated before channels are picked);
:func:`rotation_block` says when, for the heatmap's caption.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kvscope.core.analysis.record_values import Bytes, derotates, record_rows, record_shape, source_of
from kvscope.core.reader.records import CellTable, LayerRecord, ParseResult

F32A = npt.NDArray[np.float32]
I64A = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Window:
    """Rows ``row0:row1:row_step`` (display order) and channels ``col0:col1:col_step`` of a record."""

    row0: int
    row1: int
    row_step: int
    col0: int
    col1: int
    col_step: int

    @property
    def shape(self) -> tuple[int, int]:
        rows = -(-(self.row1 - self.row0) // self.row_step)
        cols = -(-(self.col1 - self.col0) // self.col_step)
        return max(0, rows), max(0, cols)

    @property
    def full_resolution(self) -> bool:
        return self.row_step == 1 and self.col_step == 1

    def rect(self) -> tuple[float, float, float, float]:
        """(x, y, width, height) in heatmap units: sample ``(k, j)`` covers row ``row0 + k·row_step`` onwards."""
        rows, cols = self.shape
        return float(self.col0), float(self.row0), float(cols * self.col_step), float(rows * self.row_step)

    def covers(self, other: Window) -> bool:
        """True when this window shows all of ``other`` at least as finely."""
        return (self.row0 <= other.row0 and other.row1 <= self.row1 and self.col0 <= other.col0
                and other.col1 <= self.col1 and self.row_step <= other.row_step and self.col_step <= other.col_step)

    def sample(self, row: int, col: int) -> tuple[int, int] | None:
        """The matrix index ``(k, j)`` drawn at display row ``row``, channel ``col`` (None: outside)."""
        rows, cols = self.shape
        k, j = (row - self.row0) // self.row_step, (col - self.col0) // self.col_step
        if row < self.row0 or col < self.col0 or not (0 <= k < rows and 0 <= j < cols):
            return None
        return k, j

    def sampled_row(self, k: int) -> int:
        return self.row0 + k * self.row_step

    def sampled_col(self, j: int) -> int:
        return self.col0 + j * self.col_step


def overview(n_rows: int, n_cols: int, max_rows: int, max_cols: int) -> Window:
    """The whole record in at most ``max_rows × max_cols`` samples (every k-th row and channel)."""
    rs = -(-n_rows // max_rows) if max_rows > 0 and n_rows > max_rows else 1
    cs = -(-n_cols // max_cols) if max_cols > 0 and n_cols > max_cols else 1
    return Window(0, n_rows, rs, 0, n_cols, cs)


def plan(n_rows: int, n_cols: int, x: tuple[float, float], y: tuple[float, float], px_w: float, px_h: float,
         margin: float = 0.25) -> Window:
    """The window to read for a view of channels ``x`` and rows ``y`` drawn on ``px_w × px_h`` pixels.

    The visible part grows by ``margin`` of its size on each side (small pans need no read), is clipped to
    the record, and is sampled about once per pixel.
    """
    def span(lo: float, hi: float, n: int, px: float) -> tuple[int, int, int]:
        lo, hi = sorted((lo, hi))
        a = max(0, int(math.floor(lo)))
        b = min(n, int(math.ceil(hi)))
        if b <= a:
            return 0, n, max(1, -(-n // max(1, int(px))))
        step = max(1, -(-(b - a) // max(1, int(px))))
        grow = int((b - a) * margin)
        a, b = max(0, a - grow), min(n, b + grow)
        a -= a % step  # aligned to the step: a pan by less than the margin keeps the same samples
        return a, b, step

    r0, r1, rs = span(y[0], y[1], n_rows, px_h)
    c0, c1, cs = span(x[0], x[1], n_cols, px_w)
    return Window(r0, r1, rs, c0, c1, cs)


def display_order(table: CellTable | None, n_rows: int, by_position: bool) -> I64A | None:
    """Display row -> cell index: None for file order; sorted by (first sequence, position) otherwise."""
    if not by_position or table is None or table.count < n_rows or n_rows == 0:
        return None
    starts = table.seq_start[:n_rows]
    first = np.where(table.n_seq[:n_rows] > 0, table.seq_ids[np.minimum(starts, max(0, table.seq_ids.size - 1))]
                     if table.seq_ids.size else -1, -1).astype(np.int64)
    return np.lexsort((np.arange(n_rows), table.pos[:n_rows].astype(np.int64), first)).astype(np.int64)


def rotation_block(rec: LayerRecord, n_cols: int) -> int:
    """The Hadamard block ``record_rows`` undoes for ``rec`` (0: the values are the stored ones)."""
    return rec.rot_block if derotates(rec) and n_cols and n_cols % rec.rot_block == 0 else 0


def record_size(res: ParseResult, rec: LayerRecord, data: Bytes = None) -> tuple[int, int]:
    """(rows present, channels) of ``rec`` in the file's bytes."""
    with source_of(res, data) as src:
        return record_shape(rec, int(src.size) - rec.data_offset)


def read_window(res: ParseResult, rec: LayerRecord, win: Window, order: I64A | None = None,
                data: Bytes = None) -> F32A:
    """The float32 samples of ``win`` (de-rotated by ``record_rows`` when the record is stored rotated).

    Only the sampled rows are read. Raises ValueError for a type gguf-py cannot decode.
    """
    with source_of(res, data) as src:
        n, dim = record_shape(rec, int(src.size) - rec.data_offset)
        if dim == 0:
            raise ValueError(f"{rec.type} rows of {rec.row_bytes} bytes cannot be decoded")
        rows: I64A | slice = slice(win.row0, min(win.row1, n), win.row_step)
        if order is not None:
            rows = order[win.row0 : min(win.row1, n) : win.row_step]
        cols = slice(win.col0, min(win.col1, dim), win.col_step)
        try:
            values = record_rows(src, rec, rows, cols)  # de-rotated by the core when stored rotated
        except NotImplementedError as e:
            raise ValueError(f"cannot decode {rec.type}: {e}") from None
    return np.ascontiguousarray(values, dtype=np.float32)
