"""The Lab view's result matrix: a table model over a :class:`~kvscope.core.lab.report.LabRun`, the colour
of each cell's outcome, the texts of its tooltip and detail pane, and the atomic export.

Rows are cases (corruptions), columns policy × reader. A cell shows the Markdown matrix's text without its
first field, the restore call's return value (:func:`short_text`: target state, others, probe), on the colour
of its outcome, so every column of the catalog fits a wide screen; the tooltip and the detail pane give all.
A run in a real engine has one column for the engine (``llama.cpp b11434 · buffer``) and, with ``both``,
one for the core (``contained · buffer``); a case where the two disagree has both its cells framed and
marked ``≠``, its row header too, and the tooltip says what differed (:meth:`LabMatrixModel.set_engine_run`).
Imports only the lab's report module (plain dataclasses), never torch.
"""

from __future__ import annotations

import json
import math
import re
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, Qt
from PySide6.QtGui import QColor, QPainter, QPen
from PySide6.QtWidgets import QStyle, QStyledItemDelegate, QStyleOptionViewItem

from kvscope.app.lab.engine_jobs import by_case, disagreement_text, engine_lines
from kvscope.core.analysis.verdict import plural
from kvscope.core.fsutil import write_atomic
from kvscope.core.lab.report import CellResult, LabRun, cell_text, diff_text, render_markdown, run_to_json

if TYPE_CHECKING:
    from kvscope.core.lab.engine_cells import Disagreement, EngineCell
    from kvscope.core.lab.engine_lab import EngineRun

Index = QModelIndex | QPersistentModelIndex
CELL_ROLE = Qt.ItemDataRole.UserRole + 1  # the CellResult (None: not run)
OUTCOME_ROLE = Qt.ItemDataRole.UserRole + 2  # ok / degraded / poisoned / na
DISAGREE_ROLE = Qt.ItemDataRole.UserRole + 3  # the case's disagreements between the core and the engine
DISAGREE_COLORS = {False: "#7b1fa2", True: "#e040fb"}  # the frame of a disagreeing case (light / dark)
DISAGREE_MARK = "≠ "
DISAGREE_LEGEND = "≠ and a purple frame: the core and the engine disagree on this case (the tooltip says how)"

OUTCOMES = ("ok", "degraded", "poisoned", "na")
OUTCOME_COLORS: dict[bool, dict[str, str]] = {  # dark theme? -> outcome -> background
    False: {"ok": "#c7e9c0", "degraded": "#fdd9a0", "poisoned": "#f4b6b6", "na": "#dcdcdc"},
    True: {"ok": "#2d5a32", "degraded": "#6e5318", "poisoned": "#7a2d2d", "na": "#4a4a4e"},
}
OUTCOME_LEGEND = ("green: target unchanged or restored, others intact with finite probes · amber: target removed "
                  "or changed, others intact · red: another sequence not intact or poisoned (non-finite dense or "
                  "real-logits probe) · grey: short-read hazard or error")


def outcome(r: CellResult) -> str:
    """The colour class of a cell (see :data:`OUTCOME_LEGEND`)."""
    if r.error is not None or r.hazard:
        return "na"
    if r.others_intact is False or any(not math.isfinite(_main_probe(o.probe_diff)) for o in r.others.values()):
        return "poisoned"
    if r.target.state in ("removed", "changed"):
        return "degraded"
    return "ok"


def _main_probe(d: dict[str, float]) -> float:
    """The probe that decides the colour: the core's dense kernel, or an engine's real next-token logits."""
    return d.get("dense", d.get("logits", 0.0))


def matrix_text(r: CellResult | None) -> str:
    """The Markdown matrix cell's text without its emphasis markers (``**NaN**`` -> ``NaN``)."""
    return cell_text(r).replace("**", "")


_RANGE = re.compile(r" \[-?\d+,-?\d+\]")


def short_text(r: CellResult | None) -> str:
    """The matrix cell's text in the table: ``restored ✓ =`` (the Markdown cell without the return value and
    the target's position range, which the tooltip and detail pane give: a dense matrix fits a laptop
    screen), ``error`` or ``⚠ short read``."""
    if r is None:
        return "–"
    if r.error is not None:
        return "error"
    if r.hazard:
        return "⚠ short read"
    parts = matrix_text(r).split(" · ")
    text = " ".join(parts[1:]) if len(parts) >= 4 else matrix_text(r)
    return _RANGE.sub("", text, count=1)


def probe_text(d: float | None) -> str:
    """A probe difference as the detail pane shows it (the matrix's wording, more digits)."""
    return diff_text(d, nonfinite="NaN/Inf", digits=4)


