"""The Overview of a slot file says what each pinned llama-server will reuse of it (#18 item 2): the
gemma2 (iSWA) slot restores in b11434 but is re-processed in full there unless --swa-full, and
0c1e5709 refuses it; the section follows the compatibility once it is known."""

from __future__ import annotations

import shutil
from pathlib import Path

from kvharness.fixtures import DATA
from kvscope.app.base.theme import Theme
from kvscope.app.shell.main_window import MainWindow
from kvscope.app.shell.settings import AppSettings


def test_the_overview_says_which_server_reuses_the_slot(qtbot, tmp_path: Path, isolated_settings):  # type: ignore[no-untyped-def]
    path = tmp_path / "gemma2-slot.seqstate"
    shutil.copyfile(DATA / "gen-b11434" / "gemma2-f16-fa0-unified0-slot.seqstate", path)
    win = MainWindow(AppSettings(isolated_settings), Theme("light"))
    qtbot.addWidget(win)
    w = win.open_file(str(path))
    qtbot.waitUntil(lambda: w.doc.result is not None, timeout=15000)
    win.set_model(w, str(DATA / "gen-models" / "gemma2.gguf"))
    qtbot.waitUntil(lambda: w.doc.profile is not None and not w.doc.busy, timeout=15000)
    assert win.wait_idle(30000)
    qtbot.waitUntil(lambda: w.doc.compat is not None, timeout=15000)
    w.overview.refresh()
    text = w.overview.browser.toPlainText()
    section = text.split("Will llama-server reuse it")[1].split("Verification")[0]
    assert "llama-server b11434: restores, but re-processes all 9 tokens: forcing full prompt re-processing" in section
    assert "(fix: start llama-server with --swa-full" in section
    assert "llama-server b11434 --swa-full: reuses 9 of 9 tokens" in section
    assert "llama-server 0c1e5709: refuses the slot: Unable to restore slot" in section
    assert "Per consumer" not in text  # the consumers are answered in the build section, once
    lines = [ln.strip() for ln in text.split("Which llama.cpp builds load it")[1].split("Will llama-server reuse it")[0]
             .splitlines() if ln.strip()]
    b = lines.index("b11434")
    assert lines[b + 2:b + 8] == ["libllama", "✔ loads", "predicted", "llama-server", "✔ loads", "predicted"]
    a = lines.index("0c1e5709")
    assert lines[a + 5].startswith("llama-server") and lines[a + 6].startswith(
        "✘ refuses: Unable to restore slot: No available space")
    win.runner.shutdown()
