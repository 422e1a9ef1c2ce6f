"""The cold-file feed of ``--stats`` (:mod:`kvscope.core.analysis.stats`): one front-to-back read of a
file's payload range that is not in the page cache, into a ring of buffers the scan reduces in place.

:func:`is_cold` tells whether a range's pages are out of the page cache; :class:`ColdFeed` keeps
``READERS`` reads of ``CHUNK`` bytes in flight, past the page cache where the file system allows it
(``O_DIRECT``), and lends each step of the scan its bytes where they landed.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import threading

import numpy as np
import numpy.typing as npt

from kvscope.core.fileio import FileIdentity, pread_into
from kvscope.core.reader.source import ByteSource

U8A = npt.NDArray[np.uint8]

CHUNK = 8 << 20  # bytes of one read of the cold-file feed (the bench's baseline reads 8 MiB at a time too)
RING = 6  # chunk buffers of the feed: up to READERS reads in flight while the scan reduces the others
READERS = 4
ALIGN = 4096  # O_DIRECT's offset, length and buffer alignment
FEED_MIN = 16 << 20  # payload bytes below which a cold file is read by the scan's own preads


def is_cold(path: str, start: int, end: int, samples: int = 64) -> bool:
    """True when some of ``samples`` pages spread over ``[start, end)`` are not in the page cache."""
    with contextlib.suppress(OSError), open(path, "rb", buffering=0) as fh:
        probe = bytearray(1)
        for off in np.linspace(start, end - 1, samples, dtype=np.int64).tolist():
            try:
                os.preadv(fh.fileno(), [probe], off, os.RWF_NOWAIT)
            except BlockingIOError:
                return True
    return False


class ColdFeed:
    """Reads a cold file's payload range once, in order, into a ring of ``RING`` aligned buffers
    of ``CHUNK`` bytes, and lends the scan's steps their bytes there (:meth:`take`, no copy but
    for a step across two chunks). ``READERS`` threads keep reads in flight while the scan's
    threads reduce the chunks already in: the disk never waits for the CPU, nor the CPU for more
    than the read of the chunk it needs.

    The reads bypass the page cache (``O_DIRECT``) where the file system allows it: the disk
    writes into the buffers the scan reads, so a cold ``--stats`` costs less CPU than one plain
    read of the file (whose every byte the kernel first puts in the page cache, then copies). On a
    loaded machine that CPU is what a buffered read waits for; where ``O_DIRECT`` is refused the
    feed reads through the page cache instead. A chunk is read only when the one ``RING`` chunks
    before it has been used by every step that needs it (``left``): steps must come in file order
    (the scan builds the feed only then), and a step gets None from :meth:`take` (and reads
    its bytes itself) when its chunk could not be read whole."""

    def __init__(self, fd: int, start: int, end: int, ranges: list[tuple[int, int]]) -> None:
        self.fd, self.base, self.end = fd, start // ALIGN * ALIGN, end
        self.n = -(-(end - self.base) // CHUNK)
        self.left = [0] * self.n  # steps still to take each chunk
        for lo, hi in ranges:
            for c in range((lo - self.base) // CHUNK, (hi - 1 - self.base) // CHUNK + 1):
                self.left[c] += 1
        self._maps = [mmap.mmap(-1, CHUNK) for _ in range(min(RING, self.n))]  # page-aligned
        self.slots = [np.frombuffer(m, np.uint8) for m in self._maps]
        self.got: dict[int, int] = {}  # chunk -> bytes read from its start (-1: the read failed)
        self.next = 0  # the next chunk a reader claims
        self.halt = False
        self.cond = threading.Condition()
        self.threads = [threading.Thread(target=self._read, daemon=True) for _ in range(min(READERS, self.n))]

    @classmethod
    def open(cls, src: ByteSource, start: int, end: int, ranges: list[tuple[int, int]]) -> ColdFeed | None:
        """A started feed of ``src``'s file (the same file: its identity checked), or None where it
        cannot be opened."""
        flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
        fd = -1
        for direct in (getattr(os, "O_DIRECT", 0), 0):  # O_DIRECT refused (tmpfs...): through the page cache
            with contextlib.suppress(OSError):
                fd = os.open(src.path, flags | direct)
                break
        if fd < 0:
            return None
        try:
            if FileIdentity.of(os.fstat(fd)) != src.identity:
                raise OSError("another file")
            feed = cls(fd, start, end, ranges)
        except (OSError, ValueError):
            os.close(fd)
            return None
        for t in feed.threads:
            t.start()
        return feed

    def _free(self, c: int) -> bool:  # chunk c's slot may take another chunk
        return c < 0 or (c in self.got and self.left[c] <= 0)

    def _read(self) -> None:
        while True:
            with self.cond:
                while not self.halt and self.next < self.n and not self._free(self.next - len(self.slots)):
                    self.cond.wait(0.05)
                if self.halt or self.next >= self.n:
                    return
                c = self.next
                self.next += 1
                if self.left[c] <= 0:  # no step needs it
                    self.got[c] = 0
                    self.cond.notify_all()
                    continue
            off = self.base + c * CHUNK
            n = min(CHUNK, -(-(self.end - off) // ALIGN) * ALIGN)
            view = memoryview(self._maps[c % len(self.slots)])[:n]
            try:
                got = pread_into(self.fd, view, off)
            except OSError as e:  # O_DIRECT refused for this file's alignment: through the page cache
                got = -1
                if e.errno == errno.EINVAL and hasattr(os, "O_DIRECT"):
                    import fcntl  # (POSIX only, as O_DIRECT is)

                    with contextlib.suppress(OSError):
                        fcntl.fcntl(self.fd, fcntl.F_SETFL, fcntl.fcntl(self.fd, fcntl.F_GETFL) & ~os.O_DIRECT)
                        got = pread_into(self.fd, view, off)
            with self.cond:
                self.got[c] = got
                self.cond.notify_all()

    def take(self, off: int, n: int, out: U8A) -> U8A | None:
        """The ``n`` bytes at ``off`` once read: a view into a chunk, or copied into ``out`` across
        two; None when they are not all there (a failed or short read, or a step too big)."""
        c0, c1 = (off - self.base) // CHUNK, (off + n - 1 - self.base) // CHUNK
        if off < self.base or c1 >= self.n or c1 - c0 > 1 or (c1 > c0 and n > out.size):
            return None
        with self.cond:
            while not self.halt and (c0 not in self.got or c1 not in self.got) and \
                    any(t.is_alive() for t in self.threads):
                self.cond.wait(0.05)
            if c0 not in self.got or c1 not in self.got:
                return None
            if self.halt or any(self.got[c] < min(off + n, self.base + (c + 1) * CHUNK) - self.base - c * CHUNK
                                for c in (c0, c1)):
                return None
        lo = off - self.base - c0 * CHUNK
        if c0 == c1:
            return self.slots[c0 % len(self.slots)][lo : lo + n]
        k = CHUNK - lo
        out[:k] = self.slots[c0 % len(self.slots)][lo:]
        out[k:n] = self.slots[c1 % len(self.slots)][: n - k]
        return out[:n]

    def done(self, off: int, n: int) -> None:
        """The step of the ``n`` bytes at ``off`` is finished with them (its chunks may be reused)."""
        with self.cond:
            for c in range(max(0, (off - self.base) // CHUNK), min(self.n, (off + n - 1 - self.base) // CHUNK + 1)):
                self.left[c] -= 1
            self.cond.notify_all()

    def stop(self) -> None:
        """From now on :meth:`take` answers None (the steps still running read their own bytes)."""
        with self.cond:
            self.halt = True
            self.cond.notify_all()

    def close(self) -> None:
        """Stop the readers, then free the buffers."""
        self.stop()
        for t in self.threads:
            t.join()
        os.close(self.fd)
        self.slots = []
        for m in self._maps:
            with contextlib.suppress(BufferError):  # a view still held: the buffer goes with it
                m.close()
