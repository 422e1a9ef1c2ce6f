"""A record's payload as values: dequantized (gguf-py), de-rotated where llama.cpp stored it rotated.

:func:`record_rows` and :func:`layer_matrix` give one K/V/r/s record as a float32 ``[cell, dim]``
matrix, reading only the rows (or kept dims) asked for, in bounded ``pread`` pieces; the GUI's
heatmaps, :mod:`kvscope.core.analysis.diff`, verify's comparison and :mod:`kvscope.core.analysis.stats` use them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeAlias

import numpy as np
import numpy.typing as npt
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from kvscope.core import ggml_types as gt
from kvscope.core.derotate_kernel import decode
from kvscope.core.reader.records import LayerRecord, ParseResult
from kvscope.core.reader.rotation import rotate_blocks
from kvscope.core.reader.source import ByteSource, FileChangedError

F32A = npt.NDArray[np.float32]
U8A = npt.NDArray[np.uint8]
I64A = npt.NDArray[np.int64]
Bytes: TypeAlias = ByteSource | U8A | bytes | bytearray | None

_F16, _BF16, _F32 = GGMLQuantizationType.F16, GGMLQuantizationType.BF16, GGMLQuantizationType.F32


def as_source(data: ByteSource | U8A | bytes | bytearray) -> ByteSource:
    """``data`` as a :class:`ByteSource` (bytes and arrays are wrapped, a source is returned as is)."""
    return data if isinstance(data, ByteSource) else ByteSource(np.asarray(data).reshape(-1).view(np.uint8)
                                                               if isinstance(data, np.ndarray) else data)


@contextmanager
def source_of(res: ParseResult, data: Bytes = None) -> Iterator[ByteSource]:
    """The bytes ``res`` was parsed from, for one pass: ``data`` when given, else ``res.path``
    opened read-only (and closed afterwards).

    A file is checked when the pass ends (:meth:`ByteSource.check`): a file that changed since it
    was opened, or whose size is no longer the size ``res`` was parsed at, raises
    :class:`FileChangedError`, as does a short read during the pass.
    """
    if data is not None:
        src = as_source(data)
        yield src
        src.check()
        return
    if not os.path.isfile(res.path):
        raise ValueError(f"{res.path}: the bytes of this result are not available (pass data=)")
    with ByteSource.open(res.path) as src:
        if src.size != res.size:
            raise FileChangedError(res.path, f"{src.size} bytes, parsed at {res.size}")
        yield src
        src.check()


def record_shape(rec: LayerRecord, avail: int | None = None) -> tuple[int, int]:
    """``(rows present, values per row)`` of ``rec``; rows are cells, a transposed V counts whole columns.

    ``avail`` clips the payload to the bytes present in the file. Values per row is 0 when the
    row is not whole blocks of a type gguf-py knows.
    """
    size = rec.data_size if avail is None else max(0, min(rec.data_size, avail))
    if rec.transposed:
        col = rec.n_rows * rec.el_bytes
        return (rec.n_rows if col and size >= col * rec.n_embd_v_gqa else 0), rec.n_embd_v_gqa
    if rec.row_bytes <= 0 or not gt.is_known_type(rec.type_id):
        return 0, 0
    return size // rec.row_bytes, gt.elements_in_row(rec.type_id, rec.row_bytes) or 0


def dequantize_rows(raw: U8A, type_id: int) -> F32A:
    """Float32 values of ``raw`` (uint8, whole blocks; any shape whose last axis is whole blocks).

    f16/bf16/f32/q8_0/q4_0 are decoded by the compiled kernel where it runs
    (:func:`kvscope.core.derotate_kernel.decode`: F16C, whatever numpy's own float16 cast costs on
    this CPU), the values of :func:`numpy_dequantize_rows` bit for bit but a NaN's payload.
    """
    fast = decode(raw, type_id)
    return fast if fast is not None else numpy_dequantize_rows(raw, type_id)


def numpy_dequantize_rows(raw: U8A, type_id: int) -> F32A:
    """:func:`dequantize_rows` with numpy and gguf-py alone: the reference, and the path where the kernel
    does not run."""
    qt = GGMLQuantizationType(type_id)
    if qt == _F16:
        return raw.view(np.float16).astype(np.float32)
    if qt == _BF16:
        return np.left_shift(raw.view(np.uint16), 16, dtype=np.uint32).view(np.float32)
    if qt == _F32:
        return raw.view(np.float32).copy()
    bs, ts = GGML_QUANT_SIZES[qt]
    shape = (*raw.shape[:-1], raw.shape[-1] // ts * bs)  # explicit: no -1 to infer when there are 0 rows
    fast = _FAST.get(qt)
    if fast is not None:
        blocks = raw.reshape(-1, ts)
        out = np.empty((blocks.shape[0], bs), np.float32)
        fast(blocks, np.ascontiguousarray(blocks[:, :2]).view(np.float16).astype(np.float32), out)
        return out.reshape(shape)
    if not raw.size:
        return np.zeros(shape, np.float32)
    flat = np.asarray(dequantize(np.ascontiguousarray(raw).reshape(1, -1), qt), dtype=np.float32)
    return flat.reshape(shape)


# The two quantized K/V types llama-server users pick most, decoded in one pass into the result
# (gguf-py's split/astype/multiply makes four: 5.7x slower on the 256 KiB pieces --stats decodes, 2x
# on 64 MiB): the same float32 products, bit for bit.
@np.errstate(all="ignore")  # a NaN/Inf scale is data here
def _q8_0(blocks: U8A, d: F32A, out: F32A) -> None:
    np.multiply(blocks[:, 2:].view(np.int8), d, out=out, casting="unsafe")  # int8 -> float32 is exact


@np.errstate(all="ignore")
def _q4_0(blocks: U8A, d: F32A, out: F32A) -> None:
    qs, half = blocks[:, 2:], out.shape[1] // 2
    np.bitwise_and(qs, np.uint8(0x0F), out=out[:, :half], casting="unsafe")  # low nibbles first
    np.right_shift(qs, np.uint8(4), out=out[:, half:], casting="unsafe")
    np.subtract(out, np.float32(8), out=out)
    np.multiply(out, d, out=out)


_FAST = {GGMLQuantizationType.Q8_0: _q8_0, GGMLQuantizationType.Q4_0: _q4_0}


_GATHER_SPAN = 4 << 20  # bytes one read of a gather covers at most
_GATHER_GAP = 64 << 10  # items further apart than this are read separately


class _Gather:
    """Where ``w``-byte items ``idx`` (item units from a base offset, any order) lie: groups of
    nearby items, each read with one ``pread`` of at most ``_GATHER_SPAN`` bytes."""

    def __init__(self, idx: I64A, w: int) -> None:
        self.w = w
        self.order = np.argsort(idx, kind="stable")
        s = idx[self.order]
        self.sorted = s
        self.groups: list[tuple[int, int, int, int]] = []  # (a, b, lo, hi): sorted[a:b] in items [lo, hi)
        if not s.size:
            return
        per = max(1, _GATHER_SPAN // max(1, w))
        brk = np.flatnonzero(np.diff(s) * w > _GATHER_GAP) + 1
        for a, b in zip([0, *brk.tolist()], [*brk.tolist(), int(s.size)], strict=True):
            while a < b:
                lo = int(s[a])
                e = a + int(np.searchsorted(s[a:b], lo + per, side="left"))
                self.groups.append((a, e, lo, int(s[e - 1]) + 1))
                a = e

    def read(self, src: ByteSource, base: int, out: U8A, buf: U8A) -> None:
        """``out[i] = src[base + idx[i] * w : + w]`` (``out`` is ``(len(idx), w)``; ``buf`` scratch)."""
        w = self.w
        for a, b, lo, hi in self.groups:
            n = (hi - lo) * w
            piece = buf[:n]
            if src.readinto(base + lo * w, piece) != n:
                raise ValueError("record bytes past the end of the file")
            out[self.order[a:b]] = piece.reshape(-1, w)[self.sorted[a:b] - lo]


def _gather_buf() -> U8A:
    return np.empty(_GATHER_SPAN, np.uint8)


@np.errstate(all="ignore")  # a NaN/Inf block scale is data here, not an error
def derotates(rec: LayerRecord) -> bool:
    """Are ``rec``'s rows stored Hadamard-rotated (and so de-rotated when read here)?

    Only rows of whole rotation blocks can be (a block size from a damaged file may not fit).
    """
    if not rec.rotated or rec.rot_block <= 0 or rec.transposed or not gt.is_known_type(rec.type_id):
        return False
    n = gt.elements_in_row(rec.type_id, rec.row_bytes)
    return n is not None and n > 0 and n % rec.rot_block == 0


def record_rows(
    src: ByteSource, rec: LayerRecord, cells: I64A | slice, dims: slice = slice(None), derotate: bool = True
) -> F32A:
    """Dequantized ``[cells, dims]`` of ``rec`` as float32 (cells are indices in file order).

    Rows stored Hadamard-rotated (``rec.rotated``) are de-rotated first, exactly as llama.cpp's
    inverse (:mod:`kvscope.core.reader.rotation`), unless ``derotate`` is False. Only the rows (or, for
    a transposed V, the kept dims of the kept cells) are read, in ``pread`` pieces of at most
    4 MiB; memory is the result's raw bytes plus one piece.
    """
    n, dim = record_shape(rec, src.size - rec.data_offset)
    idx = np.arange(n, dtype=np.int64)[cells] if isinstance(cells, slice) else np.asarray(cells, np.int64)
    buf = _gather_buf()
    if rec.transposed:
        el = rec.el_bytes
        kept = range(dim)[dims]
        raw = np.empty((idx.size, len(kept), el), np.uint8)
        plan = _Gather(idx, el)
        col = np.empty((idx.size, el), np.uint8)
        for j, d in enumerate(kept):
            plan.read(src, rec.data_offset + d * rec.n_rows * el, col, buf)
            raw[:, j, :] = col
        return dequantize_rows(raw.reshape(idx.size, len(kept) * el), rec.type_id)
    rows = np.empty((idx.size, rec.row_bytes), np.uint8)
    _Gather(idx, rec.row_bytes).read(src, rec.data_offset, rows, buf)
    values = dequantize_rows(rows, rec.type_id)
    if derotate and derotates(rec):
        values = rotate_blocks(values, rec.rot_block)
    return values[:, dims]


def layer_matrix(
    res: ParseResult, rec: LayerRecord, max_rows: int | None = None, max_cols: int | None = None, data: Bytes = None
) -> F32A:
    """One record as float32 ``[cell, dim]`` (a transposed V is transposed back).

    With ``max_rows``/``max_cols`` every k-th cell/dim is kept so the result fits (stride
    downsampling; only the kept cells are read and decoded). Raises ValueError for a type
    gguf-py cannot decode; a truncated transposed V gives zero rows. Raises
    :class:`FileChangedError` when the file changed since ``data`` was opened (or since the parse).
    """
    with source_of(res, data) as src:
        n, dim = record_shape(rec, src.size - rec.data_offset)
        if dim == 0:
            raise ValueError(f"{rec.type} rows of {rec.row_bytes} bytes cannot be decoded")
        rs = -(-n // max_rows) if max_rows and n > max_rows else 1
        cs = -(-dim // max_cols) if max_cols and dim > max_cols else 1
        try:
            return np.ascontiguousarray(record_rows(src, rec, slice(0, n, rs), slice(0, dim, cs)))
        except NotImplementedError as e:
            raise ValueError(f"cannot decode {rec.type}: {e}") from None
