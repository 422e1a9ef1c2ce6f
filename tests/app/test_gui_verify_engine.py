"""Tools → Verify on real files with real llama.cpp (the pinned builds): the verdict in the Overview, every
record's status on the Layers view, a record that is not a match named and reachable, Cancel, and an engine
that cannot start named with how to fix it. Needs the engine extra (tests/app/conftest.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from kvscope.app.document.verify_job import EngineChoice
from kvscope.core.lab.corruptions import parse_spec
from kvscope.core.model.profile import load_model_profile
from tests.support.gui_helpers import DATA, open_loaded
from tests.support.llama_builds import need_build

pytestmark = pytest.mark.slow  # real llama.cpp

GEN = DATA / "gen-b11434"
LLAMA = DATA / "gen-models" / "llama.gguf"
SEQ = GEN / "llama-f16-fa0-unified0-seq0.seqstate"
TIMEOUT = 120000


@pytest.fixture(scope="module")
def b11434() -> None:
    need_build("b11434")


def _open(window, qtbot, path: Path):  # type: ignore[no-untyped-def]
    return open_loaded(window, qtbot, path, LLAMA)


def _verify(window, qtbot, w):  # type: ignore[no-untyped-def]
    window.actions_["verify"].trigger()
    qtbot.waitUntil(lambda: w.doc.verifying, timeout=5000)
    assert not window.actions_["verify"].isEnabled() and window.actions_["cancel_verify"].isEnabled()
    qtbot.waitUntil(lambda: not w.doc.verifying, timeout=TIMEOUT)
    assert w.doc.verify_error is None, w.doc.verify_error
    assert w.doc.verify is not None
    return w.doc.verify


def _damaged(tmp_path: Path) -> Path:
    """The fixture with NaN in two cells of V layer 1 and zeros in two of K layer 0 (through its structure)."""
    prof = load_model_profile(LLAMA)
    data = SEQ.read_bytes()
    for spec in ("fill:value=nan,role=v,il=1,cells=1-2", "fill:value=0,role=k,il=0,cells=2-3"):
        data = parse_spec(spec).apply(data, prof).data
    out = tmp_path / "llama-damaged.seqstate"
    out.write_bytes(data)
    return out


@pytest.mark.xserver
def test_verify_shows_ok_in_the_overview_and_match_on_every_record(qtbot, window, b11434) -> None:  # type: ignore[no-untyped-def]
    w = _open(window, qtbot, SEQ)
    assert window.settings.engine() == EngineChoice()  # llama.cpp, the build that writes the file's layout
    assert "not verified" in w.overview.browser.toPlainText()
    result = _verify(window, qtbot, w)
    assert result["verdict"] == "ok" and result["engine"]["kind"] == "llama.cpp"
    assert result["engine"]["build"] == "b11434"  # writes 2026-10-v4, the file's layout
    text = w.overview.browser.toPlainText()
    assert "Verify: ok in llama.cpp b11434 — all 4 records match" in text
    assert "OK in llama.cpp b11434" in text and "match 4" in text and "same argmax" in text
    assert "not verified" not in text
    assert w.current_view() == "overview"
    w.show_view("layers")
    lv = w.layers
    qtbot.waitUntil(lambda: lv.built and lv.heatmap.base.matrix is not None, timeout=15000)
    marks = lv.stats.marks
    assert len(marks) == 4 and {m.status for m in marks} == {"match"}
    assert {(m.role, m.x) for m in marks} == {("k", 0.0), ("k", 1.0), ("v", 0.0), ("v", 1.0)}
    assert all(m.record is not None for m in marks)
    assert lv.stats.verify_shown and lv.stats.verify_points is not None
    assert len(lv.stats.verify_points.points()) == 4
    assert [label.text for _, label in lv.stats.verify_legend.items] == ["match 4"]
    assert "verify: match (max |Δ| 0; bitwise equal)" in lv.title.text()
    assert "verify (llama.cpp b11434): 4 match" in lv.stats.status.text()


def test_a_damaged_file_names_its_records_on_both_views(qtbot, window, b11434, tmp_path) -> None:  # type: ignore[no-untyped-def]
    w = _open(window, qtbot, _damaged(tmp_path))
    result = _verify(window, qtbot, w)
    assert result["verdict"] == "damaged"
    by = {(r["role"], r["il"]): r["status"] for r in result["records"]}
    assert by == {("k", 0): "differs", ("k", 1): "match", ("v", 0): "match", ("v", 1): "nonfinite"}
    text = w.overview.browser.toPlainText()
    assert "DAMAGED in llama.cpp b11434" in text
    assert "differs: layer 0 K (kv · stream 0)" in text and "nonfinite: layer 1 V (kv · stream 0)" in text
    assert "a DIFFERENT argmax" in text
    i = next(k for k, r in enumerate(result["records"]) if r["status"] == "nonfinite")
    assert w.overview.follow(f"vrec:{i}")  # the record's link: the Layers view on that record
    assert w.current_view() == "layers"
    lv = w.layers
    qtbot.waitUntil(lambda: lv.built and lv.record is not None and lv.record.role == "v" and lv.record.il == 1,
                    timeout=15000)
    qtbot.waitUntil(lambda: "verify: nonfinite" in lv.title.text(), timeout=15000)
    assert sorted(m.status for m in lv.stats.marks) == ["differs", "match", "match", "nonfinite"]
    assert [label.text for _, label in lv.stats.verify_legend.items] == ["match 2", "differs 1", "nonfinite 1"]
    k0 = next(m for m in lv.stats.marks if (m.role, m.x) == ("k", 0.0))
    assert lv.select_record(k0.record)
    assert "verify: differs (max |Δ|" in lv.title.text() and "first bad cell index 2, pos 2" in lv.title.text()


def test_cancel_stops_the_engine_and_drops_the_result(qtbot, window, b11434) -> None:  # type: ignore[no-untyped-def]
    w = _open(window, qtbot, SEQ)
    steps: list[str] = []

    def on_step(_fraction: object, text: str) -> None:
        steps.append(text)
        if text.startswith("restoring"):
            window.actions_["cancel_verify"].trigger()

    w.doc.verifyProgress.connect(on_step)
    t0 = time.monotonic()
    window.actions_["verify"].trigger()
    qtbot.waitUntil(lambda: bool(steps) and not w.doc.verifying, timeout=TIMEOUT)
    assert any(s.startswith("restoring") for s in steps), steps
    assert not any(s.startswith("comparing") for s in steps), steps  # stopped before the comparison
    assert w.doc.verify is None and w.doc.verify_error is None and w.doc.verify_step is None
    assert time.monotonic() - t0 < 60
    text = w.overview.browser.toPlainText()
    assert "not verified" in text and "Verifying" not in text
    assert window.actions_["verify"].isEnabled() and not window.actions_["cancel_verify"].isEnabled()
    assert "cancelled" in window.statusBar().currentMessage()
    w.doc.verifyProgress.disconnect(on_step)
    result = _verify(window, qtbot, w)  # the engine is started afresh for the next verification
    assert result["verdict"] == "ok"


def test_an_engine_that_cannot_start_says_why_in_a_banner(qtbot, window, b11434, tmp_path) -> None:  # type: ignore[no-untyped-def]
    empty = tmp_path / "no-lib"
    empty.mkdir()
    window.settings.set_engine(EngineChoice(lib_path=str(empty)))
    w = _open(window, qtbot, SEQ)
    window.verify()
    qtbot.waitUntil(lambda: w.doc.verify_error is not None, timeout=TIMEOUT)
    assert f"no libllama.so in {os.path.realpath(empty)}" in w.doc.verify_error
    banner = w.verify_banner
    assert banner.isVisible() and "Verify could not run (llama.cpp from" in banner.text
    assert banner.settings_button.isVisible() and not banner.model_button.isVisible()
    assert "Verify could not run" in w.overview.browser.toPlainText()
    window.settings.set_engine(EngineChoice(engine="server", server_bin=str(tmp_path / "no-such-llama-server")))
    window.verify()
    qtbot.waitUntil(lambda: w.doc.verify_error is not None and "no-such-llama-server" in w.doc.verify_error,
                    timeout=TIMEOUT)
    assert banner.isVisible() and "llama-server" in banner.text
    window.settings.set_engine(EngineChoice())
    assert _verify(window, qtbot, w)["verdict"] == "ok"
    assert not banner.isVisible()


def test_the_servers_refusal_of_a_bad_token_is_a_verdict(qtbot, window, b11434, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """llama-server answers HTTP 400 to a slot whose tokens are outside the model's vocabulary ("Prompt
    contains invalid tokens" to the re-prefill, "Invalid tokens in slot save file" to the restore): the
    server refuses the file, which is a verdict, not "Verify could not run"."""
    import struct

    data = bytearray(SEQ.read_bytes())
    struct.pack_into("<i", data, 12 + 4 * 3, 379_000)  # token 3 of the header's array: past the vocabulary
    bad = tmp_path / "slot-bad-token.seqstate"
    bad.write_bytes(bytes(data))
    window.settings.set_engine(EngineChoice(engine="server"))
    w = _open(window, qtbot, bad)
    result = _verify(window, qtbot, w)  # no verify_error: it ran
    assert result["verdict"] == "damaged" and not result["restore"]["ok"]
    assert "Invalid tokens in slot save file" in result["restore"]["message"]
    assert not w.verify_banner.isVisible()
    page = w.overview.browser.toPlainText()
    assert "Verify could not run" not in page and "Invalid tokens in slot save file" in page


def test_an_exported_report_carries_the_verification_without_paths(qtbot, window, b11434, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    w = _open(window, qtbot, _damaged(tmp_path))
    result = _verify(window, qtbot, w)
    assert result["engine"]["lib_dir"] and str(tmp_path) in result["file"]
    dest = tmp_path / "report"
    with qtbot.waitSignal(window.exporter.finished, timeout=60000):
        window.export_report(str(dest))
    doc = json.loads((dest / "report.json").read_text())
    v = doc["overview"]["verify"]
    assert v["verdict"] == "damaged" and v["engine"]["build"] == "b11434"
    assert [r["status"] for r in v["records"]] == [r["status"] for r in result["records"]]
    text = (dest / "report.md").read_text()
    assert "damaged (engine llama.cpp b11434)" in text and "records: 2 match, 1 differs, 1 nonfinite" in text
    assert "record: layer 1 V (kv stream 0): nonfinite" in text
    for out in (dest / "report.json", dest / "report.md", dest / "report.html"):
        body = out.read_text()
        assert str(tmp_path) not in body and str(result["engine"]["lib_dir"]) not in body, out
