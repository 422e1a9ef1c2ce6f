"""What the cell map shows of one cell table, computed in one call that touches no Qt object.

:func:`draw_picture` gathers everything the view puts on screen (the image, the position strokes, the
summary line) so that a big table can be drawn on a pool thread and only handed to pyqtgraph on the
GUI thread (:class:`kvscope.app.views.cells.cellmap.CellMapView`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kvscope.app.document.doc_index import TableRef
from kvscope.app.document.seq_owner import UNNAMED_SEQ, SeqOwner, implied_owner
from kvscope.app.views.cells.cellmap_image import CellImage, build_cell_image, hex_rgb, with_owner
from kvscope.app.views.cells.swa import swa_masked_pairs
from kvscope.core.analysis.verdict import plural
from kvscope.core.reader.records import CellTable, ParseResult

POS_POINTS = 8192  # at most this many points in the position plot
EMPTY_BRUSH = "#969696"

# (colour, x = positions, y = rows, stroke width): one curve of the position plot
Strokes = tuple[str, npt.NDArray[np.float64], npt.NDArray[np.float64], int]


@dataclass
class CellPicture:
    """One table as the cell map draws it."""

    ref: TableRef
    owner: SeqOwner | None  # whose state the id-less cells hold (a per-sequence file's recurrent table)
    shown: CellTable  # the table as drawn (id-less cells filed under ``owner``)
    image: CellImage
    by_position: bool
    positions: list[Strokes]
    summary: str


def seq_label(owner: SeqOwner | None, s: int) -> str:
    """The column label of sequence id ``s`` (the file's unnamed sequence has no id)."""
    return owner.label if s == UNNAMED_SEQ and owner is not None else f"seq {s}"


def draw_picture(res: ParseResult | None, ref: TableRef, swa: tuple[int, bool] | None, by_position: bool,
                 dark: bool, colors: Sequence[str]) -> CellPicture:
    """The picture of ``ref``'s table; ``swa`` = (n_swa, chunked) fades the pairs outside the window."""
    owner = implied_owner(res, ref.section, ref.table)
    t = with_owner(ref.table, owner.column) if owner is not None else ref.table
    masked = swa_masked_pairs(t.pos, t.seq_start, t.seq_ids, swa[0], chunked=swa[1]) if swa is not None else None
    im = build_cell_image(t, [hex_rgb(c) for c in colors], by_position, masked, dark)
    step = max(1, t.count // POS_POINTS)  # a 100,000-cell table plots every k-th row
    rows = np.arange(0, t.count, step) + 0.5
    drawn = im.order[::step]
    first = t.seq_ids[np.minimum(t.seq_start[drawn], max(0, t.seq_ids.size - 1))] if t.seq_ids.size else None
    palette = [*colors, EMPTY_BRUSH]
    color = np.full(drawn.size, len(colors), dtype=np.int64)  # empty cells: the last colour
    if first is not None:
        filled = t.n_seq[drawn] > 0
        color[filled] = np.maximum(first[filled].astype(np.int64), 0) % len(colors)
    xs = im.pos[::step].astype(np.float64)
    size = 7 if t.count <= 256 else 4 if t.count <= 4096 else 2
    strokes = [(palette[k], xs[color == k], rows[color == k], size) for k in np.unique(color)]
    summary = _summary(ref, t, im, owner, swa[0] if masked is not None and swa is not None else None)
    return CellPicture(ref, owner, t, im, by_position, strokes, summary)


def _summary(ref: TableRef, t: CellTable, im: CellImage, owner: SeqOwner | None, n_swa: int | None) -> str:
    if owner is not None:
        lo, hi = (int(t.pos.min()), int(t.pos.max())) if t.count else (0, 0)
        at = f"position {lo:,}" if lo == hi else f"positions {lo:,}..{hi:,}"
        return (f"{ref.label}: {plural(t.count, 'cell')}: the state of {owner.label} at {at}. A per-sequence "
                f"file names no sequence in its recurrent cells; the sequence is {owner.why}.")
    parts = []
    for j, s in enumerate(im.seqs):
        p = im.pos[im.occupancy[:, j]]
        parts.append(f"{seq_label(owner, s)}: {plural(p.size, 'cell')}, pos {int(p.min()):,}..{int(p.max()):,}")
    n_empty = int((t.n_seq == 0).sum())
    n_shared = int((t.n_seq > 1).sum())
    extra = [f"{n_empty:,} empty"] if n_empty else []
    extra += [f"{n_shared:,} shared"] if n_shared else []
    if n_swa is not None:
        extra.append(f"{int(im.masked.any(axis=1).sum()):,} outside the window (n_swa={n_swa})")
    return (f"{ref.label}: {plural(t.count, 'cell')}" + (f" ({', '.join(extra)})" if extra else "")
            + ("; " + "; ".join(parts) if parts else ""))
