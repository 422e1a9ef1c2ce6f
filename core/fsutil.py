"""Atomic file output: every file kvscope writes appears complete or not at all.

Data goes to a temporary file in the destination's folder, is flushed to disk, then renamed over
the destination (``os.replace`` is atomic on one file system). :func:`write_atomic` writes bytes
or text held in memory; :func:`atomic_writer` is the streaming form (a context manager yielding
a binary file object), for outputs too large to build in memory first.

Nothing is left behind: on an exception the temporary file is removed, and while a write is in
progress SIGTERM, SIGINT and SIGHUP remove every temporary file of the process before the
signal takes its usual course (the handlers are installed from the main thread; a program
that writes from other threads calls :func:`install_signal_cleanup` once at start-up). Should a
process die of SIGKILL, its temporary file is recognisable: every name starts with
:data:`TEMP_PREFIX` (:func:`is_temp_name`), so ``scan`` skips it and it can be swept away.

An output gets the permissions a plain ``open(path, "w")`` would give it: those of the file it
replaces, or ``0o666`` less the umask for a new file (``mkstemp``'s 0600 is not kept).

Where an output may go is one rule, :func:`output_problem` (:func:`check_output` raises it), which
every command that writes a file or a folder asks before it reads anything: an output never names
one of the command's inputs, by any path (a symlink, a hard link, ``/proc/self/fd/N``,
``/proc/PID/root/...``), and an output that exists must be what the command writes (a regular file,
or a folder for a folder output): a FIFO, a device node, a socket, or a folder where a file is
expected is refused, never replaced by a file and never opened (a FIFO would block).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
import signal
import stat
import threading
from collections.abc import Callable, Iterable, Iterator
from types import FrameType
from typing import IO, Any, BinaryIO

from kvscope.core.textsafe import file_kind, safe_text

TEMP_PREFIX = ".kvscope-tmp-"  # every temporary file or folder kvscope creates starts with this
CLEANUP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, n))

_live: dict[str, bool] = {}  # temporary path -> is a folder
_lock = threading.Lock()
_previous: dict[int, Any] = {}  # signal -> the handler ours replaced
_permanent = False


def is_temp_name(path: str | os.PathLike[str]) -> bool:
    """True for a file or folder name kvscope uses while it writes (``TEMP_PREFIX...``)."""
    return os.path.basename(os.fspath(path)).startswith(TEMP_PREFIX)


def temp_name(tag: str = "") -> str:
    """The prefix for a temporary name: ``TEMP_PREFIX`` plus an optional tag (``rewrite-``...)."""
    tag = tag.strip(".-")
    tag = tag.removeprefix("kvscope-").removeprefix("tmp-").strip("-")
    return TEMP_PREFIX + (f"{tag}-" if tag else "")


def current_umask() -> int:
    """The process umask, read without changing it (``/proc/self/status``; elsewhere set and restored)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """``a`` and ``b`` name the same file: the same path once links are resolved, or the same inode (a hard
    link); False where either cannot be looked at (a path that does not exist yet is no other file)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def output_problem(out: str | os.PathLike[str], inputs: Iterable[str | os.PathLike[str] | None], *,
                   folder: bool = False) -> str | None:
    """Why ``out`` must not be written by a command that reads ``inputs`` (None: it may be); never opens it.

    Refused: ``out`` names one of ``inputs`` by any path (:func:`same_file`: the same path once links are
    resolved, ``/proc/self/fd/N`` included, or the same inode); ``out`` lies in a folder of ``/proc`` (an
    ``fd/N`` of another file: the write's temporary file cannot be made there); ``out`` exists and is not a
    regular file (a FIFO, a device node, a socket, a folder), or with ``folder`` exists and is not a folder.
    A path that does not exist, a dangling symlink, or one ``stat`` cannot look at is left to the write."""
    target = os.fspath(out)
    for item in inputs:
        if item is None:
            continue
        source = os.fspath(item)
        if same_file(target, source):
            named = "" if target == source else f" {safe_text(source)}"
            return f"{safe_text(target)}: is the input{named}: an output never replaces an input (give another path)"
    where = os.path.realpath(os.path.dirname(os.path.abspath(target)))
    if where == "/proc" or where.startswith("/proc/"):  # /proc/self/fd/N of a file that is no input
        return f"{safe_text(target)}: is a /proc name, not a place to write to (give the file's own path)"
    try:
        st = os.stat(target)
    except (OSError, ValueError):
        return None
    if folder and not stat.S_ISDIR(st.st_mode):
        return f"{safe_text(target)}: exists and is {file_kind(st.st_mode)}, not a folder"
    if not folder and not stat.S_ISREG(st.st_mode):
        return (f"{safe_text(target)}: exists and is {file_kind(st.st_mode)}, not a regular file "
                "(an output replaces a regular file only)")
    return None


def check_output(out: str | os.PathLike[str], inputs: Iterable[str | os.PathLike[str] | None], *,
                 error: Callable[[str], BaseException], folder: bool = False) -> None:
    """Raise ``error(reason)`` (one line) when :func:`output_problem` refuses ``out``; see there. ``error``
    is the calling command's own :class:`~kvscope.core.errors.KvscopeError` class (this layer sits beside
    ``errors`` and does not import it)."""
    reason = output_problem(out, inputs, folder=folder)
    if reason is not None:
        raise error(reason)


def output_mode(path: str | os.PathLike[str]) -> int:
    """Permission bits a plain ``open(path, "w")`` would leave: the existing file's, else 0o666 & ~umask."""
    try:
        st = os.stat(path)
        if stat.S_ISREG(st.st_mode):
            return stat.S_IMODE(st.st_mode)
    except OSError:
        pass
    return 0o666 & ~current_umask()


