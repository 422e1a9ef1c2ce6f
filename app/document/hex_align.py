"""Two files' bytes aligned by structure, for the side-by-side hex diff (no Qt).

Each file's structure leaves (``/memory/kv/stream0/K1/rows``, ...; uncovered bytes as gaps) are matched
with :class:`difflib.SequenceMatcher` (records by their bytes, the rest by path: :func:`pieces`), so the
same record sits on the same rows of both sides even when one file has a record less, a longer token
array or more cells: a leaf only one file has faces an empty side. Within a pair, row ``r`` shows bytes
``16 r ..`` of each leaf. Rows are found by binary search over cumulative counts (no list of rows: a file
of many GiB has hundreds of millions), and :meth:`Alignment.next_diff` compares bytes with numpy a chunk
at a time.
"""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from kvscope.core.reader.tree import Node

ROW = 16  # bytes per row
CONTENT_KEYS = 512 << 20  # files up to this size pair records by their bytes
RECORD_KINDS = frozenset({"layer_header", "k_rows", "v_rows", "r_rows", "s_rows", "p_rows"})
CHUNK = 1 << 22  # bytes compared at a time


class Bytes(Protocol):
    @property
    def size(self) -> int: ...

    def __getitem__(self, key: slice, /) -> npt.NDArray[np.uint8]: ...


@dataclass(frozen=True)
class Piece:
    """A leaf (or a gap between leaves) of one file: ``path`` and bytes ``[offset, offset + size)``."""

    path: str
    offset: int
    size: int
    key: str = ""  # what pairs it with a piece of the other file (its path, or a record's kind and bytes)


