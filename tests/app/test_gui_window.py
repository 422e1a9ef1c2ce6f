"""Main window: settings, recent files, model association, drag and drop, background work, CLI."""

from __future__ import annotations

import argparse
import shutil
import threading
import time

import numpy as np
from PySide6.QtCore import QMimeData, QPointF, QSettings, Qt, QTimer, QUrl
from PySide6.QtGui import QDropEvent

from kvscope.app.base.theme import Theme
from kvscope.app.document.model_files import best_match, suggest_models
from kvscope.app.shell.main_window import MainWindow
from kvscope.app.shell.settings import RECENT_MAX, AppSettings
from tests.support.gui_helpers import LAB, STATE, model


def test_recent_files_capped_and_pruned(tmp_path, app_settings):  # type: ignore[no-untyped-def]
    files = []
    for i in range(RECENT_MAX + 3):
        f = tmp_path / f"f{i}.session"
        f.write_bytes(b"x")
        files.append(f)
        app_settings.add_recent(str(f))
    recent = app_settings.recent_files()
    assert len(recent) == RECENT_MAX
    assert recent[0] == str(files[-1])  # most recent first
    files[-1].unlink()
    recent = app_settings.recent_files()
    assert str(files[-1]) not in recent and len(recent) == RECENT_MAX - 1
    app_settings.add_recent(str(files[-2]))  # re-adding moves to the front without duplicates
    assert app_settings.recent_files()[0] == str(files[-2])
    assert len(set(app_settings.recent_files())) == len(app_settings.recent_files())
    # what is stored was pruned too
    app_settings.sync()
    again = AppSettings(QSettings(app_settings.qs.fileName(), QSettings.Format.IniFormat))
    assert str(files[-1]) not in again.recent_files()


def test_recent_menu_opens_files(qtbot, window):  # type: ignore[no-untyped-def]
    path = STATE / "llama-f16-fa0-unified0-seq1.seqstate"
    window.settings.add_recent(str(path))
    menu = window.actions_.recent_menu
    menu.aboutToShow.emit()
    act = next(a for a in menu.actions() if a.toolTip() == str(path))
    act.trigger()
    assert window.current() is not None and window.current().doc.path == str(path)


def _restarted(win, qtbot, isolated_settings):  # type: ignore[no-untyped-def]
    """``win`` saved and closed, and a new window on the same settings file (the app started again)."""
    win.save_settings()
    win.runner.shutdown()
    win.close()
    win2 = MainWindow(AppSettings(QSettings(isolated_settings.fileName(), QSettings.Format.IniFormat)),
                      Theme("light"))
    qtbot.addWidget(win2)
    return win2


def test_model_association_remembered(qtbot, tmp_path, isolated_settings):  # type: ignore[no-untyped-def]
    folder = tmp_path / "states"
    folder.mkdir()
    state = folder / "lfm2-f16-fa0-unified0-ctx.session"
    shutil.copy(STATE / state.name, state)
    for key in ("lfm2", "llama"):
        shutil.copy(model(key), folder / f"tiny-{key}.gguf")
    assert [p.split("/")[-1] for p in suggest_models(str(state))][0] == "tiny-lfm2.gguf"
    assert best_match(str(state)) == str(folder / "tiny-lfm2.gguf")

    win = MainWindow(AppSettings(isolated_settings), Theme("light"))
    qtbot.addWidget(win)
    w = win.open_file(str(state))
    qtbot.waitUntil(lambda: w.doc.result is not None, timeout=10000)
    assert w.doc.profile is None
    assert win.wait_idle(30000)  # the GGUF beside it read with the file: only the one it fits is offered
    assert w.banner.suggestions.count() == 1 and not w.banner.use_button.isHidden()
    assert w.banner.suggestions.itemData(0) == str(folder / "tiny-lfm2.gguf")
    w.banner.use_button.click()  # use the suggestion
    qtbot.waitUntil(lambda: w.doc.profile is not None and not w.doc.busy, timeout=10000)
    assert w.doc.profile.arch == "lfm2"
    win.wait_idle()
    win2 = _restarted(win, qtbot, isolated_settings)
    w2 = win2.open_file(str(state))
    assert w2.doc.model_path == str(folder / "tiny-lfm2.gguf")
    qtbot.waitUntil(lambda: w2.doc.profile is not None and not w2.doc.busy, timeout=10000)
    # "read without model" is remembered as well
    w2.banner.remove_button.click()
    qtbot.waitUntil(lambda: w2.doc.profile is None and not w2.doc.busy, timeout=10000)
    assert win2.settings.model_for(str(state)) is None
    win2.wait_idle()
    win2.runner.shutdown()


