"""The hex view's find bar: a hex pattern, text, an integer or float of a given width, or node text.

Byte searches run on the document's task runner (:func:`~kvscope.app.views.bytes.byte_search.find_wrapping`,
bounded pieces, cancellable); Next / Previous (Enter / Shift+Enter) continue from the cursor, wrapping at
the ends of the file. Node searches (name, kind, path, value) select the node.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLineEdit, QPushButton, QWidget

from kvscope.app.base.shortcuts import pass_window_shortcuts
from kvscope.app.base.tasks import CancelToken, Report, Task
from kvscope.app.base.widgets import plain_label
from kvscope.app.document.document import Document
from kvscope.app.views.bytes.byte_search import KINDS, QueryError, find_wrapping, parse_query, searched_value
from kvscope.app.views.structure.node_find import find_node

NODE_KIND = "node"
KIND_LABELS = {NODE_KIND: "node text", **{k: k for k in KINDS}}


class _Entry(QLineEdit):
    """Enter finds the next match, Shift+Enter the previous one, Escape hands focus back."""

    def __init__(self, bar: FindBar) -> None:
        super().__init__()
        self.bar = bar
        pass_window_shortcuts(self)

    def keyPressEvent(self, e: QKeyEvent) -> None:
        if e.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            self.bar.find_next(backward=bool(e.modifiers() & Qt.KeyboardModifier.ShiftModifier))
            return
        if e.key() == Qt.Key.Key_Escape:
            self.bar.cancel()
            self.bar.escaped.emit()
            return
        super().keyPressEvent(e)


class FindBar(QWidget):
    """Find bytes or nodes; ``found(offset, length)`` / ``nodeFound(node)`` carry the match."""

    found = Signal(int, int)
    nodeFound = Signal(object)
    escaped = Signal()

    def __init__(self, doc: Document, cursor: Callable[[], int], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.doc = doc
        self.start_offset = cursor  # the offset searches start from (``cursor()`` stays QWidget's)
        self.task: Task | None = None
        self.last: tuple[int, int] | None = None  # the last match (offset, length)
        self.kind = QComboBox()
        for k, label in KIND_LABELS.items():
            self.kind.addItem(label, k)
            self.kind.setItemData(self.kind.count() - 1, KINDS.get(k, "a node's name, kind, path or value"),
                                  Qt.ItemDataRole.ToolTipRole)
        self.kind.setCurrentIndex(self.kind.findData("hex"))
        self.kind.setToolTip("what the text names: bytes in hex, text, a little-endian number of a width, or nodes")
        self.entry = _Entry(self)
        self.entry.setClearButtonEnabled(True)
        self.entry.setAcceptDrops(False)  # a file dropped here opens it (the window takes it), never pastes its path
        self.prev_button = QPushButton("◀")
        self.prev_button.setToolTip("previous match (Shift+Enter)")
        self.next_button = QPushButton("▶")
        self.next_button.setToolTip("next match (Enter)")
        for b in (self.prev_button, self.next_button):
            b.setFixedWidth(b.fontMetrics().horizontalAdvance("▶") + 24)
        self.status = plain_label("")
        self.status.setMinimumWidth(self.status.fontMetrics().horizontalAdvance("0" * 18))
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(plain_label("Find"))
        lay.addWidget(self.kind)
        lay.addWidget(self.entry, 1)
        lay.addWidget(self.prev_button)
        lay.addWidget(self.next_button)
        lay.addWidget(self.status)
        self.kind.currentIndexChanged.connect(self._on_kind)
        self.prev_button.clicked.connect(lambda: self.find_next(backward=True))
        self.next_button.clicked.connect(lambda: self.find_next())
        self._on_kind()

    @property
    def mode(self) -> str:
        return str(self.kind.currentData())

    def _on_kind(self) -> None:
        k = self.mode
        hints = {"hex": "71 73 67 67", "text": "text to find", NODE_KIND: "name, kind, path or value"}
        self.entry.setPlaceholderText(hints.get(k, f"a {KINDS.get(k, k)} value"))
        self.status.setText("")

    def focus(self, kind: str | None = None) -> None:
        if kind is not None and self.kind.findData(kind) >= 0:
            self.kind.setCurrentIndex(self.kind.findData(kind))
        self.entry.setFocus(Qt.FocusReason.ShortcutFocusReason)
        self.entry.selectAll()

    def set_query(self, kind: str, text: str) -> None:
        self.kind.setCurrentIndex(self.kind.findData(kind))
        self.entry.setText(text)

    @property
    def busy(self) -> bool:
        return self.task is not None and not self.task.done

    def cancel(self) -> None:
        if self.busy and self.task is not None:
            self.task.cancel()

    def find_next(self, backward: bool = False) -> Task | None:
        """Look for the next (or previous) match; a byte search runs in the background (its task is returned)."""
        if self.mode == NODE_KIND:
            self._find_node(backward)
            return None
        try:
            pattern = parse_query(self.mode, self.entry.text())
        except QueryError as e:
            self.status.setText(str(e))
            return None
        data = self.doc.data
        if int(data.size) == 0:
            return None
        self.cancel()
        cur = self.start_offset()
        start = cur if backward else cur + 1
        what = searched_value(self.mode, pattern)

        def job(token: CancelToken, report: Report) -> tuple[int, bool]:
            return find_wrapping(data, pattern, start, backward, lambda: token.cancelled,
                                 lambda f: report(f, f"finding {what}"))

        self.status.setText("searching…")
        self.task = self.doc.runner.submit(f"find {what}", job,
                                           lambda out: self._on_found(out, len(pattern), what),
                                           lambda m: self.status.setText(f"search failed: {m}"))
        self.task.cancelled.connect(lambda: self.status.setText("cancelled"))
        return self.task

    def _on_found(self, out: tuple[int, bool], length: int, what: str) -> None:
        hit, wrapped = out
        if hit < 0:
            self.last = None
            self.status.setText(f"{what}: not found")
            return
        self.last = (hit, length)
        self.status.setText(f"at {hit:,} (0x{hit:x})" + (" · wrapped" if wrapped else ""))
        self.found.emit(hit, length)

    def _find_node(self, backward: bool) -> None:
        idx, res = self.doc.index, self.doc.result
        if idx is None or res is None:
            return
        sel = self.doc.bus.current
        node = find_node(list(res.root.walk()), self.entry.text(), sel.node if sel is not None else None, backward)
        if node is None:
            self.status.setText("no such node" if self.entry.text().strip() else "type a node's name or value")
            return
        self.status.setText(node.path if len(node.path) < 40 else "…" + node.path[-39:])
        self.nodeFound.emit(node)
