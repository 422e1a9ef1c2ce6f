"""Bounds-checked little-endian access to the bytes of a state file, read with ``pread``.

A :class:`ByteSource` never maps the file. Every byte is copied with a bounded ``os.pread``
(scalars through a small block cache, arrays into fresh arrays of the size asked for, payload
scans into the caller's reused buffers), so a file that shrinks while it is read yields a short
read, raised as :class:`FileChangedError`, where a memory map would have died of ``SIGBUS``.

Every read states how many bytes it needs and returns ``None`` (or fewer values) when the
file, as it was when opened, does not hold them, so parsers never raise on short input and
never allocate from an untrusted count.

A change of the file is detected by its :class:`FileIdentity` (size, ``mtime_ns``, inode,
device), taken when it is opened: :meth:`ByteSource.changed` compares it with the open file and
with what the path names now, :meth:`ByteSource.check` raises :class:`FileChangedError`. Readers
call ``check()`` after each pass over the bytes (a parse, a statistics scan, a diff), so a file
rewritten in place or replaced during the pass is reported instead of half-read.
"""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Self, overload

import numpy as np
import numpy.typing as npt

from kvscope.core.errors import InputError
from kvscope.core.fileio import CHANGED_MESSAGE, FileIdentity, open_regular, pread_into

__all__ = ["CHANGED_MESSAGE", "ByteSource", "FileChangedError", "FileIdentity"]

_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_U64 = struct.Struct("<Q")

BLOCK = 1 << 12  # bytes per cached block of small reads
CACHE_BLOCKS = 256  # blocks kept (1 MiB); the cache is dropped whole when full
CHUNK = 1 << 20  # bytes per step of chunked reads (find, chunks)
MAX_SLICE = 64 << 20  # the largest ``src[a:b]`` copy (bigger reads go through chunks())


class FileChangedError(InputError):
    """The file changed (size, mtime, inode or device) while it was read; ``str()`` is the message."""

    def __init__(self, path: str, detail: str = "") -> None:
        super().__init__(CHANGED_MESSAGE)
        self.path = path
        self.detail = detail  # what was seen (for logs); the message stays fixed


