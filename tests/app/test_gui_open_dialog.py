"""The Open dialog (issue 19 items 11 and 15): a slot file saved without an extension (llama-server names
it as the user asks) is listed by the default filter, recognised by its first bytes; other files are
not; "All files" shows everything; the Type column names each state file's kind, not "unknown"; what is
chosen opens. The files' kinds come from their heads only (no file is written to).

The tests marked ``xserver`` also run in a real X server (test_gui_xserver.py).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtWidgets import QFileSystemModel, QLineEdit

from kvscope.app.document.file_kind import KIND_TITLES, head_kind, sniff_kind
from kvscope.app.shell.open_dialog import ALL_FILTER, BY_CONTENT_FILTER, StateFileDialog
from tests.support.gui_helpers import LAB, STATE


def _folder(tmp_path: Path) -> Path:
    d = tmp_path / "slots"
    d.mkdir()
    shutil.copy(LAB / "seq0.clean.seqstate", d / "chat1")  # a llama-server slot save, named by the user
    shutil.copy(STATE / "llama-q8_0-fa1-unified0-ctx.session", d / "a.session")
    shutil.copy(LAB / "seq0.clean.seqdata.bin", d / "blob")
    (d / "notes").write_text("shopping: milk\n")
    (d / "noise").write_bytes(np.random.default_rng(15).integers(0, 256, 512, dtype=np.uint8).tobytes())
    (d / "empty").write_bytes(b"")
    (d / "sub").mkdir()
    return d


def _listed(dlg: StateFileDialog, folder: Path) -> dict[str, str]:
    """name -> Type column text of what the dialog's list shows in ``folder``."""
    fs = dlg.findChild(QFileSystemModel)
    root = dlg.proxy.mapFromSource(fs.index(str(folder)))
    out = {}
    for r in range(dlg.proxy.rowCount(root)):
        name = dlg.proxy.index(r, 0, root).data()
        out[name] = dlg.proxy.index(r, 2, root).data()
    return out


def test_kinds_by_first_bytes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    d = _folder(tmp_path)
    assert sniff_kind(d / "chat1") == "seq_file" and sniff_kind(d / "a.session") == "session_file"
    assert sniff_kind(d / "blob") == "seq_blob"
    for name in ("notes", "noise", "empty", "sub"):
        assert sniff_kind(d / name) is None, name
    assert sniff_kind(STATE / "tiny-llama.gguf") is None and head_kind(b"ab") is None
    assert sniff_kind(tmp_path / "missing") is None


@pytest.mark.xserver
def test_open_dialog_shows_extensionless_slot_files_by_content(qtbot, window, tmp_path) -> None:  # type: ignore[no-untyped-def]
    d = _folder(tmp_path)
    window.settings.set_last_dir(str(d))
    dlg = window.open_dialog()
    qtbot.addWidget(dlg)
    assert dlg.selectedNameFilter() == BY_CONTENT_FILTER
    qtbot.waitUntil(lambda: {"chat1", "a.session", "blob", "sub"} <= set(_listed(dlg, d)), timeout=10000)
    qtbot.waitUntil(lambda: _listed(dlg, d)["chat1"] == KIND_TITLES["seq_file"], timeout=10000)
    listed = _listed(dlg, d)
    assert set(listed) == {"chat1", "a.session", "blob", "sub"}, listed  # no notes, noise, empty
    assert listed["a.session"] == KIND_TITLES["session_file"] and listed["blob"] == KIND_TITLES["seq_blob"]
    assert "unknown" not in {listed[n] for n in ("chat1", "a.session", "blob")}
    dlg.selectNameFilter(ALL_FILTER)
    dlg.filterSelected.emit(ALL_FILTER)
    qtbot.waitUntil(lambda: {"notes", "noise", "empty"} <= set(_listed(dlg, d)), timeout=10000)
    dlg.selectNameFilter(BY_CONTENT_FILTER)
    dlg.filterSelected.emit(BY_CONTENT_FILTER)
    qtbot.waitUntil(lambda: "notes" not in _listed(dlg, d), timeout=10000)
    name_edit = dlg.findChild(QLineEdit, "fileNameEdit")  # typed, as a user does (selectFile keeps a focused edit)
    name_edit.setText("chat1")
    assert dlg.selectedFiles() == [str(d / "chat1")]
    dlg.accept()
    qtbot.waitUntil(lambda: window.current() is not None and window.current().doc.result is not None,
                    timeout=15000)
    assert window.current().doc.path.endswith("chat1") and window.current().doc.result.kind == "seq_file"


def test_compare_dialog_takes_an_extensionless_slot_file(qtbot, open_doc, window, tmp_path) -> None:  # type: ignore[no-untyped-def]
    d = _folder(tmp_path)
    w = open_doc(LAB / "nan_rows_valid.seqdata.bin", "llama")
    window.compare_with(None, w)
    dlg = window.findChild(StateFileDialog)
    assert dlg is not None and dlg.isVisible() and dlg.fileMode() == dlg.FileMode.ExistingFile
    dlg.setDirectory(str(d))
    dlg.findChild(QLineEdit, "fileNameEdit").setText("chat1")
    dlg.accept()
    qtbot.waitUntil(lambda: w.doc.diff is not None and not w.doc.busy, timeout=15000)
    assert w.doc.diff.other_path.endswith("chat1")
