"""The cell map of a big table is computed on a pool thread and shown when it is in; a redraw
made meanwhile wins over the picture still being computed."""

from __future__ import annotations

import numpy as np

from kvscope.app.base.theme import SEQ_COLORS
from kvscope.app.views.cells import cellmap
from kvscope.app.views.cells.picture import draw_picture
from tests.support.gui_helpers import STATE

FRAG = STATE / "llama-f16-fa1-unified1-frag-ctx.session"  # several sequences, empty and shared cells


def big_cells(qtbot, open_doc, monkeypatch, path=FRAG):  # type: ignore[no-untyped-def]
    """``path`` open on the cell map with every table counted as big, its first picture in."""
    monkeypatch.setattr(cellmap, "ASYNC_CELLS", 0)
    w = open_doc(path, "llama")
    w.show_view("cells")
    view = w.cells
    view.ensure_built()
    qtbot.waitUntil(lambda: view.image is not None, timeout=10000)
    return w, view


def direct(w, view, by_position=False):  # type: ignore[no-untyped-def]
    """The picture of the view's table drawn here, on the GUI thread."""
    return draw_picture(w.doc.result, view.ref, None, by_position, view.theme.dark, SEQ_COLORS)


def test_big_table_picture_comes_from_a_pool_thread_and_equals_the_direct_one(qtbot, open_doc,  # type: ignore[no-untyped-def]
                                                                               monkeypatch):
    w, view = big_cells(qtbot, open_doc, monkeypatch)
    view._redraw()
    assert view._pending is not None, "the picture was computed on the GUI thread"
    assert "drawing the map" in view.summary.text()
    qtbot.waitUntil(lambda: view._pending.done, timeout=10000)
    want = direct(w, view)
    assert np.array_equal(view.image.rgba, want.image.rgba)
    assert view.summary.text() == want.summary
    assert view.img.image.shape == want.image.rgba.shape


def test_a_newer_redraw_drops_the_picture_still_being_computed(qtbot, open_doc, monkeypatch):  # type: ignore[no-untyped-def]
    w, view = big_cells(qtbot, open_doc, monkeypatch)
    first = view._pending
    view.order_combo.setCurrentIndex(1)  # by position: a second picture, and before it is in...
    second = view._pending
    view.order_combo.setCurrentIndex(0)  # ...a third, in file order: the one that must end up shown
    third = view._pending
    assert first is not second and second is not third
    assert second.token.cancelled
    qtbot.waitUntil(lambda: third.done, timeout=10000)
    want = direct(w, view)
    assert not np.array_equal(direct(w, view, True).image.order, want.image.order)  # the orders tell apart
    qtbot.wait(200)  # a late second picture would land now
    assert np.array_equal(view.image.order, want.image.order)
    assert np.array_equal(view.image.rgba, want.image.rgba)


def test_small_tables_are_drawn_at_once(open_doc):  # type: ignore[no-untyped-def]
    w = open_doc(FRAG, "llama")
    w.show_view("cells")
    view = w.cells
    view.ensure_built()
    view._redraw()
    assert view._pending is None and view.image is not None


def test_a_picture_that_fails_says_so_in_the_view(qtbot, open_doc, monkeypatch):  # type: ignore[no-untyped-def]
    _, view = big_cells(qtbot, open_doc, monkeypatch)

    def broken(*args: object) -> None:
        raise ValueError("no room for the picture")

    monkeypatch.setattr(cellmap, "draw_picture", broken)
    view._redraw()
    qtbot.waitUntil(lambda: "could not be drawn" in view.summary.text(), timeout=10000)
    assert "no room for the picture" in view.summary.text()


def test_another_tables_picture_is_cleared_while_its_own_is_drawn(qtbot, open_doc, monkeypatch):  # type: ignore[no-untyped-def]
    w, view = big_cells(qtbot, open_doc, monkeypatch, STATE / "llama-f16-fa0-unified0-ctx.session")  # a table a stream
    assert view.table_combo.count() > 1
    view.table_combo.setCurrentIndex(1)
    assert view.image is None and view.shown is None  # hover, CSV and marks see no stale table
    assert view.csv_table() is None
    qtbot.waitUntil(lambda: view.image is not None, timeout=10000)
    assert view.shown is view.ref.table and view.ref is w.doc.index.tables[view.table_combo.currentData()]
    assert np.array_equal(view.image.rgba, direct(w, view).image.rgba)
