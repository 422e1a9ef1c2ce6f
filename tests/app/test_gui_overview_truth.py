"""The Overview says only what is true (issue 19, items 1-7 and 11): a model that does not fit is a model
mismatch, never damage, and is neither proposed nor remembered; a non-state file's compatibility and
model rows; a bad token is damage while the model fits; a per-sequence recurrent file's sequence; a
dropped record's placeholder and the layer Verify names; a cancelled Verify's stale result; the cache
types and rotation; the magic in the tree.

The tests marked ``xserver`` also run in a real X server (test_gui_xserver.py).
"""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings

from kvscope.app.base.theme import Theme
from kvscope.app.shell.main_window import MainWindow
from kvscope.app.shell.settings import AppSettings
from tests.support.bigstate import write_seq_state
from tests.support.gui_helpers import DATA, STATE, model

DROPPED = Path(__file__).parents[2] / "resources" / "examples" / "llama-dropped-layer.seqdata.bin"
SEQ = STATE / "llama-f16-fa0-unified0-seq0.seqstate"


def _row(w, label: str) -> str:  # type: ignore[no-untyped-def]
    """The value of row ``label`` of the Overview's "What it is" table (the plain text has it on the next line)."""
    lines = w.overview.browser.toPlainText().splitlines()
    start = lines.index("What it is")
    return lines[lines.index(label, start) + 1]


def _other_models_file(folder: Path) -> Path:
    """The issue's file: cells and token ids 0..N-1 of another model (2 layers of 64), beside tiny GGUFs."""
    folder.mkdir(exist_ok=True)
    path = folder / "llama-other.seqstate"
    write_seq_state(path, 4096, 2, 64)
    for key in ("llama", "lfm2", "mamba"):
        shutil.copy(model(key), folder / f"tiny-{key}.gguf")
    return path


@pytest.mark.xserver
def test_a_model_that_does_not_fit_is_a_mismatch_and_not_proposed(qtbot, tmp_path, isolated_settings):  # type: ignore[no-untyped-def]
    path = _other_models_file(tmp_path / "states")
    win = MainWindow(AppSettings(isolated_settings), Theme("light"))
    qtbot.addWidget(win)
    w = win.open_file(str(path))
    assert w is not None
    qtbot.waitUntil(lambda: w.doc.result is not None, timeout=15000)
    assert win.wait_idle(30000)
    banner = w.banner
    # three GGUF beside the file, none of which it fits: none is proposed, the tooltip says why
    assert banner.suggestions.count() == 0 and banner.use_button.isHidden()
    assert "None of the 3 GGUFs beside the file fits it" in banner.label.text()
    assert len(banner.label.toolTip().splitlines()) == 3 and "larger vocabulary" in banner.label.toolTip()
    # given the tiny llama all the same: a model mismatch, not damage
    win.set_model(w, model("llama"))
    qtbot.waitUntil(lambda: w.doc.profile is not None and not w.doc.busy, timeout=15000)
    assert win.wait_idle(30000)
    v = w.doc.verdict()
    assert v is not None and (v.level, v.state) == ("suspicious", "model_mismatch")
    text = w.overview.browser.toPlainText()
    assert text.startswith("MODEL MISMATCH") and "DAMAGED" not in text
    assert "damaged" not in text.split("Which llama.cpp builds load it")[1].split("Verification")[0]
    assert "Not with the model given:" in text
    assert w.damage_banner.label.text().startswith("model mismatch: ")
    assert w.damage_banner.show_button.text() == "Show the mismatch"
    assert "does not fit this file" in banner.label.text()
    # ... and not remembered for the next launch
    assert win.settings.model_for(str(path)) is None
    win.save_settings()
    win.runner.shutdown()
    again = AppSettings(QSettings(isolated_settings.fileName(), QSettings.Format.IniFormat))
    assert again.model_for(str(path)) is None


def test_only_the_model_that_fits_is_proposed_and_remembered(qtbot, tmp_path, isolated_settings):  # type: ignore[no-untyped-def]
    folder = tmp_path / "states"
    folder.mkdir()
    state = folder / "lfm2-f16-fa0-unified0-ctx.session"
    shutil.copy(STATE / state.name, state)
    for key in ("lfm2", "llama"):
        shutil.copy(model(key), folder / f"tiny-{key}.gguf")
    win = MainWindow(AppSettings(isolated_settings), Theme("light"))
    qtbot.addWidget(win)
    w = win.open_file(str(state))
    qtbot.waitUntil(lambda: w.doc.result is not None, timeout=15000)
    assert win.wait_idle(30000)
    b = w.banner
    assert b.suggestions.count() == 1 and b.suggestions.itemData(0) == str(folder / "tiny-lfm2.gguf")
    assert "1 GGUF beside the file fits it (1 other does not)" in b.label.text()
    assert b.label.toolTip().startswith("tiny-llama.gguf: the file does not fit the model")
    b.use_button.click()
    qtbot.waitUntil(lambda: w.doc.profile is not None and not w.doc.busy, timeout=15000)
    assert w.doc.verdict().state == "healthy"
    assert win.settings.model_for(str(state)) == str(folder / "tiny-lfm2.gguf")
    win.wait_idle()
    win.runner.shutdown()


