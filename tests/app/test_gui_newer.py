"""The app says "newer" for a file a newer llama.cpp wrote (#27): a real b11434 slot with its seq version set to 5
gets the document verdict ``newer`` (never ``damaged``), the banner on every view in the level's own colour, and
the Overview's heading; every section is still in the document's tree."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

from kvscope.app.base.theme import VERDICT_COLORS, verdict_color

SRC = Path(__file__).resolve().parents[1] / "data" / "gen-b11434" / "llama-q8_0-fa1-unified0-seq2.seqstate"


def test_the_document_of_a_newer_file_is_newer(qtbot: Any, window: Any, tmp_path: Path) -> None:
    data = bytearray(SRC.read_bytes())
    struct.pack_into("<I", data, 4, 5)
    path = tmp_path / SRC.name
    path.write_bytes(bytes(data))
    w = window.open_file(str(path))
    assert w is not None
    qtbot.waitUntil(lambda: w.doc.stats is not None and w.doc.compat is not None and not w.doc.busy, timeout=60000)
    assert window.wait_idle(60000)
    v = w.doc.verdict()
    assert v is not None and v.level == "newer" and v.title == "newer"
    assert v.reason.startswith("written by a llama.cpp newer than this kvscope knows (seq version 5; the newest "
                               "known, b11434, writes 4); read as 4 where the bytes fit: 668 bytes trusted")
    assert "newer" in VERDICT_COLORS and VERDICT_COLORS["newer"] != VERDICT_COLORS["damaged"]
    banner = w.damage_banner
    assert not banner.isHidden() and banner.label.text() == v.line()
    assert verdict_color("newer", False).name() in banner.label.styleSheet()
    assert not banner.show_button.isVisibleTo(banner)  # no error: no damage to show
    text = w.overview.browser.toPlainText().splitlines()
    assert text[:2] == ["NEWER", v.reason]
    assert w.doc.result is not None and [s.role for s in w.doc.result.sections] == ["kv"]
    assert w.doc.result.n_errors == 0
