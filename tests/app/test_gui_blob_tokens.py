"""Tools → Tokens for this blob… without an engine run: the action is off for a slot file that carries its
own tokens; text that gives no usable tokens is refused in one status-bar line with the dialog kept open on
its text and nothing set; good tokens show in the Overview, make the blob repairable and are forgotten when
the file reloads as something else; Repair hands them to ``kvscope repair`` as ``--tokens @FILE`` (a JSON
file in the run's private folder), never as ids on the command line. The real 2026-10-01 fixtures and
their model. The runs in the real engine are in test_gui_blob_tokens_engine.py."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialogButtonBox

from kvharness.fixtures import MODELS, entry_model, manifest_entries
from kvscope.app.document.given_tokens import parse_given
from kvscope.app.document.repair_job import NEEDS_TOKENS, repair_command, write_tokens
from kvscope.app.shell.tokens_dialog import TokensDialog, tokens_document
from kvscope.core.verify.prefill import parse_tokens
from tests.support.gui_helpers import open_loaded

BLOB_NAME = "llama-f16-fa0-unified0-seq1.seqdata.bin"
SLOT_NAME = "llama-f16-fa0-unified0-seq1.seqstate"


def _entry(name: str) -> tuple[Path, dict, Path]:  # type: ignore[type-arg]
    path, entry = next((p, e) for p, e in manifest_entries() if p.parent == MODELS and p.name == name)
    return path, entry, entry_model(path, entry)


BLOB, BLOB_ENTRY, MODEL = _entry(BLOB_NAME)
TOKENS = [int(t) for t in BLOB_ENTRY["seqs"]["1"]["token_ids"]]


def _open(window, qtbot, path: Path):  # type: ignore[no-untyped-def]
    return open_loaded(window, qtbot, path, MODEL)


def _ok(dlg: TokensDialog):  # type: ignore[no-untyped-def]
    box = dlg.findChild(QDialogButtonBox)
    assert box is not None
    return box.button(QDialogButtonBox.StandardButton.Ok)


def test_the_fixture_is_a_blob_of_the_2026_10_build_and_the_slot_file_carries_tokens() -> None:
    assert BLOB_ENTRY["kind"] == "seq_blob" and len(TOKENS) == 12
    slot, entry, _ = _entry(SLOT_NAME)
    assert entry["kind"] == "seq_file" and entry["seqs"]["1"]["token_ids"] == TOKENS


def test_the_action_is_off_for_a_slot_file_that_has_tokens(qtbot, window) -> None:  # type: ignore[no-untyped-def]
    act = window.actions_["blob_tokens"]
    assert not act.isEnabled() and "open a state blob first" in act.toolTip()  # nothing open
    w = _open(window, qtbot, _entry(SLOT_NAME)[0])
    assert w.doc.result.kind == "seq_file" and w.doc.result.tokens and not w.doc.takes_tokens()
    assert not act.isEnabled() and "this file is a seq_file" in act.toolTip()
    assert tokens_document(window, w) is None and window.findChildren(TokensDialog) == []
    assert "Tokens for this blob" not in w.overview.html() and w.overview.repair_problem() is None
    with pytest.raises(ValueError, match="only a state blob takes tokens"):
        w.doc.set_given_tokens(TOKENS, "1")
    assert w.doc.given_tokens is None


def test_bad_text_is_refused_in_one_line_with_the_text_kept_and_nothing_set(
        qtbot, window, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    w = _open(window, qtbot, BLOB)
    act = window.actions_["blob_tokens"]
    assert w.doc.takes_tokens() and act.isEnabled()
    assert w.overview.repair_problem() == NEEDS_TOKENS and "Tools → Tokens for this blob…" in NEEDS_TOKENS
    assert not window.actions_["repair"].isEnabled() and "Tools → Tokens for this blob…" in \
        window.actions_["repair"].toolTip()
    fifo = tmp_path / "tokens.fifo"
    os.mkfifo(fifo)  # opening it would wait for a writer forever: refused before it is opened
    (tmp_path / "obj.json").write_text('{"a": [1]}')
    (tmp_path / "empty.json").write_text("[]")
    (tmp_path / "seq0.json").write_text(json.dumps({"0": TOKENS}))
    (tmp_path / "bad.json").write_text("[1, 2,")
    cases = [("1,x", "expected comma-separated token ids"), ("   ", "no token ids given"),
             (",", "the list is empty"), ("@nope-not-here.json", "No such file or directory"),
             (f"@{fifo}", "not a regular file"), (f"@{tmp_path}", "not a regular file"),
             (f"@{tmp_path / 'obj.json'}", "expected a JSON list of token ids"),
             (f"@{tmp_path / 'bad.json'}", "Expecting value"),
             (f"@{tmp_path / 'empty.json'}", "the list is empty"),
             ("1, 999999", "token id 999999 is outside the model's vocabulary"), ("1,-5", "token id -5 is negative"),
             (f"@{tmp_path / 'seq0.json'}", "the file is sequence 1's"),
             ("1,2,3", "3 token(s) given, but the file spans 12 position(s)")]
    act.trigger()  # Tools → Tokens for this blob…: a window-modal dialog, opened, not run in a loop of its own
    dialogs = [d for d in window.findChildren(TokensDialog) if d.isVisible()]
    assert len(dialogs) == 1
    dlg = dialogs[0]
    assert dlg.windowModality() == Qt.WindowModality.WindowModal and dlg.parent() is window
    for text, why in cases:
        dlg.setTextValue(text)
        _ok(dlg).click()
        msg = window.statusBar().currentMessage()
        assert dlg.isVisible() and dlg.textValue() == text, text  # stays open, the text kept to correct
        assert msg == dlg.refused and msg.startswith(f"Tokens for {BLOB_NAME} refused: ") and why in msg, (text, msg)
        assert "\n" not in msg and len(msg) < 300
        assert w.doc.given_tokens is None and w.overview.repair_problem() == NEEDS_TOKENS
    long = ",".join(["1"] * 5000) + ",x"  # a long paste: the refusal stays one short line
    dlg.setTextValue(long)
    _ok(dlg).click()
    assert dlg.isVisible() and len(window.statusBar().currentMessage()) < 300 and w.doc.given_tokens is None
    dlg.reject()
    assert "This blob carries no tokens" in w.overview.browser.toPlainText()


def test_good_tokens_show_in_the_overview_make_it_repairable_and_clear(qtbot, window) -> None:  # type: ignore[no-untyped-def]
    w = _open(window, qtbot, BLOB)
    seen: list[int] = []
    w.doc.tokensChanged.connect(lambda: seen.append(1))
    dlg = tokens_document(window, w)
    assert dlg is not None and dlg.textValue() == ""
    dlg.setTextValue(" " + ", ".join(map(str, TOKENS)) + " ")
    _ok(dlg).click()
    assert not dlg.isVisible() and w.doc.given_tokens == TOKENS and seen == [1]
    text = w.overview.browser.toPlainText()
    assert "12 tokens given (Tools → Tokens for this blob…)" in text, text
    assert "none stored; 12 tokens given" in text
    assert w.overview.repair_problem() is None and window.actions_["repair"].isEnabled()
    assert window.actions_["blob_tokens"].isEnabled()
    again = tokens_document(window, w)  # the dialog starts from the text given
    assert again is not None and again.textValue() == ", ".join(map(str, TOKENS))
    again.reject()
    assert w.overview.follow("tokens-clear:")
    assert w.doc.given_tokens is None and seen == [1, 1]
    assert w.overview.repair_problem() == NEEDS_TOKENS and not window.actions_["repair"].isEnabled()
    assert "This blob carries no tokens" in w.overview.browser.toPlainText()


def test_an_at_file_beside_the_blob_and_a_reload_as_something_else_forgets_them(
        qtbot, window, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    blob = tmp_path / BLOB_NAME
    shutil.copyfile(BLOB, blob)
    (tmp_path / "prompt.json").write_text(json.dumps({"1": TOKENS}))
    w = _open(window, qtbot, blob)
    dlg = tokens_document(window, w)
    assert dlg is not None
    dlg.setTextValue("@prompt.json")  # relative: beside the blob
    _ok(dlg).click()
    assert w.doc.given_tokens == {1: TOKENS}
    assert "12 tokens (sequence 1: 12) given from prompt.json" in w.overview.browser.toPlainText()
    assert w.overview.repair_problem() is None
    shutil.copyfile(_entry(SLOT_NAME)[0], blob)  # the same path now holds the slot file of the same prompt
    w.doc.reload()
    qtbot.waitUntil(lambda: w.doc.result is not None and w.doc.result.kind == "seq_file" and not w.doc.busy,
                    timeout=30000)
    assert w.doc.given_tokens is None and w.doc.given_tokens_text == ""
    assert not window.actions_["blob_tokens"].isEnabled()


def test_repair_passes_the_tokens_as_a_json_file_never_on_the_command_line(tmp_path: Path) -> None:
    many = list(range(40000))  # about 230 KiB as text: past the kernel's 128 KiB limit on one argument
    for tokens in (many, {1: TOKENS}):
        folder = tmp_path / str(type(tokens).__name__)
        folder.mkdir()
        path = write_tokens(str(folder), tokens)
        assert os.path.dirname(path) == str(folder) and (os.stat(path).st_mode & 0o777) == 0o600
        cmd = repair_command(str(BLOB), str(MODEL), str(tmp_path / "out.bin"), "0c1e5709", 600.0, path)
        i = cmd.index("--tokens")
        assert cmd[i + 1] == "@" + path and max(len(a) for a in cmd) < 4096
        assert parse_tokens(cmd[i + 1]) == tokens == parse_given(cmd[i + 1], "/")
    assert "--tokens" not in repair_command(str(BLOB), str(MODEL), str(tmp_path / "o"), None, 600.0)
