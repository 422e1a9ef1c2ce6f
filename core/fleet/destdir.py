"""Outputs of ``kvscope migrate`` under DEST, reached without following a symbolic link: nothing lands outside DEST.

DEST is a resolved path (``realpath``, done once by the command). An output ``rel`` is reached
from DEST's own descriptor one folder at a time, each opened ``O_DIRECTORY | O_NOFOLLOW`` (and
created with ``mkdir(dir_fd=...)`` when missing and asked to), so a folder in DEST that is a
link (into SOURCE, or anywhere else) is refused with :class:`DestError` naming it, never written
through. The output is staged in a temporary folder of DEST (:func:`kvscope.core.fsutil.temporary_folder`,
removed on SIGTERM/SIGINT/SIGHUP) and renamed into its folder by descriptor: a rename replaces a
link that has the output's name, never the file it points to, and the output's permissions are
a new file's (``0o666`` less the umask) or those of the regular file it replaces, never a link
target's. An existing output is read (for a rerun's hashes) and removed by descriptor and
``O_NOFOLLOW`` as well.

Every :class:`OSError` raised here names the DEST path it concerns, so a full disk or a
refused link reads "DEST/a/x.bin: No space left on device", never the source's path.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
from collections.abc import Iterator

from kvscope.core.errors import InputError
from kvscope.core.fsutil import current_umask

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
CHUNK = 8 << 20


class DestError(InputError, OSError):
    """An output cannot go where it belongs under DEST (a link or a file on its way); names the path.
    An ``OSError`` too (errno, strerror, filename), so that migrate reports it per file like any other."""

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}" if self.filename is not None else str(self.strerror)


def _parts(rel: str) -> list[str]:
    parts = [p for p in rel.split("/") if p not in ("", ".", "..")]
    if not parts:
        raise DestError(errno.EINVAL, "not a file path", rel)
    return parts


def _named(e: OSError, path: str) -> OSError:
    """``e`` as an OSError naming ``path`` (a DEST path), keeping its errno and class."""
    if e.filename == path:
        return e
    cls = DestError if isinstance(e, DestError) else OSError
    return cls(e.errno, e.strerror or str(e), path)


@contextlib.contextmanager
def parent_folder(dest: str, rel: str, create: bool) -> Iterator[tuple[int, str]]:
    """``(fd, name)``: a descriptor of the folder of output ``rel`` under ``dest``, and its file name.

    Folders on the way are created when ``create`` (else a missing one raises FileNotFoundError);
    one that is a symbolic link, or not a folder, raises :class:`DestError`.
    """
    parts = _parts(rel)
    shown = dest
    try:
        fd = os.open(dest, _DIR_FLAGS)
    except OSError as e:
        raise _named(e, dest) from None
    try:
        for part in parts[:-1]:
            shown = os.path.join(shown, part)
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o777, dir_fd=fd)
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    what = "a symbolic link" if _is_link(fd, part) else "not a folder"
                    raise DestError(e.errno, f"{what} in DEST: kvscope writes no output through it",
                                    shown) from None
                raise _named(e, shown) from None
            os.close(fd)
            fd = nxt
        yield fd, parts[-1]
    finally:
        os.close(fd)


def _is_link(fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=fd).st_mode)
    except OSError:
        return False


def output_path(dest: str, rel: str) -> str:
    """The path of output ``rel`` under ``dest`` (for messages; writes go by descriptor)."""
    return os.path.join(dest, *_parts(rel))


def output_stat(dest: str, rel: str) -> os.stat_result | None:
    """The output's own status (a link is not followed); None when it is missing or on no real path."""
    try:
        with parent_folder(dest, rel, create=False) as (fd, name):
            return os.lstat(name, dir_fd=fd)
    except OSError:
        return None


def output_sha256(dest: str, rel: str) -> str | None:
    """The sha256 of the output when it is a regular file reached without links; None otherwise."""
    try:
        with parent_folder(dest, rel, create=False) as (dfd, name):
            fd = os.open(name, _READ_FLAGS, dir_fd=dfd)
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                return None
            h = hashlib.sha256()
            while chunk := fh.read(CHUNK):
                h.update(chunk)
            return h.hexdigest()
    except OSError:
        return None


def remove_output(dest: str, rel: str) -> None:
    """Remove output ``rel`` (the name itself; a link is removed, not its target)."""
    with contextlib.suppress(FileNotFoundError), parent_folder(dest, rel, create=False) as (fd, name):
        os.unlink(name, dir_fd=fd)


def place(dest: str, rel: str, staged: str) -> int:
    """Rename the finished file ``staged`` (in a temporary folder of ``dest``) to output ``rel``;
    its size. The output gets a plain ``open(path, "w")``'s permissions (see the module docstring)."""
    path = output_path(dest, rel)
    try:
        with parent_folder(dest, rel, create=True) as (fd, name):
            mode = 0o666 & ~current_umask()
            with contextlib.suppress(FileNotFoundError):
                old = os.lstat(name, dir_fd=fd)
                if stat.S_ISDIR(old.st_mode):
                    raise DestError(errno.EISDIR, "a folder is where the output goes", path)
                if stat.S_ISREG(old.st_mode):
                    mode = stat.S_IMODE(old.st_mode)
            os.chmod(staged, mode)
            size = os.stat(staged).st_size
            try:
                os.rename(staged, name, dst_dir_fd=fd)
            except OSError as e:
                if e.errno == errno.EXDEV:
                    raise DestError(e.errno, "on another file system than DEST (a mount inside DEST)",
                                    path) from None
                raise
            return size
    except OSError as e:
        raise _named(e, path) from None
