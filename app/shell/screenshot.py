"""``kvscope gui --screenshot``: open, wait for the background work (and with ``--verify`` the verification),
pose a view, save the window as PNG."""

from __future__ import annotations

import os
import sys

from kvscope.app.document.verify_marks import verify_marks
from kvscope.app.report.snapshot import png_bytes
from kvscope.app.shell.document_widget import DocumentWidget
from kvscope.app.shell.lab_pose import pose_lab
from kvscope.app.shell.main_window import MainWindow
from kvscope.core.fsutil import write_atomic
from kvscope.core.reader.source import CHANGED_MESSAGE
from kvscope.core.textsafe import safe_text

TIMEOUT_MS = 60000


def pose(w: DocumentWidget, view: str | None) -> None:
    """Select something worth seeing in ``view`` (the first finding, a shared cell, a difference...)."""
    doc, idx = w.doc, w.doc.index
    res = doc.result
    if idx is None or res is None:
        return
    if view == "diff" and doc.diff is not None:
        w.show_view("diff")
        w.diff.step(1)
        return
    if view == "cells" and idx.tables:
        ref = max(idx.tables, key=lambda t: (w.cells.swa_state(t)[0], int((t.table.n_seq > 1).sum()),
                                             t.section.kind == "kv", t.table.count))
        shared = [i for i in range(ref.table.count) if int(ref.table.n_seq[i]) > 1]
        cell = shared[0] if shared else ref.table.count // 2
        doc.bus.select(idx.for_cell(ref.key, cell))
        if w.cells.swa_check.isEnabled():
            w.cells.swa_check.setChecked(True)
    elif view == "layers" and idx.records:
        bad = next((m.record for m in verify_marks(res, doc.verify) if m.status != "match" and m.record is not None),
                   None)
        if bad is None and doc.stats is not None:
            hit = next((ls for ls in doc.stats.layers if ls.n_nonfinite or ls.zero_rows), None)
            if hit is not None:
                bad = next((r for si, _, st, r in idx.records if si == hit.section_index and r.role == hit.role
                            and r.index == hit.index and (st.index if st is not None else None) == hit.stream), None)
        rec = bad or max((r for _, _, _, r in idx.records), key=lambda r: (r.role == "k", r.n_rows))
        doc.bus.select(idx.for_record(rec))
        if w.layers.heads_check.isEnabled():
            w.layers.heads_check.setChecked(True)
    elif view == "tokens" and res.tokens:
        doc.bus.select(idx.for_token(min(3, len(res.tokens) - 1)))
    elif view == "tree" and idx.records:
        last = res.sections[-1].all_layers() if res.sections else []
        rec = last[0] if last else idx.records[0][3]
        doc.bus.select(idx.for_record(rec))
        w.tree.tree.expand(w.tree.model.index_of(rec.node)) if rec.node is not None else None
    elif res.findings:
        w.findings.step(1)
        if view == "hex":
            w.show_view("hex")
    elif idx.records:
        rec = idx.records[0][3]
        target = rec.node.children[-1] if rec.node is not None and rec.node.children else None
        doc.bus.select(idx.for_offset(target.offset + 3) if target is not None else idx.for_record(rec))
    if view == "bytemap":
        hole = next((n for n in idx.leaves if n.status != "parsed"), None)
        if hole is not None:
            doc.bus.select(idx.for_node(hole))
    sel = doc.bus.current
    if view == "bytemap" and sel is not None:
        span = max(256.0, res.size / 6)
        w.bytemap.set_range(sel.offset - span / 2, sel.offset + span / 2)
    if view is not None:
        w.show_view(view)
    if view == "overview" and doc.verify:  # the build section (a measured answer in it), then the verification
        w.overview.browser.scrollToAnchor("builds")


def take_screenshot(win: MainWindow, out: str, view: str | None, diff: str | None, size: tuple[int, int],
                    lab_restore: str | None = None, verify: bool = False) -> int:
    """Render ``win`` once its documents are loaded; 0 on success, 2 when nothing could be saved.
    ``view`` lab runs a small matrix first (``lab_restore``: the state to restore); ``verify`` verifies the
    current file first (a verification that cannot run is reported and pictured)."""
    win.resize(*size)
    win.show()
    if not win.wait_idle(TIMEOUT_MS):
        print("kvscope: background work did not finish in time; saving what is shown", file=sys.stderr)
    w = win.current()
    if w is not None and verify:
        win.verify(w)
        win.wait_idle(TIMEOUT_MS)
        if w.doc.verify_error:
            print(f"kvscope: verify: {safe_text(w.doc.verify_error)}", file=sys.stderr)
    if w is not None and diff:
        win.compare_with(diff)
        win.wait_idle(TIMEOUT_MS)
    if w is not None and view == "lab":
        pose_lab(win, w, lab_restore)
        win.wait_idle(TIMEOUT_MS)
    elif w is not None:
        pose(w, view)
        win.wait_idle(TIMEOUT_MS)
    if w is not None and getattr(w.doc, "changed", None):  # read while it changed: the picture would lie
        print(f"kvscope: {safe_text(w.doc.path)}: {CHANGED_MESSAGE}", file=sys.stderr)
        return 2
    folder = os.path.dirname(os.path.abspath(out))
    try:
        os.makedirs(folder, exist_ok=True)
        write_atomic(out, png_bytes(win.grab().toImage()), "screenshot")
    except OSError as e:
        print(f"kvscope: cannot write {safe_text(out)}: {e.strerror or e}", file=sys.stderr)
        return 2
    print(out)
    return 0
