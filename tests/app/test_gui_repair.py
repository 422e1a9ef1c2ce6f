"""Repair… and Verify from the app with the real engine (the pinned builds): a damaged sequence file rebuilt
by the real ``kvscope repair`` into a new file that opens healthy and verifies ok, whose Verify then
replaces the prediction it measured in the Overview's build section (the other answers stay predicted);
llama-server's measured refusal of a token outside the vocabulary; Cancel stops the run with nothing
written or left behind; the input unchanged throughout. Needs the engine extra (tests/app/conftest.py).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import pytest

from kvharness.fixtures import DATA
from kvharness.states import drop_records, kv_records
from kvscope.app.document.verify_job import EngineChoice
from kvscope.app.shell.repair_dialog import repair_document
from tests.support.gui_helpers import open_loaded
from tests.support.llama_builds import need_build
from tests.support.slot_damage import oov_slot

pytestmark = pytest.mark.slow  # real llama.cpp

SEQ = DATA / "gen-0c1e5709" / "llama-f16-fa0-unified0-seq0.seqstate"
LLAMA = DATA / "gen-models" / "llama.gguf"
TIMEOUT = 300000


@pytest.fixture(scope="module")
def pinned() -> None:
    need_build("0c1e5709")
    need_build("b11434")


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _open(window, qtbot, path: Path | str):  # type: ignore[no-untyped-def]
    return open_loaded(window, qtbot, path, LLAMA)


def _damaged(tmp_path: Path) -> Path:
    k, _v = kv_records(SEQ, "gen/llama")
    return drop_records(SEQ, tmp_path / "dropped.seqstate", [k[1]])


def _rows(w) -> list[str]:  # type: ignore[no-untyped-def]
    text = w.overview.browser.toPlainText()
    section = text.split("Which llama.cpp builds load it")[1].split("Verification")[0]
    return [line.strip() for line in section.splitlines() if line.strip()]


def _running(paths: list[str]) -> list[int]:
    """Processes whose command line names one of ``paths``."""
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    cmd = fh.read().decode("utf-8", "replace")
            except OSError:
                continue
            if any(p in cmd for p in paths):
                out.append(int(pid))
    return out


def _ours() -> set[str]:
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("kvscope-repair-app-")}


def test_repair_writes_a_file_that_verifies_ok_and_its_verify_replaces_the_prediction(
        qtbot, window, tmp_path: Path, pinned: None) -> None:  # type: ignore[no-untyped-def]
    bad = _damaged(tmp_path)
    before, temps = _sha(bad), _ours()
    w = _open(window, qtbot, bad)
    assert w.overview.verdict.level == "damaged" and 'href="repair:"' in w.overview.html()
    out = tmp_path / "fixed.seqstate"
    repair_document(window, w, out=str(out))
    run, banner = w.overview.repair, w.overview.repair_banner
    assert run.running and banner.cancel_button.isVisible() and not window.actions_["repair"].isEnabled()
    assert banner.label.text().startswith("Repairing into fixed.seqstate…")
    qtbot.waitUntil(lambda: not run.running, timeout=TIMEOUT)
    assert run.error is None, run.error
    assert run.result is not None and run.result["build"] == "0c1e5709"
    assert run.result["writer"] == "llama_state_seq_save_file" and run.result["verify"]["verdict"] == "ok"
    text = banner.label.text()
    assert text.startswith(f"Repaired: fixed.seqstate written ({out.stat().st_size:,} bytes): rebuilt in llama.cpp "
                           "0c1e5709 by llama_state_seq_save_file") and "verified ok" in text, text
    assert _sha(bad) == before  # the input is never modified
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".kvscope-tmp-")]
    assert _ours() == temps  # the child's private temporary folder is gone
    # Open: the repaired file in a new tab, with the same model; healthy
    banner.open_button.click()
    qtbot.waitUntil(lambda: window.current() is not w and window.current().doc.result is not None, timeout=30000)
    w2 = window.current()
    assert w2.doc.path == str(out) and w2.doc.model_path == str(LLAMA)
    qtbot.waitUntil(lambda: w2.doc.compat is not None and not w2.doc.busy, timeout=30000)
    assert w2.overview.verdict.level == "healthy" and 'href="repair:"' not in w2.overview.html()
    rows = _rows(w2)
    assert rows.count("predicted") == 4 and "measured by Verify" not in rows
    # Verify (llama.cpp, the build that writes its layout): ok, and it replaces what it measured
    window.verify(w2)
    qtbot.waitUntil(lambda: w2.doc.verifying, timeout=5000)
    qtbot.waitUntil(lambda: not w2.doc.verifying, timeout=TIMEOUT)
    assert w2.doc.verify_error is None and w2.doc.verify is not None and w2.doc.verify["verdict"] == "ok"
    entries = {(e.build, e.consumer): e for e in w2.overview.overview.consumer_entries()}
    measured = [k for k, e in entries.items() if e.measured and not e.via]
    assert measured == [("0c1e5709", "libllama")] and entries[measured[0]].answer == "loads"
    # llama-server restores through the same call, its own checks passed: its answer follows the measured one
    srv = entries[("0c1e5709", "llama-server")]
    assert (srv.answer, srv.via, srv.predicted) == ("loads", "libllama", "")
    rows = _rows(w2)
    i = rows.index("0c1e5709")
    assert rows[i + 2:i + 5] == ["libllama", "✔ loads", "measured by Verify"]
    assert rows.count("predicted") == 2
    assert _sha(bad) == before


def test_a_server_verify_measures_the_refusal_it_predicted(qtbot, window, tmp_path: Path, pinned: None) -> None:  # type: ignore[no-untyped-def]
    w = _open(window, qtbot, oov_slot(tmp_path / "oov.bin"))
    window.settings.set_engine(EngineChoice("server"))  # Tools → Engine Settings: llama-server, started by kvscope
    window.verify(w)
    qtbot.waitUntil(lambda: w.doc.verifying, timeout=5000)
    qtbot.waitUntil(lambda: not w.doc.verifying, timeout=TIMEOUT)
    assert w.doc.verify_error is None, w.doc.verify_error
    eng = w.doc.verify["engine"]
    assert (eng["kind"], eng["build"]) == ("server", "b11434")
    entries = {(e.build, e.consumer): e for e in w.overview.overview.consumer_entries()}
    srv = entries[("b11434", "llama-server")]
    assert srv.measured and srv.answer == "refuses" and "Invalid tokens in slot save file" in srv.message
    assert not entries[("b11434", "libllama")].measured and entries[("b11434", "libllama")].answer == "loads"
    rows = _rows(w)
    i = rows.index("b11434")
    assert rows[i + 5] == "llama-server" and rows[i + 7] == "measured by Verify"
    assert "Invalid tokens in slot save file" in rows[i + 6]


def test_cancel_stops_the_repair_with_nothing_written(qtbot, window, tmp_path: Path, pinned: None) -> None:  # type: ignore[no-untyped-def]
    bad = _damaged(tmp_path)
    before, temps = _sha(bad), _ours()
    w = _open(window, qtbot, bad)
    out = tmp_path / "never.seqstate"
    repair_document(window, w, out=str(out))
    run, banner = w.overview.repair, w.overview.repair_banner
    # cancel as soon as the command's process is there: on a quiet machine the whole repair of this small
    # file takes under a second (waiting for the step line to count one second let it finish first, every
    # run); the check sees the process or, if the repair was quicker still, the run already over
    qtbot.waitUntil(lambda: _running([str(out)]) != [] or not run.running, timeout=30000)
    pressed_while_running = run.running
    banner.cancel_button.click()
    qtbot.waitUntil(lambda: not run.running, timeout=60000)
    assert run.error is None and _sha(bad) == before
    if not pressed_while_running:  # over before Cancel could be pressed: a plain repair
        assert run.result is not None and not run.cancelled and out.exists()
    elif run.result is not None:  # the command had written and verified the file before the SIGINT reached it
        assert not run.cancelled and run.result["finished_before_cancel"] and out.exists()
        assert banner.label.text().startswith("Cancel came after the repair had finished. Repaired: never.seqstate")
    else:  # the usual case: the command unwound
        assert run.cancelled
        assert banner.label.text() == "Repair cancelled: never.seqstate was not written."
        assert not out.exists()
    qtbot.waitUntil(lambda: _running([str(out)]) == [], timeout=20000)
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".kvscope-tmp-")]
    assert _ours() == temps


def test_a_measurement_that_contradicts_the_prediction_leaves_no_stale_server_line(
        qtbot, window, tmp_path: Path, pinned: None) -> None:  # type: ignore[no-untyped-def]
    """A sequence file cut inside K layer 1's payload: what libllama reads past the end is what the stack held,
    so the prediction is unknown for libllama (and for llama-server, which loads it through the same call).
    A Verify measures libllama's answer; the server's line, which followed the prediction the measurement
    replaced, says so instead of repeating it."""
    data = (DATA / "gen-b11434" / "llama-f16-fa0-unified0-seq0.seqstate").read_bytes()
    path = tmp_path / "cut.seqstate"
    path.write_bytes(data[:len(data) // 2])
    w = _open(window, qtbot, path)
    qtbot.waitUntil(lambda: w.doc.stats is not None, timeout=30000)
    before = {(e.build, e.consumer): e.answer for e in w.overview.overview.consumer_entries()}
    assert before[("b11434", "libllama")] == "unknown" and before[("b11434", "llama-server")] == "unknown"
    window.verify(w)
    qtbot.waitUntil(lambda: w.doc.verifying, timeout=5000)
    qtbot.waitUntil(lambda: not w.doc.verifying, timeout=TIMEOUT)
    assert w.doc.verify_error is None
    entries = {(e.build, e.consumer): e for e in w.overview.overview.consumer_entries()}
    lib, srv = entries[("b11434", "libllama")], entries[("b11434", "llama-server")]
    assert lib.measured and lib.answer in ("refuses", "crashes"), lib
    # llama-server restores through the same call: its answer is the measured one, the prediction secondary
    assert srv.measured and srv.via == "libllama" and srv.answer == lib.answer and srv.predicted == "unknown"
    assert "predicted from libllama's answer" not in w.overview.browser.toPlainText()
