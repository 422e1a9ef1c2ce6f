"""Findings table (sort, filter, click -> hex), damaged and non-state files, and the diff view."""

from __future__ import annotations

from PySide6.QtCore import Qt

from kvscope.app.views.findings.findings_view import FINDING_ROLE
from kvscope.core.analysis.diff import diff_states
from kvscope.core.model.profile import load_model_profile
from kvscope.core.reader.parse import read_state
from tests.support.gui_helpers import LAB, STATE, model


def _click_row(qtbot, table, row: int) -> None:  # type: ignore[no-untyped-def]
    rect = table.visualRect(table.model().index(row, 1))
    qtbot.mouseClick(table.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())


def test_click_finding_moves_hex_to_offset(qtbot, open_doc):  # type: ignore[no-untyped-def]
    w = open_doc(LAB / "truncated_half.seqdata.bin", "llama")
    fv = w.findings
    assert fv.model.rowCount() == len(w.doc.result.findings) >= 1
    w.show_view("findings")
    for row in range(fv.proxy.rowCount()):
        f = fv.finding_at(row)
        _click_row(qtbot, fv.table, row)
        assert w.hex.cursor_offset == min(f.offset, w.doc.result.size - 1)
        sel = w.doc.bus.current
        assert sel.finding is f and sel.offset == f.offset and sel.length == f.length
        assert sel.node is not None
        assert w.tree.model.node(w.tree.tree.currentIndex()) is sel.node
        assert f.code in fv.detail.text()


def test_stats_findings_arrive_and_filter(qtbot, open_doc, window):  # type: ignore[no-untyped-def]
    w = open_doc(LAB / "nan_rows_valid.seqdata.bin", "llama")
    codes = {f.code for f in w.findings.model.findings}
    assert "nonfinite_values" in codes  # added by the background statistics scan
    n = w.findings.proxy.rowCount()
    w.findings.filter_edit.setText("nonfinite")
    assert 0 < w.findings.proxy.rowCount() <= n
    assert all(w.findings.finding_at(r).code == "nonfinite_values" for r in range(w.findings.proxy.rowCount()))
    w.findings.filter_edit.setText("")
    w.findings.severity.setCurrentIndex(2)  # errors only
    assert all(w.findings.finding_at(r).severity == "error" for r in range(w.findings.proxy.rowCount()))
    w.findings.severity.setCurrentIndex(0)
    # sorting by offset (the default) and by severity
    offsets = [w.findings.finding_at(r).offset for r in range(w.findings.proxy.rowCount())]
    assert offsets == sorted(offsets)
    w.findings.table.sortByColumn(0, Qt.SortOrder.DescendingOrder)
    ranks = [w.findings.proxy.index(r, 0).data(FINDING_ROLE).severity for r in range(w.findings.proxy.rowCount())]
    order = {"error": 0, "warning": 1, "info": 2}
    assert [order[s] for s in ranks] == sorted(order[s] for s in ranks)
    # F8 steps through findings
    first = window.current().findings.table.currentIndex().row()
    window.actions_["next_finding"].trigger()
    assert window.current().findings.table.currentIndex().row() == (first + 1) % w.findings.proxy.rowCount()


def test_non_state_file_shows_findings(qtbot, open_doc, tmp_path):  # type: ignore[no-untyped-def]
    junk = tmp_path / "notes.txt"
    junk.write_text("this is not a llama.cpp state file at all\n" * 20)
    w = open_doc(junk)
    res = w.doc.result
    assert res.kind == "unknown"
    assert [f.code for f in w.findings.model.findings] == ["unknown_format"]
    assert w.current_view() == "overview" and w.overview.verdict.level == "not_state"  # the verdict comes first
    assert w.bytemap._nodes and w.bytemap._nodes[0].status == "unparsed"
    assert w.layers.info.text().startswith("This file holds no layer records")
    assert w.cells.table_combo.count() == 0
    w.grab()  # every view paints


def test_empty_and_unreadable_files(qtbot, window, tmp_path):  # type: ignore[no-untyped-def]
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    w = window.open_file(str(empty))
    qtbot.waitUntil(lambda: w.doc.result is not None or not w.doc.busy, timeout=10000)
    assert window.wait_idle()
    assert window.isVisible()
    assert window.open_file(str(tmp_path / "missing.session")) is None
    assert "no such file" in window.last_message
    folder = tmp_path / "a_dir"
    folder.mkdir()
    assert window.open_file(str(folder)) is None


def test_diff_lists_differences(qtbot, open_doc, window):  # type: ignore[no-untyped-def]
    a, b = LAB / "nan_rows_valid.seqdata.bin", LAB / "seq0.clean.seqdata.bin"
    w = open_doc(a, "llama")
    with qtbot.waitSignal(w.doc.diffReady, timeout=15000):
        window.compare_with(str(b))
    prof = load_model_profile(model("llama"))
    expected = diff_states(read_state(a, prof), read_state(b, prof))
    got = [(d.kind, d.description, d.offset_a, d.offset_b, d.layer) for d in w.diff.model.items]
    assert got == [(d.kind, d.description, d.offset_a, d.offset_b, d.layer) for d in expected.differences]
    assert got and w.current_view() == "diff"
    # next/previous walk the list and select the bytes in A
    item = w.diff.step(1)
    assert item is expected.differences[0] or item.description == expected.differences[0].description
    assert w.hex.cursor_offset == item.offset_a
    item2 = w.diff.step(1)
    assert item2.description == expected.differences[1].description
    sel = w.doc.bus.current
    assert sel.record is not None and sel.offset <= item2.offset_a < sel.offset + max(1, sel.length)
    assert w.layers.record is sel.record
    assert w.diff.step(-1).description == expected.differences[0].description
    # the per-layer plot has one curve per (section, stream, role)
    assert len(w.diff.abs_plot.listDataItems()) == len({(s.role, ld.stream_a, ld.role) for s in expected.sections
                                                          for ld in s.layers})


def test_diff_of_identical_files(qtbot, open_doc, window):  # type: ignore[no-untyped-def]
    path = STATE / "llama-f16-fa0-unified0-seq0.seqstate"
    w = open_doc(path, "llama")
    with qtbot.waitSignal(w.doc.diffReady, timeout=15000):
        window.compare_with(str(path))
    assert w.diff.model.rowCount() == 0
    assert "identical" in w.diff.header.text()
    assert w.diff.step(1) is None
