"""The app's widgets keep Qt's own methods (an app attribute of the same name replaced them: mypy --strict
on kvscope.app flags it), and the context menus' copy actions, made per field, copy the field they name."""

from __future__ import annotations

from PySide6.QtCore import QSize
from PySide6.QtGui import QCursor, QGuiApplication
from PySide6.QtWidgets import QWidget

from tests.support.gui_helpers import LAB, STATE

SESSION = STATE / "llama-f16-fa1-unified1-frag-ctx.session"


def test_hex_view_and_find_bar_keep_qwidget_methods(open_doc) -> None:  # type: ignore[no-untyped-def]
    w = open_doc(SESSION, "llama")
    w.show_view("hex")
    hv = w.hex
    assert isinstance(hv.size(), QSize) and hv.size() == QWidget.size(hv)  # was an int property
    assert hv.n_bytes == int(w.doc.data.size) > 0
    assert callable(hv.lower) and callable(hv.raise_)  # QWidget.lower() was the side panel's QTabWidget
    hv.lower()
    bar = hv.find_bar
    assert isinstance(bar.cursor(), QCursor)  # was replaced by the search's start offset
    assert "find" not in vars(type(bar))  # QWidget.find(id) is not the search: find_next is
    hv.goto(5)
    assert bar.start_offset() == hv.cursor_offset == 5


def _trigger(menu, text: str) -> str:  # type: ignore[no-untyped-def]
    QGuiApplication.clipboard().setText("")
    action = next(a for a in menu.actions() if a.text() == text)
    action.trigger()
    return str(QGuiApplication.clipboard().text())


def test_menu_copy_actions_copy_their_own_field(open_doc) -> None:  # type: ignore[no-untyped-def]
    w = open_doc(SESSION, "llama")
    tv = w.tree
    node = w.doc.result.root.find("/n_token_count")
    assert node is not None
    tv.show_node(node)
    menu = tv.build_menu()
    assert _trigger(menu, "Copy name") == "n_token_count"
    assert _trigger(menu, "Copy path") == "/n_token_count"
    assert _trigger(menu, "Copy offset") == str(node.offset)

    w = open_doc(LAB / "nan_rows_late_fail.seqdata.bin", "llama")
    fv = w.findings
    w.show_view("findings")
    fv.table.selectRow(0)
    f = fv.current_finding()
    assert f is not None
    menu = fv.build_menu()
    assert _trigger(menu, "Copy offset") == str(f.offset)
    assert _trigger(menu, "Copy message") == f.message
    assert _trigger(menu, "Copy path") == f.path
