"""The Lab tab fits: nothing clipped or cut at 1280x800 and 1920x1080, no overlap at 1024x640, hints before a
run, restore candidates found beside the live context (geometry checks, not pixels)."""

from __future__ import annotations

import itertools

import pytest
from PySide6.QtCore import QPoint, QRect, Qt
from PySide6.QtWidgets import QAbstractButton, QComboBox, QLabel, QWidget

from kvscope.app.lab.detail import PLOT_MIN
from kvscope.app.lab.jobs import beside_inputs
from tests.support.gui_helpers import LAB, STATE, model

pytestmark = pytest.mark.slow  # the Lab at every window size

CONTEXT = LAB.parent / "llama" / "fa0-unified1" / "context.state.bin"
CASES = ["truncated_half", "cell_count_zero", "nan_rows_valid", "nan_rows_valid_then_seq_rm", "nan_rows_late_fail",
         "drop_k_layer_1"]


def _lab(qtbot, open_doc, window, size: tuple[int, int], path=CONTEXT):  # type: ignore[no-untyped-def]
    """The Lab tab of ``path`` with the structure tree folded away, the window at ``size``."""
    window.resize(*size)
    w = open_doc(path, "llama")
    w.show_view("lab")
    w.split.setSizes([0, sum(w.split.sizes())])
    lab = w.lab
    qtbot.waitUntil(lambda: lab.ready is not None and not lab._dirty, timeout=60000)
    return w, lab


def _run(qtbot, lab, cases: list[str] | None) -> None:  # type: ignore[no-untyped-def]
    lab.controls.check_cases(cases)
    with qtbot.waitSignal(lab.runFinished, timeout=60000):
        assert lab.run_matrix() is not None
    case = "nan_rows_late_fail" if cases is None or "nan_rows_late_fail" in cases else cases[0]
    assert lab.select_cell(case, "legacy", "buffer") is not None


def _rect_in(widget: QWidget, ancestor: QWidget) -> QRect:
    return QRect(widget.mapTo(ancestor, QPoint(0, 0)), widget.size())


def _visible(root: QWidget, kinds: tuple[type, ...]) -> list[QWidget]:
    return [x for x in root.findChildren(QWidget) if isinstance(x, kinds) and x.isVisibleTo(root)
            and x.window() is root.window()]


def _check_not_clipped(lab) -> None:  # type: ignore[no-untyped-def]
    """Every label, button and combo of the tab lies inside the tab (or inside the scroll area showing it),
    and no label's text is cut: a one-line label is as wide as its text, a wrapped one as tall."""
    area = lab.rect()
    for x in _visible(lab, (QLabel, QAbstractButton, QComboBox)):
        r = _rect_in(x, lab)
        scroll = next((a for a in (lab.controls_area, lab.detail_area) if a.widget().isAncestorOf(x)), None)
        what = (type(x).__name__, x.text() if hasattr(x, "text") else "", r)
        if scroll is None:
            assert area.contains(r), what
        else:  # inside a scroll area: up and down it may scroll, side to side it must fit
            v = _rect_in(x, scroll.viewport())
            assert v.left() >= 0 and v.right() <= scroll.viewport().width(), what
        if isinstance(x, QLabel) and x.text().strip():
            fm = x.fontMetrics()
            if x.wordWrap():
                assert x.height() >= x.heightForWidth(x.width()) - 1, x.text()
            else:
                assert x.width() >= fm.horizontalAdvance(x.text()) - 1, x.text()


def _check_matrix(lab) -> None:  # type: ignore[no-untyped-def]
    """Headers and cell texts are whole; the headers stay put while the matrix scrolls."""
    t, m = lab.table, lab.model
    fm = t.fontMetrics()
    hh, vh = t.horizontalHeader(), t.verticalHeader()
    assert hh.isVisible() and vh.isVisible()
    for c in range(m.columnCount()):
        need = max(*(fm.horizontalAdvance(line) for line in str(m.headerData(c, Qt.Orientation.Horizontal))
                     .splitlines()),
                   *(fm.horizontalAdvance(str(m.index(r, c).data() or "")) for r in range(m.rowCount())))
        assert hh.sectionSize(c) >= need, (c, hh.sectionSize(c), need)
    widest = max(hh.fontMetrics().horizontalAdvance(str(m.headerData(r, Qt.Orientation.Vertical)))
                 for r in range(m.rowCount()))
    assert vh.width() >= widest
    assert _rect_in(t, lab).intersects(lab.rect()) and t.height() >= 4 * vh.defaultSectionSize()


def _check_plots(lab) -> None:  # type: ignore[no-untyped-def]
    d = lab.detail
    assert d.stack.currentWidget() is d.plots and d.glw.isVisible()
    assert lab.detail_area.horizontalScrollBar().maximum() == 0  # the whole pane is in view, side to side
    for plot in (d.maps_plot, d.probe_plot):
        r = plot.sceneBoundingRect()
        assert r.width() >= PLOT_MIN - 10, r  # ~250 px wide or more
        assert d.glw.rect().contains(d.glw.mapFromScene(r).boundingRect().adjusted(1, 1, -1, -1))
        title = plot.titleLabel
        assert title.item.boundingRect().width() <= r.width(), title.text  # titles are not cut


@pytest.mark.xserver
def test_lab_fits_1280x800(qtbot, open_doc, window) -> None:  # type: ignore[no-untyped-def]
    w, lab = _lab(qtbot, open_doc, window, (1280, 800))
    _run(qtbot, lab, CASES)
    qtbot.wait(50)
    assert lab.width() >= 1200
    _check_matrix(lab)
    _check_plots(lab)
    _check_not_clipped(lab)


