"""What the hex view does with its selection: copy it (hex, C array, Python bytes, typed values, offset,
node path), export it, find it, go to an offset, and the context menu that offers all of it beside
bookmarking and corrupting into a copy.

:class:`HexActions` works on a :class:`HexHost` (the hex view: its selection, cursor and find bar), so
the view itself keeps only painting, paging and selecting. Big copies and exports are refused with one
line (:data:`EXPORT_LIMIT`); exports are written atomically in the background.
"""

from __future__ import annotations

import os
from typing import Protocol

from PySide6.QtCore import QPoint
from PySide6.QtGui import QGuiApplication, QKeySequence
from PySide6.QtWidgets import QFileDialog, QInputDialog, QMenu, QWidget

from kvscope.app.base.tasks import CancelToken, Report, Task
from kvscope.app.document.bookmark import Bookmark
from kvscope.app.document.document import Document
from kvscope.app.views.bytes.byte_text import TooLarge, format_bytes, read_bytes
from kvscope.app.views.bytes.find_bar import FindBar
from kvscope.app.views.bytes.selection_values import Decoded, decode_selection
from kvscope.app.views.export import ExportButton
from kvscope.core.fsutil import write_atomic

EXPORT_LIMIT = 256 << 20  # bytes "Export selected bytes" writes at most
# bytes "Find these bytes" takes at most: the pattern goes into the find bar as hex text (3 characters a byte,
# under QLineEdit's 32,767), which is enough for a row of a record or a whole small record
FIND_LIMIT = 4096
FORMAT_NAMES = {"hex": "hex", "c": "a C array", "python": "Python bytes"}


class HexHost(Protocol):
    """What the actions need of the hex view."""

    doc: Document
    cursor_offset: int
    find_bar: FindBar
    export_button: ExportButton

    @property
    def selection(self) -> tuple[int, int]: ...

    def update_values(self) -> Decoded | None: ...

    def goto(self, offset: int, publish: bool = False) -> None: ...

    def select_node_at(self, offset: int) -> None: ...

    def select_all(self) -> None: ...

    def bookmark_selection(self) -> None: ...

    def note_on_bookmark(self, b: Bookmark) -> None: ...

    def corrupt_selection(self) -> object: ...