class ByteSource:
    """Read-only access to a file's (or a buffer's) bytes with bounds-checked scalar and array reads.

    ``ByteSource(data)`` wraps bytes in memory; :meth:`open` reads a file with ``pread``. A source
    is safe to share between threads. Close file sources with :meth:`close` (or ``with``).
    """

    def __init__(self, data: bytes | bytearray | memoryview | np.ndarray, path: str = "") -> None:
        if isinstance(data, np.ndarray):
            self._arr: npt.NDArray[np.uint8] | None = data.reshape(-1).view(np.uint8)
        else:
            self._arr = np.frombuffer(data, dtype=np.uint8)
        self._buf: memoryview | None = memoryview(self._arr)  # type: ignore[arg-type]
        self.size = int(self._arr.size)
        self.path = path
        self.identity: FileIdentity | None = None  # of the file when opened (None: bytes in memory)
        self._fd: int | None = None
        self._blocks: dict[int, bytes] = {}

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> Self:
        """Open the regular file ``path`` read-only (:func:`kvscope.core.fileio.open_regular`: special
        files are refused, ValueError; an unreadable path raises OSError)."""
        p = str(Path(path))
        fd, st = open_regular(p)
        src = cls(b"", p)
        src._arr = src._buf = None
        src._fd = fd
        src.identity = FileIdentity.of(st)
        src.size = src.identity.size
        return src

    # -- lifetime ------------------------------------------------------------------------------
    @property
    def is_file(self) -> bool:
        return self._fd is not None

    def close(self) -> None:
        """Close the file (reads afterwards raise OSError); a no-op for bytes in memory."""
        fd, self._fd = self._fd, None
        self._blocks = {}
        if fd is not None:
            os.close(fd)
            self._fd = -1  # not None: the source stays a (closed) file source

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None and fd >= 0:
            os.close(fd)

    # -- change detection --------------------------------------------------------------------
    def changed(self) -> bool:
        """True when the file is no longer what was opened: the open file's size or mtime moved,
        or the path now names another file (replaced, deleted). Always False for bytes in memory.

        This is the check for a file watcher: it costs two ``stat`` calls and reads nothing.
        """
        if self.identity is None:
            return False
        if self._fd is not None and self._fd >= 0:
            try:
                if FileIdentity.of(os.fstat(self._fd)) != self.identity:
                    return True
            except OSError:
                return True
        return FileIdentity.of_path(self.path) != self.identity

    def check(self) -> None:
        """Raise :class:`FileChangedError` when :meth:`changed` (call it after a pass over the bytes)."""
        if self.changed():
            raise FileChangedError(self.path, "identity changed")

    # -- raw reads ------------------------------------------------------------------------------
    def _pread(self, off: int, n: int) -> bytes:
        """Exactly ``n`` bytes at ``off`` of the file (inside the size it had when opened)."""
        assert self._fd is not None
        data = os.pread(self._fd, n, off)
        if len(data) != n:
            raise FileChangedError(self.path, f"short read at {off}: {len(data)} of {n} bytes")
        return data

    def _block(self, i: int) -> bytes:
        b = self._blocks.get(i)
        if b is None:
            lo = i * BLOCK
            b = self._pread(lo, min(BLOCK, self.size - lo))
            if len(self._blocks) >= CACHE_BLOCKS:
                self._blocks = {}
            self._blocks[i] = b
        return b

    def _small(self, off: int, n: int) -> bytes | memoryview:
        """``n <= BLOCK`` bytes at ``off`` (already bounds-checked)."""
        if self._buf is not None:
            return self._buf[off : off + n]
        i, r = divmod(off, BLOCK)
        if r + n <= BLOCK:
            b = self._block(i)
            return b if (r == 0 and n == len(b)) else memoryview(b)[r : r + n]
        return self._block(i)[r:] + self._block(i + 1)[: r + n - BLOCK]

    def readinto(self, off: int, out: npt.NDArray[np.uint8] | memoryview | bytearray) -> int:
        """Copy the bytes at ``off`` into ``out`` (a reused buffer); returns how many the file holds
        there (fewer than ``len(out)`` only at its end). Raises FileChangedError on a short read."""
        mv = memoryview(out).cast("B")  # type: ignore[arg-type]
        n = max(0, min(len(mv), self.size - max(off, 0)))
        if n == 0 or off < 0:
            return 0
        if self._arr is not None:
            mv[:n] = memoryview(self._arr[off : off + n])  # type: ignore[arg-type]
            return n
        assert self._fd is not None
        got = pread_into(self._fd, mv[:n], off)
        if got != n:
            raise FileChangedError(self.path, f"short read at {off}: {got} of {n} bytes")
        return n

    def read(self, off: int, n: int) -> npt.NDArray[np.uint8]:
        """``n`` bytes at ``off`` (clipped to the file) as a new uint8 array (read-only view for a
        source in memory). The caller bounds ``n``: it is allocated as asked."""
        lo = min(max(off, 0), self.size)
        hi = min(max(off + n, lo), self.size)
        if self._arr is not None:
            return self._arr[lo:hi]
        out = np.empty(hi - lo, np.uint8)
        self.readinto(lo, out)
        return out

    def chunks(self, off: int, n: int, step: int = CHUNK) -> Iterator[tuple[int, npt.NDArray[np.uint8]]]:
        """``(offset, bytes)`` pieces of ``[off, off + n)`` of at most ``step`` bytes, read into one
        reused buffer: each piece is valid until the next one is produced."""
        lo = min(max(off, 0), self.size)
        hi = min(max(off + n, lo), self.size)
        if self._arr is not None:
            for a in range(lo, hi, step):
                yield a, self._arr[a : min(hi, a + step)]
            return
        buf = np.empty(min(step, max(0, hi - lo)), np.uint8)
        for a in range(lo, hi, step):
            m = min(hi, a + step) - a
            self.readinto(a, buf[:m])
            yield a, buf[:m]

    # -- scalars ---------------------------------------------------------------------------
    def has(self, off: int, n: int) -> bool:
        return off >= 0 and n >= 0 and off + n <= self.size

    def remaining(self, off: int) -> int:
        return max(0, self.size - off)

    def u32(self, off: int) -> int | None:
        if not self.has(off, 4):
            return None
        return int(_U32.unpack_from(self._small(off, 4))[0])

    def i32(self, off: int) -> int | None:
        if not self.has(off, 4):
            return None
        return int(_I32.unpack_from(self._small(off, 4))[0])

    def u64(self, off: int) -> int | None:
        if not self.has(off, 8):
            return None
        return int(_U64.unpack_from(self._small(off, 8))[0])

    def raw(self, off: int, n: int) -> bytes | None:
        """``n`` bytes at ``off`` as bytes, or None when the file does not hold them all."""
        if not self.has(off, n):
            return None
        if n <= BLOCK:
            return bytes(self._small(off, n))
        return self.read(off, n).tobytes()

    def __len__(self) -> int:
        return self.size

    @overload
    def __getitem__(self, key: int) -> int: ...
    @overload
    def __getitem__(self, key: slice) -> npt.NDArray[np.uint8]: ...
    def __getitem__(self, key: int | slice) -> int | npt.NDArray[np.uint8]:
        """``src[i]`` is one byte (IndexError outside the file); ``src[a:b]`` a copy of at most
        ``MAX_SLICE`` bytes (ValueError for more: read big ranges with :meth:`chunks`)."""
        if isinstance(key, slice):
            lo, hi, step = key.indices(self.size)
            if step != 1:
                raise ValueError("ByteSource slices take no step")
            if hi - lo > MAX_SLICE:
                raise ValueError(f"a slice of {hi - lo} bytes is more than {MAX_SLICE} (use chunks())")
            return self.read(lo, max(0, hi - lo))
        i = key + self.size if key < 0 else key
        if not 0 <= i < self.size:
            raise IndexError(f"offset {key} outside the file ({self.size} bytes)")
        return int(self._small(i, 1)[0])

    # -- arrays ------------------------------------------------------------------------------
    def i32_array(self, off: int, count: int) -> npt.NDArray[np.int32]:
        """``count`` little-endian int32 starting at ``off`` (clipped to whole values present).

        The caller bounds ``count`` (it is read and allocated as asked once clipped to the file).
        """
        avail = self.remaining(off) // 4
        count = max(0, min(count, avail))
        return self.read(off, 4 * count).view("<i4")

    def any_nonzero(self, off: int, n: int) -> bool:
        """True when a byte of ``[off, off + n)`` is not zero (read in bounded pieces)."""
        return any(bool(piece.any()) for _, piece in self.chunks(off, n))

    def find(self, pattern: bytes, start: int, end: int) -> int:
        """First offset of ``pattern`` in ``[start, end)``, or -1 (searched piece by piece; the holes
        of a sparse file are skipped with ``SEEK_DATA``, so 50 GB of hole cost no reads)."""
        start = max(0, start)
        end = min(self.size, end)
        k = len(pattern)
        if end - start < k or k == 0:
            return -1 if k else start
        buf = bytearray(min(CHUNK + k - 1, end - start))
        mv = memoryview(buf)
        pos = start
        zeros = not pattern.strip(b"\0")
        while pos + k <= end:
            data = self._next_data(pos)  # holes of a sparse file are skipped, not read
            if data is None or data >= end:
                return pos if zeros else -1  # only zeros from here on
            if data > pos:
                if zeros:
                    return pos
                pos = max(pos, data - (k - 1))  # a match may start in the hole's last bytes
                if pos + k > end:
                    return -1
            m = min(len(buf), end - pos)
            self.readinto(pos, mv[:m])
            i = buf.find(pattern, 0, m)
            if i >= 0:
                return pos + i
            pos += m - k + 1
        return -1

    def _next_data(self, off: int) -> int | None:
        """The first offset at or after ``off`` that holds data (``SEEK_DATA``), ``off`` itself where
        holes are not reported, None when only a hole follows."""
        fd = self._fd
        if fd is None or fd < 0 or not hasattr(os, "SEEK_DATA"):
            return off
        try:
            return os.lseek(fd, off, os.SEEK_DATA)
        except OSError as e:
            return None if e.errno == errno.ENXIO else off

    def prefetch(self, offsets: list[int], span: int = 16) -> None:
        """Ask the kernel to read the pages holding ``offsets`` now, all at once.

        Record headers of a large state lie hundreds of MiB apart; touching them one by one on a
        cold cache costs one disk round trip each. ``POSIX_FADV_WILLNEED`` lets the reads overlap.
        """
        if self._fd is None or self._fd < 0 or not hasattr(os, "posix_fadvise"):
            return
        for off in offsets:
            if 0 <= off < self.size:
                try:
                    os.posix_fadvise(self._fd, off, min(span, self.size - off), os.POSIX_FADV_WILLNEED)
                except OSError:
                    return
