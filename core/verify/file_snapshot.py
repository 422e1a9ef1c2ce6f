"""The input of one ``kvscope verify`` run, read once into a private copy.

The reader, the engine (which opens a path: ``llama_state_seq_load_file``, a llama-server slot
restore) and the comparison all read :attr:`Snapshot.path`, a copy in a private 0700 folder made
from one open file descriptor, so a file replaced or rewritten while verify runs cannot give them
three different contents. The copy keeps the input's holes (``SEEK_DATA``/``SEEK_HOLE``): a small
file with a 2 GB hole costs its data, not 2 GB. :meth:`Snapshot.changed` tells, at the end,
whether the path still names the file that was read (same device, inode, size, modification and
change times): a replacement or an in-place overwrite during the run is reported, and the verdict
is about the content read at the start.

Only a regular file is read: a FIFO, a directory or a device is refused by what it is (it is
opened with ``O_NONBLOCK``, so a FIFO with no writer cannot hang the open), and ``/dev/stdin`` is
read only when it is a regular file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass

from kvscope.core.engine.janitor import janitor
from kvscope.core.errors import InputError

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
_COPY_STEP = 1 << 30  # bytes per copy_file_range call
_TRIES = 3  # copies attempted while the file keeps changing under us


@dataclass(frozen=True)
class Identity:
    """What names one version of a file."""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> Identity:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def kind_of(mode: int) -> str | None:
    """What a non-regular file is (``"a FIFO (named pipe)"`` ...), None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def open_regular(path: str) -> tuple[int, os.stat_result]:
    """An O_RDONLY descriptor of the regular file ``path`` and its stat; :class:`InputError` otherwise."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as e:
        raise InputError(f"{path}: {e.strerror}") from None
    kind = kind_of(st.st_mode)
    if kind is not None:
        raise InputError(f"{path}: {kind}, not a state file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise InputError(f"{path}: {e.strerror}") from None
    st = os.fstat(fd)
    kind = kind_of(st.st_mode)  # replaced between the stat and the open
    if kind is not None:
        os.close(fd)
        raise InputError(f"{path}: {kind}, not a state file")
    os.set_blocking(fd, True)
    return fd, st


def _data_ranges(fd: int, size: int) -> list[tuple[int, int]]:
    """(offset, length) of the file's data, its holes left out (the whole file where holes are not reported)."""
    out: list[tuple[int, int]] = []
    at = 0
    try:
        while at < size:
            try:
                start = os.lseek(fd, at, os.SEEK_DATA)
            except OSError as e:
                if e.errno == errno.ENXIO:  # only a hole from here to the end
                    break
                raise
            end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
            if end > start:
                out.append((start, end - start))
            at = end
    except (OSError, AttributeError):
        return [(0, size)] if size else []
    return out


def _copy_range(src: int, dst: int, off: int, n: int) -> None:
    done = 0
    while done < n:
        step = min(_COPY_STEP, n - done)
        try:
            got = os.copy_file_range(src, dst, step, off + done, off + done)
        except (OSError, AttributeError):
            got = -1
        if got <= 0:  # not supported here, or the file shrank: copy through a buffer
            buf = os.pread(src, min(step, 1 << 24), off + done)
            if not buf:
                raise OSError(errno.EIO, "the file shrank while it was read")
            os.pwrite(dst, buf, off + done)
            got = len(buf)
        done += got


def copy_sparse(src_fd: int, dst_path: str, size: int) -> None:
    """Copy ``size`` bytes of ``src_fd`` into a new file ``dst_path`` (never an existing name, never through a
    symbolic link), holes kept; OSError on failure (the partial copy removed)."""
    out = os.open(dst_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        try:
            for off, n in _data_ranges(src_fd, size):
                _copy_range(src_fd, out, off, n)
            os.ftruncate(out, size)
        finally:
            os.close(out)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(dst_path)
        raise


class Snapshot:
    """A private copy of the input; ``close()`` removes it (also a context manager)."""

    def __init__(self, path: str | os.PathLike[str], folder: str | None = None) -> None:
        self.source = os.fspath(path)
        fd, st = open_regular(self.source)
        self.folder = tempfile.mkdtemp(prefix="kvscope-verify-", dir=folder)  # 0700
        janitor().watch_dir(self.folder)  # removed even when kvscope is killed
        self.path = os.path.join(self.folder, "input.state")
        try:
            self.identity = self._copy(fd, st)
        except BaseException:
            self.close()
            raise
        finally:
            os.close(fd)

    def _copy(self, fd: int, st: os.stat_result) -> Identity:
        for _ in range(_TRIES):
            first = Identity.of(st)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            try:
                copy_sparse(fd, self.path, first.size)
            except OSError as e:
                raise InputError(f"{self.source}: cannot copy it into {self.folder} ({e.strerror})") from None
            st = os.fstat(fd)
            if Identity.of(st) == first:
                return first
        raise InputError(f"{self.source}: the file kept changing while it was read")

    def changed(self) -> str | None:
        """Why the path no longer names the file that was read (replaced, rewritten, gone), or None."""
        try:
            now = Identity.of(os.stat(self.source))
        except OSError as e:
            return f"{self.source} is gone ({e.strerror}) since verify read it"
        was = self.identity
        if (now.dev, now.ino) != (was.dev, was.ino):
            return f"{self.source} was replaced by another file while verify ran"
        if now != was:
            return f"{self.source} was rewritten in place while verify ran"
        return None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            shutil.rmtree(self.folder)
        janitor().forget("dir", self.folder)

    def __enter__(self) -> Snapshot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
