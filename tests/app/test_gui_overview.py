"""The Overview every file opens on, damage that cannot be missed, and Reload when a file changes.

The tests marked ``xserver`` also run in a real X server (test_gui_xserver.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import QPoint

from kvscope.core.reader.layouts import GENERATIONS
from tests.support.gui_helpers import LAB, STATE, model

TRUNCATED = LAB / "truncated_half.seqdata.bin"  # 3,688 of the 7,376 bytes of seq0.clean.seqdata.bin
CLEAN = LAB / "seq0.clean.seqdata.bin"
SESSION = STATE / "llama-f16-fa0-unified0-ctx.session"


@pytest.mark.xserver
def test_a_truncated_file_opens_on_the_verdict_and_its_missing_bytes(qtbot, open_doc):  # type: ignore[no-untyped-def]
    w = open_doc(TRUNCATED, "llama")
    assert w.current_view() == "overview"
    ov = w.overview
    assert ov.verdict is not None and ov.verdict.level == "damaged"
    text = ov.browser.toPlainText()
    assert text.startswith("DAMAGED") and "the file ends early, at least 3,688 bytes missing" in text
    assert "Missing bytes: at least 3,688 bytes missing: the file should be at least 7,376 bytes" in text
    # the byte map draws the file on to the size it should have
    bm = w.bytemap
    assert bm.missing is not None and bm.missing.expected_end == CLEAN.stat().st_size
    assert bm.total == pytest.approx(2 * TRUNCATED.stat().st_size) and bm.to_scale
    strip = bm._overview_rect()
    past_end = QPoint(int(strip.left() + strip.width() * 0.8), int(strip.center().y()))
    tip = bm.tooltip_at(past_end)
    assert tip.startswith("missing past the end of the file") and "stream0/V" in tip
    inside = QPoint(int(strip.left() + strip.width() * 0.2), int(strip.center().y()))
    assert "missing" not in bm.tooltip_at(inside)
    w.grab()
    # the tree flags the cut record and lists what is missing
    tm = w.tree.model
    assert tm.rowCount() == 2 and tm.missing_node is not None
    missing = tm.index(1, 0)
    names = [tm.node(tm.index(r, 0, missing)).name for r in range(tm.rowCount(missing))]
    assert names == ["K layer 3 (rest) in kv stream 0", *(f"V layer {il} in kv stream 0" for il in range(4)), "stream1"]
    cut = w.doc.result.root.find("/memory/kv/stream0/K3")
    assert cut is not None and tm.flag(cut) == "error"
    tip = tm.data(tm.index_of(cut), 0x03)  # ToolTipRole
    assert "error truncated @2,844: file ends inside the K layer 3 payload" in tip
    assert tm.data(tm.index_of(cut), 0x01) is not None  # DecorationRole: an icon
    assert tm.flag(tm.node(missing)) == "missing"
    assert tm.flag(w.doc.result.root) == "below-error"
    # a click on the missing row selects the truncation, not bytes past the end
    w.tree.tree.setCurrentIndex(tm.index(2, 0, missing))
    sel = w.doc.bus.current
    assert sel is not None and sel.finding is not None and sel.finding.code == "truncated"


@pytest.mark.xserver
def test_the_damage_banner_is_on_every_view(qtbot, open_doc):  # type: ignore[no-untyped-def]
    from kvscope.app.shell.document_widget import TAB_VIEWS

    w = open_doc(TRUNCATED, "llama")
    for name in TAB_VIEWS:
        w.show_view(name)
        assert w.damage_banner.isVisible(), name
    assert w.damage_banner.label.text().startswith("damaged: the file ends early")
    w.damage_banner.show_button.click()
    assert w.current_view() == "hex"
    sel = w.doc.bus.current
    assert sel is not None and sel.finding is not None and sel.finding.code == "truncated"
    healthy = open_doc(SESSION, "llama")
    assert not healthy.damage_banner.isVisible() and healthy.overview.verdict.level == "healthy"


def test_overview_links_select_the_bytes(qtbot, open_doc):  # type: ignore[no-untyped-def]
    w = open_doc(LAB / "fa0-unified1" / "nan_rows_late_fail.seqdata.bin", "llama")
    ov = w.overview
    links = ov.finding_links()
    assert len(links) == 5 and f"(of {len(w.doc.result.findings)} findings)" in ov.browser.toPlainText()
    for link in links:
        w.show_view("overview")
        assert ov.follow(link)
        f = w.doc.result.findings[int(link.split(":")[1])]
        sel = w.doc.bus.current
        assert sel.finding is f and (sel.offset, sel.length) == (f.offset, f.length)
        assert w.current_view() == "hex" and w.hex.cursor_offset == min(f.offset, w.doc.result.size - 1)
    assert ov.follow("view:findings") and w.current_view() == "findings"
    assert not ov.follow("finding:999")


@pytest.mark.xserver
def test_overview_says_which_generations_load_it(qtbot, open_doc):  # type: ignore[no-untyped-def]
    w = open_doc(SESSION, "llama")
    qtbot.waitUntil(lambda: w.doc.compat is not None, timeout=15000)
    ov = w.overview
    text = ov.browser.toPlainText()
    # the pinned build that writes the session's layout loads it in libllama; llama-server restores slot files only
    assert "Loads as it is in: 0c1e5709 (libllama)" in text and w.doc.result.layout.name == "2026-10"
    for gen in GENERATIONS:
        assert f"{gen.name}" in text
    assert ov.overview is not None and len(ov.overview.compat_lines()) == len(GENERATIONS)
    flat = text.replace("\n", " ")
    for e in ov.overview.consumer_entries():  # each pinned build and consumer, then every other generation
        assert f"{e.consumer} " in flat and (f"{e.answer}: {e.message}" if e.message else e.answer) in flat
    for _, line in ov.overview.other_generations():
        assert line in flat
    for label in ("kind", "written by", "layout", "model", "sequences", "sections"):
        assert label in text
    assert "llama_state_save_file" in text and "confidence 1.00" in text
    assert "seq 1 (kv · stream 1): 12 cells, positions 0..11" in text
    assert "tiny-llama.gguf (llama, 4 layers, kv memory): fits" in text


def test_overview_shows_a_verify_result(qtbot, open_doc):  # type: ignore[no-untyped-def]
    """A result in ``kvscope verify --json``'s schema (tests/verify check the real engine's; test_gui_verify.py runs
    it from the app): the verdict first, engine, restore, records by status, each record that is not a match."""
    w = open_doc(CLEAN, "llama")
    assert "not verified" in w.overview.browser.toPlainText()
    rec = {"section": "kv", "section_index": 0, "stream": 0, "role": "k", "il": 0, "status": "match", "max_abs": 0.0,
           "file_index": 0}
    w.doc.set_verify({"verdict": "damaged", "engine": {"kind": "llama.cpp", "build": "b11434"},
                      "restore": {"ok": True, "message": "restored (7372 bytes read)"}, "compared": True,
                      "next_token": {"max_abs_logit_diff": 0.0, "same_argmax": True, "kl": 0.0},
                      "reasons": ["layer 1 K (kv stream 0): differs"],
                      "records": [rec, {**rec, "il": 1, "status": "differs", "max_abs": 0.25, "file_index": 1}]})
    text = w.overview.browser.toPlainText()
    assert "Verify: damaged in llama.cpp b11434 — layer 1 K (kv stream 0): differs" in text
    assert "DAMAGED in llama.cpp b11434" in text and "restored (7372 bytes read)" in text
    assert "match 1, ■ differs 1" in text and "differs: layer 1 K (kv · stream 0) — max |Δ| 0.25" in text
    assert "same argmax" in text and "not verified" not in text
    w.doc.set_verify(None)
    assert "not verified" in w.overview.browser.toPlainText()


@pytest.mark.xserver
def test_a_changed_file_offers_reload(qtbot, open_doc, tmp_path):  # type: ignore[no-untyped-def]
    path = tmp_path / "slot.seqdata.bin"
    shutil.copy(CLEAN, path)
    w = open_doc(path, "llama")
    assert w.overview.verdict.level == "healthy" and not w.changed_banner.isVisible()
    with open(path, "r+b") as f:  # llama-server rewrites slot files in place
        f.truncate(TRUNCATED.stat().st_size)
    with qtbot.waitSignal(w.doc.fileChanged, timeout=5000) as changed:
        pass  # the QFileSystemWatcher reports it
    assert "7,376 → 3,688 bytes" in changed.args[0]
    assert w.changed_banner.isVisible() and "The file changed" in w.changed_banner.label.text()
    assert "The file changed on disk" in w.overview.browser.toPlainText()
    assert w.doc.result.size == CLEAN.stat().st_size  # still the file as it was read
    w.hex.grab()  # painting the vanished bytes does not raise
    with qtbot.waitSignal(w.doc.loaded, timeout=10000):
        w.changed_banner.reload_button.click()
    qtbot.waitUntil(lambda: not w.doc.busy, timeout=10000)
    assert w.doc.result.size == TRUNCATED.stat().st_size and w.doc.changed is None
    assert not w.changed_banner.isVisible() and w.overview.verdict.level == "damaged"


def test_a_read_cut_short_offers_reload(qtbot, open_doc, tmp_path):  # type: ignore[no-untyped-def]
    path = tmp_path / "slot.seqdata.bin"
    shutil.copy(CLEAN, path)
    w = open_doc(path, "llama")
    os.truncate(path, 100)
    data = w.doc.data[200:300]  # what the hex view reads while painting
    assert data.size == 100 and not data.any()  # zeros for the vanished bytes, no exception
    qtbot.waitUntil(lambda: w.doc.changed is not None, timeout=5000)
    assert w.changed_banner.isVisible()


def test_open_dialog_lists_every_llama_cpp_extension() -> None:
    from kvscope.app.shell.open_dialog import ALL_FILTER, BY_EXTENSION_FILTER, STATE_FILTERS

    for ext in (".seqstate", ".slotsave", ".bin", ".session", ".state", ".seqdata"):
        assert f"*{ext}" in BY_EXTENSION_FILTER.split("(")[1]
    assert STATE_FILTERS[-1] == ALL_FILTER == "All files (*)"


@pytest.mark.slow  # the app in a subprocess
def test_screenshot_prints_no_qt_noise(tmp_path: Path) -> None:
    out = tmp_path / "shot.png"
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    p = subprocess.run([sys.executable, "-m", "kvscope.app.shell.cli", str(TRUNCATED), "--model", model("llama"),
                        "--screenshot", str(out), "--size", "1280x800"], capture_output=True, text=True,
                       timeout=120, env=env, check=False)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == str(out) and p.stderr == ""
    assert out.stat().st_size > 10000
