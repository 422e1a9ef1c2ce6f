"""Repair, Verify and "Show the damage" ask the core's preconditions before they are offered (#29 item 5):
a llama-server slot with one token outside the model's vocabulary is not offered Repair (the command would
start llama-server and fail with HTTP 400 after seconds): the action, the button and the Overview say why;
an empty and a random file are offered neither Repair, Verify nor "Show the damage", each with its reason.
The reasons are the ones ``kvscope repair`` / ``kvscope verify`` refuse with
(:mod:`kvscope.core.verify.preconditions`); the command line's side: tests/cli/test_repair_preconditions.py.
Verify stays on for the out-of-vocabulary slot: the engine's refusal of its tokens is a verdict
(test_gui_verify_engine.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvscope.core.model.profile import load_model_profile
from kvscope.core.reader.parse import read_state
from kvscope.core.verify.preconditions import repair_problem, verify_problem
from tests.support.slot_damage import LLAMA, oov_slot

VOCAB = "outside the model's vocabulary"


def _open(window, qtbot, path: Path):  # type: ignore[no-untyped-def]
    w = window.open_file(str(path), model=str(LLAMA))
    assert w is not None
    qtbot.waitUntil(lambda: w.doc.result is not None and w.doc.profile is not None and not w.doc.busy,
                    timeout=30000)
    assert window.wait_idle(30000)
    return w


@pytest.mark.xserver
def test_repair_is_not_offered_for_a_token_outside_the_vocabulary(qtbot, window, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = oov_slot(tmp_path / "oov.bin")
    w = _open(window, qtbot, path)
    ov = w.overview
    assert ov.verdict is not None and ov.verdict.level == "damaged"
    why = ov.repair_problem()
    assert why is not None and VOCAB in why and "token id 384" in why, why
    core = repair_problem(read_state(str(path), profile=load_model_profile(str(LLAMA))),
                          load_model_profile(str(LLAMA)))
    assert why == core  # the core's line, word for word: what kvscope repair refuses with
    act = window.actions_["repair"]
    assert not act.isEnabled() and VOCAB in act.toolTip()
    assert ov.repair_button.isVisible() and not ov.repair_button.isEnabled() and VOCAB in ov.repair_button.toolTip()
    html = ov.html()
    assert 'href="repair:"' not in html and "Repair: not possible" in ov.browser.toPlainText()
    assert not ov.follow("repair:")
    # Verify runs: llama-server's refusal of the tokens is what it measures (a verdict, not a setup error)
    assert window.actions_["verify"].isEnabled() and ov.verify_button.isEnabled()
    assert w.damage_banner.show_button.isEnabled()  # the bad token's bytes are there to show


@pytest.mark.xserver
@pytest.mark.parametrize("kind", ["empty", "random"])
def test_an_empty_or_random_file_is_offered_nothing_it_cannot_do(qtbot, window, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                  kind: str) -> None:
    path = tmp_path / f"{kind}.bin"
    path.write_bytes(b"" if kind == "empty" else os.urandom(5000))
    w = _open(window, qtbot, path)
    want = "the file is empty" if kind == "empty" else "not a llama.cpp state file"
    assert verify_problem(w.doc.result, w.doc.profile) is not None
    for why in (w.overview.repair_problem(), w.doc.verify_problem()):
        assert why is not None and why.startswith(want), why
    for name in ("repair", "verify"):
        act = window.actions_[name]
        assert not act.isEnabled() and want in act.toolTip(), (name, act.toolTip())
    ov = w.overview
    assert not ov.verify_button.isEnabled() and want in ov.verify_button.toolTip()
    assert 'href="verify:"' not in ov.html() and "Verify: not possible: " + want in ov.browser.toPlainText()
    banner = w.damage_banner
    assert banner.isVisibleTo(w) and not banner.show_button.isEnabled(), banner.show_button.toolTip()
    assert want in banner.show_button.toolTip()
    window.verify(w)  # the window's own path is refused as well, with the reason, and nothing runs
    assert not w.doc.verifying and w.doc.verify_error is not None and want in w.doc.verify_error
