"""The lab matrix as a picture, drawn by the app's Lab view table (GUI thread).

The table is a ``QTableView`` over the Lab tab's own :class:`~kvscope.app.lab.model.LabMatrixModel`
and :class:`~kvscope.app.lab.model.OutcomeDelegate`, set up as :class:`~kvscope.app.lab.view.LabView`
sets up its table (fixed-width columns, wrapped text, rows as tall as their text), in the light
theme and sized to show every row and column without scroll bars.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QAbstractItemView, QFrame, QHeaderView, QTableView

from kvscope.app.base.tasks import TaskRunner
from kvscope.app.lab.model import OUTCOME_LEGEND, LabMatrixModel, OutcomeDelegate
from kvscope.app.lab.view import COLUMN_WIDTH
from kvscope.app.report.snapshot import dispose, grab, png_bytes, prepare, settle
from kvscope.core.analysis.verdict import plural
from kvscope.core.lab.report import LabRun
from kvscope.core.report.model import ReportImage

MIN_WIDTH = 400


def _table(run: LabRun) -> QTableView:
    model = LabMatrixModel()
    model.set_dark(False)
    model.set_run(run)
    table = QTableView()
    model.setParent(table)
    table.setModel(model)
    table.setItemDelegate(OutcomeDelegate(table))
    table.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
    table.setFocusPolicy(Qt.FocusPolicy.NoFocus)
    table.setWordWrap(True)
    table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Fixed)
    table.horizontalHeader().setDefaultSectionSize(COLUMN_WIDTH)
    table.verticalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    table.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    table.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    table.setFrameShape(QFrame.Shape.NoFrame)
    return table


def lab_matrix_image(run: LabRun, runner: TaskRunner, file: str = "lab-matrix.png") -> ReportImage:
    """Render ``run``'s matrix and encode it as a PNG."""
    table = _table(run)
    n_cols = len(run.policies) * len(run.readers)
    prepare(table, MIN_WIDTH, 300)
    settle(runner)
    vh, hh = table.verticalHeader(), table.horizontalHeader()
    table.resize(max(MIN_WIDTH, vh.width() + COLUMN_WIDTH * n_cols), hh.height() + vh.length())
    settle(runner)
    table.resize(table.width(), hh.height() + vh.length())  # rows re-measure once the width is final
    settle(runner)
    img = grab(table)
    dispose(table)
    sc = run.scenario
    restore = sc.get("restore", {})
    caption = (f"Restore {restore.get('name', '')} ({restore.get('api', '')}) into seq {sc.get('target')} of "
               f"{sc.get('name') or sc.get('arch')}: {plural(len(run.results), 'cell')} in {run.seconds:.1f} s. "
               "Each cell: "
               "return value · target sequence afterwards [pos_min,pos_max] · other sequences intact ✓/✗ · their "
               f"dense probe against the clean baseline (= identical). Colours, {OUTCOME_LEGEND}.")
    return ReportImage(file, "Lab matrix", caption, png_bytes(img), img.width(), img.height())