def test_a_new_file_is_offered_the_model_last_used_with_its_architecture(qtbot, tmp_path, isolated_settings):  # type: ignore[no-untyped-def]
    """Issue 29 item 9: no GGUF beside the second file, none remembered for it: the model the first file of
    the same architecture was read with is offered (read with the file first: it fits); another
    architecture's is not."""
    first, second, lfm2 = (tmp_path / d for d in ("first", "second", "lfm2"))
    for d in (first, second, lfm2):
        d.mkdir()
    a = first / "a.seqstate"
    b = second / "b.seqstate"
    c = lfm2 / "c.session"
    shutil.copy(STATE / "llama-f16-fa0-unified0-seq0.seqstate", a)
    shutil.copy(STATE / "llama-f16-fa0-unified0-seq1.seqstate", b)
    shutil.copy(STATE / "lfm2-f16-fa0-unified0-ctx.session", c)
    win = MainWindow(AppSettings(isolated_settings), Theme("light"))
    qtbot.addWidget(win)
    wa = win.open_file(str(a), model=model("llama"))
    qtbot.waitUntil(lambda: wa.doc.profile is not None and not wa.doc.busy, timeout=10000)
    assert win.wait_idle(30000)
    assert win.settings.arch_models() == [("llama", model("llama"))]
    win2 = _restarted(win, qtbot, isolated_settings)
    wb = win2.open_file(str(b))
    qtbot.waitUntil(lambda: wb.doc.result is not None, timeout=10000)
    assert wb.doc.profile is None
    assert win2.wait_idle(30000)
    banner = wb.banner
    assert banner.suggestions.count() == 1 and not banner.use_button.isHidden()
    assert banner.suggestions.itemData(0) == model("llama")
    assert "used before with llama" in banner.suggestions.itemText(0)
    assert "tiny-llama.gguf, the model last used with a llama file, fits it" in banner.label.text()
    banner.use_button.click()
    qtbot.waitUntil(lambda: wb.doc.profile is not None and not wb.doc.busy, timeout=10000)
    assert wb.doc.profile.arch == "llama" and win2.settings.model_for(str(b)) == model("llama")
    # a session file names its architecture (lfm2): the llama model is not tried on it
    wc = win2.open_file(str(c))
    qtbot.waitUntil(lambda: wc.doc.result is not None, timeout=10000)
    assert win2.wait_idle(30000)
    assert wc.banner.recalled() == {} and wc.banner.suggestions.count() == 0
    assert "No GGUF beside the file" in wc.banner.label.text()
    win2.runner.shutdown()


def test_bad_model_is_reported_not_fatal(qtbot, window, tmp_path):  # type: ignore[no-untyped-def]
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 12)
    w = window.open_file(str(STATE / "llama-f16-fa0-unified0-seq0.seqstate"), model=str(bad))
    qtbot.waitUntil(lambda: w.doc.result is not None and not w.doc.busy, timeout=10000)
    assert w.doc.profile is None and w.doc.model_error
    assert "not used" in w.banner.label.text()


def test_geometry_and_layout_persist(qtbot, isolated_settings):  # type: ignore[no-untyped-def]
    win = MainWindow(AppSettings(isolated_settings), Theme("light"))
    qtbot.addWidget(win)
    win.resize(701, 503)  # inside the offscreen screen: restoreGeometry clamps to it
    win.show()
    qtbot.waitExposed(win)
    win.close()
    win2 = MainWindow(AppSettings(QSettings(isolated_settings.fileName(), QSettings.Format.IniFormat)),
                      Theme("light"))
    qtbot.addWidget(win2)
    assert (win2.width(), win2.height()) == (701, 503)
    win2.runner.shutdown()


def test_drag_and_drop_opens(qtbot, window):  # type: ignore[no-untyped-def]
    paths = [STATE / "llama-f16-fa0-unified0-seq0.seqstate", STATE / "llama-f16-fa0-unified0-seq1.seqstate"]
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    ev = QDropEvent(QPointF(50, 50), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                    Qt.KeyboardModifier.NoModifier)
    window.dropEvent(ev)
    assert [w.doc.path for w in window.documents] == [str(p) for p in paths]
    assert window.tabs.count() == 2
    window.close_current()
    window.close_current()
    assert window.tabs.count() == 0 and window.centralWidget() is window.welcome
    window.wait_idle()


