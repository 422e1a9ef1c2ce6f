"""The Lab tab's engine choice with real llama.cpp: ``both`` runs each case in llama.cpp and in the core, the
matrix shows the two columns, the agreement (or each disagreement) is said in the matrix and the detail
pane, Cancel stops between cases. Needs the engine extra (tests/app/conftest.py).

The real cases of tests/data/lab agree (tests/lab/test_lab_engine.py proves it for every scenario), so the
highlighting of a disagreement is checked in a view test, with one injected through the run object."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from kvscope.app.lab.model import DISAGREE_ROLE
from tests.support.gui_helpers import LAB, model
from tests.support.llama_builds import need_build

pytestmark = pytest.mark.slow  # real llama.cpp

LIVE = LAB / "fa0-unified1" / "context.state.bin"
CASES = ["truncated_half", "cell_count_zero", "nan_rows_valid", "drop_k_layer_1"]
TIMEOUT = 180000


@pytest.fixture(scope="module")
def pinned() -> None:
    need_build("0c1e5709")


def _lab(window, qtbot):  # type: ignore[no-untyped-def]
    w = window.open_file(str(LIVE), model=model("llama"))
    assert w is not None
    qtbot.waitUntil(lambda: w.doc.result is not None and not w.doc.busy, timeout=30000)
    w.show_view("lab")
    lab = w.lab
    qtbot.waitUntil(lambda: lab.ready is not None, timeout=60000)
    assert window.wait_idle(30000)
    return lab


def _run(lab, qtbot, engine: str, cases: list[str]):  # type: ignore[no-untyped-def]
    lab.controls.check_cases(cases)
    lab.controls.set_engine(engine)
    task = lab.run_matrix()
    assert task is not None, lab.error
    qtbot.waitUntil(lambda: task.done, timeout=TIMEOUT)
    assert lab.error == "", lab.error
    return lab.engine_run


@pytest.mark.xserver
def test_both_runs_the_core_and_llama_cpp_and_says_they_agree(qtbot, window, pinned) -> None:  # type: ignore[no-untyped-def]
    lab = _lab(window, qtbot)
    c = lab.controls
    c.set_engine("both")
    assert not any(x.isEnabled() for x in (*c.policy_checks.values(), *c.reader_checks.values()))
    assert "own code" in c.policy_checks["legacy"].toolTip()
    er = _run(lab, qtbot, "both", CASES)
    assert er is not None and er.torch is not None and er.engine["build"] == "0c1e5709"
    assert er.disagreements == []  # what the core reports for these cases
    m = lab.model
    assert m.columns == [("llama.cpp 0c1e5709", "buffer"), ("contained", "buffer")]
    assert [n for n, _ in m.cases] == CASES
    assert all(m.cell(r, k) is not None for r in range(len(CASES)) for k in range(2))
    assert not any(m.index(r, k).data(DISAGREE_ROLE) for r in range(len(CASES)) for k in range(2))
    assert "the core and the engine agree on every case" in c.status.text()
    r = lab.select_cell("nan_rows_valid", "llama.cpp 0c1e5709", "buffer")
    assert r is not None and r.restore.ok
    text = lab.detail.text.toPlainText()
    assert "The core and llama.cpp agree on this case" in text and "probe: logits NaN/Inf" in text
    assert m.data(m.index(2, 0), Qt.ItemDataRole.BackgroundRole) == m.data(m.index(2, 1),
                                                                           Qt.ItemDataRole.BackgroundRole)


def test_view_only_injected_disagreement_is_highlighted(qtbot, window, pinned, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A view test: the run is real, the disagreement is injected into what the view is given."""
    from kvscope.core.lab.engine_cells import Disagreement

    lab = _lab(window, qtbot)
    er = _run(lab, qtbot, "both", CASES[:2])
    injected = Disagreement("cell_count_zero", "state_after", 7372, 7380, "the states afterwards differ from byte 40")
    lab.show_engine_run(er, [injected])
    m = lab.model
    row = CASES.index("cell_count_zero")
    assert m.headerData(row, Qt.Orientation.Vertical) == "≠ cell_count_zero"
    assert m.headerData(0, Qt.Orientation.Vertical) == "truncated_half"
    for col in range(2):
        assert m.index(row, col).data(DISAGREE_ROLE) == [injected]
        assert str(m.index(row, col).data()).startswith("≠ ")
        tip = m.index(row, col).data(Qt.ItemDataRole.ToolTipRole)
        assert "≠ the core and llama.cpp disagree on this case" in tip
        assert "state_after: core 7372, llama.cpp 7380 (the states afterwards differ from byte 40)" in tip
    assert not m.index(0, 0).data(DISAGREE_ROLE)
    assert "1 case where the core and the engine disagree" in lab.controls.status.text()
    assert "purple frame" in lab.legend.text()
    lab.select_cell("cell_count_zero", "contained", "buffer")
    text = lab.detail.text.toPlainText()
    assert "≠ The core and llama.cpp disagree on this case:" in text and "state_after: core 7372" in text
    out = tmp_path / "lab.json"
    assert lab.export(str(out))
    import json

    doc = json.loads(out.read_text())
    assert doc["engine"]["build"] == "0c1e5709" and doc["disagreements"] == [] and len(doc["torch_results"]) == 2


def test_the_engine_run_shows_progress_and_cancels_between_cases(qtbot, window, pinned) -> None:  # type: ignore[no-untyped-def]
    lab = _lab(window, qtbot)
    steps: list[str] = []

    def on_progress(_fraction: object, text: str) -> None:
        steps.append(text)
        if "cells ·" in text and len(steps) < 50:
            lab.cancel()

    lab.runProgress.connect(on_progress)
    names = [x.name for x in lab.ready.cases]
    er = _run(lab, qtbot, "llama.cpp", names)
    assert any(s.startswith("starting llama.cpp") for s in steps)
    assert er is not None and er.run.cancelled and 1 <= len(er.run.results) < len(names)
    assert er.torch is None and lab.model.columns == [("llama.cpp 0c1e5709", "buffer")]
    assert lab.controls.status.text().startswith("cancelled:")
