"""Dropping a file's pages from the page cache, for tests and benchmarks that need a cold read."""

from __future__ import annotations

import os
from pathlib import Path


def drop_cache(path: str | Path) -> bool:
    """Ask the kernel to forget the file's cached pages (clean pages only: the file is fsynced first);
    False where the platform has no ``posix_fadvise``."""
    if not hasattr(os, "posix_fadvise"):
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return True
