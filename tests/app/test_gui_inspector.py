"""Inspector conventions: byte range selection and copy, find by hex/number/node text, typed values, menus."""

from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QGuiApplication

from kvscope.app.views.bytes.byte_search import QueryError, find, find_wrapping, parse_query
from kvscope.app.views.bytes.byte_text import TooLarge, as_c_array, as_hex, as_python, read_bytes
from kvscope.app.views.bytes.hex_model import BYTES_PER_ROW
from kvscope.core.analysis.record_values import layer_matrix
from tests.support.gui_helpers import STATE

SESSION = STATE / "llama-f16-fa1-unified1-frag-ctx.session"
Q8 = STATE / "llama-q8_0-fa1-unified0-ctx.session"


def _cell_pos(hex_view, offset: int) -> QPoint:  # type: ignore[no-untyped-def]
    hex_view.ensure_visible(offset)
    row, col = hex_view.model.cell_of(offset)
    return hex_view.table.visualRect(hex_view.model.index(row, col)).center()


def _bytes(doc, a: int, b: int) -> bytes:  # type: ignore[no-untyped-def]
    return bytes(np.asarray(doc.data[a:b], dtype=np.uint8).tobytes())


def test_byte_text_formats() -> None:
    raw = bytes([0x71, 0x73, 0x67, 0x67])
    assert as_hex(raw) == "71 73 67 67"
    assert as_c_array(raw) == "unsigned char data[4] = { 0x71, 0x73, 0x67, 0x67 };"
    assert as_python(raw) == 'b"\\x71\\x73\\x67\\x67"' and eval(as_python(raw)) == raw
    long = as_c_array(bytes(range(30)))
    assert long.count("\n") == 4 and eval("[" + long.split("{")[1].split("}")[0] + "]") == list(range(30))
    data = np.arange(100, dtype=np.uint8)
    assert read_bytes(data, 98, 10) == bytes([98, 99])
    with pytest.raises(TooLarge):
        read_bytes(np.zeros(100, np.uint8), 0, 100, limit=10)


def test_queries_and_bounded_search() -> None:
    assert parse_query("hex", "71 73 67 67") == b"qsgg" == parse_query("hex", "0x71,0x73,0x67,0x67")
    assert parse_query("u32", "0x1cd0") == (7376).to_bytes(4, "little")
    assert parse_query("i32", "-1") == b"\xff\xff\xff\xff"
    assert parse_query("u16", "513") == b"\x01\x02" and parse_query("u64", "1") == (1).to_bytes(8, "little")
    assert parse_query("f16", "1.5") == np.array([1.5], np.float16).tobytes()
    assert parse_query("f32", "-2") == np.array([-2], np.float32).tobytes()
    for kind, text in (("hex", "7"), ("hex", "zz"), ("u8", "256"), ("i32", "x")):
        with pytest.raises(QueryError):
            parse_query(kind, text)
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, 50_000, dtype=np.uint8)
    data[[100, 30_000, 49_996]] = 0xAB
    data[[101, 30_001, 49_997]] = 0xCD
    hits = [i for i in range(data.size - 1) if data[i] == 0xAB and data[i + 1] == 0xCD]
    for piece in (7, 64, 4096):  # matches across piece boundaries are found
        assert find(data, b"\xab\xcd", 0, piece=piece) == hits[0]
        assert find(data, b"\xab\xcd", hits[0] + 1, piece=piece) == hits[1]
        assert find(data, b"\xab\xcd", hits[-1], backward=True, piece=piece) == hits[-2]
    assert find_wrapping(data, b"\xab\xcd", hits[-1] + 1) == (hits[0], True)
    assert find(data, b"\xab\xcd", 0, cancelled=lambda: True) == -1


