"""Menus, the toolbar, actions and their standard shortcuts; greys out what the current document cannot do,
saying why.

The menus know the window only as a :class:`MenuHost`: the commands its actions trigger. The window
passes itself, so this module never imports the window.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Protocol

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import QMenu, QMenuBar, QMessageBox, QStatusBar, QToolBar, QWidget

from kvscope.app.base.theme import THEMES, Theme
from kvscope.app.document.document import diff_available
from kvscope.app.shell.document_widget import TAB_TITLES, TAB_VIEWS, DocumentWidget
from kvscope.app.shell.repair_dialog import repair_document
from kvscope.app.shell.settings import AppSettings
from kvscope.app.shell.tokens_dialog import tokens_document
from kvscope.core.textsafe import safe_text


class MenuHost(Protocol):
    """What the menus need from the window that owns them: its settings, theme, menu bar and commands."""

    settings: AppSettings
    theme: Theme

    def window(self) -> QWidget: ...  # the top-level widget that parents the actions and dialogs
    def menuBar(self) -> QMenuBar: ...
    def statusBar(self) -> QStatusBar: ...
    def addToolBar(self, title: str) -> QToolBar: ...
    def close(self) -> bool: ...
    def current(self) -> DocumentWidget | None: ...
    def open_file(self, path: str, model: str | None = None) -> Any: ...
    def open_dialog(self) -> Any: ...
    def close_current(self) -> None: ...
    def compare_with(self, path: str | None = None, w: DocumentWidget | None = None) -> None: ...
    def choose_model(self, w: DocumentWidget | None = None) -> None: ...
    def export_report(self, dest: str | None = None) -> None: ...
    def find_in_tree(self) -> None: ...
    def goto_offset(self, offset: int | None = None) -> None: ...
    def step_finding(self, delta: int) -> None: ...
    def step_difference(self, delta: int) -> None: ...
    def show_view(self, name: str) -> None: ...
    def set_theme(self, name: str) -> None: ...
    def verify(self) -> None: ...
    def cancel_verify(self) -> None: ...
    def engine_settings(self) -> object: ...


@dataclass
class Actions:
    """The window's actions that depend on the current document."""

    by_name: dict[str, QAction] = field(default_factory=dict)
    recent_menu: QMenu | None = None
    toolbar: QToolBar | None = None

    def __getitem__(self, name: str) -> QAction:
        return self.by_name[name]

    def update(self, w: DocumentWidget | None) -> None:
        """Enable what ``w`` (the current document's page, None without one) can do."""
        loaded = w is not None and w.doc.result is not None
        for name in ("close", "find", "goto", "next_finding", "prev_finding", "model", "export_report"):
            self.by_name[name].setEnabled(w is not None and (loaded or name in ("close", "model")))
        can_diff = loaded and diff_available()
        act = self.by_name["diff"]
        act.setEnabled(can_diff)
        act.setToolTip("" if can_diff else ("needs kvscope.core.analysis.diff" if not diff_available()
                                            else "open a state file first"))
        has_diff = w is not None and w.doc.diff is not None
        for name in ("next_diff", "prev_diff"):
            self.by_name[name].setEnabled(has_diff)
        for name in TAB_VIEWS:
            self.by_name[f"view_{name}"].setEnabled(w is not None)
        verifying = w is not None and w.doc.verifying
        act = self.by_name["verify"]
        why = w.doc.verify_problem() if loaded and w is not None else None  # the core's check, as kvscope verify's
        act.setEnabled(loaded and not verifying and why is None)
        needs = "" if loaded and w is not None and w.doc.profile is not None else (
            " (it needs the model: File → Model…)" if loaded else " (open a state file first)")
        act.setToolTip(VERIFY_TIP + (f" (not now: {why})" if why else needs))
        self.by_name["cancel_verify"].setEnabled(verifying)
        act = self.by_name["repair"]
        why = w.overview.repair_problem() if loaded and w is not None else "open a state file first"
        act.setEnabled(why is None)
        act.setToolTip(REPAIR_TIP + (f" ({why})" if why else ""))
        act = self.by_name["blob_tokens"]
        why = tokens_unavailable(w)
        act.setEnabled(why is None)
        act.setToolTip(TOKENS_TIP + (f" ({why})" if why else ""))


