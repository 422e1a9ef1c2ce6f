"""Opening and reading untrusted input files without hanging or faulting.

Inputs (state files, GGUF models) are opened with :func:`open_regular`: only regular files, and
special files are refused before ``open`` (a FIFO would block it forever); the open itself is
non-blocking in case the path changes in between. Bytes are read with ``pread``
(:func:`pread_into`), never through a memory map, so a file that shrinks under the reader gives
a short read instead of ``SIGBUS``. A :class:`FileIdentity` (size, mtime, inode, device) taken
before and after a read tells whether the file changed meanwhile.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

_PREAD_MAX = 0x7FFFF000  # Linux moves at most this many bytes per read call

# what a reader says when a file's identity changed under it (state files and GGUF models alike)
CHANGED_MESSAGE = "the file changed while it was read"


@dataclass(frozen=True)
class FileIdentity:
    """What tells two versions of a file apart without reading it."""

    size: int
    mtime_ns: int
    ino: int
    dev: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileIdentity:
        return cls(int(st.st_size), int(st.st_mtime_ns), int(st.st_ino), int(st.st_dev))

    @classmethod
    def of_path(cls, path: str | os.PathLike[str]) -> FileIdentity | None:
        """The identity of what ``path`` names now (None when it cannot be stat'ed)."""
        try:
            return cls.of(os.stat(path))
        except OSError:
            return None


def open_regular(path: str | os.PathLike[str]) -> tuple[int, os.stat_result]:
    """Open ``path`` read-only if it is a regular file: ``(fd, fstat)``.

    Raises OSError when the path cannot be opened and ValueError for anything but a regular
    file ("is a directory", "not a regular file").
    """
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise ValueError("is a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file")
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        fst = os.fstat(fd)
        if not stat.S_ISREG(fst.st_mode):
            raise ValueError("not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, fst


def pread_into(fd: int, buf: memoryview, off: int) -> int:
    """Fill ``buf`` from ``off`` with as many reads as it takes; returns the bytes read (short at EOF)."""
    done, n = 0, len(buf)
    while done < n:
        got = os.preadv(fd, [buf[done : done + _PREAD_MAX]], off + done)
        if got <= 0:
            break
        done += got
    return done


def _what(mode: int) -> str:
    """What a file that is not a regular one is, for a refusal."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "a special file"


def size_text(n: int) -> str:
    """``64 MiB``, ``1.5 GiB``, ``512 bytes``: a size in a refusal."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            v = n / (1 << shift)
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{n} bytes"


def read_bounded(path: str | os.PathLike[str], limit: int) -> bytes:
    """The whole of a small regular file (an ``@FILE`` argument: a list of token ids), at most ``limit`` bytes.

    The one reader of such arguments: anything but a regular file (a FIFO, a device, a directory) is
    refused from ``stat`` before it is opened (ValueError "not a regular file (a FIFO)"), so nothing
    blocks; a larger file is refused from its size before a byte is read (ValueError naming both sizes),
    and at most ``limit + 1`` bytes are ever read, so a file growing meanwhile is refused too. OSError
    when the path cannot be opened or read.
    """
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"not a regular file ({_what(st.st_mode)})")
    if st.st_size > limit:
        raise ValueError(f"{st.st_size:,} bytes, more than the {size_text(limit)} such a file may hold")
    fd, fst = open_regular(path)
    try:
        want = min(int(fst.st_size), limit) + 1  # one byte more: a file that grew is seen
        data = os.pread(fd, want, 0)
        while len(data) < want and (more := os.pread(fd, want - len(data), len(data))):
            data += more
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ValueError(f"more than the {size_text(limit)} such a file may hold")
    if len(data) == want:
        raise ValueError(CHANGED_MESSAGE)
    return data


def read_regular(path: str | os.PathLike[str]) -> bytes:
    """The whole of a regular file, read once with ``pread`` (:func:`open_regular`'s refusals: OSError,
    ValueError for anything but a regular file). For inputs read whole: a lab scenario's states, the
    input of ``kvscope corrupt``."""
    fd, st = open_regular(path)
    try:
        buf = bytearray(st.st_size)
        n = pread_into(fd, memoryview(buf), 0)
    finally:
        os.close(fd)
    return bytes(buf[:n])
