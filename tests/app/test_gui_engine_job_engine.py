"""Verify and Repair through the one job model with the real engine (the pinned builds; issue #30 item 6):
a real Verify's and a real Repair's progress ticks update the Overview's progress strip only, the page is
rendered when the run starts and when its result arrives (before: once per Verify tick), and a real Verify
cancelled from the strip stops the engine with the UI back to idle. Needs the engine extra
(tests/app/conftest.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kvharness.fixtures import DATA
from kvharness.states import drop_records, kv_records
from kvscope.app.shell.repair_dialog import repair_document
from tests.support.gui_helpers import count_page_renders, open_loaded
from tests.support.llama_builds import need_build

pytestmark = pytest.mark.slow  # real llama.cpp

LLAMA = DATA / "gen-models" / "llama.gguf"
SEQ = DATA / "gen-b11434" / "llama-f16-fa0-unified0-seq0.seqstate"
OLD_SEQ = DATA / "gen-0c1e5709" / "llama-f16-fa0-unified0-seq0.seqstate"
TIMEOUT = 300000


@pytest.fixture(scope="module")
def pinned() -> None:
    need_build("0c1e5709")
    need_build("b11434")


def test_a_real_verify_renders_the_page_at_start_and_end_not_per_tick(qtbot, window, pinned: None) -> None:  # type: ignore[no-untyped-def]
    w = open_loaded(window, qtbot, SEQ, LLAMA)
    sets = count_page_renders(w)
    ticks: list[str] = []
    strip: list[str] = []

    def on_tick(_fraction: object, text: str) -> None:  # after the strip's own slot: it shows this tick
        ticks.append(text)
        strip.append(w.overview.verify_strip.label.text())

    w.doc.verify_run.progressed.connect(on_tick)
    window.actions_["verify"].trigger()
    qtbot.waitUntil(lambda: w.doc.verifying, timeout=5000)
    qtbot.waitUntil(lambda: not w.doc.verifying, timeout=TIMEOUT)
    assert w.doc.verify_error is None and w.doc.verify is not None and w.doc.verify["verdict"] == "ok"
    print(f"verify: {len(ticks)} progress ticks, {len(sets)} page renders")
    assert len(ticks) >= 4, ticks  # the verifier's stages: starting, restoring, prefilling, comparing ...
    assert len(sets) <= 2, (len(sets), len(ticks))  # the start and the result (before: one per tick more)
    assert all(s.startswith("Verifying in llama.cpp") for s in strip) and any("%" in s for s in strip), strip
    assert not w.overview.verify_strip.isVisible()
    assert "Verify: ok in llama.cpp b11434" in w.overview.browser.toPlainText()


def test_a_real_verify_cancelled_from_the_strip_stops_and_the_ui_is_idle(qtbot, window, pinned: None) -> None:  # type: ignore[no-untyped-def]
    w = open_loaded(window, qtbot, SEQ, LLAMA)
    steps: list[str] = []

    def on_step(_fraction: object, text: str) -> None:
        steps.append(text)
        if text.startswith("restoring") and w.overview.verify_strip.cancel_button.isVisible():
            w.overview.verify_strip.cancel_button.click()

    w.doc.verify_run.progressed.connect(on_step)
    t0 = time.monotonic()
    window.actions_["verify"].trigger()
    qtbot.waitUntil(lambda: bool(steps) and not w.doc.verifying, timeout=TIMEOUT)
    w.doc.verify_run.progressed.disconnect(on_step)
    assert any(s.startswith("restoring") for s in steps) and not any(s.startswith("comparing") for s in steps), steps
    assert w.doc.verify_run.cancelled and w.doc.verify is None and w.doc.verify_error is None
    assert time.monotonic() - t0 < 60
    assert not w.overview.verify_strip.isVisible() and w.overview.verify_button.text() == "Verify"
    assert window.actions_["verify"].isEnabled() and not window.actions_["cancel_verify"].isEnabled()


def test_a_real_repair_renders_the_page_at_start_and_end_not_per_tick(qtbot, window, tmp_path: Path,
                                                                       pinned: None) -> None:  # type: ignore[no-untyped-def]
    k, _v = kv_records(OLD_SEQ, "gen/llama")
    bad = drop_records(OLD_SEQ, tmp_path / "dropped.seqstate", [k[1]])
    w = open_loaded(window, qtbot, bad, LLAMA)
    sets = count_page_renders(w)
    run = w.doc.repair_run
    ticks: list[str] = []
    run.progressed.connect(lambda _f, text: ticks.append(text))
    repair_document(window, w, out=str(tmp_path / "fixed.seqstate"))
    assert run.running and w.overview.repair is run
    qtbot.waitUntil(lambda: not run.running, timeout=TIMEOUT)
    assert run.error is None and run.result is not None and run.result["verify"]["verdict"] == "ok"
    print(f"repair: {len(ticks)} progress ticks, {len(sets)} page renders")
    assert len(ticks) >= 1 and len(sets) <= 2, (len(sets), len(ticks))
    assert w.overview.repair_banner.label.text().startswith("Repaired: fixed.seqstate written")