@pytest.mark.xserver
@pytest.mark.parametrize("content", [b"", bytes(range(256)) * 9])
def test_a_non_state_file_has_no_pending_rows(qtbot, open_doc, tmp_path, content):  # type: ignore[no-untyped-def]
    path = tmp_path / "random.bin"
    path.write_bytes(content)
    w = open_doc(path, "llama")
    text = w.overview.browser.toPlainText()
    assert text.startswith("NOT A STATE FILE")
    assert "working it out" not in text and "none: not a state file of a known layout" in text
    assert "fits (layer count" not in text and "not checked: the file is not a llama.cpp state file" in text


def test_a_bad_token_is_damage_and_the_model_still_fits(qtbot, open_doc, tmp_path):  # type: ignore[no-untyped-def]
    data = bytearray(SEQ.read_bytes())
    struct.pack_into("<i", data, 16, 5000)  # token 1 outside the vocabulary of 379
    path = tmp_path / "badtoken.seqstate"
    path.write_bytes(bytes(data))
    w = open_doc(path, "llama")
    assert w.doc.verdict().state == "damaged"
    model_row = _row(w, "model")
    assert "does not fit" not in model_row and "fits (layer count, row sizes and types agree)" in model_row
    assert "outside its vocabulary are damage" in model_row


def test_a_per_sequence_recurrent_file_lists_its_sequence(qtbot, open_doc):  # type: ignore[no-untyped-def]
    w = open_doc(STATE / "mamba-f32state-n3-seq1.seqstate", "mamba")
    row = _row(w, "sequences")
    assert "no cells" not in row and "(recurrent): 1 cell, position 11" in row, row
    blob = open_doc(STATE / "mamba-f32state-n3-seq1.seqdata.bin", "mamba")
    assert "seq 1 (recurrent): 1 cell, position 11" in blob.overview.browser.toPlainText()


@pytest.mark.xserver
def test_a_dropped_record_has_a_placeholder_and_verify_names_it(qtbot, open_doc):  # type: ignore[no-untyped-def]
    w = open_doc(DROPPED, "llama")
    tm = w.tree.model
    stream = tm.index_of(w.doc.result.root.find("/memory/kv/stream0"))
    names = [tm.node(tm.index(r, 0, stream)).name for r in range(tm.rowCount(stream))]
    k_end = names.index("K2") + 1
    assert names[k_end] == "K? (missing: one of layers 0..3)" and names[k_end + 1] == "V0", names
    ph = tm.node(tm.index(k_end, 0, stream))
    assert tm.flag(ph) == "missing" and "Verify" in tm.data(tm.index(k_end, 0, stream), 0x03)
    w.tree.tree.setCurrentIndex(tm.index(k_end, 0, stream))  # selects the finding, not bytes
    assert w.doc.bus.current.finding is not None and w.doc.bus.current.finding.code == "missing_layer"
    assert "the first empty slot is layer 3" in w.damage_banner.label.text()
    # a Verify result that names the layer (as kvscope verify lists a record the file lacks)
    w.doc.set_verify({"verdict": "damaged", "engine": {"kind": "llama.cpp", "build": "0c1e5709"},
                      "records": [{"section": "kv", "section_index": 0, "stream": 0, "role": "k", "il": 1,
                                   "status": "missing"}]})
    banner = w.damage_banner.label.text()
    assert "first empty slot" not in banner and "Verify names the missing record: layer 1 K" in banner
    assert "Verify names the missing record: layer 1 K" in w.overview.browser.toPlainText()
    names = [tm.node(tm.index(r, 0, stream)).name for r in range(tm.rowCount(stream))]
    assert names[k_end] == "K1 (missing: Verify names layer 1)", names


def test_a_cancelled_verify_marks_the_earlier_result_stale(qtbot, open_doc):  # type: ignore[no-untyped-def]
    w = open_doc(SEQ, "llama")
    doc = w.doc
    doc.set_verify({"verdict": "ok", "engine": {"kind": "llama.cpp", "build": "0c1e5709"}, "reasons": ["all match"]})
    assert "Not the last run" not in w.overview.browser.toPlainText()
    doc.verify_engine = "llama-server, build b11434 (started by kvscope)"
    doc.verify_run.stopped.emit()  # the job's outcome path: a run cancelled ...
    doc.verify_run.changed.emit()  # ... and ended
    text = w.overview.browser.toPlainText()
    assert "Not the last run: the run in llama-server, build b11434 (started by kvscope) was cancelled" in text
    assert "the result shown is the earlier run's" in text.split("\n")[2] or "earlier run's" in text
    doc.verify_run.succeeded.emit({"verdict": "ok", "engine": {"kind": "server", "build": "b11434"}})
    doc.verify_run.changed.emit()
    assert "Not the last run" not in w.overview.browser.toPlainText()


def test_what_it_is_names_cache_types_rotation_and_the_right_writer(qtbot, open_doc):  # type: ignore[no-untyped-def]
    gen = DATA / "gen-b11434"
    w = open_doc(gen / "llama-q8_0-fa1-unified0-seq0.seqstate")
    assert _row(w, "cache types") == "kv: K q8_0, V q8_0"
    rot = _row(w, "rotation")
    assert "n_rot_k 64, n_rot_v 64 (as written)" in rot and "Hadamard-rotated, blocks of 64" in rot
    assert "slot save" not in _row(w, "written by")  # a plain sequence file
    slot = open_doc(gen / "llama-f16-fa0-unified0-slot.seqstate")
    assert "llama-server's slot save" in _row(slot, "written by")
    # the tree shows the magic as llama.cpp spells it
    tm = slot.tree.model
    magic = slot.doc.result.root.find("/magic")
    assert tm.data(tm.index_of(magic).siblingAtColumn(4)) == "ggsq (0x67677371)"
