"""The wire format between kvscope and its llama.cpp child process (``worker``), stdlib only.

Each message is a frame on a pipe: ``kind`` (1 byte), ``u32`` length of a JSON header, ``u64``
length of an inline binary payload, then the header and the payload. Kinds: ``Q`` request (parent
to child), ``R`` reply, ``L`` one llama.cpp log line, ``A`` a ggml abort message (sent just before
the child aborts).

Payloads never go inside the JSON. Up to :data:`INLINE_MAX` bytes they follow the header on the
pipe; larger ones (state blobs of hundreds of MB) are written to a file in a scratch folder
(``/dev/shm`` when it has room, else the temp folder) whose name the header carries under
``"file"``: the child maps it (``mmap``) and llama.cpp reads or writes the mapping directly, and the
parent reads it into one ``bytes`` object. That is one memory copy per direction instead of the
three a pipe costs (into the pipe, out of it, into ``bytes``).

With a ``deadline`` the pipe ends wait with ``poll`` and raise :class:`TimeoutError` when it passes;
a closed peer raises :class:`EOFError`.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import select
import struct
import tempfile
import time
from typing import Any

FRAME = struct.Struct("<cIQ")  # kind, header bytes, inline payload bytes
REQUEST, REPLY, LOG, ABORT = b"Q", b"R", b"L", b"A"
INLINE_MAX = 1 << 20  # larger payloads travel through a scratch file
_CHUNK = 1 << 20  # one read; also the pipe size we ask the kernel for
_SHM = "/dev/shm"
_HEADROOM = 64 << 20  # free space a scratch folder must keep beyond the payload
_MADV_POPULATE_WRITE = 23  # <linux/mman.h>; Python 3.11's mmap module does not name it


def enlarge_pipe(fd: int) -> None:
    """Ask for a 1 MiB pipe buffer (fewer wake-ups); harmless where refused."""
    try:
        import fcntl

        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _CHUNK)  # type: ignore[attr-defined,unused-ignore]
    except (ImportError, AttributeError, OSError):
        pass


def _wait(fd: int, events: int, deadline: float | None) -> None:
    if deadline is None:
        timeout_ms = None
    else:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        timeout_ms = max(1, int(left * 1000))
    p = select.poll()
    p.register(fd, events)
    if not p.poll(timeout_ms):
        raise TimeoutError


def _write_all(fd: int, data: memoryview, deadline: float | None) -> None:
    off, n = 0, data.nbytes
    while off < n:
        try:
            off += os.write(fd, data[off:off + (1 << 24)])
        except BlockingIOError:
            _wait(fd, select.POLLOUT, deadline)
        except (BrokenPipeError, ConnectionResetError):
            raise EOFError from None


def send(fd: int, kind: bytes, header: dict[str, Any], payload: Any = None, deadline: float | None = None) -> None:
    """Write one frame with an inline payload (any C-contiguous buffer, at most a few MB)."""
    h = json.dumps(header, separators=(",", ":")).encode()
    body = memoryview(payload).cast("B") if payload is not None else memoryview(b"")
    head = FRAME.pack(kind, len(h), body.nbytes) + h
    if body.nbytes <= 1 << 16:
        _write_all(fd, memoryview(head + body.tobytes()), deadline)
    else:
        _write_all(fd, memoryview(head), deadline)
        _write_all(fd, body, deadline)


class Reader:
    """Reads frames from one file descriptor. With a deadline the descriptor must be non-blocking."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buf = bytearray()

    def _fill(self, want: int, deadline: float | None) -> None:
        while len(self._buf) < want:
            try:
                chunk = os.read(self.fd, _CHUNK)
            except BlockingIOError:
                _wait(self.fd, select.POLLIN, deadline)
                continue
            if not chunk:
                raise EOFError
            self._buf += chunk

    def read(self, deadline: float | None = None) -> tuple[bytes, dict[str, Any], bytes | None]:
        """The next frame: (kind, header, inline payload or None)."""
        self._fill(FRAME.size, deadline)
        kind, hlen, plen = FRAME.unpack_from(self._buf)
        end = FRAME.size + hlen + plen
        self._fill(end, deadline)
        header = json.loads(bytes(self._buf[FRAME.size:FRAME.size + hlen])) if hlen else {}
        payload = bytes(self._buf[FRAME.size + hlen:end]) if plen else None
        del self._buf[:end]
        return kind, header, payload


# --- payloads through scratch files ------------------------------------------------------------
def make_scratch() -> list[str]:
    """Scratch folders for large payloads, best first: one in /dev/shm (when usable), one in the temp folder."""
    out = []
    if os.path.isdir(_SHM) and os.access(_SHM, os.W_OK | os.X_OK):
        with contextlib.suppress(OSError):
            out.append(tempfile.mkdtemp(prefix="kvscope-llama-", dir=_SHM))
    out.append(tempfile.mkdtemp(prefix="kvscope-llama-"))
    return out


def scratch_file(dirs: list[str], size: int, tag: str) -> str:
    """A new file name for a ``size``-byte payload in the first folder with room for it."""
    chosen = dirs[-1]
    for d in dirs:
        try:
            st = os.statvfs(d)
        except OSError:
            continue
        if st.f_bavail * st.f_frsize >= size + _HEADROOM:
            chosen = d
            break
    fd, path = tempfile.mkstemp(prefix=f"{tag}-", dir=chosen)
    os.close(fd)
    return path


def spill(dirs: list[str], data: Any, tag: str) -> str:
    """Write ``data`` to a new scratch file; returns its path (the reader unlinks it)."""
    view = memoryview(data).cast("B")
    path = scratch_file(dirs, view.nbytes, tag)
    try:
        with open(path, "wb") as fh:
            fh.write(view)
    except BaseException:
        os.unlink(path)
        raise
    return path


def take_file(path: str) -> bytes:
    """Read a payload file into one bytes object and delete it."""
    try:
        with open(path, "rb") as fh:
            return fh.read()
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


def map_file(path: str, size: int, *, create: bool) -> mmap.mmap:
    """A writable mapping of a payload file: shared when ``create`` (the child fills it for the parent),
    else private copy-on-write (the child hands the parent's bytes to llama.cpp without copying)."""
    if create:
        fd = os.open(path, os.O_RDWR)
        try:
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        with contextlib.suppress(OSError, ValueError):  # fault every page in at once (Linux >= 5.14)
            mm.madvise(getattr(mmap, "MADV_POPULATE_WRITE", _MADV_POPULATE_WRITE))
        return mm
    fd = os.open(path, os.O_RDONLY)
    try:
        return mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
    finally:
        os.close(fd)