@pytest.mark.xserver
def test_select_a_byte_range_and_copy_it(qtbot, open_doc) -> None:  # type: ignore[no-untyped-def]
    w = open_doc(SESSION, "llama")
    w.show_view("hex")
    hv, doc = w.hex, w.doc
    vp = hv.table.viewport()
    # click, then shift+click: the range between, in the hex view and in the document's selection
    qtbot.mouseClick(vp, Qt.MouseButton.LeftButton, pos=_cell_pos(hv, 20))
    qtbot.mouseClick(vp, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.ShiftModifier, _cell_pos(hv, 35))
    assert hv.selection == (20, 36)
    assert (doc.bus.current.offset, doc.bus.current.length) == (20, 16)
    hv.table.setFocus()
    qtbot.keyClick(hv.table, Qt.Key.Key_C, Qt.KeyboardModifier.ControlModifier)
    assert QGuiApplication.clipboard().text() == _bytes(doc, 20, 36).hex(" ")
    # shift+arrows grow and shrink it from the anchor
    qtbot.keyClick(hv.table, Qt.Key.Key_Right, Qt.KeyboardModifier.ShiftModifier)
    assert hv.selection == (20, 37)
    qtbot.keyClick(hv.table, Qt.Key.Key_Down, Qt.KeyboardModifier.ShiftModifier)
    assert hv.selection == (20, 37 + BYTES_PER_ROW)
    for _ in range(3):
        qtbot.keyClick(hv.table, Qt.Key.Key_Up, Qt.KeyboardModifier.ShiftModifier)
    assert hv.selection == (20 - BYTES_PER_ROW, 21)  # above the anchor: the range flips
    # a drag selects from the press to the release
    qtbot.mousePress(vp, Qt.MouseButton.LeftButton, pos=_cell_pos(hv, 64))
    qtbot.mouseMove(vp, _cell_pos(hv, 70))
    qtbot.mouseMove(vp, _cell_pos(hv, 83))
    qtbot.mouseRelease(vp, Qt.MouseButton.LeftButton, pos=_cell_pos(hv, 83))
    assert hv.selection == (64, 84) and doc.bus.current.length == 20
    assert hv.copy("c") == as_c_array(_bytes(doc, 64, 84))
    assert QGuiApplication.clipboard().text().startswith("unsigned char data[20] = {")
    assert hv.copy("python") == as_python(_bytes(doc, 64, 84))


