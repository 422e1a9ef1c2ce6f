"""Verify without an engine run: the model it needs, the message when the engine is not installed, the app
starting without the engine extra, the engine settings, and issue #11's leftovers (the byte map's and the
Overview's PNG export, the tokens of a recurrent per-sequence file, one overview build per parse, the
signal cleanup)."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtGui import QImage

from kvscope.app.document.verify_job import NEEDS_MODEL, VERIFY_ENGINES, EngineChoice
from kvscope.app.shell.engine_dialog import EngineDialog
from kvscope.core.engine.abi import INSTALL_HINT
from tests.support.gui_helpers import LAB, STATE, model

CLEAN = LAB / "seq0.clean.seqstate"
TRUNCATED = LAB / "truncated_half.seqdata.bin"
MAMBA_SEQ = STATE / "mamba-f32state-n3-seq1.seqstate"
ROOT = Path(__file__).resolve().parent.parent.parent


def test_the_app_names_the_verify_engines_and_statuses_of_the_core() -> None:
    """One list of engines: the runners, the parsers and the app all take kvscope.core.engine.choices's."""
    import argparse

    from kvscope.app.document.verify_marks import STATUSES
    from kvscope.app.shell.cli import add_arguments
    from kvscope.core.analysis.overview import VERIFY_STATUSES
    from kvscope.core.cli.lab_command import register as register_lab
    from kvscope.core.cli.verify_command import register as register_verify
    from kvscope.core.engine.choices import LAB_ENGINES
    from kvscope.core.lab.engine_lab import ENGINES as LAB_CORE_ENGINES
    from kvscope.core.verify.comparison import STATUSES as CORE_STATUSES
    from kvscope.core.verify.engines import ENGINES

    assert VERIFY_ENGINES == ENGINES and LAB_ENGINES == LAB_CORE_ENGINES
    root = argparse.ArgumentParser()
    sub = root.add_subparsers()
    register_lab(sub)
    register_verify(sub)
    app = argparse.ArgumentParser()
    add_arguments(app)
    choices = {tuple(a.choices or ()) for p in (*sub.choices.values(), app) for a in p._actions
               if "--engine" in a.option_strings}
    assert choices == {VERIFY_ENGINES, LAB_ENGINES}
    assert STATUSES == VERIFY_STATUSES == CORE_STATUSES


@pytest.mark.xserver
def test_verify_without_a_model_says_it_needs_one(qtbot, window, open_doc) -> None:  # type: ignore[no-untyped-def]
    w = open_doc(CLEAN)
    assert w.doc.profile is None
    assert "it needs the model" in window.actions_["verify"].toolTip()
    assert "Verify needs the GGUF model" in w.overview.browser.toPlainText()
    window.actions_["verify"].trigger()
    assert w.doc.verify_error == NEEDS_MODEL and not w.doc.verifying
    banner = w.verify_banner
    assert banner.isVisible() and banner.text == NEEDS_MODEL
    assert banner.model_button.isVisible() and not banner.settings_button.isVisible()
    assert window.last_message == NEEDS_MODEL
    assert "Verify could not run" in w.overview.browser.toPlainText()
    window.set_model(w, model("llama"))  # choosing the model clears the message
    qtbot.waitUntil(lambda: w.doc.profile is not None and not w.doc.busy, timeout=15000)
    assert not banner.isVisible() and w.doc.verify_error is None
    assert "Verify now" in w.overview.browser.toPlainText()