def restore_line(r: CellResult) -> str:
    """The restore call in one line: return value, bytes read, failed check and its offset."""
    x = r.restore
    ret = str(x.returned).lower() if isinstance(x.returned, bool) else str(x.returned)
    parts = [f"returned {ret}"]
    if x.bytes is not None:
        parts.append(f"{x.bytes:,} bytes read")
    if x.failed_check:
        where = f" at offset {x.offset:,} (0x{x.offset:x})" if x.offset is not None else ""
        parts.append(f"failed check {x.failed_check}{where}" + (f" in {x.section}" if x.section else ""))
    else:
        parts.append("all checks passed" if x.ok else "failed")
    return " · ".join(parts)


def target_line(r: CellResult) -> str:
    t = r.target
    return f"target seq {t.seq}: {t.state} [{t.pos_min},{t.pos_max}]"


def others_line(r: CellResult) -> str:
    if not r.others:
        return "others: none live"
    items = []
    for s, o in r.others.items():
        probes = ", ".join(f"{k} {probe_text(v)}" for k, v in o.probe_diff.items())
        items.append(f"seq {s} {'intact' if o.intact else 'NOT intact'} [{o.pos_min},{o.pos_max}]"
                     + (f" (probe {probes})" if probes else ""))
    return "others: " + "; ".join(items)


def stale_line(r: CellResult) -> str:
    if r.stale_cells is None:
        return "stale cells: not measured"
    by = ", ".join(f"{role} {n}" for role, n in r.stale_by_component.items() if n)
    text = f"stale cells: {r.stale_cells}" + (f" ({r.stale_nonfinite} non-finite)" if r.stale_nonfinite else "")
    return text + (f" · {by}" if by and len(r.stale_by_component) > 1 else "")


def tooltip(r: CellResult) -> str:
    """The cell's tooltip: what ran, the failed check and offset, target, others, stale cells."""
    lines = [f"{r.corruption} · {r.policy} · {r.reader}: {matrix_text(r)}", r.description,
             "restore: " + restore_line(r)]
    if r.restore.message:
        lines.append("  " + r.restore.message)
    if r.error is not None:
        lines.append("error: " + r.error)
        return "\n".join(lines)
    if not r.hazard:
        lines += [target_line(r), others_line(r), stale_line(r)]
        if r.recovered is not None:
            lines.append("a clean restore afterwards " + ("brings the target back" if r.recovered
                                                          else "does NOT bring the target back"))
    return "\n".join(lines)


def detail_text(r: CellResult, before: dict[str, int] | None = None) -> str:
    """The detail pane's text for one cell; ``before`` maps component role -> the target's cells before."""
    x = r.restore
    lines = [f"{r.corruption} · {r.policy} · {r.reader}", r.description, "", "Restore: " + restore_line(r)]
    if x.message:
        lines.append("  " + x.message)
    if x.actions:
        lines.append("  actions: " + "; ".join(x.actions))
    if r.error is not None:
        lines += ["", "Error: " + r.error]
        return "\n".join(lines)
    if r.hazard:
        return "\n".join(lines)
    t = r.target
    lines += ["", _upper_first(target_line(r))]
    for role, c in t.components.items():
        was = f" (before: {before[role]})" if before is not None and role in before else ""
        lines.append(f"  {role}: {c.state}, {plural(c.n_cells, 'cell')}{was}, positions [{c.pos_min},{c.pos_max}]")
    if t.probe_diff:
        lines.append("  probe: " + ", ".join(f"{k} {probe_text(v)}" for k, v in t.probe_diff.items()))
    lines += ["", _upper_first(others_line(r)), "", _upper_first(stale_line(r))]
    if r.recovered is not None:
        lines.append("Recovered by a clean restore: " + ("yes" if r.recovered else "no"))
    return "\n".join(lines)


def _upper_first(text: str) -> str:
    return text[:1].upper() + text[1:]


# ---------------------------------------------------------------------------------------------
# export


def export_text(run: LabRun, fmt: str, engine_run: EngineRun | None = None) -> str:
    """What ``kvscope lab --json`` (``fmt`` json) or ``--markdown`` prints for ``run`` (``engine_run``: what
    ``kvscope lab --engine ...`` prints for that run)."""
    if engine_run is not None:
        from kvscope.core.lab.engine_report import engine_run_to_json, render_engine_markdown

        text = json.dumps(engine_run_to_json(engine_run), indent=1) if fmt == "json" \
            else render_engine_markdown(engine_run)
    else:
        text = json.dumps(run_to_json(run), indent=1) if fmt == "json" else render_markdown(run)
    return text if text.endswith("\n") else text + "\n"