@pytest.mark.xserver
def test_find_a_hex_pattern(qtbot, open_doc) -> None:  # type: ignore[no-untyped-def]
    w = open_doc(SESSION, "llama")
    w.show_view("hex")
    hv, doc = w.hex, w.doc
    rec = doc.index.records[2][3]
    needle = _bytes(doc, rec.data_offset + 6, rec.data_offset + 12)
    raw = _bytes(doc, 0, int(doc.data.size))
    hits = []
    at = raw.find(needle)
    while at >= 0:
        hits.append(at)
        at = raw.find(needle, at + 1)
    hv.goto(0)
    hv.find_bar.set_query("hex", needle.hex(" ").upper())
    task = hv.find_bar.find_next()
    qtbot.waitUntil(lambda: task.done, timeout=10000)
    assert hv.selection == (hits[0], hits[0] + len(needle))
    assert doc.bus.current.offset == hits[0] and doc.bus.current.length == len(needle)
    assert hv.model.cell_of(hits[0]) is not None  # scrolled into view
    # Enter finds the next one, Shift+Enter the previous one (wrapping at the ends)
    qtbot.keyClick(hv.find_bar.entry, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not hv.find_bar.busy, timeout=10000)
    assert hv.cursor_offset == (hits[1] if len(hits) > 1 else hits[0])
    qtbot.keyClick(hv.find_bar.entry, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.waitUntil(lambda: not hv.find_bar.busy, timeout=10000)
    assert hv.cursor_offset == hits[0]
    hv.find_bar.set_query("hex", "71 7")
    assert hv.find_bar.find_next() is None and "odd number" in hv.find_bar.status.text()


def test_find_numbers_and_nodes(qtbot, open_doc) -> None:  # type: ignore[no-untyped-def]
    w = open_doc(SESSION, "llama")
    w.show_view("hex")
    hv, doc = w.hex, w.doc
    n_tokens = len(doc.result.tokens)  # n_token_count is a u32 at offset 8
    hv.goto(0)
    hv.find_bar.set_query("u32", str(n_tokens))
    task = hv.find_bar.find_next()
    qtbot.waitUntil(lambda: task.done, timeout=10000)
    assert hv.cursor_offset == _bytes(doc, 0, 64).find(n_tokens.to_bytes(4, "little"))
    value = float(layer_matrix(doc.result, doc.index.records[0][3])[3, 5])  # an f16 of K layer 0
    hv.goto(0)
    hv.find_bar.set_query("f16", repr(value))
    task = hv.find_bar.find_next()
    qtbot.waitUntil(lambda: task.done, timeout=10000)
    at = hv.cursor_offset
    assert np.frombuffer(_bytes(doc, at, at + 2), np.float16)[0] == np.float16(value)
    hv.find_bar.set_query("node", "v_trans")
    hv.find_bar.find_next()
    assert doc.bus.current.node is not None and doc.bus.current.node.name == "v_trans"
    assert w.tree.current_node() is doc.bus.current.node


@pytest.mark.xserver
def test_selection_decodes_as_the_records_type(qtbot, open_doc) -> None:  # type: ignore[no-untyped-def]
    w = open_doc(Q8, "llama")
    w.show_view("hex")
    hv, doc = w.hex, w.doc
    rec = doc.index.records[0][3]
    assert rec.type == "q8_0"
    row = 2
    hv.select_range(rec.data_offset + row * rec.row_bytes, rec.data_offset + (row + 1) * rec.row_bytes)
    d = hv.decoded
    expected = layer_matrix(doc.result, rec)[row]
    assert d is not None and d.type == "q8_0" and np.allclose(d.values, expected)
    assert hv.values.toPlainText().startswith(f"{expected.size} q8_0 values of K layer 0")
    text = hv.copy_values()
    assert text is not None and [float(x) for x in text.split(", ")] == pytest.approx(expected.tolist(), rel=1e-6)
    assert QGuiApplication.clipboard().text() == text
    # a few bytes inside a block widen to that whole block
    hv.select_range(rec.data_offset + 3, rec.data_offset + 5)
    assert hv.decoded.length == 34 and "34-byte blocks" in hv.decoded.note
    # the token ids as int32
    t = doc.index.tokens_node
    hv.select_range(t.offset, t.offset + 8)
    assert hv.decoded.type == "i32" and hv.decoded.values.tolist() == doc.result.tokens[:2]


def test_hex_context_menu(qtbot, open_doc, tmp_path) -> None:  # type: ignore[no-untyped-def]
    w = open_doc(SESSION, "llama")
    w.show_view("hex")
    hv, doc = w.hex, w.doc
    hv.select_range(12, 20)
    menu = hv.build_menu()
    texts = [a.text() for a in menu.actions() if a.text()]
    for expect in ("Copy 8 bytes as hex", "Copy as C array", "Copy as Python bytes", "Copy 2 i32 values",
                   "Copy offset", "Copy node path /tokens", "Go to offset…", "Select node tokens", "Export 8 bytes…",
                   "Export view as PNG…"):
        assert any(t.startswith(expect) for t in texts), (expect, texts)
    next(a for a in menu.actions() if a.text().startswith("Select node")).trigger()
    tokens = doc.index.tokens_node
    assert (doc.bus.current.offset, doc.bus.current.length) == (tokens.offset, tokens.size)
    assert hv.selection == (tokens.offset, tokens.end)
    assert hv.copy_path() == "/tokens" and hv.copy_offset() == str(hv.cursor_offset)
    out = tmp_path / "sel.bin"
    task = hv.export_bytes(str(out))
    qtbot.waitUntil(lambda: task.done, timeout=10000)
    assert out.read_bytes() == _bytes(doc, tokens.offset, tokens.end)


@pytest.mark.xserver
def test_tree_copy_and_context_menu(qtbot, open_doc) -> None:  # type: ignore[no-untyped-def]
    w = open_doc(SESSION, "llama")
    tv = w.tree
    node = doc_node = w.doc.result.root.find("/n_token_count")
    assert node is not None
    tv.show_node(doc_node)
    tv.tree.setFocus()
    qtbot.keyClick(tv.tree, Qt.Key.Key_C, Qt.KeyboardModifier.ControlModifier)
    clip = QGuiApplication.clipboard().text().split("\t")
    assert clip[:4] == ["n_token_count", node.kind, str(node.offset), str(node.size)] and clip[4].startswith("25")
    texts = [a.text() for a in tv.build_menu().actions() if a.text()]
    assert {"Copy name", "Copy path", "Copy offset", "Copy value", "Show bytes in Hex"} <= set(texts)
    assert tv.copy_field("path") == "/n_token_count" and tv.copy_field("offset") == str(node.offset)
    # the value column is wide enough to read; names elide on the right (a record says which one first)
    header = tv.tree.header()
    assert header.sectionSize(header.logicalIndex(1)) >= 150 and header.logicalIndex(1) == 4  # value shown second
    assert tv.tree.textElideMode() == Qt.TextElideMode.ElideRight


@pytest.mark.xserver
def test_list_views_copy_and_export(qtbot, open_doc, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import csv
    import io

    from tests.support.gui_helpers import LAB

    w = open_doc(LAB / "nan_rows_late_fail.seqdata.bin", "llama")
    fv = w.findings
    w.show_view("findings")
    fv.table.selectAll()
    fv.table.setFocus()
    qtbot.keyClick(fv.table, Qt.Key.Key_C, Qt.KeyboardModifier.ControlModifier)
    lines = QGuiApplication.clipboard().text().split("\n")
    assert len(lines) == len(w.doc.result.findings) and all(len(x.split("\t")) == 6 for x in lines)
    out = tmp_path / "findings.csv"
    task = fv.export_button.export_csv(str(out))
    qtbot.waitUntil(lambda: task.done, timeout=10000)
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert [(r["code"], int(r["offset"])) for r in rows] == [(f.code, f.offset) for f in w.doc.result.findings]
    png = tmp_path / "findings.png"
    assert fv.export_button.export_png(str(png)) and png.stat().st_size > 1000
    # tokens: the selected rows, tab-separated
    w2 = open_doc(LAB / "seq0.clean.seqstate", "llama")
    tv = w2.tokens
    w2.show_view("tokens")
    tv.table.selectRow(1)
    tv.table.setFocus()
    qtbot.keyClick(tv.table, Qt.Key.Key_C, Qt.KeyboardModifier.ControlModifier)
    assert QGuiApplication.clipboard().text().split("\t")[:2] == ["1", str(w2.doc.result.tokens[1])]
    out = tmp_path / "tokens.csv"
    task = tv.export_button.export_csv(str(out))
    qtbot.waitUntil(lambda: task.done, timeout=10000)
    rows = list(csv.reader(io.StringIO(out.read_text())))
    assert rows[0] == ["index", "id", "text", "cell"] and [int(r[1]) for r in rows[1:]] == w2.doc.result.tokens


def _drop_on(qtbot, widget, path) -> None:  # type: ignore[no-untyped-def]
    from PySide6.QtCore import QMimeData, QPointF, QUrl
    from PySide6.QtGui import QDragEnterEvent, QDropEvent
    from PySide6.QtWidgets import QApplication

    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(path))])
    at = widget.rect().center()
    enter = QDragEnterEvent(at, Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                            Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(widget, enter)
    drop = QDropEvent(QPointF(at), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                      Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(widget, drop)


@pytest.mark.xserver
def test_find_shortcut_show_bytes_and_drops(qtbot, open_doc, window) -> None:  # type: ignore[no-untyped-def]
    w = open_doc(SESSION, "llama")
    w.show_view("hex")
    window.find_in_tree()  # Ctrl+F with the hex view in front: its find bar
    assert window.focusWidget() is w.hex.find_bar.entry  # (the window's focus: Xvfb has no window manager)
    w.show_view("cells")
    window.find_in_tree()  # any other view: the tree's find box
    assert window.focusWidget() is w.tree.find_edit
    node = w.doc.result.root.find("/n_token_count")
    w.tree.show_node(node)
    w.tree.show_in_hex()  # the tree's "Show bytes in Hex"
    assert w.current_view() == "hex" and w.hex.selection == (node.offset, node.end)
    # a file dropped on a view (not only on the window's frame) opens it; a find box never takes its path
    other = STATE / "llama-f16-fa0-unified0-seq0.seqstate"
    _drop_on(qtbot, w.hex.find_bar.entry, other)
    assert any(d.doc.path == str(other) for d in window.documents) and w.hex.find_bar.entry.text() == ""
    third = STATE / "llama-f16-fa0-unified0-seq1.seqstate"
    _drop_on(qtbot, w.tree.tree.viewport(), third)
    assert any(d.doc.path == str(third) for d in window.documents)
    window.wait_idle()