@dataclass(frozen=True)
class Segment:
    """One leaf of A facing the same leaf of B (either None when only the other file has it)."""

    path: str
    a: Piece | None
    b: Piece | None

    @property
    def rows(self) -> int:
        n = max(self.a.size if self.a else 0, self.b.size if self.b else 0)
        return max(1, -(-n // ROW))


@dataclass(frozen=True)
class Row:
    """Row ``index``: ``a_off``/``b_off`` (None: that side is empty there) and how many bytes each shows."""

    index: int
    segment: int
    first: bool  # the segment's first row (it names the path)
    a_off: int | None
    a_len: int
    b_off: int | None
    b_len: int


def pieces(leaves: Sequence[Node], data: Bytes) -> list[Piece]:
    """The leaves in file order, with a ``(bytes at N)`` piece for each range no leaf covers.

    A record's header and rows are keyed by their kind and bytes (files up to :data:`CONTENT_KEYS`): the
    reader names records by position, so when B lacks K layer 1 its "K1" is A's K2; by content the
    K2 of both files face each other and A's K1 stands alone. Anything else is keyed by its path.
    """
    size = int(data.size)
    by_content = size <= CONTENT_KEYS
    out: list[Piece] = []
    at = 0

    def key(leaf: Node, n: int) -> str:
        if by_content and leaf.kind in RECORD_KINDS:
            raw = np.asarray(data[leaf.offset : leaf.offset + n], np.uint8).tobytes()
            return f"{leaf.kind}:{n}:{hashlib.blake2b(raw, digest_size=16).hexdigest()}"
        return leaf.path

    for leaf in sorted(leaves, key=lambda n: n.offset):
        if leaf.size <= 0 or leaf.offset < at:
            continue
        if leaf.offset > at:
            out.append(Piece(f"(bytes at {at:,})", at, leaf.offset - at, "(gap)"))
        n = min(leaf.size, max(0, size - leaf.offset))
        out.append(Piece(leaf.path, leaf.offset, n, key(leaf, n)))
        at = leaf.offset + leaf.size
    if at < size:
        out.append(Piece(f"(bytes at {at:,})", at, size - at, "(gap)"))
    return [p for p in out if p.size > 0]


def align(a: list[Piece], b: list[Piece]) -> list[Segment]:
    """The pieces of A and B paired by key in file order; between matches, pieces of the same parent node
    (``.../K1/rows`` and ``.../K1/rows`` with other bytes) pair in order, the others stand alone."""
    sm = difflib.SequenceMatcher(None, [p.key for p in a], [p.key for p in b], autojunk=False)
    out: list[Segment] = []
    for op, i1, i2, j1, j2 in sm.get_opcodes():
        if op == "equal":
            out += [Segment(a[i].path if a[i].path == b[j].path else f"{a[i].path} ↔ {b[j].path}", a[i], b[j])
                    for i, j in zip(range(i1, i2), range(j1, j2), strict=True)]
            continue
        pa, pb = a[i1:i2], b[j1:j2]
        for k in range(max(len(pa), len(pb))):  # replaced: pair in order when the kinds agree
            x, y = pa[k] if k < len(pa) else None, pb[k] if k < len(pb) else None
            if x is not None and y is not None and op == "replace" and x.path.split("/")[-1] == y.path.split("/")[-1]:
                out.append(Segment(x.path if x.path == y.path else f"{x.path} ↔ {y.path}", x, y))
            else:
                out += [Segment(p.path, p, None) for p in ([x] if x else [])]
                out += [Segment(p.path, None, p) for p in ([y] if y else [])]
    return out


class Alignment:
    """The aligned rows of two files; ``data_a``/``data_b`` their bytes (indexable by slices)."""

    def __init__(self, segments: list[Segment], data_a: Bytes, data_b: Bytes) -> None:
        self.segments = segments
        self.data_a, self.data_b = data_a, data_b
        counts = np.array([s.rows for s in segments], np.int64)
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.total_rows = int(self.starts[-1])

    @classmethod
    def of(cls, leaves_a: Sequence[Node], data_a: Bytes, leaves_b: Sequence[Node], data_b: Bytes) -> Alignment:
        return cls(align(pieces(leaves_a, data_a), pieces(leaves_b, data_b)), data_a, data_b)

    def row(self, i: int) -> Row:
        s = int(np.searchsorted(self.starts, i, side="right")) - 1
        seg, r = self.segments[s], i - int(self.starts[s])

        def side(p: Piece | None) -> tuple[int | None, int]:
            if p is None or r * ROW >= p.size:
                return None, 0
            return p.offset + r * ROW, min(ROW, p.size - r * ROW)

        (ao, al), (bo, bl) = side(seg.a), side(seg.b)
        return Row(i, s, r == 0, ao, al, bo, bl)

    def row_of(self, offset: int, side: str = "a") -> int | None:
        """The row showing byte ``offset`` of file A (``side="b"``: of B)."""
        for s, seg in enumerate(self.segments):
            p = seg.a if side == "a" else seg.b
            if p is not None and p.offset <= offset < p.offset + p.size:
                return int(self.starts[s]) + (offset - p.offset) // ROW
        return None

    def bytes_of(self, r: Row) -> tuple[bytes, bytes]:
        a = bytes(np.asarray(self.data_a[r.a_off : r.a_off + r.a_len], np.uint8)) if r.a_off is not None else b""
        b = bytes(np.asarray(self.data_b[r.b_off : r.b_off + r.b_len], np.uint8)) if r.b_off is not None else b""
        return a, b

    def differs(self, i: int) -> bool:
        a, b = self.bytes_of(self.row(i))
        return a != b

    def next_diff(self, after: int, backward: bool = False) -> int | None:
        """The first row after (``backward``: the last before) row ``after`` whose two sides differ, wrapping
        round the end; None when the aligned bytes are the same everywhere."""
        n, total = len(self.segments), self.total_rows
        if n == 0 or total == 0:
            return None
        after = max(-1, min(after, total))
        spans = [(after + 1, total), (0, after + 1)] if not backward else [(0, after), (after, total)]
        for lo, hi in spans:
            if lo >= hi:
                continue
            seg_range = range(self._segment(lo), self._segment(hi - 1) + 1)
            for s in (reversed(seg_range) if backward else seg_range):
                base = int(self.starts[s])
                r = self._diff_in(s, max(0, lo - base), min(self.segments[s].rows, hi - base), backward)
                if r is not None:
                    return base + r
        return None

    def _segment(self, row: int) -> int:
        return int(np.searchsorted(self.starts, row, side="right")) - 1

    def _diff_in(self, s: int, r0: int, r1: int, last: bool) -> int | None:
        """The first (``last``: the last) row in ``[r0, r1)`` of segment ``s`` whose sides differ."""
        if r0 >= r1:
            return None
        seg = self.segments[s]
        if seg.a is None or seg.b is None:  # a leaf only one file has: one difference, at its first row
            return 0 if r0 == 0 else None
        common = min(seg.a.size, seg.b.size)
        # the sides' lengths part from this row on: every row from it differs
        tail = common // ROW if seg.a.size != seg.b.size else None
        if last and tail is not None and r1 - 1 >= tail:
            return r1 - 1
        lo, hi = r0 * ROW, min(common, r1 * ROW)
        starts = range(lo, hi, CHUNK)
        for c in (reversed(starts) if last else starts):
            e = min(hi, c + CHUNK)
            xa = np.asarray(self.data_a[seg.a.offset + c : seg.a.offset + e], np.uint8)
            xb = np.asarray(self.data_b[seg.b.offset + c : seg.b.offset + e], np.uint8)
            d = np.flatnonzero(xa != xb)
            if d.size:
                return int((c + int(d[-1] if last else d[0])) // ROW)
        if not last and tail is not None and max(tail, r0) < r1:
            return max(tail, r0)
        return None