def tokens_unavailable(w: DocumentWidget | None) -> str | None:
    """Why Tools → Tokens for this blob… is off for ``w`` (one line), None when it is on."""
    res = w.doc.result if w is not None else None
    if w is None or res is None:
        return "open a state blob first"
    if not w.doc.takes_tokens():
        return f"only a state blob, which carries no tokens, takes them: this file is a {res.kind}"
    if w.doc.verifying:
        return "a Verify is running"
    if w.overview.repair.running:
        return "a repair is running"
    return None


VERIFY_TIP = ("Verify the file in real llama.cpp: restore it, re-prefill its tokens (a blob's: those given with "
              "Tools → Tokens for this blob…), compare record by record and the next token (the engine in Tools → "
              "Engine Settings)")


REPAIR_TIP = ("Rebuild the state from the file's own tokens (a blob's: those given with Tools → Tokens for this blob…) "
              "in real llama.cpp (kvscope repair), verify it and write it to a new file; the input is never changed")

TOKENS_TIP = ("Give the tokens a state blob was made of (it carries none), as --tokens takes them: comma-separated ids "
              "or @FILE of a JSON list; Verify then re-prefills them and Repair rebuilds from them")


def _action(win: MenuHost, acts: Actions, name: str, text: str, slot: object,
            shortcut: QKeySequence | QKeySequence.StandardKey | str | None = None, tip: str = "") -> QAction:
    a = QAction(text, win.window())
    if shortcut is not None:
        a.setShortcut(QKeySequence(shortcut))
    if tip:
        a.setStatusTip(tip)
        a.setToolTip(tip)
    a.triggered.connect(slot)
    acts.by_name[name] = a
    return a


def _fill_recent(win: MenuHost, menu: QMenu) -> None:
    menu.clear()
    paths = win.settings.recent_files()
    for i, p in enumerate(paths):
        a = menu.addAction(f"&{(i + 1) % 10} {safe_text(os.path.basename(p))}")
        a.setToolTip(safe_text(p))
        a.setStatusTip(safe_text(p))
        a.triggered.connect(lambda _=False, p=p: win.open_file(p))
    if not paths:
        menu.addAction("(no recent files)").setEnabled(False)
    menu.addSeparator()
    menu.addAction("Clear list").triggered.connect(win.settings.clear_recent)


