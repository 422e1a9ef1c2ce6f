"""Findings: a sortable, filterable table; a click jumps to the bytes and the node.

Ctrl+C copies the selected findings (tab-separated, as shown); the context menu copies a finding's
offset or message, shows its bytes in the hex view; Export saves the table as CSV or the view as PNG.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtCore import (
    QItemSelectionModel,
    QModelIndex,
    QPersistentModelIndex,
    QSortFilterProxyModel,
    Qt,
    Signal,
)
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLineEdit,
    QMenu,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from kvscope.app.base.shortcuts import pass_window_shortcuts
from kvscope.app.base.theme import SEVERITY_COLORS
from kvscope.app.base.widgets import plain_label
from kvscope.app.document.doc_index import Selection
from kvscope.app.document.document import Document
from kvscope.app.views.export import CsvTable, doc_export_button
from kvscope.app.views.row_model import RIGHT, RowTableModel
from kvscope.app.views.table_tools import (
    copy_text,
    install_copy,
    install_menu,
    rows_text,
    selected_rows,
    step_row,
)
from kvscope.core.analysis.measured import measured_message
from kvscope.core.findings import SEVERITY_RANK, Finding
from kvscope.core.reader.record_names import label_of
from kvscope.core.reader.tree import Node

Index = QModelIndex | QPersistentModelIndex
SORT_ROLE = Qt.ItemDataRole.UserRole + 1
FINDING_ROLE = Qt.ItemDataRole.UserRole + 2
COLUMNS = ("severity", "code", "offset", "length", "layer", "message")


class FindingsModel(RowTableModel[Finding]):
    """A snapshot of the document's findings (refreshed when statistics add some)."""

    columns = COLUMNS

    verify: dict[str, Any] | None = None  # the document's Verify result: a record it names replaces the guess

    @property
    def findings(self) -> list[Finding]:
        return self.rows

    def set_findings(self, findings: list[Finding], verify: dict[str, Any] | None = None) -> None:
        self.verify = verify
        self.set_rows(findings)

    def message(self, f: Finding) -> str:
        """The finding's message, with what Verify measured in place of the reader's guess it measured."""
        return measured_message(f, self.verify) or f.message

    def cell(self, f: Finding, col: str, role: int) -> Any:
        if role == Qt.ItemDataRole.DisplayRole:
            return {
                "severity": f.severity, "code": f.code, "offset": f"{f.offset:,}", "length": f"{f.length:,}",
                "layer": f.layer_text(), "message": self.message(f),
            }[col]
        if role == SORT_ROLE:
            return {
                "severity": SEVERITY_RANK.get(f.severity, 0), "code": f.code, "offset": f.offset,
                "length": f.length, "layer": -1 if f.layer is None else f.layer, "message": self.message(f),
            }[col]
        if role == FINDING_ROLE:
            return f
        if role == Qt.ItemDataRole.ToolTipRole:
            return (f"{f.severity} {f.code} @{f.offset:,} (0x{f.offset:x}), {f.length:,} bytes\n{f.path}\n"
                    + self.message(f))
        if role == Qt.ItemDataRole.ForegroundRole and col == "severity":
            return QColor(SEVERITY_COLORS.get(f.severity, "#808080"))
        if role == Qt.ItemDataRole.TextAlignmentRole and col in ("offset", "length", "layer"):
            return RIGHT
        return None


class FindingsFilter(QSortFilterProxyModel):
    """Keeps findings at or above a severity whose code, message (as shown: what Verify measured in place of
    the reader's guess) or path contains the filter text."""

    def __init__(self, parent: Any = None) -> None:
        super().__init__(parent)
        self.min_rank = 0
        self.text = ""
        self.setSortRole(SORT_ROLE)

    def set_filter(self, min_rank: int, text: str) -> None:
        self.min_rank, self.text = min_rank, text.strip().lower()
        self.invalidate()

    def filterAcceptsRow(self, row: int, parent: Index) -> bool:
        model = self.sourceModel()
        if not isinstance(model, FindingsModel):
            return True
        f = model.findings[row]
        if SEVERITY_RANK.get(f.severity, 0) < self.min_rank:
            return False
        return not self.text or self.text in f"{f.code} {model.message(f)} {f.path}".lower()


