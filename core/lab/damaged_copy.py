"""A damaged copy of a state file on disk: the lab's corruptions applied in order, written atomically.

:func:`corrupt_file` is ``kvscope corrupt``'s work (:mod:`kvscope.core.cli.corrupt_command`): it copies the
input once, read-only (a regular file only: a FIFO or a device is refused before it is read), into the
output's temporary file (:func:`kvscope.core.fsutil.atomic_writer`), applies each
:class:`~kvscope.core.lab.corruptions.Corruption` there in place, to the result of the one before, and
renames the copy into place: memory about what the mutations touch, not the file's size. An output that names the
input or the model, by any path, or that exists and is not a regular file, is refused before anything
is read (:func:`kvscope.core.fsutil.check_output`). No torch: the corruptions work on the reader's
parse of the bytes.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from dataclasses import dataclass

from kvscope.core.errors import InputError
from kvscope.core.fileio import open_regular, read_regular
from kvscope.core.fsutil import atomic_writer, check_output
from kvscope.core.lab.corruptions import (
    MAX_TRAILER,
    Corruption,
    CorruptionError,
    Damage,
    apply_edits_fd,
    parse_spec,
)
from kvscope.core.model.profile import ModelProfile, load_model_or
from kvscope.core.reader.source import ByteSource
from kvscope.core.textsafe import safe_text

__all__ = ["CorruptCopyError", "DamagedCopy", "corrupt_file", "read_file"]

_PIECE = 64 << 20  # bytes per step of the copy (a kernel copy: none of it passes through this process)


class CorruptCopyError(InputError):
    """The copy was not written: one line saying why."""


@dataclass(frozen=True)
class DamagedCopy:
    """What was written: where, its size, and each mutation as applied (labels in the same order)."""

    source: str
    output: str
    size: int
    labels: tuple[str, ...]
    mutations: tuple[Damage, ...]

    def lines(self) -> list[str]:
        """One line per mutation (its label, what it did, the input bytes it touched), then the output."""
        out = []
        for label, m in zip(self.labels, self.mutations, strict=True):
            where = _where(m.ranges)
            out.append(f"{safe_text(label)}: {safe_text(m.description)}" + (f" [input {where}]" if where else ""))
        out.append(f"written: {safe_text(self.output)} ({self.size:,} bytes)")
        return out


def _where(ranges: Sequence[tuple[int, int]]) -> str:
    """The input bytes touched, from ``(offset, length)`` ranges: each one when there are few, else their span."""
    if not ranges:
        return ""
    if len(ranges) <= 3:
        return ", ".join(f"bytes {off:,}..{off + n:,}" for off, n in ranges)
    lo, hi = min(off for off, _ in ranges), max(off + n for off, n in ranges)
    return f"{len(ranges)} byte ranges within {lo:,}..{hi:,}"


def read_file(path: str | os.PathLike[str]) -> bytes:
    """The bytes of a regular file, read-only; CorruptCopyError (one line) for anything else."""
    try:
        return read_regular(path)
    except OSError as e:
        raise CorruptCopyError(f"{safe_text(os.fspath(path))}: {e.strerror or e}") from None
    except ValueError as e:
        raise CorruptCopyError(f"{safe_text(os.fspath(path))}: {e}") from None


def _profile(model: str | None) -> ModelProfile | None:
    if model is None:
        return None
    return load_model_or(model, CorruptCopyError)


def corrupt_file(source: str | os.PathLike[str], output: str | os.PathLike[str], specs: Sequence[str | Corruption],
                 model: str | None = None) -> DamagedCopy:
    """Apply ``specs`` to ``source``'s bytes in order and write the result to ``output`` atomically.

    Every spec is checked before anything is read (a malformed one, or trailers adding more than
    :data:`~kvscope.core.lab.corruptions.MAX_TRAILER` bytes in all, is refused). The input is copied to the
    output's temporary file by the kernel, each mutation is planned on the copy so far and made in place
    there (:func:`~kvscope.core.lab.corruptions.apply_edits_fd`), then the copy is renamed into place: the
    memory used is what the edits touch, not the file's size.
    """
    src, out = os.fspath(source), os.fspath(output)
    if not specs:
        raise CorruptCopyError("no corruption given (--corrupt SPEC; kvscope corrupt --list names the catalog)")
    check_output(out, [src, model], error=CorruptCopyError)  # never over FILE or the model; no FIFO, device, folder
    corruptions: list[Corruption] = []
    for spec in specs:
        try:
            corruptions.append(spec if isinstance(spec, Corruption) else parse_spec(spec))
        except CorruptionError as e:
            raise CorruptCopyError(f"{safe_text(str(spec))}: {e}; kvscope corrupt --list names the catalog") from None
    added = sum(c.appends for c in corruptions)
    if added > MAX_TRAILER:
        raise CorruptCopyError(f"the trailers add {added:,} bytes in all: at most {MAX_TRAILER:,}")
    profile = _profile(model)
    fd_in = _open_input(src)
    done: list[Damage] = []
    try:
        with atomic_writer(out, "corrupt") as fh:
            fd = fh.fileno()
            size = _copy(fd_in, fd)
            os.close(fd_in)
            fd_in = -1
            for c in corruptions:
                with ByteSource.open(f"/dev/fd/{fd}") as copy:  # the copy so far, through a descriptor of its own
                    try:
                        d = c.plan(copy, profile)
                    except CorruptionError as e:
                        raise CorruptCopyError(f"{safe_text(c.label)}: {e}") from None
                size = apply_edits_fd(fd, size, d.edits)
                done.append(d)
    except OSError as e:
        raise CorruptCopyError(f"{safe_text(out)}: cannot write: {e.strerror or e}") from None
    finally:
        if fd_in >= 0:
            os.close(fd_in)
    return DamagedCopy(src, out, size, tuple(c.label for c in corruptions), tuple(done))


def _open_input(path: str) -> int:
    """The input open read-only (a regular file only: :func:`~kvscope.core.fileio.open_regular`)."""
    try:
        return open_regular(path)[0]
    except OSError as e:
        raise CorruptCopyError(f"{safe_text(path)}: {e.strerror or e}") from None
    except ValueError as e:
        raise CorruptCopyError(f"{safe_text(path)}: {e}") from None


def _copy(src: int, dst: int) -> int:
    """Copy the file open as ``src`` into ``dst`` from the start, in the kernel where it can; the bytes copied."""
    off, kernel = 0, hasattr(os, "copy_file_range")
    while True:
        if kernel:
            try:
                n = os.copy_file_range(src, dst, _PIECE, off, off)
            except OSError as e:
                if off or e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM):
                    raise
                kernel = False
                continue
        else:
            piece = os.pread(src, _PIECE, off)
            n = len(piece)
            view = memoryview(piece)
            while view:
                w = os.pwrite(dst, view, off + n - len(view))
                view = view[w:]
        if n == 0:
            return off
        off += n