def build_menus(win: MenuHost) -> Actions:
    """Create the menu bar of ``win``."""
    acts = Actions()
    mb = win.menuBar()
    SK = QKeySequence.StandardKey
    file_menu = mb.addMenu("&File")
    file_menu.addAction(_action(win, acts, "open", "&Open…", win.open_dialog, SK.Open, "Open state files"))
    recent = acts.recent_menu = file_menu.addMenu("Open &Recent")
    recent.aboutToShow.connect(lambda: _fill_recent(win, recent))
    _fill_recent(win, recent)
    file_menu.addAction(_action(win, acts, "diff", "Compare &with…", lambda: win.compare_with(), "Ctrl+D",
                                "Diff the current file against a second state file"))
    file_menu.addAction(_action(win, acts, "model", "&Model…", lambda: win.choose_model(), "Ctrl+M",
                                "Choose the GGUF model the current file was written with"))
    file_menu.addAction(_action(win, acts, "export_report", "&Export Report…", lambda: win.export_report(), "Ctrl+E",
                                "Write an HTML / Markdown / JSON report of the current file, with pictures"))
    file_menu.addSeparator()
    file_menu.addAction(_action(win, acts, "close", "&Close", win.close_current, SK.Close))
    file_menu.addAction(_action(win, acts, "quit", "&Quit", win.close, SK.Quit))

    nav = mb.addMenu("&Navigate")
    nav.addAction(_action(win, acts, "find", "&Find…", win.find_in_tree, SK.Find,
                          "Find bytes, numbers or text in the hex view (when it is in front), else a node in the tree"))
    nav.addAction(_action(win, acts, "goto", "&Go to Offset…", lambda: win.goto_offset(), "Ctrl+G"))
    nav.addSeparator()
    nav.addAction(_action(win, acts, "next_finding", "&Next Finding", lambda: win.step_finding(1), "F8"))
    nav.addAction(_action(win, acts, "prev_finding", "&Previous Finding", lambda: win.step_finding(-1), "Shift+F8"))
    nav.addAction(_action(win, acts, "next_diff", "Next &Difference", lambda: win.step_difference(1), "F7"))
    nav.addAction(_action(win, acts, "prev_diff", "Previous D&ifference", lambda: win.step_difference(-1),
                          "Shift+F7"))

    view = mb.addMenu("&View")
    for i, name in enumerate(TAB_VIEWS):
        view.addAction(_action(win, acts, f"view_{name}", TAB_TITLES[name], lambda _=False, n=name: win.show_view(n),
                               f"Alt+{i + 1}"))
    view.addSeparator()
    theme_menu = view.addMenu("&Theme")
    group = QActionGroup(win.window())
    for name in THEMES:
        a = theme_menu.addAction(name.capitalize() if name != "system" else "Follow system")
        a.setCheckable(True)
        a.setChecked(win.theme.preference == name)
        a.triggered.connect(lambda _=False, n=name: win.set_theme(n))
        group.addAction(a)

    tools = mb.addMenu("&Tools")
    tools.addAction(_action(win, acts, "verify", "&Verify", win.verify, "Ctrl+Shift+V", VERIFY_TIP))
    tools.addAction(_action(win, acts, "cancel_verify", "&Cancel Verify", win.cancel_verify, None,
                            "Stop the verification (the engine call in flight is killed)"))
    tools.addAction(_action(win, acts, "repair", "&Repair…", lambda: repair_document(win), None, REPAIR_TIP))
    tools.addAction(_action(win, acts, "blob_tokens", "&Tokens for this blob…", lambda: tokens_document(win), None,
                            TOKENS_TIP))
    tools.addSeparator()
    tools.addAction(_action(win, acts, "engine_settings", "&Engine Settings…", win.engine_settings, SK.Preferences,
                            "The engine Verify and the Lab run in: llama.cpp build, your own libllama, llama-server"))

    bar = acts.toolbar = win.addToolBar("Main")
    bar.setObjectName("main_toolbar")  # saveState/restoreState find it by name
    bar.setMovable(False)
    for name in ("open", "model", "verify", "cancel_verify", "export_report"):
        bar.addAction(acts[name])

    help_menu = mb.addMenu("&Help")
    help_menu.addAction("&About kvscope").triggered.connect(lambda: _about(win))
    return acts


def app_version() -> str:
    """kvscope's version, from the installed package's metadata ("unknown" where it is not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kvscope")
    except PackageNotFoundError:
        return "unknown"


def about_text() -> str:
    from PySide6 import __version__ as pyside_version
    from PySide6.QtCore import qVersion

    return (f"kvscope {app_version()}\n\nInspector for llama.cpp saved state (slot, sequence and session files, "
            f"state blobs).\nFiles are opened read-only.\n\nQt {qVersion()}, PySide6 {pyside_version}")


def _about(win: MenuHost) -> QMessageBox:
    """Help → About: kvscope's version (the package's metadata) and what it is; returned for tests."""
    box = QMessageBox(QMessageBox.Icon.Information, "About kvscope", about_text(), QMessageBox.StandardButton.Ok,
                      win.window())
    box.setTextFormat(Qt.TextFormat.PlainText)
    box.setModal(False)
    box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    box.show()
    return box
