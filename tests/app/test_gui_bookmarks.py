"""Bookmarks and annotations on byte ranges (issue 19 item 12): made from the hex selection, listed in the
hex view's Bookmarks tab, a click selects the bytes again, kept per file in the settings (a new window
on the same file has them, another file does not), and listed in the report the app exports (JSON,
Markdown, HTML). The input file is never written to.

The tests marked ``xserver`` also run in a real X server (test_gui_xserver.py).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from kvscope.app.document.bookmark import Bookmark
from tests.support.gui_helpers import LAB


def _copy(tmp_path: Path, name: str = "slot.seqstate") -> Path:
    d = tmp_path / "files"  # the isolated settings file is in tmp_path itself
    d.mkdir(exist_ok=True)
    p = d / name
    shutil.copy(LAB / "seq0.clean.seqstate", p)
    return p


def test_bookmark_json_round_trip_and_bad_entries() -> None:
    b = Bookmark(10, 42, "K layer 0", "zeros here")
    assert Bookmark.from_json(b.to_json()) == b and b.length == 32
    for bad in ({"start": 5, "end": 5, "name": "x"}, {"start": -1, "end": 3, "name": "x"}, "x",
                {"start": True, "end": 3, "name": "x"}, {"start": 1, "end": 3, "name": 7}):
        assert Bookmark.from_json(bad) is None


@pytest.mark.xserver
def test_bookmarks_list_jump_and_persist_per_file(qtbot, open_doc, window, app_settings, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = _copy(tmp_path)
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    w = open_doc(path, "llama")
    w.show_view("hex")
    hv = w.hex
    leaf = next(n for n in w.doc.index.leaves if n.kind == "k_rows")
    hv.select_range(leaf.offset, leaf.offset + 64)
    panel = hv.bookmarks
    b = panel.add()  # the name defaults to the node path
    assert b is not None and (b.start, b.end) == (leaf.offset, leaf.offset + 64) and b.name == leaf.path
    hv.select_range(4, 8)
    panel.add("token count", "the header's n_token")
    assert [x.name for x in w.doc.bookmarks.items] == ["token count", leaf.path]  # in offset order
    assert hv.side_tabs.tabText(1) == "Bookmarks (2)"
    assert panel.model.rowCount() == 2 and panel.model.index(0, 0).data() == "token count"
    # the dump underlines bookmarked bytes and names the bookmark in the byte's tooltip
    assert hv.model.marks_at(5) == ["token count"] and hv.model.marks_at(9) == []
    hv.ensure_visible(5)
    cell = hv.model.cell_of(5)
    assert cell is not None
    row, col = cell
    assert "bookmark: token count" in hv.model.data(hv.model.index(row, col), Qt.ItemDataRole.ToolTipRole)
    # a click on the K rows' bookmark selects those bytes again
    hv.select_range(0, 1)
    qtbot.mouseClick(panel.table.viewport(), Qt.MouseButton.LeftButton,
                     pos=panel.table.visualRect(panel.model.index(1, 0)).center())
    assert hv.selection == (leaf.offset, leaf.offset + 64)
    assert w.doc.bus.current.offset == leaf.offset and w.doc.bus.current.length == 64
    w.doc.bookmarks.update(1, note="NaN injected here\nby the lab")
    assert "NaN injected" in panel.model.index(1, 3).data()
    # the hex menu offers bookmarking and the note of the bookmark under the cursor
    texts = [a.text() for a in hv.build_menu().actions()]
    assert any(t.startswith("Bookmark 64 bytes") for t in texts)
    assert any(t.startswith("Note on bookmark") for t in texts)
    # kept per file: the same file in a fresh window has them, another file none
    window.close_tab(window.tabs.currentIndex())
    w2 = open_doc(path, "llama")
    assert [(x.start, x.end, x.name, x.note) for x in w2.doc.bookmarks.items] == [
        (4, 8, "token count", "the header's n_token"), (leaf.offset, leaf.offset + 64, leaf.path,
                                                      "NaN injected here\nby the lab")]
    other = open_doc(_copy(tmp_path, "other.seqstate"), "llama")
    assert other.doc.bookmarks.items == [] and "No bookmarks" in other.hex.bookmarks.status.text()
    w2.doc.bookmarks.remove(0)
    assert len(w2.doc.bookmarks.items) == 1
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before  # nothing written to the input
    assert sorted(p.name for p in path.parent.iterdir()) == ["other.seqstate", "slot.seqstate"]  # no sidecar


def test_bookmarks_are_in_the_exported_report(qtbot, open_doc, window, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = _copy(tmp_path)
    w = open_doc(path, "llama")
    leaf = next(n for n in w.doc.index.leaves if n.kind == "v_rows")
    w.doc.bookmarks.add(leaf.offset, leaf.offset + 32, "V <b>rows</b> | odd", "check | these")
    dest = tmp_path / "report"
    with qtbot.waitSignal(window.exporter.finished, timeout=60000):
        window.export_report(str(dest))
    js = json.loads((dest / "report.json").read_text())
    assert js["bookmarks"] == [{"start": leaf.offset, "end": leaf.offset + 32, "length": 32,
                                "name": "V <b>rows</b> | odd", "note": "check | these", "node": leaf.path}]
    md = (dest / "report.md").read_text()
    assert "## Bookmarks" in md and f"{leaf.offset:,} (0x{leaf.offset:x})" in md
    assert "| V \\<b\\>rows\\</b\\> \\| odd |" in md and "check \\| these" in md  # escaped: the table holds
    html = (dest / "report.html").read_text()
    assert 'id="bookmarks"' in html and "V &lt;b&gt;rows&lt;/b&gt; | odd" in html and "<b>rows" not in html
