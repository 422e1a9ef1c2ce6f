"""The app shows a file name with U+202E (and a newline, ESC) escaped: window title, tab, tooltips, labels.

A U+202E in a file name reversed kvscope's own text after it ("(setyb 216,21)"). Offscreen, a real
main window opens the file; every text the window shows must be free of raw bidi and control characters.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from PySide6.QtWidgets import QAbstractButton, QLabel, QTextBrowser, QTextEdit

from tests.support.report_paths import NAN_FILE

NAME = "name\u202eevil\x1b[31m\nline.seqdata.bin"
RAW = ("\u202e", "\x1b", "\n")


def _texts(win) -> list[str]:  # type: ignore[no-untyped-def]
    out = [win.windowTitle(), win.statusBar().currentMessage()]
    out += [win.tabs.tabText(i) for i in range(win.tabs.count())]
    out += [win.tabs.tabToolTip(i) for i in range(win.tabs.count())]
    out += [w.text() for w in win.findChildren(QLabel)] + [w.text() for w in win.findChildren(QAbstractButton)]
    out += [w.toPlainText() for w in win.findChildren(QTextBrowser)] + [w.toPlainText() for w in
                                                                        win.findChildren(QTextEdit)]
    return out


def test_a_bidi_file_name_is_shown_escaped(window, qtbot, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    src = tmp_path / NAME
    shutil.copy(NAN_FILE, src)
    w = window.open_file(str(src))
    qtbot.waitUntil(lambda: w.doc.result is not None, timeout=20000)
    qtbot.wait(200)
    texts = _texts(window)
    shown = [t for t in texts if "evil" in t]
    assert shown, "the file name is shown somewhere"
    assert any("name\\u202eevil\\x1b[31m\\nline" in t for t in shown), shown
    bad = [t for t in texts if any(c in t for c in RAW[:2])]
    assert bad == [], [t[max(0, t.find("evil") - 80):t.find("evil") + 40] for t in bad]