class HexActions:
    """The hex view's copy, export, find, go-to and context-menu actions (``parent``: the dialogs' parent)."""

    def __init__(self, host: HexHost, parent: QWidget) -> None:
        self.host, self.parent = host, parent
        self.task: Task | None = None

    @property
    def doc(self) -> Document:
        return self.host.doc

    # -- copying --------------------------------------------------------------------------------------
    def _clip(self, text: str, what: str) -> None:
        QGuiApplication.clipboard().setText(text)
        self.doc.message.emit(f"copied {what}")

    def copy(self, fmt: str = "hex") -> str | None:
        """Copy the selected bytes as ``hex``, ``c`` or ``python``; the text, or None when they are too many."""
        a, b = self.host.selection
        try:
            text = format_bytes(read_bytes(self.doc.data, a, b - a), fmt)
        except TooLarge as e:
            self.doc.message.emit(str(e))
            return None
        self._clip(text, f"{b - a:,} bytes as {FORMAT_NAMES.get(fmt, fmt)}")
        return text

    def copy_values(self) -> str | None:
        """Copy the selection's values (as the record's type); None when the bytes have no type of their own."""
        d = self.host.update_values()
        if d is None:
            self.doc.message.emit("these bytes hold no typed values (select K/V/r/s rows or token ids)")
            return None
        text = d.text()
        self._clip(text, f"{d.values.size:,} {d.type} values")
        return text

    def copy_offset(self) -> str:
        off = self.host.cursor_offset
        self._clip(str(off), f"offset {off:,}")
        return str(off)

    def copy_path(self) -> str | None:
        idx = self.doc.index
        leaf = idx.leaf_at(self.host.cursor_offset) if idx is not None else None
        if leaf is None:
            return None
        self._clip(leaf.path, leaf.path)
        return leaf.path

    # -- menu ------------------------------------------------------------------------------------------
    def build_menu(self) -> QMenu:
        """The context menu of the selected bytes."""
        host = self.host
        a, b = host.selection
        n = b - a
        cur = host.cursor_offset
        menu = QMenu(self.parent)
        what = f"{n:,} byte" + ("" if n == 1 else "s")
        copy = menu.addAction(f"Copy {what} as hex", lambda: self.copy("hex"))
        copy.setShortcut(QKeySequence(QKeySequence.StandardKey.Copy))
        menu.addAction("Copy as C array", lambda: self.copy("c"))
        menu.addAction("Copy as Python bytes", lambda: self.copy("python"))
        idx = self.doc.index
        d = decode_selection(idx, self.doc.data, a, n) if idx is not None and n else None
        values = menu.addAction(f"Copy {d.values.size:,} {d.type} values" if d is not None else "Copy values",
                                self.copy_values)
        values.setEnabled(d is not None)
        menu.addSeparator()
        menu.addAction(f"Copy offset {cur:,} (0x{cur:x})", self.copy_offset)
        leaf = idx.leaf_at(cur) if idx is not None else None
        path = menu.addAction("Copy node path" + (f" {leaf.path}" if leaf is not None else ""), self.copy_path)
        path.setEnabled(leaf is not None)
        menu.addSeparator()
        menu.addAction("Go to offset…", self.ask_goto)
        node = menu.addAction("Select node" + (f" {leaf.name} ({leaf.size:,} bytes)" if leaf is not None else ""),
                              lambda: host.select_node_at(host.cursor_offset))
        node.setEnabled(leaf is not None)
        menu.addAction("Select all", host.select_all)
        find = menu.addAction("Find these bytes" if n <= FIND_LIMIT else f"Find these bytes (at most {FIND_LIMIT:,})",
                              self.find_selection)
        find.setEnabled(0 < n <= FIND_LIMIT)
        if n > FIND_LIMIT:
            find.setToolTip(f"a find takes at most {FIND_LIMIT:,} bytes (the find bar holds them as hex): select "
                            f"fewer than these {n:,}")
        else:
            find.setToolTip(f"the next place the file holds these {what} (the find bar, from the cursor)" if n
                            else "select the bytes to find first")
        menu.setToolTipsVisible(True)
        menu.addSeparator()
        bad = menu.addAction(f"Corrupt {what} into a copy… (zero / NaN / random / drop)", host.corrupt_selection)
        bad.setEnabled(n > 0 and self.doc.result is not None and self.doc.result.kind != "unknown")
        mark = menu.addAction(f"Bookmark {what}…", host.bookmark_selection)
        mark.setShortcut(QKeySequence("Ctrl+B"))
        here = self.doc.bookmarks.at(cur)
        if here:
            menu.addAction(f"Note on bookmark {here[0].name}…", lambda: host.note_on_bookmark(here[0]))
        menu.addSeparator()
        menu.addAction(f"Export {what}…", self.ask_export_bytes)
        menu.addAction("Export view as PNG…", host.export_button.ask_png)
        return menu

    def context_menu(self, at: QPoint) -> QMenu:
        """The context menu, shown at global point ``at`` (returned for tests)."""
        menu = self.build_menu()
        menu.popup(at)
        return menu

    # -- go to, find ------------------------------------------------------------------------------------
    def ask_goto(self) -> None:
        text, ok = QInputDialog.getText(self.parent, "Go to offset", "Offset (decimal or 0x hex):")
        if ok and text.strip():
            try:
                off = int(text.strip().replace("_", "").replace(",", ""), 0)
            except ValueError:
                self.doc.message.emit(f"not an offset: {text!r}")
                return
            self.host.goto(off, publish=True)

    def find_selection(self) -> None:
        """Find the next place the file holds the selected bytes (at most :data:`FIND_LIMIT`)."""
        a, b = self.host.selection
        if not 0 < b - a <= FIND_LIMIT:
            self.doc.message.emit(f"a find takes 1 to {FIND_LIMIT:,} bytes; {b - a:,} are selected")
            return
        self.host.find_bar.set_query("hex", format_bytes(read_bytes(self.doc.data, a, b - a), "hex"))
        self.host.find_bar.find_next()

    # -- export ---------------------------------------------------------------------------------------
    def ask_export_bytes(self) -> None:
        a, b = self.host.selection
        start = os.path.join(os.path.dirname(self.doc.path), f"{self.doc.name}.{a:x}-{b:x}.bin")
        path, _ = QFileDialog.getSaveFileName(self.parent, "Export the selected bytes", start, "All files (*)")
        if path:
            self.export_bytes(path)

    def export_bytes(self, path: str) -> Task | None:
        """Write the selected bytes to ``path`` (atomically, in the background); None when there are too many."""
        a, b = self.host.selection
        doc = self.doc
        if b - a > EXPORT_LIMIT:
            doc.message.emit(f"{b - a:,} bytes is more than an export takes ({EXPORT_LIMIT:,})")
            return None
        data = doc.data

        def job(token: CancelToken, report: Report) -> str:
            report(None, f"writing {os.path.basename(path)}")
            write_atomic(path, read_bytes(data, a, b - a, EXPORT_LIMIT), prefix=".kvscope-bytes-")
            return path

        self.task = doc.runner.submit(f"export {b - a:,} bytes", job,
                                      lambda p: doc.message.emit(f"saved {b - a:,} bytes to {os.path.basename(p)}"),
                                      lambda m: doc.message.emit(f"Cannot write {path}: {m}"))
        return self.task
