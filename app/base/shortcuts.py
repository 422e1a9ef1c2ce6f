"""Window shortcuts that reach the window from a text box.

Under X11 a QLineEdit claims some Ctrl keys for its emacs-style cursor moves (Ctrl+E: end of line), so a
window action on that key (File › Export Report…) never fired while a find box had focus. The filter
here lets a key through to the window when an enabled action of the window has it as its shortcut and it
is not one of the editing keys the box needs (copy, cut, paste, undo, redo, select all).
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject
from PySide6.QtGui import QAction, QKeyEvent, QKeySequence
from PySide6.QtWidgets import QWidget

EDITING_KEYS = (QKeySequence.StandardKey.Copy, QKeySequence.StandardKey.Cut, QKeySequence.StandardKey.Paste,
                QKeySequence.StandardKey.Undo, QKeySequence.StandardKey.Redo, QKeySequence.StandardKey.SelectAll)


def window_claims(widget: QWidget, event: QKeyEvent) -> bool:
    """Whether an enabled action of ``widget``'s window has the key of ``event`` (an editing key never)."""
    if any(event.matches(k) for k in EDITING_KEYS):
        return False
    combo = QKeySequence(event.keyCombination())
    for action in widget.window().findChildren(QAction):
        if action.isEnabled() and any(s.matches(combo) == QKeySequence.SequenceMatch.ExactMatch
                                      for s in action.shortcuts()):
            return True
    return False


class _PassWindowShortcuts(QObject):
    def eventFilter(self, obj: QObject, event: QEvent) -> bool:
        if (event.type() == QEvent.Type.ShortcutOverride and isinstance(obj, QWidget)
                and isinstance(event, QKeyEvent) and window_claims(obj, event)):
            event.ignore()  # not overridden: the shortcut goes to the window's action
            return True
        return False


def pass_window_shortcuts(widget: QWidget) -> None:
    """Let the window's own shortcuts through ``widget`` (a line edit or combo box)."""
    f = _PassWindowShortcuts(widget)
    widget.installEventFilter(f)
