"""Corrupt from the hex view (issue 19 item 14): select bytes, "Corrupt … into a copy" with zero / NaN /
random / drop writes a new file (never the input, a name the user confirms, atomically), which opens in
a new tab headed by what was done, with Verify and Send to the Lab one click away. NaN and drop inside a
record go through the lab's corruption code (the record's own NaN pattern; the whole record dropped).

The tests marked ``xserver`` also run in a real X server (test_gui_xserver.py).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import Qt

from kvscope.app.document.corrupt_copy import corrupt_range, default_copy_name, write_copy
from kvscope.core.analysis.record_values import layer_matrix
from kvscope.core.lab.corruptions import CorruptionError
from kvscope.core.reader.parse import read_state
from tests.support.gui_helpers import LAB

SOURCE = LAB / "seq0.clean.seqstate"


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _k1(doc):  # type: ignore[no-untyped-def]
    return next(r for _, r in doc.result.layer_records() if r.role == "k" and r.il == 1)


def test_modes_on_bytes_and_records(tmp_path) -> None:  # type: ignore[no-untyped-def]
    data = SOURCE.read_bytes()
    res = read_state(SOURCE)
    rec = next(r for _, r in res.layer_records() if r.role == "v" and r.il == 0)
    assert rec.transposed  # V stored by channel: the selection's bytes are of cells 1 and 2 in channel 0
    a = rec.data_offset + rec.el_bytes + 1
    b = rec.data_offset + 3 * rec.el_bytes - 1
    z = corrupt_range(data, res, None, a, b, "zero")
    assert z.data[a:b] == bytes(b - a) and z.data[:a] == data[:a] and z.data[b:] == data[b:] and z.spec is None
    r1, r2 = corrupt_range(data, res, None, a, b, "random", 7), corrupt_range(data, res, None, a, b, "random", 7)
    assert r1.data == r2.data != data and len(r1.data) == len(data) and "seed 7" in r1.description
    nan = corrupt_range(data, res, None, a, b, "nan")
    assert nan.spec is not None and nan.spec.startswith("fill:value=nan") and nan.spec.endswith("cells=1-2")
    again = read_state(data=nan.data)
    m = layer_matrix(again, next(r for _, r in again.layer_records() if r.role == "v" and r.il == 0), data=nan.data)
    assert np.isnan(m[1:3]).all() and np.isfinite(m[[0, *range(3, m.shape[0])]]).all()
    drop = corrupt_range(data, res, None, a, b, "drop")
    assert drop.spec is not None and len(drop.data) == len(data) - rec.size
    assert corrupt_range(data, res, None, 0, 4, "drop").data == data[4:]  # not in a record: exactly those bytes
    with pytest.raises(CorruptionError, match="NaN needs bytes inside one"):
        corrupt_range(data, res, None, 0, 4, "nan")
    # the copy never replaces the input or an existing file
    with pytest.raises(CorruptionError, match="input file"):
        write_copy(str(SOURCE), str(SOURCE), z)
    (tmp_path / "taken").write_bytes(b"x")
    with pytest.raises(CorruptionError, match="exists"):
        write_copy(str(SOURCE), str(tmp_path / "taken"), z)
    out = write_copy(str(SOURCE), str(tmp_path / "z.seqstate"), z)
    assert Path(out).read_bytes() == z.data and sorted(os.listdir(tmp_path)) == ["taken", "z.seqstate"]
    assert default_copy_name(str(SOURCE), "nan", 16, 32) == str(LAB / "seq0.clean.nan-10-20.seqstate")


@pytest.mark.xserver
def test_corrupt_nan_from_the_hex_view_opens_the_copy(qtbot, open_doc, window, tmp_path) -> None:  # type: ignore[no-untyped-def]
    before = _sha(SOURCE)
    w = open_doc(SOURCE, "llama")
    w.show_view("hex")
    rec = _k1(w.doc)
    hv = w.hex
    hv.select_range(rec.data_offset + 3, rec.data_offset + rec.row_bytes + 1)  # cells 0 and 1 of K layer 1
    assert any(a.text().startswith("Corrupt 126 bytes into a copy") for a in hv.build_menu().actions())
    dlg = hv.corrupt_selection()
    qtbot.addWidget(dlg)
    ok = dlg.buttons.button(dlg.buttons.StandardButton.Ok)
    assert dlg.mode() == "nan" and "cells 0-1 of K layer 1 NaN" in dlg.plan.text()
    assert dlg.dest() == default_copy_name(str(SOURCE), "nan", rec.data_offset + 3, rec.data_offset + rec.row_bytes + 1)
    dlg.name_edit.setText(str(SOURCE))  # the input itself: refused
    assert not ok.isEnabled() and "input file" in dlg.problem.text()
    dest = tmp_path / "k1-nan.seqstate"
    dlg.name_edit.setText(str(dest))
    dlg.set_mode("zero")
    assert dlg.dest() == str(dest)  # a name the user gave stays when the mode changes
    dlg.set_mode("nan")
    assert ok.isEnabled()
    qtbot.mouseClick(ok, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.current() is not None and window.current() is not w
                    and window.current().doc.result is not None and not window.current().doc.busy, timeout=20000)
    nw = window.current()
    assert nw.doc.path == str(dest) and nw.doc.model_path == w.doc.model_path
    banner = nw.corrupted_banner
    assert banner.isVisible() and "Corrupted copy of seq0.clean.seqstate" in banner.label.text()
    m = layer_matrix(nw.doc.result, _k1(nw.doc))
    assert np.isnan(m[:2]).all() and np.isfinite(m[2:]).all()
    assert _sha(SOURCE) == before and sorted(os.listdir(tmp_path)) == ["k1-nan.seqstate", "kvscope.ini"]
    # one click to the Lab: the copy is the state to restore, into the scenario its source sits in
    qtbot.mouseClick(nw.corrupted_banner.lab_button, Qt.MouseButton.LeftButton)
    assert nw.tabs.currentWidget() is nw.lab
    assert nw.lab.controls.restore_path == str(dest) and nw.lab.controls.live_path == str(LAB)
    # one click to Verify it
    qtbot.mouseClick(nw.corrupted_banner.verify_button, Qt.MouseButton.LeftButton)
    assert nw.doc.verifying or nw.doc.verify_error is not None
    nw.doc.cancel_verify()
    qtbot.waitUntil(lambda: not nw.doc.verifying, timeout=60000)


def test_corrupt_drop_a_record_and_zero_a_header(qtbot, open_doc, window, tmp_path) -> None:  # type: ignore[no-untyped-def]
    w = open_doc(SOURCE, "llama")
    rec = _k1(w.doc)
    w.hex.select_range(rec.data_offset + 10, rec.data_offset + 20)
    task = w.hex.write_corrupted("drop", str(tmp_path / "dropped.seqstate"))
    qtbot.waitUntil(lambda: task.done, timeout=20000)
    qtbot.waitUntil(lambda: window.current().doc.path.endswith("dropped.seqstate")
                    and window.current().doc.result is not None and not window.current().doc.busy, timeout=20000)
    nw = window.current()
    assert os.path.getsize(nw.doc.path) == os.path.getsize(SOURCE) - rec.size
    assert "removed the K layer 1 record" in nw.corrupted_banner.label.text()
    assert nw.doc.result.n_errors > 0  # the reader sees the missing record
    w.hex.select_range(0, 4)
    task = w.hex.write_corrupted("zero", str(tmp_path / "zero-magic.seqstate"))
    qtbot.waitUntil(lambda: task.done, timeout=20000)
    assert (tmp_path / "zero-magic.seqstate").read_bytes()[:4] == bytes(4)
    # the copy's tab reads it in the background: let it finish, or its progress lines race the refusal's
    qtbot.waitUntil(lambda: window.current().doc.path.endswith("zero-magic.seqstate")
                    and window.current().doc.compat is not None and not window.current().doc.busy, timeout=20000)
    assert window.wait_idle(20000)
    w.hex.select_range(0, 4)
    assert w.hex.write_corrupted("zero", str(SOURCE)) is not None  # refused in the job: the input stays
    qtbot.waitUntil(lambda: "Cannot write the copy" in window.statusBar().currentMessage(), timeout=20000)
