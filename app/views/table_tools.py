"""Copy, stepping and context-menu conventions shared by the list views (findings, tokens, diff).

Ctrl+C copies the selected rows as tab-separated text (what each column shows); F8/Shift+F8 step to the
next or previous row, wrapping; a right click opens the view's menu, built by the view at that moment.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QAbstractItemModel, QEvent, QItemSelectionModel, QObject, QPoint, Qt
from PySide6.QtGui import QGuiApplication, QKeyEvent, QKeySequence
from PySide6.QtWidgets import QAbstractItemView, QMenu

COPY_ROWS_LIMIT = 100_000  # rows a copy takes at most


def selected_rows(view: QAbstractItemView) -> list[int]:
    """The selected rows of ``view`` (the current row when none is selected), in order."""
    rows = sorted({i.row() for i in view.selectionModel().selectedRows()})
    if not rows and view.currentIndex().isValid():
        rows = [view.currentIndex().row()]
    return rows[:COPY_ROWS_LIMIT]


def step_row(view: QAbstractItemView, delta: int) -> int | None:
    """Make the next (``delta`` 1) or previous (-1) row of ``view`` current and selected, wrapping, and scroll to
    it: its row, or None when the view has none."""
    model = view.model()
    n = model.rowCount()
    if n == 0:
        return None
    cur = view.currentIndex()
    row = (cur.row() + delta) % n if cur.isValid() else (0 if delta > 0 else n - 1)
    idx = model.index(row, 0)
    view.selectionModel().setCurrentIndex(
        idx, QItemSelectionModel.SelectionFlag.ClearAndSelect | QItemSelectionModel.SelectionFlag.Rows)
    view.scrollTo(idx)
    return row


def rows_text(model: QAbstractItemModel, rows: list[int], header: bool = False) -> str:
    """``rows`` of ``model`` as tab-separated lines of what each column shows."""
    cols = range(model.columnCount())
    lines = []
    if header:
        lines.append("\t".join(str(model.headerData(c, Qt.Orientation.Horizontal) or "") for c in cols))
    for r in rows:
        lines.append("\t".join(_text(model.index(r, c).data()) for c in cols))
    return "\n".join(lines)


def _text(v: object) -> str:
    return "" if v is None else str(v).replace("\t", " ").replace("\n", " ")


def copy_text(text: str) -> str:
    QGuiApplication.clipboard().setText(text)
    return text


class _CopyKey(QObject):
    """Catches the Copy key (Ctrl+C) on a view before the view's own handler (which copies one cell)."""

    def __init__(self, view: QAbstractItemView, copy: Callable[[], object]) -> None:
        super().__init__(view)
        self._copy = copy

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:
        if event.type() in (QEvent.Type.KeyPress, QEvent.Type.ShortcutOverride) and isinstance(event, QKeyEvent) \
                and event.matches(QKeySequence.StandardKey.Copy):
            event.accept()
            if event.type() == QEvent.Type.KeyPress:
                self._copy()
            return True
        return False


def install_copy(view: QAbstractItemView, copy: Callable[[], object]) -> QObject:
    """Ctrl+C on ``view`` runs ``copy`` (instead of Qt's copy of the current cell only). A key filter, not a
    shortcut: it works whether or not the window is the active one."""
    key = _CopyKey(view, copy)
    view.installEventFilter(key)
    return key


def install_menu(view: QAbstractItemView, build: Callable[[], QMenu]) -> None:
    """A right click on ``view`` makes the row under the pointer current and shows ``build()``'s menu."""
    view.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)

    def show(pos: QPoint) -> None:
        idx = view.indexAt(pos)
        if idx.isValid() and not view.selectionModel().isRowSelected(idx.row(), idx.parent()):
            view.setCurrentIndex(idx)
        build().popup(view.viewport().mapToGlobal(pos))

    view.customContextMenuRequested.connect(show)
