"""Issue 19 item 11, the small things a user trips over: NaN drawn in a colour of its own (the report's, in
no colour of the map), the pinned build's radio button checked in Engine Settings, Ctrl+E reaching the
window from the tree's find box, "1 cell" (never "1 cells"), no empty axes in the Cells view of a
non-state file, and the file dialog naming state files by their kind.

The tests marked ``xserver`` also run in a real X server (test_gui_xserver.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import QPointF

from kvscope.app.base.theme import NONFINITE_RGB
from tests.support.gui_helpers import LAB


def _far_from(rgb: tuple[int, int, int], lut: np.ndarray) -> int:
    """The smallest L1 distance between ``rgb`` and any colour of ``lut``."""
    return int(np.abs(lut[:, :3].astype(np.int64) - np.array(rgb)).sum(1).min())


@pytest.mark.xserver
def test_nan_is_drawn_in_its_own_colour_the_reports(qtbot, open_doc) -> None:  # type: ignore[no-untyped-def]
    w = open_doc(LAB / "nan_rows_valid.seqdata.bin", "llama")
    w.show_view("layers")
    hm = w.layers.heatmap
    qtbot.waitUntil(lambda: hm.base.matrix is not None and not hm.busy, timeout=15000)
    qtbot.wait(100)
    assert not np.isfinite(hm.base.matrix).any()
    assert _far_from(NONFINITE_RGB, hm.bar.lut) > 150  # not the map's top red (it was 44 away)
    # what is on screen in the middle of the plot: every value there is NaN
    centre = hm.plot.vb.mapViewToScene(QPointF(hm.n_cols / 2, hm.n_rows / 2))
    pt = hm.glw.mapFromScene(centre)
    img = hm.glw.grab().toImage()
    c = img.pixelColor(int(pt.x() * img.devicePixelRatio()), int(pt.y() * img.devicePixelRatio()))
    assert (c.red(), c.green(), c.blue()) == NONFINITE_RGB
    # the report's heatmap paints NaN the same colour
    from kvscope.app.report.figures import heatmap

    m = np.full((4, 8), np.nan, np.float32)
    m[0, 0] = 1.0
    rimg = heatmap("f", "K layer 0", m, 4, 8, "")
    colours = {(rimg.pixelColor(x, y).red(), rimg.pixelColor(x, y).green(), rimg.pixelColor(x, y).blue())
               for x in range(0, rimg.width(), 7) for y in range(0, rimg.height(), 7)}
    assert NONFINITE_RGB in colours


@pytest.mark.xserver
def test_engine_settings_checks_the_pinned_builds_radio_button(qtbot, window) -> None:  # type: ignore[no-untyped-def]
    from kvscope.app.document.verify_job import EngineChoice

    dlg = window.engine_settings()
    assert dlg.pinned.isChecked() and not dlg.own_lib.isChecked()  # both were unchecked: one radio group
    assert dlg.start_server.isChecked()
    dlg.running_server.setChecked(True)
    assert dlg.pinned.isChecked()  # the server's choice leaves the llama.cpp one alone
    dlg.own_lib.setChecked(True)
    assert dlg.running_server.isChecked() and not dlg.pinned.isChecked()
    dlg.reject()
    window.settings.set_engine(EngineChoice(lib_path="/opt/llama"))
    dlg = window.engine_settings()
    assert dlg.own_lib.isChecked() and not dlg.pinned.isChecked() and dlg.start_server.isChecked()
    dlg.reject()


@pytest.mark.xserver
def test_ctrl_e_reaches_the_window_from_the_find_boxes(qtbot, open_doc, window, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from PySide6.QtCore import Qt

    w = open_doc(LAB / "seq0.clean.seqstate", "llama")
    calls: list[int] = []
    monkeypatch.setattr(window, "export_report", lambda *a, **k: calls.append(1))
    window.activateWindow()
    w.tree.focus_find()
    qtbot.waitUntil(lambda: w.tree.find_edit.hasFocus(), timeout=5000)
    w.tree.find_edit.setText("layer")
    w.tree.find_edit.setCursorPosition(0)
    qtbot.keyClick(w.tree.find_edit, Qt.Key.Key_E, Qt.KeyboardModifier.ControlModifier)
    assert calls == [1]  # under X11 the line edit took it as "end of line"
    assert w.tree.find_edit.text() == "layer"
    qtbot.keyClick(w.tree.find_edit, Qt.Key.Key_A, Qt.KeyboardModifier.ControlModifier)
    assert w.tree.find_edit.selectedText() == "layer"  # the box's own editing keys stay its own


def _texts(model, parent=None):  # type: ignore[no-untyped-def]
    """Every display text and tooltip of a tree model, depth first."""
    from PySide6.QtCore import QModelIndex, Qt

    parent = parent or QModelIndex()
    for r in range(model.rowCount(parent)):
        for c in range(model.columnCount(parent)):
            ix = model.index(r, c, parent)
            for role in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.ToolTipRole):
                v = model.data(ix, role)
                if v is not None:
                    yield str(v)
        yield from _texts(model, model.index(r, 0, parent))


@pytest.mark.xserver
def test_one_cell_is_never_1_cells(qtbot, open_doc) -> None:  # type: ignore[no-untyped-def]
    import re

    from PySide6.QtGui import QTextDocument

    from tests.support.gui_helpers import STATE

    w = open_doc(STATE / "mamba-f32state-n3-seq0.seqstate", "mamba")
    texts = list(_texts(w.tree.model))
    assert any(re.search(r"\b1 cell\b", t) for t in texts)  # the tree's cells node: "1 cell"
    page = QTextDocument()
    page.setHtml(w.overview.html())
    texts.append(page.toPlainText())
    bad = [t for t in texts if re.search(r"(?<![\d,.])1 (\w+ )?cells\b", t)]
    assert not bad, bad[:3]


@pytest.mark.xserver
def test_cells_view_of_a_non_state_file_says_there_are_no_cells(qtbot, open_doc, tmp_path) -> None:  # type: ignore[no-untyped-def]
    junk = tmp_path / "notes.bin"
    junk.write_bytes(np.random.default_rng(19).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    w = open_doc(junk)
    w.show_view("cells")
    view = w.cells
    qtbot.waitUntil(lambda: view.built, timeout=10000)
    qtbot.wait(50)
    assert not view.glw.isVisible()  # no empty axes
    assert not view.legend.isVisible()
    assert view.summary.isVisible() and "No cells" in view.summary.text()
    assert "not a llama.cpp state file" in view.summary.text()
    assert not view.table_combo.isEnabled()
    w2 = open_doc(LAB / "seq0.clean.seqstate", "llama")
    w2.show_view("cells")
    qtbot.waitUntil(lambda: w2.cells.built and w2.cells.image is not None, timeout=10000)
    assert w2.cells.glw.isVisible() and "No cells" not in w2.cells.summary.text()