@pytest.mark.xserver
@pytest.mark.parametrize("size", [(1280, 800), (1920, 1080)])
def test_the_whole_catalog_and_its_controls_fit_without_folding_by_hand(qtbot, open_doc, window, size):  # type: ignore[no-untyped-def]
    """The issue's case: the tree as the window opens it, every corruption of the catalog: all 6 columns and
    every row in view at once, the Run button and the legend inside the tab; the tree comes back after."""
    window.resize(*size)
    w = open_doc(CONTEXT, "llama")
    tree_before = w.split.sizes()[0]
    assert tree_before > 0
    w.show_view("lab")
    lab = w.lab
    qtbot.waitUntil(lambda: lab.ready is not None and not lab._dirty, timeout=60000)
    assert w.split.sizes()[0] == 0 and not w.bytemap.isVisible()  # the Lab takes the tree's and map's room
    _run(qtbot, lab, None)
    qtbot.wait(100)
    t = lab.table
    assert lab.model.columnCount() == 6 and lab.model.rowCount() >= 20
    assert t.horizontalScrollBar().maximum() == 0 and t.verticalScrollBar().maximum() == 0
    hh = t.horizontalHeader()
    last = lab.model.columnCount() - 1
    assert hh.sectionViewportPosition(last) + hh.sectionSize(last) <= t.viewport().width()
    assert t.rowViewportPosition(lab.model.rowCount() - 1) + t.rowHeight(0) <= t.viewport().height()
    inside = lab.rect()
    for widget in (lab.controls.run_button, lab.controls.export_button, lab.legend):
        assert widget.isVisible() and inside.contains(_rect_in(widget, lab)), widget
    _check_matrix(lab)
    w.show_view("overview")
    assert w.split.sizes()[0] > 0 and w.bytemap.isVisible()


def test_lab_export_is_named_after_the_scenario(qtbot, open_doc, window) -> None:  # type: ignore[no-untyped-def]
    w, lab = _lab(qtbot, open_doc, window, (1280, 800))
    _run(qtbot, lab, CASES[:1])
    name = lab.export_name()
    assert name.endswith("-lab-matrix.md") and not name.startswith("lab-lab") and "/" not in name


def test_lab_shows_the_whole_catalog_at_1920x1080(qtbot, open_doc, window) -> None:  # type: ignore[no-untyped-def]
    w, lab = _lab(qtbot, open_doc, window, (1920, 1080))
    _run(qtbot, lab, None)  # every entry of the standard catalog
    t = lab.table
    qtbot.wait(50)
    assert lab.model.columnCount() == 6 and lab.model.rowCount() >= 20
    assert t.horizontalScrollBar().maximum() == 0  # every column at once
    _check_matrix(lab)
    _check_plots(lab)
    _check_not_clipped(lab)
    # every row is in view, or the rows scroll under headers that stay
    if t.verticalScrollBar().maximum() > 0:
        t.verticalScrollBar().setValue(t.verticalScrollBar().maximum())
        assert t.rowAt(t.viewport().height() - 2) == lab.model.rowCount() - 1
        assert t.horizontalHeader().isVisible() and t.horizontalHeader().y() >= 0


@pytest.mark.xserver
def test_no_overlap_at_1024x640(qtbot, open_doc, window) -> None:  # type: ignore[no-untyped-def]
    w, lab = _lab(qtbot, open_doc, window, (1024, 640))
    w.split.setSizes([300, 700])  # with the tree: the tab is small and scrolls where it must
    qtbot.wait(50)
    items = [x for x in _visible(lab.controls, (QLabel, QAbstractButton, QComboBox))
             if not any(x is not y and y.isAncestorOf(x) for y in _visible(lab.controls, (QComboBox,)))]
    for a, b in itertools.combinations(items, 2):
        if a.isAncestorOf(b) or b.isAncestorOf(a):
            continue
        assert not _rect_in(a, lab).intersected(_rect_in(b, lab)).isValid(), (a, b)
    assert lab.detail.glw.minimumWidth() >= 2 * PLOT_MIN  # plots keep their width: the pane scrolls instead


def test_hints_until_the_first_run(qtbot, open_doc, window) -> None:  # type: ignore[no-untyped-def]
    w, lab = _lab(qtbot, open_doc, window, (1280, 800))
    assert lab.matrix_stack.currentWidget() is lab.matrix_hint and "press Run" in lab.matrix_hint.text()
    assert lab.detail.stack.currentWidget() is lab.detail.hint and not lab.detail.glw.isVisible()
    _run(qtbot, lab, ["truncated_half"])
    assert lab.matrix_stack.currentWidget() is lab.table
    assert lab.detail.stack.currentWidget() is lab.detail.plots


def test_restore_candidates_beside_the_live_context(qtbot, open_doc, window) -> None:  # type: ignore[no-untyped-def]
    session = STATE / "llama-f16-fa0-unified0-ctx.session"
    beside = beside_inputs(str(session))
    assert beside[0].endswith("llama-f16-fa0-unified0-seq0.seqdata.bin")  # the same run's files first
    assert all(p.endswith((".seqdata.bin", ".seqstate")) for p in beside)
    w = open_doc(session, "llama")
    w.show_view("lab")
    c = w.lab.controls
    qtbot.waitUntil(lambda: c.restore_combo.count() > 0, timeout=10000)
    assert len(window.documents) == 1  # no second file opened
    offered = [c.restore_combo.itemData(i) for i in range(c.restore_combo.count())]
    assert str(STATE / "llama-f16-fa0-unified0-seq1.seqstate") in offered
    assert c.restore_path == str(STATE / "llama-f16-fa0-unified0-seq0.seqdata.bin")  # the destination's own
    assert "beside the live context" in c.restore_combo.itemData(0, Qt.ItemDataRole.ToolTipRole)
    assert model("llama")
