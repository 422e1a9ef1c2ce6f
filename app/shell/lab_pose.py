"""``kvscope gui --screenshot OUT --view lab``: run a small lab matrix on the open file and pose a telling cell.

The open file is the live context (a whole-context state; inside a lab scenario folder the clean blob
of sequence 0 is restored by default) or, with ``--lab-restore``, any state file is restored into it.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvscope.app.shell.document_widget import DocumentWidget
    from kvscope.app.shell.main_window import MainWindow

TIMEOUT_MS = 60000
# the cell pictured, first present wins: a late failure that the legacy policy leaves half-applied
POSE_CELLS = (("nan_rows_late_fail", "legacy", "buffer"), ("nan_rows_valid", "contained", "buffer"))


def pose_lab(win: MainWindow, w: DocumentWidget, restore: str | None = None) -> None:
    """Show the Lab tab (which folds the structure tree away), run the whole matrix, select a cell."""
    w.show_view("lab")
    lab = w.lab
    if restore:
        lab.controls.set_restore(restore)
    lab.load_scenario()
    win.wait_idle(TIMEOUT_MS)
    if lab.ready is None:
        print(f"kvscope: the lab has no scenario: {lab.error or lab.unavailable() or lab.summary.text()}",
              file=sys.stderr)
        return
    lab.controls.check_cases(None)  # the whole catalog: every row and column fits at 1280x800
    if lab.run_matrix() is None:
        print(f"kvscope: the lab did not run: {lab.error}", file=sys.stderr)
        return
    win.wait_idle(TIMEOUT_MS)
    for cell in POSE_CELLS:
        if lab.select_cell(*cell) is not None:
            break
    else:
        if lab.model.rowCount() and lab.model.columnCount():
            lab.table.setCurrentIndex(lab.model.index(0, 0))
