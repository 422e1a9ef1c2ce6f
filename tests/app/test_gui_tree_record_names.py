"""The tree names a record as the core does (issue #29, item 4): section, role and model layer with the model,
the index said as an index without; node paths and bookmarks stay put when the model is set or changed."""

from __future__ import annotations

from kvscope.app.document.bookmarks import Bookmarks
from tests.support.gui_helpers import STATE, model

ISWA = STATE / "gemma2-f16-fa0-unified1-swafull0-seq0.seqstate"  # kv_base: layers 1, 3; kv_swa: layers 0, 2
PATH = "/memory/kv_base/stream0/K1"  # the second K record of kv_base: model layer 3


def _row_label(w, path: str) -> str:  # type: ignore[no-untyped-def]
    tm = w.tree.model
    node = w.doc.result.root.find(path)
    assert node is not None
    return str(tm.data(tm.index_of(node), 0))  # DisplayRole of the name column


def test_the_same_record_keeps_its_node_path_and_bookmark_when_the_model_is_set(  # type: ignore[no-untyped-def]
        qtbot, window, open_doc, isolated_settings):
    w = open_doc(ISWA)
    doc = w.doc
    node = doc.result.root.find(PATH + "/rows")
    assert node is not None
    assert _row_label(w, PATH) == "K #1"  # under its section's node: the section is said there
    start = node.offset
    name = w.hex.bookmarks.default_name(start)
    assert name == PATH + "/rows"
    doc.bookmarks.add(start, start + 16, name)
    for key, label in ((model("gemma2"), "K layer 3"), (None, "K #1")):
        doc.set_model(key)
        qtbot.waitUntil(lambda key=key: doc.model_path == key and doc.result is not None and not doc.busy,
                        timeout=15000)
        assert window.wait_idle(15000)
        assert _row_label(w, PATH) == label
        again = doc.result.root.find(PATH + "/rows")
        assert again is not None and again.offset == start
        assert w.hex.bookmarks.default_name(start) == name
        assert [(b.start, b.name) for b in doc.bookmarks.items] == [(start, name)]
    # the bookmarks as saved read back the same
    assert [(b.start, b.name) for b in Bookmarks(str(ISWA), 0, isolated_settings).items] == [(start, name)]


def test_each_missing_record_shows_which_it_is_in_a_narrow_name_column(  # type: ignore[no-untyped-def]
        qtbot, window, open_doc):
    """At the default splitter a 1280x800 window gives the name column about 170 px: an elided label must still
    say which record it is (the middle elision showed 'V layer…tream 0' four times over)."""
    from PySide6.QtCore import Qt

    from tests.support.gui_helpers import LAB

    window.resize(1280, 800)
    w = open_doc(LAB / "seq_file_truncated_half.seqstate", model("llama"))
    tree, tm = w.tree.tree, w.tree.model
    assert tree.textElideMode() == Qt.TextElideMode.ElideRight
    w.tree.tree.expandAll()
    assert tm.missing_node is not None
    missing = tm.index(tm.rowCount() - 1, 0)
    rows = [tm.index(r, 0, missing) for r in range(tm.rowCount(missing))][:-1]  # the records, not stream1
    assert len(rows) == 5
    fm = tree.fontMetrics()
    shown = []
    for index in rows:
        rect = tree.visualRect(index)
        assert rect.width() > 0
        shown.append(fm.elidedText(str(tm.data(index, 0)), tree.textElideMode(), max(40, rect.width() - 24)))
    assert [s.split(" (")[0].split(" in ")[0].rstrip("…") for s in shown] == [
        "K layer 3", "V layer 0", "V layer 1", "V layer 2", "V layer 3"], shown
    cut = w.doc.result.root.find("/memory/kv/stream0/K3")  # flagged (its icon takes room too), five levels deep
    assert cut is not None
    index = tm.index_of(cut)
    room = tree.visualRect(index).width() - tree.style().pixelMetric(tree.style().PixelMetric.PM_SmallIconSize) - 8
    assert fm.horizontalAdvance("K layer 3") <= room, room


def test_a_finding_in_an_iswa_half_says_its_index_without_the_model(  # type: ignore[no-untyped-def]
        qtbot, window, open_doc, tmp_path):
    """Without the model the findings view's layer column, its detail line and its CSV say ``#1`` for kv_swa's
    cut K record, and the message names it ``kv_swa K #1``: it said layer 1 (the plain cache's naming: layer 1 is
    a kv_base layer); with the model, layer 2."""
    from PySide6.QtCore import Qt

    from kvscope.core.lab.damaged_copy import corrupt_file

    show = Qt.ItemDataRole.DisplayRole
    cut = tmp_path / "cut.seqstate"
    corrupt_file(ISWA, cut, ["truncate:node=/memory/kv_swa/stream0/K1,at=half"])
    w = open_doc(cut)
    fv = w.findings
    f = next(f for f in fv.model.findings if f.code == "truncated")
    assert fv.model.cell(f, "layer", show) == "#1"
    assert "kv_swa K #1" in fv.model.cell(f, "message", show)
    table = fv.csv_table()
    assert table is not None
    header, rows = table
    assert rows[[r[1] for r in rows].index("truncated")][header.index("layer")] == "#1"
    w.doc.set_model(model("gemma2"))
    qtbot.waitUntil(lambda: w.doc.model_path is not None and w.doc.result is not None and not w.doc.busy,
                    timeout=15000)
    assert window.wait_idle(15000)
    f = next(f for f in fv.model.findings if f.code == "truncated")
    assert fv.model.cell(f, "layer", show) == "2" and "kv_swa K layer 2" in fv.model.cell(f, "message", show)


def test_the_layer_plots_say_record_indexes_without_the_model(qtbot, window, open_doc):  # type: ignore[no-untyped-def]
    """The RMS and count plots of an iSWA half read without the model put records at their index: the axis says
    so and the ticks read ``#0``, ``#1`` (it said "layer" 0, 1); with the model, the layers 0 and 2 of kv_swa."""
    w = open_doc(ISWA)
    w.show_view("layers")
    lv = w.layers
    swa = next(i for i, u in enumerate(lv.units) if w.doc.result.sections[u.section_index].role == "kv_swa")
    lv.unit_combo.setCurrentIndex(swa)
    axis = lv.stats.bad_plot.getAxis("bottom")
    assert axis.labelText.startswith("record #")
    assert [t for t, _ in axis._tickLevels[0]] == [0.0, 1.0] and [s for _, s in axis._tickLevels[0]] == ["#0", "#1"]
    w.doc.set_model(model("gemma2"))
    qtbot.waitUntil(lambda: w.doc.model_path is not None and w.doc.result is not None and not w.doc.busy,
                    timeout=15000)
    assert window.wait_idle(15000)
    swa = next(i for i, u in enumerate(lv.units) if w.doc.result.sections[u.section_index].role == "kv_swa")
    lv.unit_combo.setCurrentIndex(swa)
    axis = lv.stats.bad_plot.getAxis("bottom")
    assert axis.labelText == "layer" and [s for _, s in axis._tickLevels[0]] == ["0", "2"]