def export_run(run: LabRun, path: str, engine_run: EngineRun | None = None) -> str:
    """Save ``run`` atomically, as JSON when ``path`` ends in ``.json``, else Markdown; returns the format."""
    fmt = "json" if path.lower().endswith(".json") else "markdown"
    write_atomic(path, export_text(run, fmt, engine_run), prefix=".kvscope-lab-")
    return fmt


def combined_run(er: EngineRun) -> LabRun:
    """One matrix of an engine run: the engine's column, then (``both``) the core's."""
    run = er.run
    if er.torch is None:
        return run
    t = er.torch
    return LabRun(run.scenario, run.cases, run.skipped, (*run.policies, *t.policies), run.readers,
                  [*run.results, *t.results], run.cancelled or t.cancelled, run.seconds)


# ---------------------------------------------------------------------------------------------
# the table model


class LabMatrixModel(QAbstractTableModel):
    """Cases × (policy, reader); cells fill in as results arrive (:meth:`add_result`) or all at once."""

    def __init__(self, parent: Any = None) -> None:
        super().__init__(parent)
        self.cases: list[tuple[str, str]] = []
        self.columns: list[tuple[str, str]] = []
        self.cells: dict[tuple[str, str, str], CellResult] = {}
        self.disagreements: dict[str, list[Disagreement]] = {}  # case -> what the core and the engine disagree on
        self.engine_cells: dict[str, EngineCell] = {}  # case -> the engine's cell (crash, poisoned-slot check)
        self.engine_name = "llama.cpp"
        self.both = False  # the matrix is a ``both`` run: the core's column beside the engine's
        self.dark = False
        self.grow = False  # add the column of a result that arrives for none (an engine run's labels)

    def set_layout(self, cases: list[tuple[str, str]], policies: tuple[str, ...], readers: tuple[str, ...],
                   grow: bool = False) -> None:
        """An empty matrix with these rows and columns (``grow``: columns come with the results)."""
        self.beginResetModel()
        self.cases = list(cases)
        self.columns = [(p, r) for p in policies for r in readers]
        self.cells = {}
        self.disagreements, self.engine_cells = {}, {}
        self.grow, self.both = grow, False
        self.endResetModel()

    def set_engine_run(self, er: EngineRun, disagreements: list[Disagreement] | None = None) -> None:
        """Show an engine run: its engine's column, the core's with ``both``, the disagreements
        (``disagreements`` replaces the run's own, for a view test)."""
        self.set_run(combined_run(er))
        dis, cells = by_case(er)
        if disagreements is not None:
            dis = {}
            for d in disagreements:
                dis.setdefault(d.case, []).append(d)
        self.disagreements, self.engine_cells = dis, cells
        self.both = er.torch is not None
        kind = str(er.engine.get("kind") or "llama.cpp")
        self.engine_name = "llama-server" if kind == "server" else kind
        if self.cases:
            self.headerDataChanged.emit(Qt.Orientation.Vertical, 0, len(self.cases) - 1)

    def disagreement_lines(self, case: str) -> list[str]:
        return [disagreement_text(d, self.engine_name) for d in self.disagreements.get(case, [])]

    def set_run(self, run: LabRun | None) -> None:
        """Show ``run`` (None: nothing)."""
        self.beginResetModel()
        self.disagreements, self.engine_cells = {}, {}
        self.grow, self.both = False, False
        if run is None:
            self.cases, self.columns, self.cells = [], [], {}
        else:
            self.cases = list(run.cases)
            self.columns = [(p, r) for p in run.policies for r in run.readers]
            self.cells = {(c.corruption, c.policy, c.reader): c for c in run.results}
        self.endResetModel()

    def add_result(self, r: CellResult) -> None:
        """One finished cell (ignored when its row or column is not in the matrix)."""
        rows = [n for n, _ in self.cases]
        if r.corruption in rows and self.grow and (r.policy, r.reader) not in self.columns:
            n = len(self.columns)
            self.beginInsertColumns(QModelIndex(), n, n)
            self.columns.append((r.policy, r.reader))
            self.endInsertColumns()
        if r.corruption not in rows or (r.policy, r.reader) not in self.columns:
            return
        self.cells[(r.corruption, r.policy, r.reader)] = r
        i = self.index(rows.index(r.corruption), self.columns.index((r.policy, r.reader)))
        self.dataChanged.emit(i, i)

    def set_dark(self, dark: bool) -> None:
        self.dark = dark
        if self.cases and self.columns:
            self.dataChanged.emit(self.index(0, 0), self.index(len(self.cases) - 1, len(self.columns) - 1))

    def cell(self, row: int, col: int) -> CellResult | None:
        if not (0 <= row < len(self.cases) and 0 <= col < len(self.columns)):
            return None
        p, rd = self.columns[col]
        return self.cells.get((self.cases[row][0], p, rd))

    def position(self, case: str, policy: str, reader: str) -> tuple[int, int] | None:
        """(row, column) of a cell, or None."""
        rows = [n for n, _ in self.cases]
        if case not in rows or (policy, reader) not in self.columns:
            return None
        return rows.index(case), self.columns.index((policy, reader))

    def engine_extra(self, r: CellResult) -> list[str]:
        """What only the engine tells about ``r``'s case, when ``r`` is the engine's cell."""
        cell = self.engine_cells.get(r.corruption)
        return engine_lines(cell) if cell is not None and cell.result is r else []

    def tooltip(self, r: CellResult) -> str:
        """The cell's tooltip, with what the engine tells and the case's disagreements."""
        text = tooltip(r)
        extra = self.engine_extra(r)
        if extra:
            text += "\n" + "\n".join(extra)
        lines = self.disagreement_lines(r.corruption)
        if lines:
            text += (f"\n\n≠ the core and {self.engine_name} disagree on this case:\n"
                     + "\n".join(f"  {x}" for x in lines))
        return text

    def detail_extra(self, r: CellResult) -> str:
        """Lines the detail pane adds for an engine run's cell (empty for a core-only run)."""
        lines = [*self.engine_extra(r)]
        dis = self.disagreement_lines(r.corruption)
        if dis:
            lines += ["", f"≠ The core and {self.engine_name} disagree on this case:"] + [f"  {x}" for x in dis]
        elif self.both:
            lines += ["", f"The core and {self.engine_name} agree on this case (return value, target, other "
                      "sequences, the state afterwards byte for byte)."]
        return "\n".join(lines)

    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.cases)

    def columnCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.columns)

    def headerData(self, section: int, orientation: Qt.Orientation,
                   role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if orientation == Qt.Orientation.Horizontal and 0 <= section < len(self.columns):
            if role == Qt.ItemDataRole.DisplayRole:  # two lines: the matrix is as wide as its cells
                return "{}\n{}".format(*self.columns[section])
            if role == Qt.ItemDataRole.ToolTipRole:
                return "policy {} · reader {}".format(*self.columns[section])
        elif orientation == Qt.Orientation.Vertical and 0 <= section < len(self.cases):
            name = self.cases[section][0]
            if role == Qt.ItemDataRole.DisplayRole:
                return (DISAGREE_MARK if name in self.disagreements else "") + name
            if role == Qt.ItemDataRole.ToolTipRole:
                lines = self.disagreement_lines(name)
                return self.cases[section][1] + ("\n\nThe core and the engine disagree:\n" + "\n".join(lines)
                                                 if lines else "")
            if role == Qt.ItemDataRole.ForegroundRole and name in self.disagreements:
                return QColor(DISAGREE_COLORS[self.dark])
        return None

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        r = self.cell(index.row(), index.column())
        if role == CELL_ROLE:
            return r
        if r is None:
            return None
        if role == DISAGREE_ROLE:
            return self.disagreements.get(r.corruption, [])
        if role == Qt.ItemDataRole.DisplayRole:
            return (DISAGREE_MARK if r.corruption in self.disagreements else "") + short_text(r)
        if role == OUTCOME_ROLE:
            return outcome(r)
        if role == Qt.ItemDataRole.BackgroundRole:
            return QColor(OUTCOME_COLORS[self.dark][outcome(r)])
        if role == Qt.ItemDataRole.ToolTipRole:
            return self.tooltip(r)
        if role == Qt.ItemDataRole.TextAlignmentRole:
            return int(Qt.AlignmentFlag.AlignCenter)
        return None


class OutcomeDelegate(QStyledItemDelegate):
    """Paints a selected matrix cell on its outcome colour inside a frame (the selection colour would hide it)."""

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: Index) -> None:
        selected = bool(option.state & QStyle.StateFlag.State_Selected)
        opt = QStyleOptionViewItem(option)
        opt.state = opt.state & ~QStyle.StateFlag.State_Selected
        super().paint(painter, opt, index)
        model = index.model()
        if index.data(DISAGREE_ROLE):
            dark = bool(getattr(model, "dark", False))
            painter.save()
            painter.setPen(QPen(QColor(DISAGREE_COLORS[dark]), 3, Qt.PenStyle.DashLine))
            painter.drawRect(option.rect.adjusted(2, 2, -3, -3))
            painter.restore()
        if selected:
            painter.save()
            painter.setPen(QPen(option.palette.highlight().color(), 3))
            painter.drawRect(option.rect.adjusted(1, 1, -2, -2))
            painter.restore()
