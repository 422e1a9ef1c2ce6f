"""The hex view at laptop and desktop sizes (issue 19 item 10): all 16 hex and 16 ASCII columns in view
at 1280x800 with the tree as the window opens it, the inspector's header whole, and at 1920x1080 the
ASCII header no wider than its columns (geometry checks, not pixels).

The tests marked ``xserver`` also run in a real X server (test_gui_xserver.py).
"""

from __future__ import annotations

import pytest

from kvscope.app.views.bytes.hex_model import ASCII_COL, BYTES_PER_ROW
from tests.support.gui_helpers import STATE

SESSION = STATE / "llama-q8_0-fa1-unified0-ctx.session"


@pytest.mark.xserver
@pytest.mark.parametrize("size", [(1280, 800), (1920, 1080)])
def test_every_hex_and_ascii_column_is_in_view(qtbot, open_doc, window, size):  # type: ignore[no-untyped-def]
    window.resize(*size)
    w = open_doc(SESSION, "llama")
    w.show_view("hex")
    qtbot.wait(100)
    hv = w.hex
    t, hh = hv.table, hv.table.horizontalHeader()
    right = hh.sectionViewportPosition(ASCII_COL) + hh.sectionSize(ASCII_COL)
    assert right <= t.viewport().width(), (right, t.viewport().width())
    assert t.horizontalScrollBar().maximum() == 0
    ascii_need = t.fontMetrics().horizontalAdvance("M" * BYTES_PER_ROW)
    assert ascii_need <= hh.sectionSize(ASCII_COL) <= ascii_need + 40  # not stretched over the empty rest
    ih = hv.inspector.horizontalHeader()
    label = hv.inspector.horizontalHeaderItem(1).text()
    assert ih.fontMetrics().horizontalAdvance(label) <= ih.sectionSize(1), label
    assert w.tree.isVisible() and w.tree.width() > 100  # the tree is still there
