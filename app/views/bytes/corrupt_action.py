"""The hex view's "Corrupt into a copy…": ask how (:class:`~kvscope.app.views.bytes.corrupt_dialog.CorruptDialog`),
then write the corrupted copy in the background.

The selection's bytes are corrupted by :mod:`kvscope.app.document.corrupt_copy` in a copy of the whole
file (read through the document's open source, at most :data:`CORRUPT_LIMIT` bytes), written
atomically as a new file; ``written(path, what was done)`` tells the window, which opens the copy. The
file itself is never changed.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from PySide6.QtWidgets import QWidget

from kvscope.app.base.tasks import CancelToken, Report, Task
from kvscope.app.document.corrupt_copy import corrupt_range, write_copy
from kvscope.app.document.document import Document
from kvscope.app.views.bytes.byte_text import read_bytes
from kvscope.app.views.bytes.corrupt_dialog import CorruptDialog

CORRUPT_LIMIT = 1 << 30  # the largest file "Corrupt into a copy" reads whole


class CorruptAction:
    """Corrupts ``selection()`` of ``doc`` into a copy; ``written(path, what)`` when one is on disk."""

    def __init__(self, doc: Document, selection: Callable[[], tuple[int, int]], parent: QWidget,
                 written: Callable[[str, str], None]) -> None:
        self.doc, self.selection, self.parent, self.written = doc, selection, parent, written
        self.task: Task | None = None

    def ask(self) -> CorruptDialog | None:
        """Ask how to corrupt the selection and the copy's name (window-modal); the copy is written on OK."""
        a, b = self.selection()
        res = self.doc.result
        if res is None or b <= a:
            return None
        dlg = CorruptDialog(self.doc.path, res, a, b, self.parent)
        dlg.accepted.connect(lambda: self.write(dlg.mode(), dlg.dest()))
        dlg.open()
        return dlg

    def write(self, mode: str, dest: str, seed: int = 0) -> Task | None:
        """Write the selection corrupted by ``mode`` to ``dest`` (a new file, atomically, in the background)."""
        a, b = self.selection()
        doc = self.doc
        res, profile, data, src, size = doc.result, doc.profile, doc.data, doc.path, int(doc.data.size)
        if res is None:
            return None
        if size > CORRUPT_LIMIT:
            doc.message.emit(f"{size:,} bytes is more than a corrupted copy takes ({CORRUPT_LIMIT:,})")
            return None

        def job(token: CancelToken, report: Report) -> tuple[str, str]:
            report(None, f"corrupting {os.path.basename(dest)}")
            copy = corrupt_range(read_bytes(data, 0, size, CORRUPT_LIMIT), res, profile, a, b, mode, seed)
            return write_copy(src, dest, copy), copy.description

        def done(out: tuple[str, str]) -> None:
            doc.message.emit(f"wrote {os.path.basename(out[0])}: {out[1]}")
            self.written(*out)

        self.task = doc.runner.submit(f"corrupt into {os.path.basename(dest)}", job, done,
                                      lambda m: doc.message.emit(f"Cannot write the copy: {m}"))
        return self.task