def test_window_responsive_during_parse(qtbot, window, monkeypatch):  # type: ignore[no-untyped-def]
    import kvscope.core.reader.parse as parse

    gate = threading.Event()
    real = parse.read_state  # what the document calls
    thread_names: list[str] = []

    def slow_read(*a, **k):  # type: ignore[no-untyped-def]
        thread_names.append(threading.current_thread().name)
        gate.wait(10)
        return real(*a, **k)

    monkeypatch.setattr(parse, "read_state", slow_read)
    w = window.open_file(str(STATE / "llama-f16-fa1-unified1-frag-ctx.session"))
    assert w.doc.result is None and w.doc.busy and window.progress.isVisible()
    ticks = []
    timer = QTimer()
    timer.timeout.connect(lambda: ticks.append(time.monotonic()))
    timer.start(10)
    with qtbot.waitSignal(timer.timeout, timeout=2000):
        pass  # the event loop runs while the parse is blocked in the pool
    qtbot.wait(100)
    assert len(ticks) >= 3 and w.doc.result is None
    assert thread_names and thread_names[0] != threading.main_thread().name
    with qtbot.waitSignal(w.doc.loaded, timeout=10000):
        gate.set()
    timer.stop()
    assert w.doc.result is not None
    window.wait_idle()


def test_cancel_drops_result(qtbot, window, monkeypatch):  # type: ignore[no-untyped-def]
    import kvscope.core.reader.parse as parse

    gate = threading.Event()
    real = parse.read_state
    monkeypatch.setattr(parse, "read_state", lambda *a, **k: (gate.wait(10), real(*a, **k))[1])
    w = window.open_file(str(STATE / "llama-f16-fa0-unified0-seq0.seqstate"))
    task = next(iter(window.runner.active))
    with qtbot.waitSignal(task.cancelled, timeout=10000):
        window.cancel_button.click()
        gate.set()
    assert w.doc.result is None


def test_heatmap_shape_per_layer(qtbot, open_doc):  # type: ignore[no-untyped-def]
    from kvscope.core.analysis.record_values import layer_matrix

    w = open_doc(STATE / "lfm2-f16-fa0-unified0-ctx.session", "lfm2")
    lv = w.layers
    seen = 0
    for ui in range(lv.unit_combo.count()):
        lv.unit_combo.setCurrentIndex(ui)
        for ri in range(lv.role_combo.count()):
            lv.role_combo.setCurrentIndex(ri)
            for k in range(lv.slider.maximum() + 1):
                lv.slider.setValue(k)
                rec = lv.record
                qtbot.waitUntil(lambda: not lv.heatmap.busy, timeout=5000)
                try:
                    expected = layer_matrix(w.doc.result, rec, max_rows=lv.max_rows, max_cols=lv.max_cols)
                except ValueError:
                    continue
                assert lv.heatmap.record is rec
                assert lv.matrix is not None and lv.matrix.shape == expected.shape
                assert np.array_equal(lv.matrix, expected, equal_nan=True)
                assert lv.heatmap.base.img.image.shape == expected.shape
                seen += 1
    assert seen >= 8
    # the stats plot has a point per record of the current unit
    assert lv.stats.series and sum(len(v) for v in lv.stats.series.values()) == sum(
        len(r) for r in lv.unit.records.values())
    # heads: the model gives the head size, one separator per head boundary
    lv.unit_combo.setCurrentIndex(0)
    lv.role_combo.setCurrentIndex(0)
    lv.heads_check.setChecked(True)
    qtbot.waitUntil(lambda: lv.matrix is not None and not lv.heatmap.busy, timeout=5000)
    dim = lv.heatmap.n_cols
    assert len(lv.heatmap.head_lines) == dim // w.doc.profile.head_dim_k - 1


def test_theme_switch(qtbot, open_doc, window):  # type: ignore[no-untyped-def]
    w = open_doc(STATE / "llama-f16-fa0-unified0-seq0.seqstate", "llama")
    window.set_theme("dark")
    assert window.theme.dark
    qtbot.waitUntil(lambda: window.palette().window().color().lightness() < 128, timeout=2000)
    assert window.settings.theme() == "dark"
    w.grab()
    window.set_theme("light")
    assert not window.theme.dark


def test_cli_screenshot(qtbot, tmp_path):  # type: ignore[no-untyped-def]
    from kvscope.app.shell.cli import cmd_gui, register

    ap = argparse.ArgumentParser()
    register(ap.add_subparsers())
    out = tmp_path / "shot.png"
    args = ap.parse_args(["gui", str(LAB / "drop_k_layer_1.seqdata.bin"), "--model", model("llama"),
                          "--screenshot", str(out), "--view", "findings", "--theme", "light"])
    assert cmd_gui(args) == 0
    assert out.stat().st_size > 10000
    bad = ap.parse_args(["gui", str(tmp_path / "missing.session"), "--screenshot", str(out)])
    assert cmd_gui(bad) == 2


def test_core_cli_finds_gui_command() -> None:
    from kvscope.app.shell.cli import cmd_gui, main, register
    from kvscope.core.cli.main import build_parser

    ap = build_parser({"gui": register})
    args = ap.parse_args(["gui", "a.session", "--model", "m.gguf", "--view", "cells"])
    assert args.func is cmd_gui and args.files == ["a.session"] and args.view == "cells"
    assert main(["/no/such/file.session"]) == 2
