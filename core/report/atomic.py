"""Writing a report folder: complete files only, and nothing in the folder but the report's own files touched.

A new destination is built next to where it goes and renamed into place (it appears whole). An
existing destination (an empty folder or an earlier report) keeps its identity and everything the
user put into it: the new report is built in a temporary folder inside it, and only once it is
complete are its files renamed over their namesakes one by one (each rename atomic, report.html
last); then the earlier report's own files the new one does not have (the pictures its report.json
lists) are removed. Any other file or folder in the destination is kept. On any failure (or
SIGTERM/SIGINT while it is built) the earlier report is left as it was and the partial one is
removed. The temporary folders are named with :data:`kvscope.core.fsutil.TEMP_PREFIX`, so ``scan``
skips them. Only an empty folder or a previous kvscope report is ever written into, so a mistyped
``-o ~`` cannot touch a home directory; the destination and every file the report writes are held
to :func:`kvscope.core.fsutil.output_problem` (never an input, by any path; never a FIFO or device).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TypeGuard

from kvscope.core.fsutil import check_output, output_problem, temporary_folder
from kvscope.core.report.model import GENERATOR, ReportError, ReportOptions

REPORT_FILES = ("report.json", "report.md", "report.html")  # written last, in this order (report.html last)

Inputs = Iterable[str | os.PathLike[str] | None]


def report_inputs(options: ReportOptions) -> list[str | None]:
    """The files a report reads: its outputs never name one of them."""
    return [options.file, options.model, options.compare, options.lab_context]


def is_report(folder: Path) -> bool:
    """True when ``folder`` holds a report.json written by kvscope report."""
    try:
        meta = json.loads((folder / "report.json").read_text(encoding="utf-8")).get("report")
    except (OSError, ValueError, AttributeError, RecursionError):  # RecursionError: JSON nested 100,000 deep
        return False
    return isinstance(meta, dict) and meta.get("generator") == GENERATOR


def check_destination(dest: Path, inputs: Inputs = ()) -> None:
    """ReportError unless ``dest`` is absent, an empty folder, or a kvscope report, and names no input."""
    check_output(dest, inputs, folder=True, error=ReportError)
    if not dest.exists() and not dest.is_symlink():
        return
    if not dest.is_dir() or dest.is_symlink():
        raise ReportError(f"{dest}: exists and is not a folder")
    if any(dest.iterdir()) and not is_report(dest):
        raise ReportError(f"{dest}: exists and is not a kvscope report (refusing to replace it)")


def _plain_name(name: object) -> TypeGuard[str]:
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\0" not in name


def own_files(folder: Path) -> set[str]:
    """The names an earlier report in ``folder`` wrote: report.json/.md/.html and the pictures its
    report.json lists (plain names in the folder only; a hand-edited list cannot reach elsewhere)."""
    try:
        images = json.loads((folder / "report.json").read_text(encoding="utf-8"))["report"]["images"]
        names = {im.get("file") for im in images if isinstance(im, dict)}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        names = set()
    return {n for n in names if _plain_name(n)} | set(REPORT_FILES)


def _in_order(names: Sequence[str]) -> list[str]:
    """Pictures first, then the report files in :data:`REPORT_FILES`'s order (report.html last)."""
    return sorted(n for n in names if n not in REPORT_FILES) + [n for n in REPORT_FILES if n in names]


def _is_file_or_link(path: Path) -> bool:
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return False
    return stat.S_ISREG(mode) or stat.S_ISLNK(mode)


def _replace_in_place(dest: Path, fill: Callable[[Path], None],
                      inputs: Sequence[str | os.PathLike[str] | None]) -> None:
    """Build the report inside ``dest``, then rename its files over their namesakes; remove the earlier
    report's own files the new one lacks. Nothing else in ``dest`` is touched."""
    earlier = own_files(dest) if is_report(dest) else set()
    with temporary_folder(dest, "report.new") as tmp_name:  # removed on failure or SIGTERM; same file system
        tmp = Path(tmp_name)
        fill(tmp)
        names = _in_order(os.listdir(tmp))
        for name in names:  # every target checked before the first rename: all of it is written, or none
            check_output(dest / name, inputs, error=ReportError)
        for name in names:
            os.replace(tmp / name, dest / name)
        os.rmdir(tmp)
    for name in sorted(earlier - set(names)):
        old = dest / name
        if _is_file_or_link(old) and output_problem(old, inputs) is None:
            os.unlink(old)


def replace_folder(dest: str | os.PathLike[str], fill: Callable[[Path], None], inputs: Inputs = ()) -> Path:
    """Call ``fill(tmp)`` on a fresh folder, then put its files in place in ``dest`` (see the module docstring).
    ``inputs``: the files the report read, which neither ``dest`` nor any file written into it may name."""
    dest = Path(os.path.abspath(dest))
    held = list(inputs)
    check_destination(dest, held)
    parent = dest.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ReportError(f"{parent}: cannot create: {e.strerror or e}") from None
    if dest.exists():
        _replace_in_place(dest, fill, held)
        return dest
    with temporary_folder(parent, dest.name + ".new") as tmp_name:  # removed on failure or SIGTERM
        fill(Path(tmp_name))
        os.rename(tmp_name, dest)
    return dest
