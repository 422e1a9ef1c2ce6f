"""Bounds-checked little-endian access to the bytes of a state file (a read-only memory map).

Every read states how many bytes it needs and returns ``None`` when they are not there, so
parsers never raise on short input and never allocate from an untrusted count.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

import numpy as np
import numpy.typing as npt

_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_U64 = struct.Struct("<Q")


class ByteSource:
    """Read-only view of a file's bytes with bounds-checked scalar and array reads."""

    def __init__(self, data: bytes | bytearray | memoryview | np.ndarray, path: str = "") -> None:
        if isinstance(data, np.ndarray):
            self._arr: npt.NDArray[np.uint8] = data.reshape(-1).view(np.uint8)
        else:
            self._arr = np.frombuffer(data, dtype=np.uint8)
        self._buf = memoryview(self._arr)  # type: ignore[arg-type]
        self.size = int(self._arr.size)
        self.path = path
        self._mm: mmap.mmap | None = None

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> ByteSource:
        """Memory-map ``path`` read-only (an empty file gives an empty source)."""
        p = Path(path)
        size = p.stat().st_size
        if size == 0:
            return cls(b"", str(p))
        with open(p, "rb") as fh:
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        arr = np.frombuffer(mm, dtype=np.uint8)
        src = cls(arr, str(p))
        src._mm = mm
        return src

    # -- scalars ---------------------------------------------------------------------------
    def has(self, off: int, n: int) -> bool:
        return off >= 0 and n >= 0 and off + n <= self.size

    def remaining(self, off: int) -> int:
        return max(0, self.size - off)

    def u32(self, off: int) -> int | None:
        if not self.has(off, 4):
            return None
        return int(_U32.unpack_from(self._buf, off)[0])

    def i32(self, off: int) -> int | None:
        if not self.has(off, 4):
            return None
        return int(_I32.unpack_from(self._buf, off)[0])

    def u64(self, off: int) -> int | None:
        if not self.has(off, 8):
            return None
        return int(_U64.unpack_from(self._buf, off)[0])

    def raw(self, off: int, n: int) -> bytes | None:
        if not self.has(off, n):
            return None
        return bytes(self._buf[off : off + n])

    # -- arrays (zero-copy views) -----------------------------------------------------------
    def view(self, off: int, n: int) -> npt.NDArray[np.uint8]:
        """``n`` bytes at ``off`` as a uint8 view, clipped to the file."""
        lo = min(max(off, 0), self.size)
        hi = min(max(off + n, lo), self.size)
        return self._arr[lo:hi]

    def i32_array(self, off: int, count: int) -> npt.NDArray[np.int32]:
        """``count`` little-endian int32 starting at ``off`` (clipped to whole values present)."""
        avail = self.remaining(off) // 4
        count = max(0, min(count, avail))
        return self._arr[off : off + 4 * count].view("<i4")

    def find(self, pattern: bytes, start: int, end: int) -> int:
        """First offset of ``pattern`` in ``[start, end)``, or -1 (no copy of the file is made)."""
        start = max(0, start)
        end = min(self.size, end)
        if end - start < len(pattern):
            return -1
        if self._mm is not None:
            return self._mm.find(pattern, start, end)
        i = bytes(self._buf[start:end]).find(pattern)
        return -1 if i < 0 else i + start

    def prefetch(self, offsets: list[int], span: int = 16) -> None:
        """Ask the kernel to read the pages holding ``offsets`` now, all at once.

        Record headers of a large state lie hundreds of MiB apart; touching them one by one on a
        cold cache costs one disk round trip each. ``MADV_WILLNEED`` lets the reads overlap.
        """
        if self._mm is None or not hasattr(mmap, "MADV_WILLNEED"):
            return
        page = mmap.PAGESIZE
        for off in offsets:
            if 0 <= off < self.size:
                start = off - off % page
                try:
                    self._mm.madvise(mmap.MADV_WILLNEED, start, min(self.size - start, off - start + span))
                except (OSError, ValueError):
                    return

    def bytes_all(self) -> npt.NDArray[np.uint8]:
        return self._arr