def test_verify_without_the_engine_extra_says_how_to_install_it(qtbot, window, open_doc, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # llama-cpp-python not importable: as without the extra
    w = open_doc(CLEAN, "llama")
    window.verify()
    qtbot.waitUntil(lambda: w.doc.verify_error is not None, timeout=30000)
    assert "llama-cpp-python is not installed" in w.doc.verify_error and INSTALL_HINT in w.doc.verify_error
    assert w.verify_banner.isVisible() and "pip install 'kvscope[engine]'" in w.verify_banner.text
    assert w.doc.verify is None and "pip install" in w.overview.browser.toPlainText()


@pytest.mark.slow  # the app in a subprocess
def test_the_app_starts_and_draws_without_the_engine_extra(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "shot.png"
    code = ("import sys; sys.modules['llama_cpp'] = None\n"
            "from kvscope.app.shell.cli import main\n"
            f"sys.exit(main([{str(CLEAN)!r}, '--model', {model('llama')!r}, '--view', 'overview', "
            f"'--size', '800x600', '--screenshot', {str(out)!r}]))")
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=120, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    assert QImage(str(out)).size().toTuple() == (800, 600)


def test_engine_settings_round_trip_through_the_dialog(qtbot, window) -> None:  # type: ignore[no-untyped-def]
    dlg = window.engine_settings()
    assert isinstance(dlg, EngineDialog) and dlg.choice() == EngineChoice()
    dlg.engine_combo.setCurrentIndex(dlg.engine_combo.findData("server"))
    dlg.running_server.setChecked(True)
    dlg.url_edit.setText("http://127.0.0.1:8080")
    ok = dlg.buttons.button(dlg.buttons.StandardButton.Ok)
    assert not ok.isEnabled() and "slot-save-path" in dlg.problem.text()  # a running server needs its folder
    dlg.slot_edit.setText(" /srv/slots ")
    assert ok.isEnabled()
    dlg.accept()
    assert window.settings.engine() == EngineChoice("server", server_url="http://127.0.0.1:8080",
                                                    slot_dir="/srv/slots")
    dlg = window.engine_settings()
    assert dlg.running_server.isChecked() and dlg.url_edit.text() == "http://127.0.0.1:8080"
    dlg.engine_combo.setCurrentIndex(dlg.engine_combo.findData("llama.cpp"))
    dlg.build_combo.setCurrentIndex(dlg.build_combo.findData("0c1e5709"))
    assert not dlg.url_edit.isEnabled() and dlg.build_combo.isEnabled()
    dlg.reject()  # Cancel keeps the saved choice
    assert window.settings.engine().engine == "server"
    dlg = window.engine_settings()
    dlg.engine_combo.setCurrentIndex(dlg.engine_combo.findData("llama.cpp"))
    dlg.build_combo.setCurrentIndex(dlg.build_combo.findData("0c1e5709"))
    dlg.accept()
    got = window.settings.engine()
    assert (got.engine, got.build) == ("llama.cpp", "0c1e5709") and got.verifier_kwargs()["server_url"] is None
    assert got.cleaned() == EngineChoice(build="0c1e5709")
    assert got.lab_kwargs("server")["server_url"] == "http://127.0.0.1:8080"  # the lab's server keeps the URL
    window.settings.qs.setValue("engine/choice", "{not json")
    assert window.settings.engine() == EngineChoice()


def test_the_toolbar_and_tools_menu_hold_verify(window) -> None:  # type: ignore[no-untyped-def]
    bar = window.actions_.toolbar
    assert bar is not None and window.actions_["verify"] in bar.actions()
    assert window.actions_["verify"].shortcut().toString() == "Ctrl+Shift+V"
    assert not window.actions_["verify"].isEnabled()  # no file open


@pytest.mark.xserver
def test_byte_map_exports_png_and_csv(qtbot, window, open_doc, tmp_path) -> None:  # type: ignore[no-untyped-def]
    w = open_doc(TRUNCATED, "llama")
    button = w.bytemap_export
    assert [a.text() for a in button.menu().actions()] == ["PNG image…", "CSV table…"]
    png = tmp_path / "bytemap.png"
    assert button.export_png(str(png))
    img = QImage(str(png))
    assert img.size() == w.bytemap.size() * w.bytemap.devicePixelRatioF() or img.size() == w.bytemap.size()
    task = button.export_csv(str(tmp_path / "bytemap.csv"))
    assert task is not None
    qtbot.waitUntil(lambda: task.done, timeout=15000)
    with open(tmp_path / "bytemap.csv", newline="") as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == list(w.bytemap.CSV_HEADER)
    leaves = w.doc.index.leaves
    assert [int(r[0]) for r in rows[1: 1 + len(leaves)]] == [n.offset for n in leaves]
    missing = [r for r in rows[1:] if r[4] == "missing"]
    m = w.doc.verdict().missing
    assert m is not None and len(missing) == len(m.records) and int(missing[0][0]) == w.doc.result.size


@pytest.mark.xserver
def test_overview_exports_png_only(qtbot, window, open_doc, tmp_path) -> None:  # type: ignore[no-untyped-def]
    w = open_doc(CLEAN, "llama")
    button = w.overview.export_button
    assert [a.text() for a in button.menu().actions()] == ["PNG image…"]
    png = tmp_path / "overview.png"
    assert button.export_png(str(png))
    img = QImage(str(png))
    assert not img.isNull() and img.width() >= w.overview.browser.width()
    assert "saved overview.png" in window.statusBar().currentMessage()


def test_the_overview_is_built_once_per_parse(qtbot, window, open_doc) -> None:  # type: ignore[no-untyped-def]
    w = open_doc(CLEAN, "llama")
    qtbot.waitUntil(lambda: w.doc.compat is not None and w.doc.stats is not None, timeout=15000)
    ov = w.overview
    assert ov.builds == 1 and ov.overview is not None and ov.overview.compat is w.doc.compat
    w.doc.set_verify({"verdict": "ok", "records": []})
    assert ov.builds == 1 and ov.overview.verify == {"verdict": "ok", "records": []}
    w.doc.reload()
    qtbot.waitUntil(lambda: not w.doc.busy, timeout=15000)
    assert ov.builds == 2 and w.doc.verify is None  # a new parse: a new overview, the verification forgotten


def test_tokens_of_a_recurrent_per_sequence_file_map_to_its_cell(qtbot, open_doc) -> None:  # type: ignore[no-untyped-def]
    w = open_doc(MAMBA_SEQ, "mamba")
    idx = w.doc.index
    summary = w.tokens.summary.text()
    assert "0 sequences" not in summary
    n = len(w.doc.result.tokens)
    assert (f"the recurrent state is 1 cell of seq 0 (assumed) (its state after position {n - 1}): token {n - 1} "
            "↔ that cell") in summary
    sel = idx.for_token(n - 1)
    assert sel.cell == 0 and sel.table == idx.token_link.table
    assert idx.for_token(0).cell is None  # folded into the state
    assert idx.for_cell(idx.token_link.table, 0).token == n - 1


def test_the_app_installs_the_signal_cleanup(qapp) -> None:  # type: ignore[no-untyped-def]
    from kvscope.app.base.application import ensure_app
    from kvscope.core import fsutil

    ensure_app()
    assert signal.getsignal(signal.SIGTERM) is fsutil._on_signal


def test_a_sigterm_removes_the_temporary_file_of_a_write_in_flight(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The app writes from worker threads: killed in the middle, no ``.kvscope-*`` temporary is left."""
    out = tmp_path / "big.bin"
    code = f"""
import os, sys, threading, time
os.environ["QT_QPA_PLATFORM"] = "offscreen"
from kvscope.app.base.application import ensure_app
from kvscope.core.fsutil import atomic_writer
app = ensure_app()
def write():
    with atomic_writer({str(out)!r}, "test") as fh:
        fh.write(b"x")
        fh.flush()
        print("writing", flush=True)
        time.sleep(60)
threading.Thread(target=write, daemon=True).start()
sys.exit(app.exec())
"""
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    p = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "writing"
        assert [f.name for f in tmp_path.iterdir() if f.name != "big.bin"]  # the temporary exists
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == -signal.SIGTERM
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        if p.stdout is not None:
            p.stdout.close()
    assert list(tmp_path.iterdir()) == []


def test_a_different_argmax_in_the_overview_comes_with_the_engines_own_variation() -> None:
    """#28: the Overview printed "a DIFFERENT argmax" under an ok verdict without the spread that explains it."""
    from kvscope.app.views.overview.verify_html import next_token_text

    nt = {"token": 5, "same_argmax": False, "argmax_restored": 7, "argmax_fresh": 9, "kl": 0.05,
          "max_abs_logit_diff": 0.8}
    beh = {"steps": [{"step": 0, "spread_kl": 0.04}], "limit_kl": 0.12}
    assert ("a DIFFERENT argmax (7 after the restore, 9 after the prefill; the engine's own variation at that step: "
            "KL up to 0.04 under other batch schedules, limit 0.12)") in next_token_text(nt, beh)
    assert "a DIFFERENT argmax (7 after the restore, 9 after the prefill)" in next_token_text(nt, None)
    assert "variation" not in next_token_text({**nt, "same_argmax": True}, beh)