# -- cleanup on signals ------------------------------------------------------------------------------


def remove_temporaries() -> None:
    """Remove every temporary file and folder this process is writing now."""
    with _lock:
        items = list(_live.items())
        _live.clear()
    for path, is_dir in items:
        if is_dir:
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(path)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    prev = _previous.get(signum, signal.SIG_DFL)
    if prev == signal.SIG_IGN:
        return  # the signal does not stop the process: the write goes on
    remove_temporaries()
    if callable(prev):
        prev(signum, frame)  # e.g. Python's SIGINT handler: KeyboardInterrupt
        return
    signal.signal(signum, signal.SIG_DFL)  # die of the signal, as without us
    os.kill(os.getpid(), signum)


def _install() -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in CLEANUP_SIGNALS:
        if sig in _previous:
            continue
        with contextlib.suppress(ValueError, OSError):
            _previous[sig] = signal.signal(sig, _on_signal)


def _uninstall() -> None:
    if _permanent or threading.current_thread() is not threading.main_thread():
        return
    for sig, prev in list(_previous.items()):
        with contextlib.suppress(ValueError, OSError, TypeError):
            if signal.getsignal(sig) is _on_signal:
                signal.signal(sig, prev if prev is not None else signal.SIG_DFL)
        del _previous[sig]


def install_signal_cleanup() -> None:
    """Keep the cleanup handlers installed for the life of the process (call from the main thread)."""
    global _permanent
    _permanent = True
    _install()


def _register(path: str, is_dir: bool) -> None:
    with _lock:
        first = not _live
        _live[path] = is_dir
    if first:
        _install()


def _unregister(path: str) -> None:
    with _lock:
        _live.pop(path, None)
        last = not _live
    if last:
        _uninstall()


# -- writers -----------------------------------------------------------------------------------------


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike[str], tag: str = "", buffering: int = -1) -> Iterator[BinaryIO]:
    """Yield a binary file object whose content replaces ``path`` atomically when the block ends.

    The temporary file (``TEMP_PREFIX`` + ``tag``, beside ``path``) is removed if the block raises
    or the process gets SIGTERM/SIGINT/SIGHUP; the result gets :func:`output_mode`'s permissions.
    """
    target = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(target))
    mode = output_mode(target)
    fd, tmp = _new_temp_file(folder, tag)
    try:
        with os.fdopen(fd, "wb", buffering=buffering) as fh:
            yield fh
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    finally:
        _unregister(tmp)


def _new_temp_file(folder: str, tag: str) -> tuple[int, str]:
    """A new, empty ``TEMP_PREFIX...`` file in ``folder``, open for reading and writing with mode 0600 (as
    ``mkstemp`` makes it: a writer may read back what it wrote), registered for the
    signal cleanup *before* it exists: made first, a SIGTERM between its creation and its registration
    left it behind (the race :func:`temporary_folder` had too)."""
    while True:
        path = os.path.join(folder, temp_name(tag) + secrets.token_hex(8))
        _register(path, False)
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600), path
        except FileExistsError:  # 64 random bits taken: another name (that file is not ours to remove)
            _unregister(path)
        except BaseException:
            _unregister(path)
            raise


def write_atomic(
    path: str | os.PathLike[str], data: bytes | bytearray | memoryview | str, prefix: str = ""
) -> None:
    """Write ``data`` (text is UTF-8 encoded) to ``path`` atomically (``prefix``: a tag for the
    temporary name, after :data:`TEMP_PREFIX`)."""
    with atomic_writer(path, prefix) as fh:
        fh.write(data.encode("utf-8") if isinstance(data, str) else data)


@contextlib.contextmanager
def temporary_folder(parent: str | os.PathLike[str], tag: str = "") -> Iterator[str]:
    """A new folder ``TEMP_PREFIX...`` in ``parent``, removed on SIGTERM/SIGINT/SIGHUP while the
    block runs; the block renames it away or it is removed when the block raises."""
    # registered before it exists: made first (mkdtemp), a signal between its creation and its registration
    # left it behind (a lab run stopped by SIGTERM as it began: 6 of 8 tries on a loaded machine)
    while True:
        path = os.path.join(os.fspath(parent), temp_name(tag) + secrets.token_hex(8))
        _register(path, True)
        try:
            os.mkdir(path)  # a plain mkdir's mode (0o777 less the umask)
            break
        except FileExistsError:  # 64 random bits taken: another name (that folder is not ours to remove)
            _unregister(path)
        except BaseException:
            _unregister(path)
            raise
    try:
        yield path
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    finally:
        _unregister(path)


# Files above this size get no sha256 in a report or a verify result: hashing reads every byte, holes of a sparse
# file included (a 20 GB sparse file took 21-61 s, its parse 0.8 s); the size still identifies them.
SHA256_MAX_BYTES = 2 << 30


def sha256_file(path: str | os.PathLike[str], piece: int = 8 << 20) -> str:
    """The SHA-256 (hex) of the file at ``path``, read in pieces of ``piece`` bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(piece):
            h.update(chunk)
    return h.hexdigest()


def lock_exclusive(fh: IO[str], waiting: Callable[[], None]) -> None:
    """Hold an exclusive lock on ``fh`` (released when it closes); ``waiting`` is called when another
    process holds it, before this one blocks on it. A no-op where flock does not exist."""
    try:
        import fcntl
    except ImportError:
        return
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        waiting()
        fcntl.flock(fh, fcntl.LOCK_EX)