class FindingsView(QWidget):
    """Findings table with a severity filter and a text filter; F8/Shift+F8 step through rows."""

    showBytes = Signal()  # "show in hex": the window brings the hex view to the front
    export_name = "findings"

    def __init__(self, doc: Document, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.doc = doc
        self.model = FindingsModel(self)
        self.proxy = FindingsFilter(self)
        self.proxy.setSourceModel(self.model)
        self.table = QTableView()
        self.table.setModel(self.proxy)
        self.table.setSortingEnabled(True)
        self.table.sortByColumn(2, Qt.SortOrder.AscendingOrder)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.table.verticalHeader().hide()
        self.table.verticalHeader().setDefaultSectionSize(self.table.fontMetrics().height() + 6)
        self.table.setWordWrap(False)
        install_copy(self.table, self.copy_rows)
        install_menu(self.table, self.build_menu)
        hh = self.table.horizontalHeader()
        hh.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        hh.setSectionResizeMode(len(COLUMNS) - 1, QHeaderView.ResizeMode.Stretch)
        self.severity = QComboBox()
        self.severity.addItem("all severities", 0)
        self.severity.addItem("warnings and errors", 1)
        self.severity.addItem("errors only", 2)
        self.filter_edit = QLineEdit()
        self.filter_edit.setPlaceholderText("Filter findings (code, message, path)…")
        self.filter_edit.setClearButtonEnabled(True)
        pass_window_shortcuts(self.filter_edit)
        self.count = plain_label()
        self.detail = plain_label(" ", wrap=True)
        self.detail.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        top = QHBoxLayout()
        top.addWidget(self.severity)
        top.addWidget(self.filter_edit, 1)
        top.addWidget(self.count)
        self.export_button = doc_export_button(self, doc)
        top.addWidget(self.export_button)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(2, 2, 2, 2)
        lay.addLayout(top)
        lay.addWidget(self.table, 1)
        lay.addWidget(self.detail)
        self.severity.currentIndexChanged.connect(self._apply_filter)
        self.filter_edit.textChanged.connect(self._apply_filter)
        self.table.clicked.connect(self._activate)
        self.table.activated.connect(self._activate)
        self.table.selectionModel().currentRowChanged.connect(self._on_current)
        doc.loaded.connect(self._reload)
        doc.statsReady.connect(self._reload)
        doc.verifyChanged.connect(self._reload)
        doc.bus.changed.connect(self._on_selection)
        self._syncing = False
        self._reload()

    def _reload(self) -> None:
        res = self.doc.result
        self.model.set_findings(res.findings if res is not None else [], self.doc.verify)
        self._update_count()

    def _apply_filter(self) -> None:
        self.proxy.set_filter(int(self.severity.currentData() or 0), self.filter_edit.text())
        self._update_count()

    def _update_count(self) -> None:
        n, shown = self.model.rowCount(), self.proxy.rowCount()
        self.count.setText(f"{shown:,} of {n:,}" if shown != n else f"{n:,} finding" + ("" if n == 1 else "s"))

    def finding_at(self, proxy_row: int) -> Finding | None:
        f = self.proxy.index(proxy_row, 0).data(FINDING_ROLE)
        return f if isinstance(f, Finding) else None

    def _activate(self, index: QModelIndex) -> None:
        f = self.finding_at(index.row())
        self._show_detail(f)
        if f is not None and self.doc.index is not None:
            self.doc.bus.select(self.doc.index.for_finding(f), origin=self)

    def record_label(self, f: Finding) -> str | None:
        """The label of the record ``f`` is about (``kv_swa K layer 6``, ``kv_swa K #5`` without the model's
        layer: the tree's naming), None when it is about no record of the file."""
        res, index = self.doc.result, self.doc.index
        if res is None or index is None:
            return None
        node = f.node if isinstance(f.node, Node) else (res.root.find(f.path) if f.path else None)
        rec = index.record_of(node)
        sec = next((s for _, s, _, r in index.records if r is rec), None) if rec is not None else None
        return label_of(res, sec, rec) if rec is not None and sec is not None else None

    def _show_detail(self, f: Finding | None) -> None:
        if f is None:
            self.detail.setText(" ")
            return
        rec = self.record_label(f)
        layer = f" · {rec}" if rec is not None else (f" · layer {f.layer_text()}" if f.layer_text() else "")
        self.detail.setText(f"{f.severity} {f.code} at {f.offset:,} (0x{f.offset:x}), {f.length:,} bytes{layer} · "
                            f"{f.path}\n{self.model.message(f)}")

    def _on_current(self, current: QModelIndex, _prev: QModelIndex) -> None:
        if not self._syncing and current.isValid():
            self._activate(current)

    def step(self, delta: int) -> Finding | None:
        """Select the next (``delta`` 1) or previous (-1) finding in table order, wrapping."""
        row = step_row(self.table, delta)
        return None if row is None else self.finding_at(row)

    def _on_selection(self, sel: Selection) -> None:
        if sel.origin is self or sel.finding is None:
            return
        for row in range(self.proxy.rowCount()):
            if self.finding_at(row) is sel.finding:
                self._show_detail(sel.finding)
                self._syncing = True
                try:
                    self.table.selectionModel().setCurrentIndex(
                        self.proxy.index(row, 0),
                        QItemSelectionModel.SelectionFlag.ClearAndSelect | QItemSelectionModel.SelectionFlag.Rows)
                finally:
                    self._syncing = False
                return

    # -- copy, menu, export ------------------------------------------------------------------------
    def copy_rows(self) -> str:
        """Copy the selected findings as tab-separated lines (the columns as shown)."""
        text = rows_text(self.proxy, selected_rows(self.table))
        n = text.count("\n") + 1 if text else 0
        self.doc.message.emit(f"copied {n:,} finding" + ("" if n == 1 else "s"))
        return copy_text(text)

    def current_finding(self) -> Finding | None:
        cur = self.table.currentIndex()
        return self.finding_at(cur.row()) if cur.isValid() else None

    def show_in_hex(self) -> None:
        f = self.current_finding()
        if f is not None and self.doc.index is not None:
            self.doc.bus.select(self.doc.index.for_finding(f), origin=self)
            self.showBytes.emit()

    def build_menu(self) -> QMenu:
        """The context menu of the current finding (returned for tests)."""
        f = self.current_finding()
        menu = QMenu(self)
        menu.addAction("Copy", self.copy_rows)

        def copier(text: Callable[[Finding], str]) -> Callable[[], object]:
            return lambda: copy_text(text(f)) if f is not None else None

        texts: tuple[tuple[str, Callable[[Finding], str]], ...] = (
            ("Copy offset", lambda x: str(x.offset)), ("Copy message", self.model.message),
            ("Copy path", lambda x: x.path))
        for label, text in texts:
            a = menu.addAction(label, copier(text))
            a.setEnabled(f is not None)
        menu.addSeparator()
        show = menu.addAction("Show bytes in Hex", self.show_in_hex)
        show.setEnabled(f is not None)
        menu.addSeparator()
        menu.addAction("Export as CSV…", self.export_button.ask_csv)
        menu.addAction("Export view as PNG…", self.export_button.ask_png)
        return menu

    def export_widget(self) -> QWidget:
        return self.table

    def csv_table(self) -> CsvTable | None:
        """Every finding (not only those the filter shows): severity, code, offset, length, layer, path, message
        (as shown)."""
        res = self.doc.result
        if res is None:
            return None
        header = ["severity", "code", "offset", "length", "layer", "path", "message"]
        return header, [[f.severity, f.code, f.offset, f.length, f.layer_text(), f.path,
                         self.model.message(f)] for f in res.findings]
