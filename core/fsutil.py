"""Atomic file output: every file kvscope writes appears complete or not at all.

Data goes to a temporary file in the destination's folder, is flushed to disk, then renamed over
the destination (``os.replace`` is atomic on one file system). Nothing is left behind on failure.
"""

from __future__ import annotations

import os
import tempfile


def write_atomic(
    path: str | os.PathLike[str], data: bytes | bytearray | memoryview | str, prefix: str = ".kvscope-"
) -> None:
    """Write ``data`` (text is UTF-8 encoded) to ``path`` atomically."""
    target = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(target))
    fd, tmp = tempfile.mkstemp(prefix=prefix, dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
