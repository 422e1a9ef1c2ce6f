"""The Tokens tab of a state blob (#29 item 6): a blob carries no tokens, so before any are given the tab
says so and how to give them (not "token text needs a model" when the model is set); once they are given
(Tools → Tokens for this blob…) it lists them, count and text with the model, and clearing them empties it
again. The real 2026-10-01 blob and its model."""

from __future__ import annotations

import pytest

from tests.app.test_gui_blob_tokens import BLOB, MODEL, TOKENS
from tests.support.gui_helpers import open_loaded


@pytest.mark.xserver
def test_the_tokens_given_for_a_blob_show_in_its_tokens_tab(qtbot, window) -> None:  # type: ignore[no-untyped-def]
    w = open_loaded(window, qtbot, BLOB, MODEL)
    assert w.doc.profile is not None and w.doc.result.tokens == []
    view = w.tokens
    before = view.summary.text()
    assert "needs a model" not in before and "Tokens for this blob" in before, before
    assert view.model.rowCount() == 0 and w.tabs.tabText(w.tabs.indexOf(view)) == "Tokens"
    w.doc.set_given_tokens(TOKENS, ", ".join(map(str, TOKENS)))
    n = len(TOKENS)
    assert view.model.rowCount() == n and w.tabs.tabText(w.tabs.indexOf(view)) == f"Tokens ({n})"
    summary = view.summary.text()
    assert summary.startswith(f"{n} tokens given"), summary
    text = w.doc.profile.detokenize(TOKENS)
    assert f"text: {text[:300]!r}" in summary and "needs a model" not in summary
    ids = [view.model.data(view.model.index(i, 1)) for i in range(n)]
    assert ids == TOKENS
    texts = [view.model.data(view.model.index(i, 2)) for i in range(n)]
    assert all(t not in ("—", "⟨out of vocabulary⟩") for t in texts), texts
    table = view.csv_table()
    assert table is not None and [row[1] for row in table[1]] == TOKENS
    w.doc.set_given_tokens(None)
    assert view.model.rowCount() == 0 and view.summary.text() == before
    assert w.tabs.tabText(w.tabs.indexOf(view)) == "Tokens"
