"""The Overview's "Which llama.cpp builds load it" answers per pinned build and per consumer in one place
(#18 item 4): libllama and llama-server apart, loads / refuses with the consumer's message / crashes with
the assert, each marked predicted; no second row that could contradict it, and the head line follows the
same answers. The report writes the same lines. (Verify replacing a prediction, with the real engine:
test_gui_repair.py.)

The files are a real llama-server slot of the b11434 build (tests/data/gen-b11434), one token of it
moved outside the vocabulary, and the same slot cut inside its last V record.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.slot_damage import LLAMA, SLOT, cut_slot, oov_slot

ASSERT = "GGML_ASSERT(nread <= state_size) failed"


def _section(window, qtbot, path: Path) -> tuple[object, str]:  # type: ignore[no-untyped-def]
    w = window.open_file(str(path), model=str(LLAMA))
    assert w is not None
    qtbot.waitUntil(lambda: w.doc.result is not None and w.doc.compat is not None and not w.doc.busy, timeout=30000)
    assert window.wait_idle(30000)
    text = w.overview.browser.toPlainText()
    assert "Per consumer" not in text  # one place: no second list
    return w, text.split("Which llama.cpp builds load it")[1].split("Verification")[0]


def _rows(section: str) -> list[str]:
    """The table's rows as text lines (QTextBrowser puts each cell on its own line)."""
    return [line.strip() for line in section.splitlines() if line.strip()]


@pytest.mark.xserver
def test_a_slot_that_loads_is_answered_per_build_and_consumer(qtbot, window, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "slot.bin"
    path.write_bytes(SLOT.read_bytes())
    w, section = _section(window, qtbot, path)
    assert section.strip().startswith("Loads as it is in: b11434 (libllama, llama-server)")
    ov = w.overview.overview
    got = {(e.build, e.consumer): e for e in ov.consumer_entries()}
    assert {k: (e.answer, e.measured) for k, e in got.items()} == {
        ("0c1e5709", "libllama"): ("refuses", False), ("0c1e5709", "llama-server"): ("refuses", False),
        ("b11434", "libllama"): ("loads", False), ("b11434", "llama-server"): ("loads", False)}
    rows = _rows(section)
    assert "b11434" in rows and "writes 2026-10-v4" in rows and "writes 2026-10" in rows
    assert rows.count("predicted") == 4 and "measured by Verify" not in section
    assert "✘ refuses: Unable to restore slot: No available space in KV cache or invalid slot save file" in rows
    lib = next(r for r in rows if r.startswith("✘ refuses: state_seq_load_file: unknown (magic, version)"))
    assert lib.endswith("`kvscope rewrite` migrates it exactly")  # the way out, on libllama's refusal
    others = section.split("Other layout generations")[1]
    assert "2025-05: refuses" in others and "2026-10-v4" not in others  # the pinned layouts are answered above
    # the colours follow the answers: the loads green, the refusals red
    html = w.overview.html()
    assert html.count("✔ <b>loads</b>") == 2 and html.count("✘ <b>refuses</b>") == 2


def test_a_token_outside_the_vocabulary_loads_in_libllama_and_the_server_refuses(qtbot, window, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    w, section = _section(window, qtbot, oov_slot(tmp_path / "oov.bin"))
    assert w.overview.verdict.level == "damaged"
    # the compatibility of layout 2026-10-v4 says the damaged file is refused: libllama does not check token ids
    assert section.strip().startswith("Loads as it is in: b11434 (libllama)")
    rows = _rows(section)
    i = rows.index("b11434")
    assert rows[i + 1:i + 8] == ["writes 2026-10-v4", "libllama", "✔ loads", "predicted", "llama-server",
                                 "✘ refuses: Unable to restore slot: Invalid tokens in slot save file", "predicted"]
    assert "refuses: the file is damaged" not in section  # the generation's own line for b11434 is not repeated


def test_a_file_cut_inside_its_last_record_crashes_both_consumers(qtbot, window, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    w, section = _section(window, qtbot, cut_slot(tmp_path / "cut.bin"))
    assert "No pinned llama.cpp build loads it as it is" in section or "No llama.cpp build loads it" in section
    crashes = [e for e in w.overview.overview.consumer_entries() if e.answer == "crashes"]
    assert {(e.build, e.consumer) for e in crashes} == {("b11434", "libllama"), ("b11434", "llama-server")}
    rows = _rows(section)
    assert sum(1 for r in rows if r.startswith(f"✘ crashes: {ASSERT}")) == 2
    assert "Loads as it is in" not in section


def test_the_report_writes_the_same_answers(tmp_path: Path) -> None:
    from kvscope.core.cli.report_command import main

    path = oov_slot(tmp_path / "oov.bin")
    assert main([str(path), "--model", str(LLAMA), "-o", str(tmp_path / "r")]) == 1
    md = (tmp_path / "r" / "report.md").read_text(encoding="utf-8")
    html = (tmp_path / "r" / "report.html").read_text(encoding="utf-8")
    section = md.split("### Which llama.cpp builds load it")[1].split("## Structure")[0]
    assert "Loads as it is in: **b11434 (libllama)**." in section
    assert "- b11434 libllama: loads (predicted)" in section
    assert "- b11434 llama-server: refuses: Unable to restore slot: Invalid tokens in slot save file (predicted)" \
        in section
    assert "Loads as it is in: <b>b11434 (libllama)</b>." in html
    assert "b11434 llama-server: refuses: Unable to restore slot: Invalid tokens in slot save file (predicted)" in html
