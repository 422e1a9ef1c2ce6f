"""Byte map and hex view: regions, tooltips, clicks, paging, go-to-offset, data inspector."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from PySide6.QtCore import QPoint

from kvscope.app.views.bytes.hex_inspect import inspect_values, read_value
from kvscope.app.views.bytes.hex_model import BYTES_PER_ROW, HexModel
from tests.support.gui_helpers import LAB, STATE


def test_bytemap_tooltip_and_click(qtbot, open_doc):  # type: ignore[no-untyped-def]
    w = open_doc(STATE / "lfm2-f16-fa0-unified0-ctx.session", "lfm2")
    bm = w.bytemap
    leaves = w.doc.index.leaves
    assert bm.kinds_present() == list(dict.fromkeys(n.kind for n in leaves))
    target = next(n for n in leaves if n.kind == "v_rows")
    rect = bm._strip_rect()
    x = bm.x_of(target.offset + target.size / 2, rect, bm.lo, bm.hi)
    assert target.path in bm.tooltip_at(QPoint(int(x), int(rect.center().y())))
    node = bm.click_at(x)
    assert node is target
    sel = w.doc.bus.current
    assert sel.node is target and sel.offset == target.offset and sel.length == target.size
    assert w.hex.cursor_offset == target.offset
    # zoom keeps the range inside the file
    bm.zoom(0.1, target.offset)
    assert 0 <= bm.lo < bm.hi <= w.doc.result.size and bm.hi - bm.lo < w.doc.result.size


def test_bytemap_shows_unparsed(qtbot, open_doc):  # type: ignore[no-untyped-def]
    w = open_doc(LAB / "nan_rows_late_fail.seqdata.bin", "llama")
    statuses = {n.status for n in w.bytemap._nodes}
    assert statuses - {"parsed"}, "the damaged file should have untrusted/unparsed/trailing leaves"
    bad = next(n for n in w.bytemap._nodes if n.status != "parsed")
    rect = w.bytemap._strip_rect()
    x = w.bytemap.x_of(bad.offset + bad.size / 2, rect, w.bytemap.lo, w.bytemap.hi)
    assert bad.status in w.bytemap.tooltip_at(QPoint(int(x), int(rect.center().y())))
    w.bytemap.grab()  # paints without error


def test_hex_model_paging(qtbot):  # type: ignore[no-untyped-def]
    buf = np.arange(1000, dtype=np.uint32).view(np.uint8)  # 4000 bytes
    m = HexModel()
    m.set_data(buf, [])
    assert m.total_rows == 250
    m.set_page(240, 32)
    assert m.rowCount() == 10
    assert m.headerData(0, __import__("PySide6.QtCore").QtCore.Qt.Orientation.Vertical) == f"{240 * 16:08x}"
    assert m.index(0, 0).data() == f"{buf[240 * 16]:02x}"
    assert m.offset_of(2, 5) == 242 * BYTES_PER_ROW + 5
    assert m.cell_of(242 * 16 + 5) == (2, 5)
    assert m.cell_of(0) is None


def test_hex_goto_and_inspector(qtbot, open_doc, window):  # type: ignore[no-untyped-def]
    w = open_doc(STATE / "llama-f16-fa1-unified1-frag-ctx.session", "llama")
    rec = w.doc.index.records[0][3]
    off = rec.data_offset + rec.row_bytes * 2 + 6
    window.goto_offset(off)
    assert w.hex.cursor_offset == off
    sel = w.doc.bus.current
    assert sel.record is rec and sel.cell == 2  # a K row byte selects its cell
    assert sel.node is not None and sel.node.kind == "k_rows"
    assert w.tree.model.node(w.tree.tree.currentIndex()) is sel.node
    w.show_view("cells")
    assert w.cells.marks[0].isVisible() and w.cells.ref.key == sel.table
    w.show_view("hex")
    cell = w.hex.model.cell_of(off)
    assert cell is not None
    assert w.hex.table.currentIndex().row() == cell[0]
    f16 = w.hex.inspector.item(8, 1).text()
    assert w.hex.inspector.item(8, 0).text() == "f16"
    raw = bytes(w.doc.data[off : off + 2])
    assert float(f16) == pytest.approx(struct.unpack("<e", raw)[0], rel=1e-6)
    # far offset on another page of a bigger file: paging follows
    window.goto_offset(w.doc.result.size - 1)
    assert w.hex.model.cell_of(w.doc.result.size - 1) is not None


def test_inspector_values() -> None:
    buf = np.frombuffer(struct.pack("<fHd", 1.5, 0x3C00, -2.25), dtype=np.uint8)
    vals = dict(inspect_values(buf, 0))
    assert vals["f32"] == "1.5"
    assert read_value(buf, 4, "f16") == 1.0
    assert read_value(buf, 6, "f64") == -2.25
    assert read_value(buf, 2, "bf16") == 1.5  # the upper half of the f32 1.5
    assert dict(inspect_values(buf, buf.size - 1))["u32"] == "-"
