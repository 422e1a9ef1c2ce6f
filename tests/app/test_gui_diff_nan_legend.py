"""The diff view's NaN plot tells A from B by something no series uses (#29 item 7): its title said "A solid,
B dashed" while dotted and dash-dotted lines are what tell the series (sections, streams: an iSWA file's SWA
K/V) apart, so the file without NaNs seemed to hold them. Now A's points are circles and B's triangles, each
curve keeping its series' line style, and the title says so."""

from __future__ import annotations

from tests.support.gui_helpers import LAB


def test_the_nan_plot_tells_a_from_b_by_markers_not_line_styles(qtbot, open_doc, window):  # type: ignore[no-untyped-def]
    a, b = LAB / "nan_rows_valid.seqdata.bin", LAB / "seq0.clean.seqdata.bin"  # A holds the NaNs, B none
    w = open_doc(a, "llama")
    with qtbot.waitSignal(w.doc.diffReady, timeout=15000):
        window.compare_with(str(b))
    view = w.diff
    qtbot.waitUntil(lambda: view.built, timeout=15000)
    view._plot(view.diff)
    title = view.nan_plot.titleLabel.text
    assert "dashed" not in title and "solid" not in title, title
    assert "A ●" in title and "B ▲" in title, title
    curves = view.nan_plot.listDataItems()
    assert curves and len(curves) % 2 == 0
    for ca, cb in zip(curves[::2], curves[1::2], strict=True):  # per series: A's curve, then B's
        assert ca.opts["symbol"] == "o" and cb.opts["symbol"] == "t1"
        assert ca.opts["pen"].style() == cb.opts["pen"].style()  # the series' own style, not one of B's own
    nan_a = sum(float(y) for c in curves[::2] for y in c.getData()[1] if y == y)
    nan_b = sum(float(y) for c in curves[1::2] for y in c.getData()[1] if y == y)
    assert nan_a > 0 and nan_b == 0  # the circles (A) hold the NaNs, the healthy file's triangles none
