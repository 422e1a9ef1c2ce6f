"""Cell map against the CellTable; SWA marks; tokens <-> cells."""

from __future__ import annotations

import numpy as np
import pytest

from kvscope.app.views.cells.cellmap_image import build_cell_image
from kvscope.app.views.cells.swa import seq_max_pos, swa_masked_cells, swa_masked_pairs
from kvscope.core.reader.records import CellTable
from tests.support.gui_helpers import LAB, STATE


@pytest.mark.parametrize("name,key", [
    ("llama-f16-fa1-unified1-frag-ctx.session", "llama"),
    ("lfm2-f16-fa0-unified0-ctx.session", "lfm2"),
    ("gemma2-f16-fa0-unified1-swafull0-ctx.session", "gemma2"),
    ("qwen2vl-f16-fa0-unified0-ctx.session", "qwen2vl"),
])
def test_cell_map_counts_match_cell_table(qtbot, open_doc, name, key):  # type: ignore[no-untyped-def]
    w = open_doc(STATE / name, key)
    w.show_view("cells")  # the picture is built when the view is shown
    view = w.cells
    assert view.table_combo.count() == len(w.doc.index.tables) > 0
    for i in range(view.table_combo.count()):
        view.table_combo.setCurrentIndex(i)
        ref = view.ref
        assert ref is not None and view.image is not None
        t = ref.table
        expected = {s: int(t.cells_of_seq(s).size) for s in t.seq_set()}
        assert view.image.cells_per_seq() == expected
        assert view.image.rgba.shape[:2] == (t.count, len(expected) + 1)
        for order in (0, 1):  # file order and position order show the same cells
            view.order_combo.setCurrentIndex(order)
            assert view.image.cells_per_seq() == expected


def test_shared_and_empty_cells_are_visible() -> None:
    pos = np.array([0, 1, 2, 5], np.int32)
    n_seq = np.array([1, 2, 0, 1], np.int32)
    seq_ids = np.array([0, 0, 1, 1], np.int32)
    t = CellTable(0, 0, pos, n_seq, seq_ids)
    im = build_cell_image(t, [(255, 0, 0), (0, 0, 255)])
    assert im.cells_per_seq() == {0: 2, 1: 2}
    assert im.rgba[1, -1, 3] == 255 and im.rgba[0, -1, 3] == 0  # shared marker only on the shared cell
    assert (im.rgba[2, :, :3] == im.rgba[2, 0, :3]).all() and im.rgba[2, 0, 3] == 255  # empty row: grey across
    assert im.rgba[0, 1, 3] == 0  # cell 0 does not hold seq 1


def test_swa_mask_pure() -> None:
    pos = np.array([0, 1, 2, 3, 4, 5, 0, 1], np.int32)
    n_seq = np.array([1, 1, 1, 1, 1, 2, 1, 1], np.int32)
    seq_ids = np.array([0, 0, 0, 0, 0, 0, 1, 1, 1], np.int32)
    starts = np.concatenate([[0], np.cumsum(n_seq)]).astype(np.int64)
    assert seq_max_pos(pos, starts, seq_ids) == {0: 5, 1: 5}
    pairs = swa_masked_pairs(pos, starts, seq_ids, 4)
    # both sequences reach position 5, window 4: positions 0 and 1 are out (5 - p >= 4)
    assert pairs.tolist() == [True, True, False, False, False, False, False, True, True]
    cells = swa_masked_cells(pos, starts, seq_ids, 4)
    assert cells.tolist() == [True, True, False, False, False, False, True, True]
    chunked = swa_masked_pairs(pos, starts, seq_ids, 4, chunked=True)  # chunk [4, 8) holds position 5
    assert chunked.tolist() == [True, True, True, True, False, False, False, True, True]
    assert not swa_masked_pairs(pos, starts, seq_ids, 0).any()


def test_swa_marks_need_a_model(qtbot, open_doc):  # type: ignore[no-untyped-def]
    path = STATE / "gemma2-f16-fa0-unified1-swafull0-ctx.session"
    w = open_doc(path)
    assert not w.cells.swa_check.isEnabled()
    assert "needs a model" in w.cells.swa_check.toolTip()
    assert not w.layers.heads_check.isEnabled() and "needs a model" in w.layers.heads_check.toolTip()
    assert w.tokens.model.index(0, 2).data() == "—"
    w.doc.set_model(str(STATE / "tiny-gemma2.gguf"))
    qtbot.waitUntil(lambda: w.doc.profile is not None and not w.doc.busy, timeout=15000)
    w.show_view("cells")
    swa_tables = [i for i, t in enumerate(w.doc.index.tables) if t.section.role == "kv_swa"]
    assert swa_tables
    w.cells.table_combo.setCurrentIndex(swa_tables[0])
    assert w.cells.swa_check.isEnabled()
    w.cells.swa_check.setChecked(True)
    t = w.cells.ref.table
    n_swa = w.doc.profile.n_swa
    expected = swa_masked_cells(t.pos, t.seq_start, t.seq_ids, n_swa)
    shown = w.cells.image.masked.any(axis=1)[w.cells.image.row_of_cell]
    assert expected.any() and (shown == expected).all()
    assert w.tokens.model.index(0, 2).data() != "—"


def test_token_selects_its_cell_and_back(qtbot, open_doc):  # type: ignore[no-untyped-def]
    w = open_doc(LAB / "seq0.clean.seqstate", "llama")
    idx = w.doc.index
    assert idx.token_link is not None
    w.show_view("cells")
    tokens = w.tokens
    row = 3
    tokens.table.setCurrentIndex(tokens.model.index(row, 0))
    sel = w.doc.bus.current
    t = idx.tables[idx.token_link.table].table
    assert sel.token == row and sel.cell is not None and int(t.pos[sel.cell]) == row
    assert idx.token_link.seq in t.seqs_of(sel.cell)
    assert w.cells.marks[0].isVisible()
    assert w.hex.cursor_offset == t.record_offset(sel.cell)
    # the other way: a cell selects its token
    other = int(np.nonzero(t.pos == 1)[0][0])
    w.cells.select_row(int(w.cells.image.row_of_cell[other]))
    assert tokens.table.currentIndex().row() == 1
    assert tokens.model.index(row, 2).data()  # with a model the text column is filled


def test_tokens_without_link_say_why(qtbot, open_doc):  # type: ignore[no-untyped-def]
    w = open_doc(STATE / "lfm2-f16-fa0-unified0-ctx.session", "lfm2")
    assert w.doc.index.token_link is None
    assert "single-sequence" in w.tokens.summary.text()
    w.tokens.table.setCurrentIndex(w.tokens.model.index(2, 0))
    sel = w.doc.bus.current
    assert sel.token == 2 and sel.node is w.doc.index.tokens_node and sel.length == 4
