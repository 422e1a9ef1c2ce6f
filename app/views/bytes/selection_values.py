"""The values a byte selection holds, decoded as the record's own type (pure Python + numpy, no Qt).

A selection inside a K/V/r/s payload is widened to whole elements (whole blocks for a quantized type)
and dequantized with gguf-py (:func:`kvscope.core.analysis.record_values.dequantize_rows`): an f16 row
shows as 64 floats, a q8_0 row as its 32-value blocks. Token ids are int32. Anything else has no type
of its own; the inspector then shows its per-type readings of the cursor byte only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from kvscope.app.document.doc_index import DocumentIndex
from kvscope.core import ggml_types as gt
from kvscope.core.analysis.record_values import dequantize_rows, derotates

VALUE_LIMIT = 1 << 16  # values decoded at most (a bigger selection shows its first ones)


@dataclass(frozen=True)
class Decoded:
    """``values`` of ``type`` held by bytes ``[offset, offset + length)`` (the selection widened to whole
    elements or blocks, perhaps cut at :data:`VALUE_LIMIT`)."""

    type: str
    offset: int
    length: int
    values: npt.NDArray[Any]
    where: str  # the record or array the values belong to
    note: str = ""  # widened / cut / transposed layout

    def summary(self) -> str:
        """One line: count, type, where, and min / max / mean of the finite values."""
        v = self.values
        text = f"{v.size:,} {self.type} value" + ("" if v.size == 1 else "s") + f" of {self.where}"
        if v.size and v.dtype.kind == "f":
            fin = v[np.isfinite(v)]
            bad = int(v.size - fin.size)
            if fin.size:
                text += f" · min {fin.min():.6g} · max {fin.max():.6g} · mean {float(fin.mean()):.6g}"
            if bad:
                text += f" · {bad:,} non-finite"
        return text + (f" ({self.note})" if self.note else "")

    def text(self, limit: int | None = None, sep: str = ", ") -> str:
        """The values as text (floats with 7 significant digits, NaN/Inf spelled out)."""
        vals = self.values if limit is None else self.values[:limit]
        items = [_float(float(x)) for x in vals] if vals.dtype.kind == "f" else [str(int(x)) for x in vals]
        more = "" if limit is None or self.values.size <= limit else f"{sep}… ({self.values.size - limit:,} more)"
        return sep.join(items) + more


def _float(x: float) -> str:
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Inf" if x > 0 else "-Inf"
    return f"{x:.7g}"


def _read(data: Any, lo: int, hi: int) -> npt.NDArray[np.uint8]:
    return np.asarray(data[lo:hi], dtype=np.uint8)


def decode_selection(index: DocumentIndex, data: Any, offset: int, length: int,
                     limit: int = VALUE_LIMIT) -> Decoded | None:
    """The values of ``[offset, offset + length)`` as the type of the record or array holding ``offset``."""
    leaf = index.leaf_at(offset)
    if leaf is None or length <= 0:
        return None
    size = int(data.size)
    end = min(offset + length, leaf.end, size)
    if leaf.kind == "tokens":
        lo = leaf.offset + (offset - leaf.offset) // 4 * 4
        hi = min(leaf.end, size, lo + 4 * limit, lo + -(-(end - lo) // 4) * 4)
        hi -= (hi - lo) % 4
        if hi <= lo:
            return None
        ids = _read(data, lo, hi).view("<i4").astype(np.int64)
        return Decoded("i32", lo, hi - lo, ids, "the token ids", _note(offset, length, lo, hi))
    rec = index.record_of(leaf)
    if rec is None or not leaf.kind.endswith("_rows") or not gt.is_known_type(rec.type_id):
        return None
    where = f"{rec.role.upper() if rec.role in ('k', 'v') else rec.role} layer {'?' if rec.il is None else rec.il}"
    p0, p1 = rec.data_offset, min(rec.data_offset + rec.data_size, size)
    lo, hi = max(offset, p0), min(end, p1)
    if hi <= lo:
        return None
    if rec.transposed:
        el = rec.el_bytes
        if el <= 0:
            return None
        unit, per = el, 1
        layout = f"transposed V: value k is channel k // {rec.n_rows:,}, cell k % {rec.n_rows:,} of the record"
    else:
        unit, per = gt.type_size(rec.type_id), gt.block_size(rec.type_id)
        row = rec.row_bytes
        first_row = (lo - p0) // row if row > 0 else 0
        layout = f"from cell {first_row:,}" if row > 0 else ""
    a = p0 + (lo - p0) // unit * unit
    b = p0 + -(-(hi - p0) // unit) * unit
    b = min(b, p1 - (p1 - p0) % unit, a + max(1, limit // per) * unit)
    if b <= a:
        return None
    raw = _read(data, a, b)
    with np.errstate(all="ignore"):
        vals = dequantize_rows(raw.reshape(1, -1), rec.type_id).reshape(-1)
    rotated = f"as stored: Hadamard-rotated in blocks of {rec.rot_block} (the Layers view de-rotates)" \
        if derotates(rec) else ""
    note = ", ".join(x for x in (_note(offset, length, a, b, unit if per > 1 else 0), layout, rotated) if x)
    return Decoded(rec.type, a, b - a, vals, where, note)


def _note(offset: int, length: int, lo: int, hi: int, block: int = 0) -> str:
    if lo == offset and hi == offset + length:
        return ""
    if hi < offset + length and lo <= offset:
        return f"the first {hi - lo:,} bytes"
    return f"widened to whole {block}-byte blocks" if block else "widened to whole values"
