"""A damaged copy of a state file on disk: the lab's corruptions applied in order, written atomically.

:func:`corrupt_file` is ``kvscope corrupt``'s work (:mod:`kvscope.core.lab.corrupt_cli`): it reads the
input once, read-only (a regular file only: a FIFO or a device is refused before it is read), applies
each :class:`~kvscope.core.lab.corruptions.Corruption` to the result of the one before, and writes the
last result to the output through :func:`kvscope.core.fsutil.write_atomic`. An output that names the
input or the model, by any path, or that exists and is not a regular file, is refused before anything
is read (:func:`kvscope.core.fsutil.check_output`). No torch: the corruptions work on the reader's
parse of the bytes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from kvscope.core.errors import InputError
from kvscope.core.fileio import read_regular
from kvscope.core.fsutil import check_output, write_atomic
from kvscope.core.lab.corruptions import Corruption, CorruptionError, Mutation, parse_spec
from kvscope.core.model.profile import ModelProfile, ModelProfileError, load_model_profile
from kvscope.core.textsafe import safe_text

__all__ = ["CorruptCopyError", "DamagedCopy", "corrupt_file", "read_file"]


class CorruptCopyError(InputError):
    """The copy was not written: one line saying why."""


@dataclass(frozen=True)
class DamagedCopy:
    """What was written: where, its size, and each mutation as applied (labels in the same order)."""

    source: str
    output: str
    size: int
    labels: tuple[str, ...]
    mutations: tuple[Mutation, ...]

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
    try:
        return load_model_profile(model)
    except (ModelProfileError, OSError) as e:
        raise CorruptCopyError(f"cannot use model {safe_text(model)}: {e}") from None


def corrupt_file(source: str | os.PathLike[str], output: str | os.PathLike[str], specs: Sequence[str | Corruption],
                 model: str | None = None) -> DamagedCopy:
    """Apply ``specs`` to ``source``'s bytes in order and write the result to ``output`` atomically."""
    src, out = os.fspath(source), os.fspath(output)
    if not specs:
        raise CorruptCopyError("no corruption given (--corrupt SPEC; kvscope corrupt --list names the catalog)")
    check_output(out, [src, model], error=CorruptCopyError)  # never over FILE or the model; no FIFO, device, folder
    try:
        corruptions = [s if isinstance(s, Corruption) else parse_spec(s) for s in specs]
    except CorruptionError as e:
        raise CorruptCopyError(f"{e}; kvscope corrupt --list names the catalog") from None
    profile = _profile(model)
    data = read_file(src)
    done: list[Mutation] = []
    for c in corruptions:
        try:
            m = c.apply(data, profile)
        except CorruptionError as e:
            raise CorruptCopyError(f"{safe_text(c.label)}: {e}") from None
        done.append(m)
        data = m.data
    try:
        write_atomic(out, data, "corrupt")
    except OSError as e:
        raise CorruptCopyError(f"{safe_text(out)}: cannot write: {e.strerror or e}") from None
    return DamagedCopy(src, out, len(data), tuple(c.label for c in corruptions), tuple(done))
