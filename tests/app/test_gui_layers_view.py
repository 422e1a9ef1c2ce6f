"""Layer view: heatmap axes in real units at every zoom on a big file, hover read-out, de-rotation caption,
whole-number and readable stats ticks, a legend beside the data, following the selection, export."""

from __future__ import annotations

import csv
import io
import struct
from pathlib import Path

import numpy as np
import pytest

from kvscope.app.views.layers.lod import Window, display_order, overview, plan
from kvscope.core.analysis.record_values import layer_matrix
from kvscope.core.reader.rotation import rotate_blocks
from tests.support.gui_helpers import LAB, STATE

BIG_CELLS = 131_072


def write_big(path: Path, cells: int = BIG_CELLS, n_embd: int = 32, n_layer: int = 1) -> Path:
    """A current-layout sequence state file: ``cells`` cells of seq 0 at positions 0.., F16 K and V rows
    whose value at (cell c, channel j) is ``(c % 1000) / 1000 + j / 10000`` (so a read-out can be checked)."""
    c = np.arange(cells, dtype=np.float64)[:, None]
    j = np.arange(n_embd, dtype=np.float64)[None, :]
    rows = ((c % 1000) / 1000 + j / 10000).astype(np.float16)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<III", 0x67677371, 3, cells) + np.arange(cells, dtype=np.int32).tobytes())
        meta = np.zeros((cells, 3), np.int32)
        meta[:, 0] = np.arange(cells)
        meta[:, 1] = 1
        fh.write(struct.pack("<II", 1, cells) + meta.tobytes() + struct.pack("<II", 0, n_layer))
        for _ in range(2 * n_layer):
            fh.write(struct.pack("<iQ", 1, 2 * n_embd) + rows.tobytes())
    return path


def _ticks(axis, lo: float, hi: float, px: float = 400) -> list[float]:  # type: ignore[no-untyped-def]
    return [v for _, vs in axis.tickValues(lo, hi, px) for v in vs]


