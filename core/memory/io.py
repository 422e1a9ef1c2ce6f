"""The io seam: sinks that state writers write to, readers that state readers read from.

Mirrors ``llama_io_write_i`` / ``llama_io_read_i`` (spec §3.3). A reader offers ``read(n)``,
``read_tensor(...)``, ``discard()`` and ``n_bytes``; what differs between llama.cpp's readers is
*when* tensor bytes land:

* ``file`` kind (``llama_io_read_file``, and the buffer API before PR #22679): immediately.
* ``buffer`` kind (``llama_io_read_host``): deferred to :meth:`StateReader.finish` (the
  destructor); :meth:`StateReader.discard` drops them (0c1e5709 calls it on failure).

``read_tensor(store, flat, offset, size, count, stride)`` stands for ``count`` llama.cpp
``read_tensor`` calls of ``size`` bytes at ``offset + i * stride``: on a short input the calls
that fit are handed over and the first that does not raises ``truncated`` at its offset.
"""

from __future__ import annotations

import io
import struct
from abc import ABC, abstractmethod
from typing import Any, BinaryIO

import numpy as np
import numpy.typing as npt
import torch

from kvscope.core.fileio import pread_into
from kvscope.core.memory.result import RestoreFailure
from kvscope.core.memory.tensors import TensorStore
from kvscope.core.reader.source import FileChangedError

U8 = npt.NDArray[np.uint8]
Raw = bytes | npt.NDArray[Any]
Runs = list[tuple[int, int]]
CHUNK = 8 << 20
WINDOW = 64 << 20  # FileReader: largest tensor read into its buffer at a time

_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_U64 = struct.Struct("<Q")


# ---------------------------------------------------------------------------------------------
# sinks


class StateSink(ABC):
    """Where a state writer puts bytes; ``n_bytes`` counts them (``llama_io_write_i::n_bytes``)."""

    n_bytes: int = 0

    @abstractmethod
    def write(self, data: Raw) -> None:
        """Raw bytes (a C-contiguous array is written as its bytes)."""

    @abstractmethod
    def write_rows(self, mat: U8, runs: Runs) -> None:
        """Rows ``a:b`` of each run of the 2-D ``mat``, run after run."""

    @abstractmethod
    def write_cols(self, mat: U8, runs: Runs) -> None:
        """For every row of ``mat``, its byte columns ``a:b`` of each run (a transposed V)."""

    def u32(self, v: int) -> None:
        """Write a little-endian uint32."""
        self.write(_U32.pack(v))

    def i32(self, v: int) -> None:
        """Write a little-endian int32."""
        self.write(_I32.pack(v))

    def u64(self, v: int) -> None:
        """Write a little-endian uint64."""
        self.write(_U64.pack(v))


def _run_bytes(runs: Runs) -> int:
    return sum(b - a for a, b in runs)


class CountingSink(StateSink):
    """Counts only (``llama_io_write_dummy``): the size of a state before writing it."""

    def __init__(self) -> None:
        self.n_bytes = 0

    def write(self, data: Raw) -> None:
        """Count the bytes."""
        self.n_bytes += len(data) if isinstance(data, bytes) else int(data.nbytes)

    def write_rows(self, mat: U8, runs: Runs) -> None:
        """Count the bytes."""
        self.n_bytes += _run_bytes(runs) * int(mat.shape[1])

    def write_cols(self, mat: U8, runs: Runs) -> None:
        """Count the bytes."""
        self.n_bytes += _run_bytes(runs) * int(mat.shape[0])


class BufferSink(StateSink):
    """Fills a preallocated ``bytearray`` of the exact state size (``llama_io_write_buffer``)."""

    def __init__(self, size: int) -> None:
        self.buf = bytearray(size)
        self._out: U8 = np.frombuffer(self.buf, dtype=np.uint8)
        self.n_bytes = 0

    def _take(self, n: int) -> U8:
        if self.n_bytes + n > self._out.size:
            raise RuntimeError("state grew between the size pass and the write pass")
        out = self._out[self.n_bytes : self.n_bytes + n]
        self.n_bytes += n
        return out

    def write(self, data: Raw) -> None:
        """Copy the bytes into the buffer."""
        src = np.frombuffer(data, np.uint8) if isinstance(data, bytes) else data.reshape(-1).view(np.uint8)
        self._take(int(src.size))[...] = src

    def write_rows(self, mat: U8, runs: Runs) -> None:
        """Copy the rows into the buffer."""
        for a, b in runs:
            self._take((b - a) * int(mat.shape[1])).reshape(b - a, mat.shape[1])[...] = mat[a:b]

    def write_cols(self, mat: U8, runs: Runs) -> None:
        """Copy the column ranges of every row into the buffer (one strided copy per run)."""
        width = _run_bytes(runs)
        out = self._take(width * int(mat.shape[0])).reshape(mat.shape[0], width)
        c = 0
        for a, b in runs:
            out[:, c : c + b - a] = mat[:, a:b]
            c += b - a


