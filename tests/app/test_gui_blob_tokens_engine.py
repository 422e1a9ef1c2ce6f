"""A state blob's tokens given in the app (Tools → Tokens for this blob…), then Verify and Repair in the real
engine (the pinned build that writes the 2026-10 layout): without tokens Verify only restores the blob;
with them it compares every record with a prefill of those tokens; Repair hands them to the real
``kvscope repair``, which writes a blob ``kvscope inspect`` reads as the same kind and that verifies ok,
the input unchanged and the run's private folder (where the tokens' JSON file was) gone; a damaged copy's
refusal names the action until the tokens are given, and then it is rebuilt. Needs the engine extra
(tests/app/conftest.py)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from PySide6.QtWidgets import QDialogButtonBox

from kvharness.fixtures import MODELS, entry_model, entry_profile, manifest_entries
from kvharness.states import drop_records
from kvscope.app.document.repair_job import NEEDS_TOKENS
from kvscope.app.shell.repair_dialog import repair_document
from kvscope.app.shell.tokens_dialog import tokens_document
from kvscope.core.reader.parse import read_state
from tests.support.gui_helpers import open_loaded
from tests.support.llama_builds import need_build

pytestmark = pytest.mark.slow  # real llama.cpp

BLOB, ENTRY = next((p, e) for p, e in manifest_entries()
                   if p.parent == MODELS and p.name == "llama-f16-fa0-unified0-seq1.seqdata.bin")
MODEL = entry_model(BLOB, ENTRY)
TOKENS = [int(t) for t in ENTRY["seqs"]["1"]["token_ids"]]
TIMEOUT = 300000


@pytest.fixture(scope="module")
def pinned() -> None:
    need_build("0c1e5709")  # writes the 2026-10 layout


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _ours() -> set[str]:
    return {n for n in Path(tempfile.gettempdir()).iterdir() if n.name.startswith("kvscope-repair-app-")}


def _open(window, qtbot, path: Path):  # type: ignore[no-untyped-def]
    return open_loaded(window, qtbot, path, MODEL)


def _give(window, w, text: str) -> None:  # type: ignore[no-untyped-def]
    dlg = tokens_document(window, w)
    assert dlg is not None
    dlg.setTextValue(text)
    dlg.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Ok).click()
    assert not dlg.isVisible(), window.statusBar().currentMessage()


def _verify(window, qtbot, w) -> dict:  # type: ignore[no-untyped-def, type-arg]
    window.verify(w)
    qtbot.waitUntil(lambda: w.doc.verifying, timeout=5000)
    qtbot.waitUntil(lambda: not w.doc.verifying, timeout=TIMEOUT)
    assert w.doc.verify_error is None and w.doc.verify is not None, w.doc.verify_error
    return w.doc.verify


def _inspect(path: Path) -> dict:  # type: ignore[type-arg]
    out = subprocess.run([sys.executable, "-m", "kvscope.core.cli.main", "inspect", str(path), "--model", str(MODEL),
                          "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def _repair(window, qtbot, w, out: Path) -> dict:  # type: ignore[no-untyped-def, type-arg]
    repair_document(window, w, out=str(out))
    run = w.overview.repair
    assert run.running and not window.actions_["blob_tokens"].isEnabled()  # the tokens stay as the run has them
    step = run.step_text
    assert "from the 12 tokens given in llama.cpp 0c1e5709" in step or step == "starting", step
    qtbot.waitUntil(lambda: not run.running, timeout=TIMEOUT)
    assert run.error is None, run.error
    assert run.result is not None
    return run.result


def test_verify_and_repair_a_blob_with_the_tokens_given(qtbot, window, tmp_path: Path, pinned: None) -> None:  # type: ignore[no-untyped-def]
    before, temps = _sha(BLOB), _ours()
    w = _open(window, qtbot, BLOB)
    assert w.doc.result.kind == "seq_blob" and w.overview.verdict.level == "healthy"
    bare = _verify(window, qtbot, w)  # no tokens: the restore only
    assert not bare["compared"] and not bare["prefill"]["possible"] and bare["records"] == []
    assert any("nothing to re-prefill" in r for r in bare["reasons"]), bare["reasons"]
    _give(window, w, ",".join(map(str, TOKENS)))
    assert w.doc.verify_stale is not None and "tokens given changed" in w.doc.verify_stale
    assert "12 tokens given (Tools → Tokens for this blob…)" in w.overview.browser.toPlainText()
    # Verify re-prefills the tokens given: every record compared with that prefill
    got = _verify(window, qtbot, w)
    assert got["compared"] and got["prefill"]["possible"] and got["prefill"]["seqs"] == {"1": 12}
    assert got["verdict"] == "ok" and got["records"] and all(r["status"] == "match" for r in got["records"]), got
    assert not any("nothing to re-prefill" in r for r in got["reasons"]) and w.doc.verify_stale is None
    # Repair rebuilds from them: a blob of the same kind that verifies ok; the input unchanged
    out = tmp_path / "rebuilt.seqdata.bin"
    result = _repair(window, qtbot, w, out)
    assert result["kind"] == "seq_blob" and result["seqs"] == {"1": 12} and result["tokens_given"] == 12
    assert result["writer"] == "llama_state_seq_get_data_ext" and result["verify"]["verdict"] == "ok"
    assert "from the 12 tokens given, verified ok" in w.overview.repair_banner.label.text()
    found = _inspect(out)
    assert found["kind"] == "seq_blob" and found["verdict"]["level"] == "healthy"
    assert found["header"].get("seq_id") == 1
    assert _sha(BLOB) == before
    assert _ours() == temps  # the run's private folder, with the tokens' JSON file, is gone
    # cleared: the refusal is back, naming the action
    assert w.overview.follow("tokens-clear:") and w.doc.given_tokens is None
    assert w.overview.repair_problem() == NEEDS_TOKENS and not window.actions_["repair"].isEnabled()
    assert "Tools → Tokens for this blob…" in window.actions_["repair"].toolTip()


def test_a_damaged_blob_is_refused_until_its_tokens_are_given_then_rebuilt(
        qtbot, window, tmp_path: Path, pinned: None) -> None:  # type: ignore[no-untyped-def]
    res = read_state(BLOB, profile=entry_profile(BLOB, ENTRY))
    st = next(st for sec in res.sections if sec.kind == "kv" for st in sec.streams if st.k_layers)
    bad = drop_records(BLOB, tmp_path / "dropped.seqdata.bin", [st.k_layers[1]])
    before = _sha(bad)
    w = _open(window, qtbot, bad)
    assert w.overview.verdict.level == "damaged" and 'href="repair:"' not in w.overview.html()
    assert f"Repair: not possible: {NEEDS_TOKENS}" in w.overview.browser.toPlainText()
    assert not w.overview.repair_button.isEnabled()
    (tmp_path / "prompt.json").write_text(json.dumps(TOKENS))
    _give(window, w, "@prompt.json")
    assert 'href="repair:"' in w.overview.html() and w.overview.repair_button.isEnabled()
    assert "Repair… rebuilds the state from the 12 tokens given" in w.overview.browser.toPlainText()
    out = tmp_path / "fixed.seqdata.bin"
    result = _repair(window, qtbot, w, out)
    assert result["verify"]["verdict"] == "ok" and result["tokens_given"] == 12
    found = _inspect(out)
    assert found["kind"] == "seq_blob" and found["verdict"]["level"] == "healthy"
    assert _sha(bad) == before
