"""The Overview says which llama.cpp releases write the file's bytes and which load it (#27), in the one line
the text output and the report carry (``Overview.releases_line``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[1] / "data" / "gen-b11434" / "llama-q8_0-fa1-unified0-seq2.seqstate"


def test_the_overview_names_the_releases(qtbot: Any, window: Any) -> None:
    w = window.open_file(str(SRC))
    assert w is not None
    qtbot.waitUntil(lambda: w.doc.compat is not None and not w.doc.busy, timeout=60000)
    assert window.wait_idle(60000)
    lines = w.overview.browser.toPlainText().splitlines()
    assert "releases" in lines, lines
    row = " ".join(lines[lines.index("releases") + 1:lines.index("releases") + 4])  # a cell: lines of the text
    assert row.startswith("written by b11434") and "loads in" in row, row
