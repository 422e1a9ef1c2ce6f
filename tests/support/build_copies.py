"""Copies of a pinned build's cache folder for tests that change one (never the real cache): with the
record of its files' sha256 that a build made now carries, or without it as a cache made before that."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from kvscope.core.engine.builds import FILES_KEY, InstalledBuild, file_record


def build_copy(have: InstalledBuild, cache: Path, *, recorded: bool = True) -> Path:
    """``have``'s folder copied into the cache folder ``cache`` under its own name (links kept as links);
    ``recorded``: BUILD.json gets the file record ``_build`` writes at the end of a build."""
    dst = cache / have.path.name
    shutil.copytree(have.path, dst, symlinks=True)
    info = json.loads((dst / "BUILD.json").read_text())
    info.pop(FILES_KEY, None)
    if recorded:
        info[FILES_KEY] = file_record(dst)
    (dst / "BUILD.json").write_text(json.dumps(info, indent=1) + "\n")
    return dst
