"""The open file's bytes as the views read them, and what tells the document that the file changed.

:class:`ViewSource` is the core's :class:`~kvscope.core.reader.source.ByteSource` (bounded
``pread``, never a memory map, so a file cut short under the app cannot kill it with SIGBUS) with
one difference for the GUI: indexing (``src[i]``, ``src[a:b]``), which the hex view and the data
inspector use while painting, does not raise when the file shrank. It gives zero bytes for what
is gone and reports the change once through ``on_changed``; the document then offers Reload. The
core's own reads (statistics, heatmaps, diffs on pool threads) still raise
:class:`~kvscope.core.reader.source.FileChangedError`, so no computation runs on vanished bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, overload

import numpy as np
import numpy.typing as npt

from kvscope.core.reader.source import ByteSource, FileChangedError, FileIdentity


class IndexedBytes(Protocol):
    """What the byte views read: a :class:`ViewSource` or, in tests, a numpy array of the bytes."""

    @property
    def size(self) -> int: ...

    def __getitem__(self, key: slice, /) -> npt.NDArray[np.uint8]: ...


class ViewSource(ByteSource):
    """A :class:`ByteSource` whose indexing survives a file that changed (see the module docstring)."""

    on_changed: Callable[[str], None] | None = None
    changed_seen = False

    @overload
    def __getitem__(self, key: int) -> int: ...
    @overload
    def __getitem__(self, key: slice) -> npt.NDArray[np.uint8]: ...
    def __getitem__(self, key: int | slice) -> int | npt.NDArray[np.uint8]:
        try:
            return super().__getitem__(key)
        except (FileChangedError, OSError) as e:
            self._report(str(e))
            if isinstance(key, slice):
                lo, hi, _ = key.indices(self.size)
                return np.zeros(max(0, hi - lo), np.uint8)
            return 0

    def _report(self, message: str) -> None:
        if not self.changed_seen:
            self.changed_seen = True
            if self.on_changed is not None:
                self.on_changed(message)


def empty_source() -> ViewSource:
    """The bytes of a document not read yet."""
    return ViewSource(b"")


def describe_change(before: FileIdentity | None, path: str) -> str | None:
    """What changed since ``before`` (None when nothing did): ``size 7,376 → 3,688 bytes``, ``deleted``..."""
    now = FileIdentity.of_path(path)
    if before is None or now == before:
        return None
    if now is None:
        return "the file was deleted or cannot be read any more"
    if (now.ino, now.dev) != (before.ino, before.dev):
        return f"the file was replaced ({before.size:,} → {now.size:,} bytes)"
    if now.size != before.size:
        return f"the file was rewritten: {before.size:,} → {now.size:,} bytes"
    return "the file was rewritten in place (same size, new modification time)"