class FileSink(StateSink):
    """Streams to a binary file object; big payloads go out without an intermediate copy."""

    def __init__(self, fh: BinaryIO) -> None:
        self.fh = fh
        self.n_bytes = 0

    def write(self, data: Raw) -> None:
        """Write the bytes (an array goes out from its own memory)."""
        if isinstance(data, bytes):
            self.fh.write(data)
            self.n_bytes += len(data)
            return
        arr = np.ascontiguousarray(data)
        self.fh.write(arr.reshape(-1).view(np.uint8).data)
        self.n_bytes += int(arr.nbytes)

    def write_rows(self, mat: U8, runs: Runs) -> None:
        """Write each run of rows straight from the tensor memory."""
        for a, b in runs:
            self.write(mat[a:b])

    def write_cols(self, mat: U8, runs: Runs) -> None:
        """Write the column ranges of every row, gathered in chunks of at most 8 MiB."""
        rows, cols = int(mat.shape[0]), int(mat.shape[1])
        if runs == [(0, cols)]:
            self.write(mat)
            return
        width = _run_bytes(runs)
        step = max(1, CHUNK // max(1, width))
        for r0 in range(0, rows, step):
            part = mat[r0 : r0 + step]
            self.write(np.concatenate([part[:, a:b] for a, b in runs], axis=1))


# ---------------------------------------------------------------------------------------------
# readers


class StateReader(ABC):
    """What a state reader reads from; ``pos`` is the absolute offset of the next byte."""

    kind = "buffer"
    pos = 0
    start = 0

    @property
    def n_bytes(self) -> int:
        """Bytes consumed since the reader was made (``llama_io_read_i::n_bytes``)."""
        return self.pos - self.start

    @property
    @abstractmethod
    def size(self) -> int:
        """Absolute end offset of the input."""

    def _short(self, what: str, need: int) -> RestoreFailure:
        have = max(0, self.size - self.pos)
        return RestoreFailure("truncated", self.pos, f"unexpectedly reached end of input reading {what}: "
                              f"{need} bytes needed at offset {self.pos}, {have} present", thrown=True)

    @abstractmethod
    def read(self, n: int, what: str = "data") -> bytes | U8:
        """``n`` bytes, or ``truncated`` (a thrown failure) when fewer remain."""

    def u32(self, what: str = "u32") -> int:
        """Read a little-endian uint32."""
        return int(_U32.unpack(bytes(self.read(4, what)))[0])

    def i32(self, what: str = "i32") -> int:
        """Read a little-endian int32."""
        return int(_I32.unpack(bytes(self.read(4, what)))[0])

    def u64(self, what: str = "u64") -> int:
        """Read a little-endian uint64."""
        return int(_U64.unpack(bytes(self.read(8, what)))[0])

    def i32_array(self, n: int, what: str) -> npt.NDArray[np.int32]:
        """Read ``n`` little-endian int32 values."""
        raw = self.read(4 * n, what)
        return np.frombuffer(raw if isinstance(raw, bytes) else raw.tobytes(), dtype="<i4").astype(np.int32)

    def _fit(self, size: int, count: int) -> int:
        """How many of ``count`` calls of ``size`` bytes the input still holds."""
        if size == 0:
            return count
        return min(count, max(0, self.size - self.pos) // size)

    @abstractmethod
    def read_tensor(self, store: TensorStore, flat: torch.Tensor, offset: int, size: int, count: int = 1,
                    stride: int = 0, what: str = "tensor data") -> None:
        """``count`` ``read_tensor`` calls of ``size`` bytes into ``flat`` at ``offset + i * stride``."""

    def discard(self) -> None:  # noqa: B027 - a hook; immediate readers have nothing to drop
        """Drop deferred tensor writes (a no-op for immediate readers)."""

    def finish(self) -> None:  # noqa: B027 - a hook; immediate readers have nothing to apply
        """Apply deferred tensor writes (llama.cpp does it in the reader's destructor)."""


class BufferReader(StateReader):
    """``llama_io_read_host`` over bytes in memory; ``deferred=False`` gives the ``file`` kind."""

    def __init__(self, data: bytes | bytearray | memoryview | U8, deferred: bool = True, start: int = 0) -> None:
        self._arr: U8 = data if isinstance(data, np.ndarray) else np.frombuffer(data, dtype=np.uint8)
        self.deferred = deferred
        self.kind = "buffer" if deferred else "file"
        self.pos = self.start = start
        self._pending: list[tuple[TensorStore, torch.Tensor, int, int, int, U8]] = []

    @property
    def size(self) -> int:
        """Absolute end offset of the input."""
        return int(self._arr.size)

    def read(self, n: int, what: str = "data") -> U8:
        """A view of the next ``n`` bytes."""
        if n < 0 or self.pos + n > self.size:
            raise self._short(what, n)
        out = self._arr[self.pos : self.pos + n]
        self.pos += n
        return out

    def read_tensor(self, store: TensorStore, flat: torch.Tensor, offset: int, size: int, count: int = 1,
                    stride: int = 0, what: str = "tensor data") -> None:
        """Hand the rows over: recorded for :meth:`finish` (buffer kind) or written now (file kind)."""
        fit = self._fit(size, count)
        if fit:
            src = self._arr[self.pos : self.pos + fit * size]
            if self.deferred:
                self._pending.append((store, flat, offset, stride or size, fit, src))
            else:
                store.write(flat, offset, src, stride or size, fit)
            self.pos += fit * size
        if fit < count:
            raise self._short(what, size)

    def discard(self) -> None:
        """Drop the recorded tensor writes."""
        self._pending.clear()

    def finish(self) -> None:
        """Apply the recorded tensor writes, in order."""
        pending, self._pending = self._pending, []
        for store, flat, offset, stride, count, src in pending:
            store.write(flat, offset, src, stride, count)


class FileReader(StateReader):
    """``llama_io_read_file``: reads a binary file object, tensor bytes straight into the tensors.

    Tensor payloads of a real file are read with ``pread`` into one reused buffer of at most
    ``WINDOW`` bytes (or one row, when a row is larger), then copied into the tensors: no memory
    map, so a file that shrinks meanwhile raises :class:`FileChangedError` instead of ``SIGBUS``.
    Unlike llama.cpp's POSIX reader, a short read is an error here (``truncated``); llama.cpp would
    read past the end without noticing (spec §2.2).
    """

    kind = "file"

    def __init__(self, fh: io.BufferedIOBase, size: int | None = None) -> None:
        self.fh = fh
        self.pos = self.start = fh.tell()
        if size is None:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(self.pos)
        self._size = size
        try:
            self._fd: int | None = fh.fileno()
        except (OSError, io.UnsupportedOperation):
            self._fd = None
        self._buf: U8 = np.empty(0, np.uint8)

    @property
    def size(self) -> int:
        """Absolute end offset of the file."""
        return self._size

    def read(self, n: int, what: str = "data") -> bytes:
        """The next ``n`` bytes of the file."""
        if n < 0 or self.pos + n > self.size:
            raise self._short(what, n)
        data = self.fh.read(n)
        if len(data) != n:
            raise self._short(what, n)
        self.pos += n
        return data

    def _copy_out(self, store: TensorStore, flat: torch.Tensor, offset: int, size: int, count: int,
                  stride: int) -> None:
        nbytes = size * count
        if self._fd is None:
            src = np.frombuffer(self.fh.read(nbytes), dtype=np.uint8)
            if src.size != nbytes:
                raise self._short("tensor data", nbytes)
            store.write(flat, offset, src, stride, count)
            self.pos += nbytes
            return
        if self._buf.size < nbytes:
            self._buf = np.empty(nbytes, np.uint8)
        view = self._buf[:nbytes]
        if pread_into(self._fd, memoryview(view), self.pos) != nbytes:  # type: ignore[arg-type]
            raise FileChangedError(str(getattr(self.fh, "name", "")), f"short read at {self.pos}")
        store.write(flat, offset, view, stride, count)
        self.pos += nbytes
        self.fh.seek(self.pos)

    def read_tensor(self, store: TensorStore, flat: torch.Tensor, offset: int, size: int, count: int = 1,
                    stride: int = 0, what: str = "tensor data") -> None:
        """Copy the rows into the tensor now, window by window."""
        fit = self._fit(size, count)
        stride = stride or size
        done = 0
        while done < fit:
            n = max(1, min(fit - done, WINDOW // max(1, size)))
            self._copy_out(store, flat, offset + done * stride, size, n, stride)
            done += n
        if fit < count:
            raise self._short(what, size)
