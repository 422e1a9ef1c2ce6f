"""The side-by-side hex diff (issue 19 item 13): the Diff view's "Bytes side by side" tab shows A's and B's
bytes in one table (scroll-locked by construction), aligned by structure so the same record faces
itself even when B lacks one, differing bytes highlighted, F3 / the buttons jump to the next difference,
and a difference chosen in the list scrolls the bytes to it.

The tests marked ``xserver`` also run in a real X server (test_gui_xserver.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import Qt

from kvscope.app.document.hex_align import ROW, Alignment, pieces
from kvscope.app.views.diff.hex_diff import A_BYTES, B_BYTES
from kvscope.core.reader.parse import read_state
from tests.support.gui_helpers import LAB

CLEAN = LAB / "seq0.clean.seqdata.bin"


def _alignment(a, b) -> Alignment:  # type: ignore[no-untyped-def]
    ra, rb = read_state(a), read_state(b)
    return Alignment.of([n for n in ra.root.leaves() if n is not ra.root], np.fromfile(a, np.uint8),
                        [n for n in rb.root.leaves() if n is not rb.root], np.fromfile(b, np.uint8))


def test_a_dropped_record_faces_an_empty_side_and_the_rest_stays_paired() -> None:
    al = _alignment(CLEAN, LAB / "drop_k_layer_1.seqdata.bin")
    alone = [s for s in al.segments if s.b is None]
    assert [s.path for s in alone] == ["/memory/kv/stream0/K1/header", "/memory/kv/stream0/K1/rows"]
    k2 = next(s for s in al.segments if s.a is not None and s.a.path.endswith("K2/rows"))
    assert k2.b is not None and k2.b.path.endswith("K1/rows")  # B's second K record is A's K2 (same bytes)
    assert al.data_a[k2.a.offset : k2.a.offset + k2.a.size].tobytes() == \
        al.data_b[k2.b.offset : k2.b.offset + k2.b.size].tobytes()
    diffs, r = [], -1
    for _ in range(10):
        r = al.next_diff(r)
        if r is None or r in diffs:
            break
        diffs.append(r)
    rows = [al.row(i) for i in diffs]
    assert all(x.b_off is None for x in rows)  # the only differences: the record B lacks
    assert al.next_diff(diffs[0], backward=True) == diffs[-1]  # wraps backwards


def test_pieces_tile_the_file_and_identical_files_have_no_difference() -> None:
    res = read_state(CLEAN)
    data = np.fromfile(CLEAN, np.uint8)
    ps = pieces([n for n in res.root.leaves() if n is not res.root], data)
    assert ps[0].offset == 0 and sum(p.size for p in ps) == data.size
    assert all(x.offset + x.size == y.offset for x, y in zip(ps, ps[1:], strict=False))
    al = _alignment(CLEAN, CLEAN)
    assert al.next_diff(-1) is None and al.total_rows >= data.size // ROW


@pytest.mark.xserver
def test_side_by_side_jumps_to_highlighted_differences(qtbot, open_doc, window) -> None:  # type: ignore[no-untyped-def]
    w = open_doc(LAB / "nan_rows_valid.seqdata.bin", "llama")
    with qtbot.waitSignal(w.doc.diffReady, timeout=20000):
        window.compare_with(str(CLEAN), w)
    dv = w.diff
    task = dv.show_side_by_side()
    assert task is not None
    qtbot.waitUntil(lambda: dv.hexdiff.model.alignment is not None, timeout=20000)
    hd = dv.hexdiff
    assert hd.isVisible() and hd.model.rowCount() > 0
    row = hd.jump()
    assert row is not None and hd.model.current == row
    assert hd.model.base <= row < hd.model.base + hd.visible_rows()  # scrolled into view
    line, a, b = hd.model.line(row - hd.model.base)
    assert a != b and line.a_off is not None and line.b_off is not None
    seg = hd.model.alignment.segments[line.segment]
    assert seg.path.endswith("/rows")  # the NaN rows of a record, facing the same record of B
    assert line.a_off - seg.a.offset == line.b_off - seg.b.offset  # same place in the same record
    window.activateWindow()
    hd.table.setFocus()
    qtbot.waitUntil(lambda: hd.table.hasFocus(), timeout=5000)
    qtbot.keyClick(hd.table, Qt.Key.Key_F3)
    assert hd.model.current is not None and hd.model.current > row
    qtbot.keyClick(hd.table, Qt.Key.Key_F3, Qt.KeyboardModifier.ShiftModifier)
    assert hd.model.current == row
    # both sides in one row: scrolling moves them together
    hd.scroll_rows(5)
    top, ta, tb = hd.model.line(0)
    assert top.index == hd.model.base and hd.model.index(0, A_BYTES).data() == ta.hex(" ")
    assert hd.model.index(0, B_BYTES).data() == tb.hex(" ")
    # a difference chosen in the list scrolls the bytes to it
    dv.pages.setCurrentIndex(0)
    item = next(i for i, x in enumerate(dv.model.items) if x.offset_a is not None and x.offset_a > 2000)
    dv.table.selectRow(item)
    want = hd.model.alignment.row_of(dv.model.items[item].offset_a)
    assert hd.model.current == want


@pytest.mark.xserver
def test_side_by_side_fits_at_1280x800(qtbot, open_doc, window) -> None:  # type: ignore[no-untyped-def]
    window.resize(1280, 800)
    w = open_doc(LAB / "drop_k_layer_1.seqdata.bin", "llama")
    with qtbot.waitSignal(w.doc.diffReady, timeout=20000):
        window.compare_with(str(CLEAN), w)
    w.diff.show_side_by_side()
    qtbot.waitUntil(lambda: w.diff.hexdiff.model.alignment is not None, timeout=20000)
    qtbot.wait(100)
    t = w.diff.hexdiff.table
    hh = t.horizontalHeader()
    right = hh.sectionViewportPosition(B_BYTES) + hh.sectionSize(B_BYTES)
    assert right <= t.viewport().width(), (right, t.viewport().width())  # B's bytes whole: the tree gave way
    assert w.tree.isVisible() and w.tree.width() >= 100
