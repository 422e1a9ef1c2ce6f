"""Repair… in the app without an engine run (#17 item 4): where it is offered (beside a damaged verdict, and
Tools → Repair… only with the model and a file that can be rebuilt), the output it proposes (beside the
input, never the input), and a refusal of the real ``kvscope repair`` command shown as a banner with its
one line, the input unchanged. The repair itself with the real engine: test_gui_repair.py.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from kvharness.fixtures import DATA
from kvharness.states import drop_records, kv_records, with_media_payload
from kvscope.app.document.repair_job import default_output
from kvscope.app.shell.repair_dialog import repair_document
from tests.support.gui_helpers import open_loaded

SEQ = DATA / "gen-0c1e5709" / "llama-f16-fa0-unified0-seq0.seqstate"
SLOT = DATA / "gen-b11434" / "llama-f16-fa0-unified0-slot.seqstate"
LLAMA = DATA / "gen-models" / "llama.gguf"


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def damaged(tmp_path: Path) -> Path:
    """The real 0c1e5709 sequence file without its K record of layer 1 (the PR #21576 pattern)."""
    k, _v = kv_records(SEQ, "gen/llama")
    return drop_records(SEQ, tmp_path / "dropped.seqstate", [k[1]])


def _open(window, qtbot, path: Path, model: Path | None = LLAMA):  # type: ignore[no-untyped-def]
    return open_loaded(window, qtbot, path, model)


@pytest.mark.xserver
def test_repair_is_offered_beside_a_damaged_verdict_with_the_model(qtbot, window, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    w = _open(window, qtbot, damaged(tmp_path))
    ov = w.overview
    assert ov.verdict is not None and ov.verdict.level == "damaged"
    html = ov.html()
    assert html.index('href="repair:"') < html.index("<h3>")  # beside the verdict, before the first section
    assert "Repair…" in ov.browser.toPlainText()
    act = window.actions_["repair"]
    assert act.isEnabled() and "kvscope repair" in act.toolTip()
    assert ov.repair_button.isVisible() and ov.repair_button.isEnabled()  # and a button beside Verify
    emitted: list[bool] = []
    ov.repairRequested.connect(lambda: emitted.append(True))
    assert ov.follow("repair:") and emitted == [True]
    # the dialog proposes the file beside the input, with the suffix; it is window-modal, not a blocking loop
    dlg = repair_document(window, w)
    assert dlg is not None and dlg.isVisible()
    want = default_output(w.doc.path)
    assert os.path.dirname(want) == os.path.dirname(w.doc.path) and want.endswith("dropped.repaired.seqstate")
    assert [os.path.abspath(p) for p in dlg.selectedFiles()] == [want]
    dlg.reject()


def test_repair_needs_the_model_and_a_healthy_file_has_no_link(qtbot, window, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    w = _open(window, qtbot, damaged(tmp_path), model=None)
    text = w.overview.browser.toPlainText()
    assert "Repair: not possible: Repair needs the GGUF model" in text and 'href="repair:"' not in w.overview.html()
    act = window.actions_["repair"]
    assert not act.isEnabled() and "Repair needs the GGUF model" in act.toolTip()
    assert not w.overview.follow("repair:")
    assert w.overview.repair_button.isVisible() and not w.overview.repair_button.isEnabled()
    assert "Repair needs the GGUF model" in w.overview.repair_button.toolTip()
    healthy = _open(window, qtbot, SLOT)
    assert healthy.overview.verdict.level == "healthy"
    assert "Repair" not in healthy.overview.browser.toPlainText() and not healthy.overview.repair_button.isVisible()
    assert window.actions_["repair"].isEnabled()  # a healthy file can still be rebuilt from the menu


def test_a_slot_with_media_chunks_is_not_offered_and_the_command_refuses_it(qtbot, window, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    mm = with_media_payload(SLOT, tmp_path / "mm.bin", media_at=5, media_len=4)
    k, _v = kv_records(mm, "gen/llama")
    bad = drop_records(mm, tmp_path / "mm-dropped.bin", [k[0]])
    before = _sha(bad)
    w = _open(window, qtbot, bad)
    assert w.overview.verdict.level == "damaged"
    assert "Repair: not possible: the prompt holds 1 media chunk(s) from position 5" in w.overview.browser.toPlainText()
    assert not window.actions_["repair"].isEnabled()
    # the real command run as the app runs it, past the app's own check: its refusal is the banner's one line
    out = tmp_path / "mm-fixed.bin"
    run = w.overview.repair
    assert run.start(str(bad), str(LLAMA), str(out)) is not None
    assert w.overview.repair_banner.isVisible() and w.overview.repair_banner.cancel_button.isVisible()
    qtbot.waitUntil(lambda: not run.running, timeout=60000)
    banner = w.overview.repair_banner
    assert run.error is not None and "\n" not in run.error and "media chunk" in run.error
    assert banner.isVisible() and banner.label.text().startswith("Repair wrote nothing: ")
    assert "media chunk" in banner.label.text() and not banner.open_button.isVisible()
    assert not out.exists() and _sha(bad) == before
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".kvscope-tmp-")]
    banner.dismiss_button.click()
    assert not banner.isVisible()


def test_the_input_is_never_the_output(qtbot, window, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bad = damaged(tmp_path)
    link = tmp_path / "link.seqstate"
    link.symlink_to(bad)
    before = _sha(bad)
    w = _open(window, qtbot, bad)
    for target in (bad, link):  # by its name, or another
        repair_document(window, w, out=str(target))
        run = w.overview.repair
        assert not run.running and run.error is not None and "is the input" in run.error
        assert w.overview.repair_banner.label.text().startswith("Repair wrote nothing: ")
    assert _sha(bad) == before
    assert default_output(str(bad)) != str(bad)
    (tmp_path / "dropped.repaired.seqstate").write_bytes(b"taken")
    assert default_output(str(bad)).endswith("dropped.repaired-2.seqstate")  # an existing file is not proposed
