"""Writing a report folder all at once: built next to the destination, then renamed into place.

An existing destination is replaced only after the new folder is complete (rename the old one
away, rename the new one in, delete the old one); on any failure (or SIGTERM/SIGINT while it is
built) the old folder is left as it was and the partial one is removed. The temporary folders are
named with :data:`kvscope.core.fsutil.TEMP_PREFIX`, so ``scan`` skips them. Only an empty folder
or a previous kvscope report is ever replaced, so a mistyped ``-o ~`` cannot remove a home
directory.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path

from kvscope.app.report.model import GENERATOR, ReportError
from kvscope.core.fsutil import temp_name, temporary_folder


def is_report(folder: Path) -> bool:
    """True when ``folder`` holds a report.json written by kvscope report."""
    try:
        meta = json.loads((folder / "report.json").read_text(encoding="utf-8")).get("report")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(meta, dict) and meta.get("generator") == GENERATOR


def check_destination(dest: Path) -> None:
    """ReportError unless ``dest`` is absent, an empty folder, or a kvscope report."""
    if not dest.exists() and not dest.is_symlink():
        return
    if not dest.is_dir() or dest.is_symlink():
        raise ReportError(f"{dest}: exists and is not a folder")
    if any(dest.iterdir()) and not is_report(dest):
        raise ReportError(f"{dest}: exists and is not a kvscope report (refusing to replace it)")


def _free_name(parent: Path, stem: str) -> Path:
    for _ in range(100):
        path = parent / f"{temp_name(stem)}{secrets.token_hex(4)}"
        if not path.exists():
            return path
    raise ReportError(f"{parent}: cannot find a free temporary name")


def replace_folder(dest: str | os.PathLike[str], fill: Callable[[Path], None]) -> Path:
    """Call ``fill(tmp)`` on a fresh folder beside ``dest``, then put it in place of ``dest``."""
    dest = Path(os.path.abspath(dest))
    check_destination(dest)
    parent = dest.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ReportError(f"{parent}: cannot create: {e.strerror or e}") from None
    with temporary_folder(parent, dest.name + ".new") as tmp_name:  # removed on failure or SIGTERM
        tmp = Path(tmp_name)
        fill(tmp)
        if dest.exists():
            old = _free_name(parent, dest.name + ".old")
            os.rename(dest, old)
            try:
                os.rename(tmp, dest)
            except BaseException:
                os.rename(old, dest)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, dest)
    return dest
