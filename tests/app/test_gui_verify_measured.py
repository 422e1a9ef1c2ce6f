"""What Verify measured replaces the prediction it measured, everywhere it is shown (#29 items 2 and 3).

The files are damaged copies of a real llama-server slot (tests/data/gen-b11434, the generated llama model)
made with the lab's corruption catalog: one with K layer 1 dropped (the reader sees one K record missing
and guesses the first empty slot), one cut in half (libllama's answer is unknown). The Verify results are
what ``kvscope verify --json`` lists for such files (a record ``missing`` by its true layer and role; a
restore refused), attached as the app attaches a finished run, so no engine runs here.

The tests marked ``xserver`` also run in a real X server (test_gui_xserver.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvscope.core.lab.damaged_copy import corrupt_file
from tests.support.gui_helpers import open_loaded
from tests.support.slot_damage import LLAMA, SLOT

GUESS = "first empty slot"
REFUSED = "Unable to restore slot: No available space in KV cache or invalid slot save file"


def dropped_slot(dst: Path) -> Path:
    corrupt_file(SLOT, dst, ["drop_k_layer_1"], str(LLAMA))
    return dst


def truncated_slot(dst: Path) -> Path:
    corrupt_file(SLOT, dst, ["truncated_half"], str(LLAMA))
    return dst


def missing_result(il: int, role: str) -> dict[str, Any]:
    """Verify's answer for the dropped copy: the record the file lacks, by the engine's layer and role."""
    return {"verdict": "damaged", "engine": {"kind": "llama.cpp", "build": "b11434"},
            "restore": {"ok": False, "message": "llama_state_seq_load_file failed"},
            "reasons": [f"layer {il} {role.upper()} is missing"],
            "records": [{"section": "kv", "section_index": 0, "stream": 0, "role": role, "il": il,
                         "status": "missing"}]}


def refused_result() -> dict[str, Any]:
    """Verify's answer for the cut copy: b11434's libllama refuses it."""
    return {"verdict": "damaged", "engine": {"kind": "llama.cpp", "build": "b11434"},
            "restore": {"ok": False, "message": "llama_state_seq_load_file: failed to read the state"},
            "reasons": ["the restore failed"], "records": []}


def _builds(w: Any) -> str:
    return w.overview.browser.toPlainText().split("Which llama.cpp builds load it")[1].split("Verification")[0]


def _reuse(w: Any) -> str:
    return w.overview.browser.toPlainText().split("Will llama-server reuse it")[1]


@pytest.mark.xserver
def test_the_record_verify_names_replaces_the_guess_everywhere(qtbot, window, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    w = open_loaded(window, qtbot, dropped_slot(tmp_path / "dropped.seqstate"), LLAMA)
    assert GUESS in w.damage_banner.label.text() and GUESS in _builds(w) and GUESS in _reuse(w)
    # the reader counted a K record missing; Verify names V layer 0 (alike records read as each other)
    w.doc.set_verify(missing_result(0, "v"))
    answer = "Verify names the missing record: layer 0 V (measured)"
    assert GUESS not in w.damage_banner.label.text() and answer in w.damage_banner.label.text()
    page = w.overview.browser.toPlainText()
    assert GUESS not in page, page
    assert answer in _builds(w) and GUESS not in _reuse(w)
    assert "llama-server b11434: refuses the slot: " + REFUSED + " (libllama's restore measured by Verify)" in _reuse(w)
    # the findings: the missing_layer finding's message says what Verify measured
    fm = w.findings.model
    row = next(r for r, f in enumerate(fm.findings) if f.code == "missing_layer")
    shown = fm.data(fm.index(row, fm.columns.index("message")))
    assert GUESS not in shown and answer in shown
    # ... and the filter, Copy message and the CSV export read the message as shown
    w.findings.filter_edit.setText("verify names the missing")
    assert w.findings.proxy.rowCount() == 1
    w.findings.filter_edit.setText("first empty slot")
    assert w.findings.proxy.rowCount() == 0
    w.findings.filter_edit.setText("")
    table = w.findings.csv_table()
    assert table is not None and any(answer in row[-1] and GUESS not in row[-1] for row in table[1])
    # the tree's placeholder: Verify's layer and role, not the reader's K?
    names = [n.name for n in w.tree.model.placeholders()]
    assert names == ["V0 (missing: Verify names layer 0)"], names


def test_the_placeholder_names_candidate_layers_as_runs() -> None:
    from kvscope.app.document.missing_records import layer_runs

    assert layer_runs((0, 1, 2, 3)) == "0..3"
    assert layer_runs((0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 12, 13, 14, 15, 16)) == "0..4, 6..10, 12..16"


@pytest.mark.xserver
def test_a_cut_slot_has_one_server_answer_in_the_table_and_the_reuse_lines(qtbot, window, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    w = open_loaded(window, qtbot, truncated_slot(tmp_path / "cut.seqstate"), LLAMA)
    ov = w.overview.overview
    srv = next(e for e in ov.consumer_entries() if (e.build, e.consumer) == ("b11434", "llama-server"))
    assert srv.answer == "unknown"
    reuse = [line for line in ov.reuse_lines() if line.startswith("llama-server b11434")]
    assert len(reuse) == 2 and not any(": refuses the slot" in line for line in reuse), reuse
    assert all("unknown" in line for line in reuse), reuse
    # Verify measures libllama's restore: llama-server's answer follows it, in the table and the reuse lines
    w.doc.set_verify(refused_result())
    ov = w.overview.overview
    got = {(e.build, e.consumer): e for e in ov.consumer_entries()}
    srv = got[("b11434", "llama-server")]
    assert (srv.answer, srv.message, srv.measured, srv.predicted) == ("refuses", REFUSED, True, "unknown")
    assert got[("b11434", "libllama")].predicted == "unknown"
    builds = _builds(w)
    assert "predicted from libllama's answer" not in builds and "which Verify measured" not in builds
    assert f"✘ refuses: {REFUSED}; predicted unknown" in builds, builds
    reuse = [line for line in ov.reuse_lines() if line.startswith("llama-server b11434")]
    assert all(line.startswith(f"llama-server b11434{flag}: refuses the slot: {REFUSED}; predicted unknown")
               for line, flag in zip(reuse, ("", " --swa-full"), strict=True)), reuse
