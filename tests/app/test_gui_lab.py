"""Lab view: the GUI's matrix equals ``kvscope lab``'s; progress and cancel; the detail pane; no model, no lab."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from kvscope.app.lab.model import CELL_ROLE, OUTCOME_ROLE, matrix_text, short_text
from kvscope.core.cli.lab_command import main as lab_main
from kvscope.core.lab.report import cell_text, cell_to_json, run_to_json
from tests.support.gui_helpers import LAB, model

FA0 = LAB.parent / "llama" / "fa0-unified1"
CONTEXT = FA0 / "context.state.bin"
CLEAN = FA0 / "seq0.clean.seqdata.bin"
CASES = ["truncated_half", "cell_count_zero", "nan_rows_valid", "nan_rows_late_fail"]
SPEC = "truncate:at=100"


def _lab_tab(qtbot, open_doc, path: Path, key: str | None = "llama"):  # type: ignore[no-untyped-def]
    """Open ``path``, show its Lab tab and wait for the scenario."""
    w = open_doc(path, key)
    w.show_view("lab")
    lab = w.lab
    if key is not None:
        qtbot.waitUntil(lambda: lab.ready is not None and not lab._dirty, timeout=20000)
    return w, lab


def _run(qtbot, lab, cases: list[str], spec: str = "", policies=None, readers=None):  # type: ignore[no-untyped-def]
    lab.controls.check_cases(cases)
    lab.controls.spec_edit.setText(spec)
    for name, box in lab.controls.policy_checks.items():
        box.setChecked(policies is None or name in policies)
    for name, box in lab.controls.reader_checks.items():
        box.setChecked(readers is None or name in readers)
    assert lab.controls.run_button.isEnabled(), lab.controls.run_button.toolTip()
    with qtbot.waitSignal(lab.runFinished, timeout=30000):
        assert lab.run_matrix() is not None
    return lab.lab_run


def _cli(capsys, *extra: str) -> str:  # type: ignore[no-untyped-def]
    args = ["lab", "--context", str(CONTEXT), "--restore", str(CLEAN), "--into", "0", "--model", model("llama")]
    for c in [*CASES, SPEC]:
        args += ["--corrupt", c]
    assert lab_main([*args, *extra]) == 0
    return str(capsys.readouterr().out)


def _no_seconds(d: dict) -> dict:  # type: ignore[type-arg]
    return {k: v for k, v in d.items() if k != "seconds"}


@pytest.mark.slow  # a lab matrix twice
def test_gui_matrix_equals_kvscope_lab(qtbot, open_doc, capsys, tmp_path):  # type: ignore[no-untyped-def]
    w, lab = _lab_tab(qtbot, open_doc, CONTEXT)
    assert lab.controls.live_path == str(CONTEXT) and lab.controls.restore_path == str(CLEAN)
    progress: list[tuple[object, str]] = []
    lab.runProgress.connect(lambda f, t: progress.append((f, t)))
    run = _run(qtbot, lab, CASES, SPEC)
    assert run is not None and not run.cancelled and lab.error == ""
    total = (len(CASES) + 1) * 6
    assert len(run.results) == total
    assert progress and progress[-1][0] == pytest.approx(1.0) and f"{total}/{total} cells" in progress[-1][1]

    cli = json.loads(_cli(capsys, "--json"))
    gui = run_to_json(run)
    assert gui["scenario"] == cli["scenario"] and gui["cases"] == cli["cases"]
    assert [_no_seconds(r) for r in gui["results"]] == [_no_seconds(r) for r in cli["results"]]
    # every cell of the table model: the CLI's result, the Markdown cell's text, an outcome colour
    by_key = {(r["corruption"], r["policy"], r["reader"]): r for r in cli["results"]}
    m = lab.model
    assert m.rowCount() == len(CASES) + 1 and m.columnCount() == 6
    assert [m.headerData(c, Qt.Orientation.Horizontal) for c in range(6)][:2] == ["contained\nbuffer",
                                                                                   "contained\nfile"]
    assert m.headerData(0, Qt.Orientation.Horizontal, Qt.ItemDataRole.ToolTipRole) == "policy contained · reader buffer"
    for row in range(m.rowCount()):
        for col in range(m.columnCount()):
            i = m.index(row, col)
            r = i.data(CELL_ROLE)
            assert _no_seconds(cell_to_json(r)) == _no_seconds(by_key[(r.corruption, r.policy, r.reader)])
            assert matrix_text(r) == cell_text(r).replace("**", "")
            assert i.data() == short_text(r)  # the Markdown cell without the return value and range
            assert i.data().startswith(f"{r.target.state} ") and "[" not in i.data()
            assert str(r.restore.returned).lower() not in i.data().split()[:1]
            assert i.data(Qt.ItemDataRole.BackgroundRole) is not None
            tip = i.data(Qt.ItemDataRole.ToolTipRole)
            assert r.policy in tip and matrix_text(r) in tip
    pos = m.position("nan_rows_valid", "contained", "buffer")
    assert pos is not None and m.index(*pos).data(OUTCOME_ROLE) == "poisoned"  # others' dense probe NaN
    pos = m.position("truncated_half", "contained", "buffer")
    assert pos is not None and m.index(*pos).data(OUTCOME_ROLE) == "degraded"  # target removed
    pos = m.position("truncated_half", "transactional", "file")
    assert pos is not None and m.index(*pos).data(OUTCOME_ROLE) == "ok"
    tip = m.index(*m.position("nan_rows_late_fail", "legacy", "buffer")).data(Qt.ItemDataRole.ToolTipRole)
    assert "failed check v_type at offset 6,464 (0x1940)" in tip

    # Export writes what kvscope lab prints
    out = tmp_path / "export"
    out.mkdir()
    md, js = out / "m.md", out / "m.json"
    assert lab.export(str(md)) and lab.export(str(js))
    assert md.read_text() == _cli(capsys, "--markdown")
    assert [_no_seconds(r) for r in json.loads(js.read_text())["results"]] == [
        _no_seconds(r) for r in cli["results"]]
    assert sorted(p.name for p in out.iterdir()) == ["m.json", "m.md"]  # no temporary left behind


def test_cancel_keeps_only_finished_cells(qtbot, open_doc, monkeypatch):  # type: ignore[no-untyped-def]
    from kvscope.core.lab.runner import LabRunner

    original = LabRunner.run_cell

    def slow(self, case, policy, reader):  # type: ignore[no-untyped-def]
        time.sleep(0.03)
        return original(self, case, policy, reader)

    monkeypatch.setattr(LabRunner, "run_cell", slow)
    w, lab = _lab_tab(qtbot, open_doc, CONTEXT)
    seen: list[object] = []

    def on_progress(fraction: object, _text: str) -> None:
        seen.append(fraction)
        if isinstance(fraction, float) and fraction > 0:
            lab.cancel()

    lab.runProgress.connect(on_progress)
    lab.controls.check_cases(None)  # the whole catalog: 21 rows x 6 columns
    assert lab.controls.cancel_button.isEnabled() is False
    with qtbot.waitSignal(lab.runFinished, timeout=30000):
        task = lab.run_matrix()
        assert task is not None and lab.controls.cancel_button.isEnabled()
        assert not lab.controls.run_button.isEnabled() and not lab.controls.case_list.isEnabled()
    run = lab.lab_run
    total = lab.model.rowCount() * lab.model.columnCount()
    assert run is not None and run.cancelled and seen
    assert 0 < len(run.results) < total
    shown = [lab.model.cell(r, c) for r in range(lab.model.rowCount()) for c in range(lab.model.columnCount())]
    assert [c for c in shown if c is not None] == run.results  # exactly the cells that ran, in order
    assert "cancelled after" in lab.controls.status.text()
    assert lab.controls.run_button.isEnabled() and not lab.controls.cancel_button.isEnabled()


def test_detail_pane_of_a_cell(qtbot, open_doc):  # type: ignore[no-untyped-def]
    from kvscope.core.lab.probe import seq_cells

    w, lab = _lab_tab(qtbot, open_doc, CONTEXT)
    _run(qtbot, lab, ["nan_rows_late_fail", "cell_count_zero"], policies=["legacy"], readers=["buffer"])
    before = seq_cells(lab.ready.scenario.live, 0)["kv"][0]
    for case in ("nan_rows_late_fail", "cell_count_zero"):
        r = lab.select_cell(case, "legacy", "buffer")
        d = lab.detail
        assert r is not None and d.result is r
        assert d.before_counts[0] == before == 7 and d.before_counts[1] == 7
        assert d.after_counts.get(0, 0) == r.target.components["kv"].n_cells
        assert d.after_counts[1] == 7  # the other sequence keeps its cells
        assert d.probe_values == {s: o.probe_diff for s, o in r.others.items()}
        text = d.text.toPlainText()
        assert f"returned {r.restore.returned}" in text
        assert f"Stale cells: {r.stale_cells}" in text
    r = lab.select_cell("nan_rows_late_fail", "legacy", "buffer")
    assert r is not None and r.target.state == "removed" and lab.detail.after_counts.get(0, 0) == 0
    assert lab.detail.probe_values[1]["dense"] == float("inf")  # the legacy policy leaves NaN rows behind
    assert "failed check v_type at offset 6,464" in lab.detail.text.toPlainText()
    assert "7 → 0 cells" in lab.detail.maps_label.text()


def test_lab_needs_the_model(qtbot, open_doc):  # type: ignore[no-untyped-def]
    w, lab = _lab_tab(qtbot, open_doc, CONTEXT, key=None)
    c = lab.controls
    assert lab.unavailable() is not None and "needs the model" in lab.reason.text()
    assert not lab.reason.isHidden()
    for widget in (c.run_button, c.live_combo, c.restore_combo, c.case_list, c.spec_edit, c.into_spin):
        assert not widget.isEnabled()
    assert lab.run_matrix() is None and "needs the model" in lab.error
    w.doc.set_model(model("llama"))
    qtbot.waitUntil(lambda: lab.ready is not None and c.run_button.isEnabled(), timeout=20000)
    assert lab.reason.isHidden()


def test_specs_are_checked_inline_and_folders_work(qtbot, open_doc):  # type: ignore[no-untyped-def]
    # a per-sequence file in a scenario folder: the folder is the live context, the file the input
    w, lab = _lab_tab(qtbot, open_doc, FA0 / "nan_rows_valid.seqdata.bin")
    c = lab.controls
    assert c.live_path == str(FA0) and c.restore_path == str(FA0 / "nan_rows_valid.seqdata.bin")
    assert lab.ready is not None and lab.ready.scenario.restore.name == "nan_rows_valid.seqdata.bin"
    c.check_cases(["truncated_half"])
    c.spec_edit.setText("bogus:x=1")
    assert c.spec_error.isVisibleTo(lab) and "bogus" in c.spec_error.text() and not c.run_button.isEnabled()
    c.spec_edit.setText("truncated_half")
    assert "already in the list" in c.spec_error.text() and not c.run_button.isEnabled()
    c.spec_edit.setText("fill:value=nan,role=k,index=0,cells=0-1 as-is")
    assert not c.spec_error.isVisibleTo(lab) and c.run_button.isEnabled()
    run = _run(qtbot, lab, ["truncated_half"], "fill:value=nan,role=k,index=0,cells=0-1 as-is",
               policies=["contained"], readers=["buffer"])
    assert [n for n, _ in run.cases] == ["truncated_half", "fill:value=nan,role=k,index=0,cells=0-1", "as-is"]
    # a corruption that parses but does not apply: a message, no crash
    _run(qtbot, lab, [], "drop:role=k,il=99", policies=["contained"], readers=["buffer"])
    assert "drop:role=k,il=99" in lab.error and lab.lab_run is None


@pytest.mark.slow  # the app in a subprocess
def test_screenshot_runs_a_small_matrix(qtbot, window, tmp_path):  # type: ignore[no-untyped-def]
    from kvscope.app.shell.screenshot import take_screenshot

    assert window.open_file(str(CONTEXT), model=model("llama")) is not None
    out = tmp_path / "lab.png"
    assert take_screenshot(window, str(out), "lab", None, (1400, 900), str(FA0 / "seq1.clean.seqdata.bin")) == 0
    lab = window.current().lab
    assert out.stat().st_size > 20000
    assert lab.lab_run is not None and lab.lab_run.scenario["restore"]["name"] == "seq1.clean.seqdata.bin"
    assert lab.detail.result is not None


def test_closing_the_tab_stops_the_run(qtbot, window, open_doc, monkeypatch):  # type: ignore[no-untyped-def]
    from kvscope.core.lab.runner import LabRunner

    original = LabRunner.run_cell
    ran: list[int] = []

    def slow(self, case, policy, reader):  # type: ignore[no-untyped-def]
        time.sleep(0.03)
        ran.append(1)
        return original(self, case, policy, reader)

    monkeypatch.setattr(LabRunner, "run_cell", slow)
    w, lab = _lab_tab(qtbot, open_doc, CONTEXT)
    lab.controls.check_cases(None)
    assert lab.run_matrix() is not None
    qtbot.waitUntil(lambda: len(ran) > 0, timeout=20000)  # a cell ran: the run is under way
    window.close_tab(window.tabs.indexOf(w))
    assert window.wait_idle(20000)
    assert 0 < len(ran) < 126 and window.tabs.count() == 0