def test_windows_and_orders() -> None:
    w = overview(131_072, 384, 993, 1024)  # the "shown 993×384": each sample row is 132 cells apart
    assert w.row_step == 132 and w.shape == (993, 384) and w.rect() == (0.0, 0.0, 384.0, 993.0 * 132)
    assert w.sample(50_000, 10) == (50_000 // 132, 10) and w.sampled_row(375) == 375 * 132
    p = plan(131_072, 384, (100, 160), (50_000, 50_060), 600, 400)
    assert p.full_resolution and p.row0 <= 50_000 and p.row1 >= 50_060 and p.col0 <= 100 and p.col1 >= 160
    assert Window(0, 100, 1, 0, 10, 1).covers(Window(10, 20, 2, 0, 5, 1))
    assert not Window(0, 100, 2, 0, 10, 1).covers(Window(10, 20, 1, 0, 5, 1))
    from kvscope.core.reader.records import CellTable

    t = CellTable(0, 0, np.array([5, 0, 3, 1], np.int32), np.array([1, 1, 1, 1], np.int32),
                  np.array([1, 0, 0, 1], np.int32))
    assert display_order(t, 4, True).tolist() == [1, 2, 3, 0]  # seq 0 by position, then seq 1
    assert display_order(t, 4, False) is None


@pytest.mark.xserver
def test_heatmap_axes_in_real_units_on_a_big_file(qtbot, open_doc, tmp_path) -> None:  # type: ignore[no-untyped-def]
    w = open_doc(write_big(tmp_path / "big.seqstate"))
    lv = w.layers
    w.show_view("layers")
    hm = lv.heatmap
    qtbot.waitUntil(lambda: hm.base.matrix is not None and not hm.busy, timeout=15000)
    assert hm.n_rows == BIG_CELLS and f"{BIG_CELLS:,} cells × 32 channels" in lv.title.text()
    # the overview is downsampled, the axis is not: it spans every cell
    assert hm.base.window.row_step > 1 and "zoom in for every value" in lv.info.text()
    (y0, y1) = hm.plot.vb.viewRange()[1]
    assert y0 <= 0 and y1 >= BIG_CELLS - 1
    ticks = _ticks(hm.row_axis, y0, y1)
    assert ticks and max(ticks) > 100_000 and all((t - 0.5).is_integer() for t in ticks)
    assert hm.row_axis.tickStrings(ticks, 1, 1)[-1].replace(",", "").isdigit()
    assert lv.heatmap.plot.getAxis("left").labelText.startswith("cell")
    # zoomed in: a finer window is read; axes, read-out and values stay in cells and channels
    hm.plot.vb.setRange(xRange=(4, 20), yRange=(100_000, 100_040), padding=0)
    qtbot.waitUntil(lambda: hm.detail.window is not None and not hm.busy and hm.detail.img.isVisible(), timeout=15000)
    assert hm.shown_window().full_resolution and lv.sampling_note() == "every value shown"
    ticks = _ticks(hm.row_axis, *hm.plot.vb.viewRange()[1], 300)
    assert ticks and all(100_000 <= t <= 100_040 for t in ticks)
    row, col, v = hm.sample_at(12.5, 100_012.5)
    assert (row, col) == (100_012, 12) and v == pytest.approx((100_012 % 1000) / 1000 + 12 / 10000, abs=1e-3)
    text = hm.describe(12.5, 100_012.5)
    assert text.startswith("value 0.01") and "cell 100,012" in text and "pos 100,012" in text
    assert "seq 0" in text and "channel 12" in text


@pytest.mark.xserver
def test_hover_readout_and_heads(qtbot, open_doc) -> None:  # type: ignore[no-untyped-def]
    w = open_doc(STATE / "llama-f16-fa1-unified1-frag-ctx.session", "llama")
    w.show_view("layers")
    lv, hm = w.layers, w.layers.heatmap
    qtbot.waitUntil(lambda: hm.base.matrix is not None and not hm.busy, timeout=15000)
    rec = lv.record
    m = layer_matrix(w.doc.result, rec)
    t = w.doc.index.table_of(rec).table
    scene = hm.plot.vb.mapViewToScene(__import__("PySide6.QtCore").QtCore.QPointF(5.5, 3.5))
    hm._on_move(scene)
    text = hm.hover.text()
    assert f"value {m[3, 5]:.4g}"[:10] in text and "cell 3" in text and f"pos {int(t.pos[3])}" in text
    assert f"seq {t.seqs_of(3)[0]}" in text and "channel 5" in text
    lv.heads_check.setChecked(True)
    hd = w.doc.profile.head_dim_k
    assert hm.col_axis.label_of(hd + 0.5) == "h1" and hm.col_axis.label_of(hd + 3.5) == "h1·3"
    assert "head 0, dim 5" in hm.describe(5.5, 3.5)
    assert hm.bar.axis.labelText == "value"  # the colour bar is labelled, in value units
    lo, hi = hm.bar.levels()
    finite = lv.matrix[np.isfinite(lv.matrix)]
    assert lo == -hi and hi == pytest.approx(float(np.abs(finite).max()))


def test_rotated_rows_are_shown_de_rotated(qtbot, open_doc) -> None:  # type: ignore[no-untyped-def]
    w = open_doc(STATE / "llama-q8_0-fa1-unified0-ctx.session", "llama")
    lv = w.layers
    sec = w.doc.result.sections[0]
    stream = sec.streams[0]
    rec = stream.k_layers[1]
    raw = layer_matrix(w.doc.result, rec)
    assert rec.rotated is False  # head size 32: llama.cpp does not rotate this model; pretend it did
    rec.rotated, rec.rot_block, stream.n_rot_inferred = True, 32, True
    lv.select_record(rec)
    qtbot.waitUntil(lambda: lv.heatmap.base.matrix is not None and not lv.heatmap.busy, timeout=15000)
    assert "de-rotated (Hadamard, block 32, inferred)" in lv.title.text()
    assert np.allclose(lv.matrix, rotate_blocks(raw, 32), atol=1e-5)  # de-rotated once (by the core)
    assert np.allclose(lv.matrix, layer_matrix(w.doc.result, rec), atol=1e-6)
    assert not np.allclose(lv.matrix, raw, atol=1e-3)
    stream.n_rot_inferred = False
    lv.select_record(stream.k_layers[0])
    lv.select_record(rec)
    assert "de-rotated (Hadamard, block 32)" in lv.title.text()


@pytest.mark.xserver
def test_stats_ticks_and_legend(qtbot, open_doc) -> None:  # type: ignore[no-untyped-def]
    w = open_doc(STATE / "llama-f16-fa1-unified1-frag-ctx.session", "llama")
    w.show_view("layers")
    sp = w.layers.stats
    count, rms = sp.bad_plot.getAxis("left"), sp.rms_plot.getAxis("left")
    lo, hi = sp.bad_plot.vb.viewRange()[1]
    ticks = _ticks(count, lo, hi, 60)
    assert ticks and all(float(t).is_integer() for t in ticks)  # no 0.5 when every count is 0
    assert rms.autoSIPrefix is False and -0.2 < sp.rms_plot.vb.viewRange()[1][0] <= 0  # from 0
    labels = rms.tickStrings(_ticks(rms, *sp.rms_plot.vb.viewRange()[1], 120), 1, 0.2)
    assert labels and all("e" not in s for s in labels)
    # the legend is beside the plots, not on them, in the plot's foreground colour
    legend = sp.legend
    assert legend.parentItem() is not sp.rms_plot.vb and not legend.sceneBoundingRect().intersects(
        sp.rms_plot.vb.sceneBoundingRect())
    assert [label.text for _, label in legend.items] == ["K", "V"]
    for theme in ("dark", "light"):
        w.layers.theme.set_preference(theme)
        fg = w.layers.theme.plot_colors()[1]
        assert all(label.opts["color"] == fg for _, label in legend.items)


@pytest.mark.xserver
def test_f8_moves_the_layers_view(qtbot, open_doc, window) -> None:  # type: ignore[no-untyped-def]
    w = open_doc(LAB.parent / "lfm2" / "nan_rows_late_fail_recr.seqdata.bin", "lfm2")
    w.show_view("layers")
    lv = w.layers
    res = w.doc.result
    seen = 0
    for _ in res.findings:
        window.step_finding(1)
        f = w.doc.bus.current.finding
        rec = w.doc.bus.current.record
        if rec is not None:
            assert lv.record is rec and lv.unit.records[rec.role][lv.slider.value()] is rec
            seen += rec.role in ("r", "s")
        elif f.path.startswith("/memory/recurrent"):  # a layer the parse could not read: its section, said so
            assert lv.unit.label == "recurrent" and "not read" in lv.title.text() and f.code in lv.info.text()
    assert seen >= 2  # the recurrent findings moved the view to their records


def test_a_recurrent_record_of_one_cell_is_one_cell(qtbot, open_doc) -> None:  # type: ignore[no-untyped-def]
    """A per-sequence recurrent state is one cell: the heading said "1 recurrent cells" (issue #29 item 10)."""
    w = open_doc(LAB.parent / "mamba" / "seq0.clean.seqstate", "mamba")
    w.show_view("layers")
    lv = w.layers
    rec = next(r for sec in w.doc.result.sections if sec.kind == "recurrent" for r in sec.all_layers())
    assert lv.select_record(rec)
    qtbot.waitUntil(lambda: "recurrent cell" in lv.title.text(), timeout=10000)
    title = lv.title.text()
    assert "1 recurrent cell × " in title and "recurrent cells" not in title, title


@pytest.mark.xserver
def test_layers_export(qtbot, open_doc, tmp_path) -> None:  # type: ignore[no-untyped-def]
    w = open_doc(STATE / "llama-f16-fa1-unified1-frag-ctx.session", "llama")
    w.show_view("layers")
    lv = w.layers
    qtbot.waitUntil(lambda: lv.matrix is not None and not lv.heatmap.busy, timeout=15000)
    png, heat, stats = tmp_path / "l.png", tmp_path / "heat.csv", tmp_path / "stats.csv"
    assert lv.export_button.export_png(str(png)) and png.read_bytes()[:4] == b"\x89PNG"
    for path, method in ((heat, "csv_table"), (stats, "stats_csv_table")):
        task = lv.export_button.export_csv(str(path), method)
        qtbot.waitUntil(lambda t=task: t.done, timeout=10000)
    rows = list(csv.reader(io.StringIO(heat.read_text())))
    m = lv.matrix
    assert rows[0][:4] == ["row", "cell", "pos", "seq_ids"] and len(rows) == m.shape[0] + 1
    assert [float(x) for x in rows[4][4:]] == pytest.approx(m[3].tolist())
    srows = list(csv.DictReader(io.StringIO(stats.read_text())))
    assert len(srows) == len(w.doc.stats.layers) and {"role", "il", "rms", "n_nonfinite"} <= set(srows[0])


def _nan_layer_copy(tmp_path: Path, layer: int) -> Path:
    """The clean lab blob with NaN in the first row of K layer ``layer``."""
    from kvscope.core.reader.parse import read_state

    src = LAB / "seq0.clean.seqdata.bin"
    data = bytearray(src.read_bytes())
    rec = next(r for _, r in read_state(str(src)).layer_records() if r.role == "k" and r.il == layer)
    data[rec.data_offset:rec.data_offset + rec.row_bytes] = np.full(rec.row_bytes // 2, np.nan, np.float16).tobytes()
    out = tmp_path / f"nan-k{layer}.seqdata.bin"
    out.write_bytes(bytes(data))
    return out


@pytest.mark.xserver
def test_layers_open_on_the_flagged_layer(qtbot, open_doc, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Issue 29 item 9: the layer the verdict names (NaN in K layer 2), not layer 0; then the user's choice."""
    w = open_doc(_nan_layer_copy(tmp_path, 2), "llama")
    top = w.doc.verdict().top_findings[0]
    assert top.code == "nonfinite_values" and top.layer == 2
    w.show_view("layers")
    lv = w.layers
    qtbot.waitUntil(lambda: lv.built, timeout=5000)
    assert lv.record is not None and (lv.record.role, lv.record.il) == ("k", 2)
    assert lv.slider.value() == 2 and "layer 2" in lv.layer_label.text() and "K layer 2" in lv.title.text()
    assert w.doc.bus.current is None or w.doc.bus.current.record is not lv.record  # nothing was published
    # once the user picks a layer, statistics or a Verify arriving later do not move it back
    lv.slider.setValue(0)
    assert lv.record.il == 0
    w.doc.statsReady.emit()
    assert lv.record.il == 0


@pytest.mark.xserver
def test_layers_open_on_a_dropped_layer(qtbot, open_doc) -> None:  # type: ignore[no-untyped-def]
    """The verdict names a layer with no record (the first empty slot, layer 3): the view says so."""
    root = Path(__file__).resolve().parent.parent.parent
    w = open_doc(root / "resources" / "examples" / "llama-dropped-layer.seqdata.bin", "llama")
    assert w.doc.verdict().top_findings[0].layer == 3
    w.show_view("layers")
    lv = w.layers
    assert lv.record is None and lv.layer_label.text() == "layer 3"
    assert lv.title.text().startswith("K layer 3 · ") and "not read" in lv.title.text()
    assert "missing_layer" in lv.info.text()
    qtbot.waitUntil(lambda: lv.built, timeout=5000)
    assert all(m.isVisible() and m.value() == 3 for m in lv.stats.markers)  # the plots mark layer 3 too


def test_a_healthy_file_opens_on_layer_0(qtbot, open_doc) -> None:  # type: ignore[no-untyped-def]
    w = open_doc(LAB / "seq0.clean.seqdata.bin", "llama")
    lv = w.layers
    assert lv.flagged() is None and lv.record is not None and lv.record.il == 0
