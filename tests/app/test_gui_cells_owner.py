"""Cell map: a per-sequence file's recurrent state belongs to the file's sequence; axes in whole numbers; export."""

from __future__ import annotations

import csv
import io

import numpy as np
import pytest

from kvscope.app.document.seq_owner import UNNAMED_SEQ, file_sequence, implied_owner
from kvscope.app.views.cells.cellmap_image import build_cell_image, with_owner
from kvscope.app.views.plot_axes import IntegerAxis, integer_ticks, nice_step, value_text, value_ticks
from kvscope.core.reader.parse import read_state
from kvscope.core.reader.records import CellTable
from tests.support.gui_helpers import LAB, STATE

LFM2_SEQ1_BLOB = STATE / "lfm2-f16-fa0-unified0-seq1.seqdata.bin"  # header seq_id 1
LFM2_SEQ1_FILE = STATE / "lfm2-f16-fa0-unified0-seq1.seqstate"  # no seq_id: its KV cells hold seq 1
MAMBA_SEQ0_FILE = LAB.parent / "mamba" / "seq0.clean.seqstate"  # recurrent only: nothing names the sequence


def _recurrent(res):  # type: ignore[no-untyped-def]
    sec = next(s for s in res.sections if s.kind == "recurrent")
    return sec, sec.cells


@pytest.mark.parametrize("path,seq", [(LFM2_SEQ1_BLOB, 1), (LFM2_SEQ1_FILE, 1), (MAMBA_SEQ0_FILE, None)])
def test_the_owner_of_a_per_sequence_recurrent_cell(path, seq) -> None:  # type: ignore[no-untyped-def]
    res = read_state(path)
    sec, t = _recurrent(res)
    assert t.count == 1 and int(t.n_seq[0]) == 0  # what llama.cpp writes for one sequence
    owner = implied_owner(res, sec, t)
    assert owner is not None and owner.seq == seq
    assert owner.label == (f"seq {seq}" if seq is not None else "seq 0 (assumed)")
    im = build_cell_image(with_owner(t, owner.column), [(255, 0, 0)])
    assert im.cells_per_seq() == {owner.column: 1}  # a filled cell of the sequence, not an empty one
    assert im.rgba[0, 0, 3] == 255 and im.rgba[0, -1, 3] == 0  # ... and not shared


def test_whole_context_empty_cells_stay_empty() -> None:
    res = read_state(STATE / "lfm2-f16-fa0-unified0-ctx.session")
    assert file_sequence(res) is None
    sec, t = _recurrent(res)
    assert implied_owner(res, sec, t) is None
    mixed = CellTable(0, 0, np.array([3, 4], np.int32), np.array([1, 0], np.int32), np.array([2], np.int32))
    filled = with_owner(mixed, 7)
    assert filled.seqs_of(0) == [2] and filled.seqs_of(1) == [7]


@pytest.mark.xserver
def test_cell_map_draws_the_files_sequence(qtbot, open_doc) -> None:  # type: ignore[no-untyped-def]
    w = open_doc(LFM2_SEQ1_BLOB, "lfm2")
    w.show_view("cells")
    view = w.cells
    rec_key = next(t.key for t in w.doc.index.tables if t.section.kind == "recurrent")
    view.table_combo.setCurrentIndex(view.table_combo.findData(rec_key))
    text = view.summary.text()
    assert "1 cell:" in text and "state of seq 1 at position 11" in text and "empty" not in text
    assert view.table_combo.currentText() == "recurrent (1 cell)"
    assert view.image.cells_per_seq() == {1: 1}
    ticks = view.plot.getAxis("bottom")._tickLevels[0]
    assert [label for _, label in ticks] == ["seq 1", "shared"]
    assert "seq 1" in view.describe_row(0) and "empty" not in view.describe_row(0)


def test_cell_map_of_an_unnamed_sequence(qtbot, open_doc) -> None:  # type: ignore[no-untyped-def]
    w = open_doc(MAMBA_SEQ0_FILE, "mamba")
    w.show_view("cells")
    assert w.cells.image.cells_per_seq() == {UNNAMED_SEQ: 1}
    assert "seq 0 (assumed)" in w.cells.summary.text()
    assert [label for _, label in w.cells.plot.getAxis("bottom")._tickLevels[0]][0] == "seq 0 (assumed)"


def test_integer_and_value_ticks() -> None:
    assert nice_step(0.3) == 1 and nice_step(7) == 10 and nice_step(120) == 200
    assert nice_step(5, unit=32) == 8 and nice_step(40, unit=32) == 64
    step, ticks = integer_ticks(0, 0.9, 400)  # a tiny range still ticks only at whole numbers
    assert step == 1 and all(float(t).is_integer() for t in ticks)
    step, ticks = integer_ticks(0, 131_072, 300, centred=True)
    assert step >= 10_000 and all((t - 0.5).is_integer() for t in ticks) and ticks[-1] < 131_072
    axis = IntegerAxis("left")
    assert axis.tickStrings([0.0, 50_000.0], 1, 50_000) == ["0", "50,000"]
    step, vals = value_ticks(440.8, 440.95, 60, 24)  # no "x0.001": plain decimals with the digits needed
    assert [value_text(v, step) for v in vals][:2] == ["440.80", "440.85"]
    assert value_text(0.4409, 0.0001) == "0.4409" and value_text(1.5e-7, 1e-8).startswith("1.5")


@pytest.mark.xserver
def test_cell_map_axes_tick_whole_cells_and_positions(qtbot, open_doc) -> None:  # type: ignore[no-untyped-def]
    w = open_doc(STATE / "llama-f16-fa1-unified1-frag-ctx.session", "llama")
    w.show_view("cells")
    view = w.cells
    for order in (0, 1):
        view.order_combo.setCurrentIndex(order)
        for axis in (view.row_axis, view.pos_axis):
            levels = axis.tickValues(*axis.range, 300)
            values = [v for _, vs in levels for v in vs]
            assert values, "the axis shows ticks"
            shift = 0.5 if axis.centred else 0.0
            assert all(float(v - shift).is_integer() for v in values)
            assert all("." not in s for s in axis.tickStrings(values, 1, 1))
    # by position, a row's tick names its cell's position
    view.order_combo.setCurrentIndex(1)
    im, t = view.image, view.ref.table
    assert view.row_axis.label_of(0.5) == f"{int(t.pos[im.order[0]]):,}"


@pytest.mark.xserver
def test_cell_map_exports_png_and_csv(qtbot, open_doc, tmp_path) -> None:  # type: ignore[no-untyped-def]
    w = open_doc(STATE / "llama-f16-fa1-unified1-frag-ctx.session", "llama")
    w.show_view("cells")
    png, out = tmp_path / "cells.png", tmp_path / "cells.csv"
    assert w.cells.export_button.export_png(str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    task = w.cells.export_button.export_csv(str(out))
    assert task is not None
    qtbot.waitUntil(lambda: task.done, timeout=10000)
    rows = list(csv.reader(io.StringIO(out.read_text())))
    t = w.cells.ref.table
    assert rows[0][:4] == ["cell", "pos", "n_seq", "seq_ids"] and len(rows) == t.count + 1
    for i in (0, t.count - 1):
        assert int(rows[i + 1][1]) == int(t.pos[i]) and rows[i + 1][3].split() == [str(s) for s in t.seqs_of(i)]
