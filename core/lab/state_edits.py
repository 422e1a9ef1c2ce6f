"""Edits of a state's bytes, and their making: in memory, or in place in a file (``kvscope corrupt``: memory
about what the edits touch, not the file's size). What a corruption plans (:mod:`kvscope.core.lab.corruptions`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

_CHUNK = 4 << 20  # bytes per step of the on-disk edits


@dataclass(frozen=True)
class Edit:
    """One change, in offsets of the bytes it was planned on.

    ``write``: ``data`` at ``off``; ``fill``: the ``n`` bytes from ``off`` become ``data`` repeated (``n`` is a
    multiple of its length); ``swap``: the ``n`` bytes at ``off`` and those at ``other`` trade places;
    ``delete``: the ``n`` bytes at ``off`` go, what follows moves up; ``cut``: everything from ``off`` goes;
    ``append``: ``n`` bytes of ``data`` (one byte) at the end. A plan's writes, fills and swaps never overlap;
    the deletes, cut and append are made after them.
    """

    op: str
    off: int = 0
    n: int = 0
    data: bytes = b""
    other: int = 0



@dataclass(frozen=True)
class Damage:
    """A planned mutation: its edits, what it does in words, the input byte ranges it touches, the size after."""

    edits: tuple[Edit, ...]
    description: str
    ranges: tuple[tuple[int, int], ...]
    size: int



# ---------------------------------------------------------------------------------------------
# making the edits: in memory, or in place in a file


def _in_place(edits: Sequence[Edit]) -> tuple[list[Edit], list[Edit], Edit | None, Edit | None]:
    """(writes, fills and swaps in order; deletes by offset; the cut; the append)."""
    fixed = [e for e in edits if e.op in ("write", "fill", "swap")]
    deletes = sorted((e for e in edits if e.op == "delete"), key=lambda e: e.off)
    cut = next((e for e in edits if e.op == "cut"), None)
    append = next((e for e in edits if e.op == "append"), None)
    return fixed, deletes, cut, append


def apply_edits(data: bytes, edits: Sequence[Edit]) -> bytes:
    """``data`` with ``edits`` made, as new bytes."""
    out = bytearray(data)
    fixed, deletes, cut, append = _in_place(edits)
    for e in fixed:
        if e.op == "write":
            out[e.off : e.off + len(e.data)] = e.data
        elif e.op == "fill":
            out[e.off : e.off + e.n] = e.data * (e.n // len(e.data))
        else:
            x = bytes(out[e.off : e.off + e.n])
            out[e.off : e.off + e.n] = out[e.other : e.other + e.n]
            out[e.other : e.other + e.n] = x
    for e in reversed(deletes):
        del out[e.off : e.off + e.n]
    if cut is not None:
        del out[cut.off :]
    if append is not None:
        out += append.data * append.n
    return bytes(out)


def _pwrite(fd: int, data: bytes | memoryview, off: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, off)
        view, off = view[n:], off + n


def _pread(fd: int, n: int, off: int) -> bytes:
    out = os.pread(fd, n, off)
    while len(out) < n:
        more = os.pread(fd, n - len(out), off + len(out))
        if not more:
            raise OSError(f"short read at byte {off + len(out)}")
        out += more
    return out


def _fill_fd(fd: int, off: int, n: int, unit: bytes) -> None:
    piece = unit * max(1, _CHUNK // len(unit))
    done = 0
    while done < n:
        m = min(n - done, len(piece))
        _pwrite(fd, memoryview(piece)[:m], off + done)
        done += m


def apply_edits_fd(fd: int, size: int, edits: Sequence[Edit]) -> int:
    """Make ``edits`` in place in the file open read-write as ``fd`` (``size`` bytes); its new size. Memory: a
    few pieces of :data:`_CHUNK` bytes, whatever the file's size (a swap and a delete move data piece by piece)."""
    fixed, deletes, cut, append = _in_place(edits)
    for e in fixed:
        if e.op == "write":
            _pwrite(fd, e.data, e.off)
        elif e.op == "fill":
            _fill_fd(fd, e.off, e.n, e.data)
        else:
            for k in range(0, e.n, _CHUNK):
                m = min(_CHUNK, e.n - k)
                x, y = _pread(fd, m, e.off + k), _pread(fd, m, e.other + k)
                _pwrite(fd, y, e.off + k)
                _pwrite(fd, x, e.other + k)
    if deletes:  # one pass: every kept run moves up to where the bytes before it end
        dst = deletes[0].off
        for i, e in enumerate(deletes):
            lo, hi = e.off + e.n, deletes[i + 1].off if i + 1 < len(deletes) else size
            for k in range(lo, hi, _CHUNK):
                m = min(_CHUNK, hi - k)
                _pwrite(fd, _pread(fd, m, k), dst)
                dst += m
        size = dst
        os.ftruncate(fd, size)
    if cut is not None:
        size = cut.off
        os.ftruncate(fd, size)
    if append is not None:
        _fill_fd(fd, size, append.n, append.data)
        size += append.n
    return size
