"""Tokens: ids and, with a model, their text; a token selects its cell where tokens map to cells.

A state blob carries no tokens: once they are given for it (Tools → Tokens for this blob…) the view lists
those, with their text, and says they were given; without them it says how to give them.

Ctrl+C copies the selected tokens (index, id, text, cell: tab-separated); the context menu copies their
ids or text and shows a token's bytes; Export saves every token as CSV or the view as PNG.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QAbstractTableModel, QItemSelectionModel, QModelIndex, QPersistentModelIndex, Qt, Signal
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import (
    QAbstractItemView,
    QApplication,
    QHBoxLayout,
    QHeaderView,
    QMenu,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from kvscope.app.base.widgets import plain_label
from kvscope.app.document.doc_index import Selection
from kvscope.app.document.document import Document
from kvscope.app.document.given_tokens import ACTION as TOKENS_ACTION
from kvscope.app.document.given_tokens import all_ids, count_text
from kvscope.app.views.export import CsvTable, doc_export_button
from kvscope.app.views.table_tools import copy_text, install_copy, install_menu, rows_text, selected_rows
from kvscope.core.analysis.verdict import plural

Index = QModelIndex | QPersistentModelIndex
NEEDS_MODEL = "needs a model: token text comes from the GGUF vocabulary (File → Model…)"


def doc_tokens(doc: Document) -> list[int]:
    """What the view lists: the file's tokens, or the ones given for a blob that carries none."""
    res = doc.result
    if res is None:
        return []
    if not res.tokens and doc.takes_tokens() and doc.given_tokens is not None:
        return all_ids(doc.given_tokens)
    return res.tokens


class TokensModel(QAbstractTableModel):
    """Columns: index, token id, text (with a model), cell (where tokens map to cells)."""

    HEADERS = ("#", "id", "text", "cell")

    def __init__(self, doc: Document, parent: Any = None) -> None:
        super().__init__(parent)
        self.doc = doc

    def reset(self) -> None:
        self.beginResetModel()
        self.endResetModel()

    @property
    def tokens(self) -> list[int]:
        """The file's tokens; a blob's (it carries none): those given for it (Tools → Tokens for this blob…)."""
        return doc_tokens(self.doc)

    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.tokens)

    def columnCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.HEADERS)

    def headerData(self, section: int, orientation: Qt.Orientation,
                   role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if orientation != Qt.Orientation.Horizontal:
            return None
        if role == Qt.ItemDataRole.DisplayRole:
            return self.HEADERS[section]
        if role == Qt.ItemDataRole.ToolTipRole and section == 2 and self.doc.profile is None:
            return NEEDS_MODEL
        if role == Qt.ItemDataRole.ToolTipRole and section == 3 and self.doc.index is not None \
                and self.doc.index.token_link is None:
            return self.doc.index.token_link_reason
        return None

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        i, col = index.row(), index.column()
        tok = self.tokens[i]
        prof = self.doc.profile
        if role == Qt.ItemDataRole.DisplayRole:
            if col == 0:
                return i
            if col == 1:
                return tok
            if col == 2:
                if prof is None:
                    return "—"
                text = prof.token_text(tok)
                return "⟨out of vocabulary⟩" if text is None else repr(text)[1:-1]
            idx = self.doc.index
            cell = idx.cell_of_token(i) if idx is not None else None
            return "" if cell is None else cell
        if role == Qt.ItemDataRole.ToolTipRole and col == 2 and prof is None:
            return NEEDS_MODEL
        if role == Qt.ItemDataRole.ForegroundRole and col == 2 and prof is None:
            return QApplication.palette().color(QPalette.ColorGroup.Disabled, QPalette.ColorRole.Text)
        return None


class TokensView(QWidget):
    """The token list; selecting a token selects its cell (or its bytes) everywhere."""

    showBytes = Signal()  # "show in hex": the window brings the hex view to the front
    export_name = "tokens"

    def __init__(self, doc: Document, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.doc = doc
        self.model = TokensModel(doc, self)
        self.table = QTableView()
        self.table.setModel(self.model)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.table.verticalHeader().hide()
        self.table.verticalHeader().setDefaultSectionSize(self.table.fontMetrics().height() + 4)
        install_copy(self.table, self.copy_rows)
        install_menu(self.table, self.build_menu)
        hh = self.table.horizontalHeader()
        # Fixed widths from the widest number: ResizeToContents would ask every row (100,000+ tokens).
        for col in (0, 1, 3):
            hh.setSectionResizeMode(col, QHeaderView.ResizeMode.Interactive)
        hh.setSectionResizeMode(2, QHeaderView.ResizeMode.Stretch)
        self.table.setAlternatingRowColors(True)
        self.summary = plain_label()
        self.summary.setWordWrap(True)
        self.export_button = doc_export_button(self, doc)
        top = QHBoxLayout()
        top.addWidget(self.summary, 1)
        top.addWidget(self.export_button, 0, Qt.AlignmentFlag.AlignTop)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(2, 2, 2, 2)
        lay.addLayout(top)
        lay.addWidget(self.table, 1)
        self.table.selectionModel().currentRowChanged.connect(self._on_current)
        doc.loaded.connect(self._reload)
        doc.tokensChanged.connect(self._reload)  # tokens given for a blob (or cleared): listed, with their text
        doc.bus.changed.connect(self._on_selection)
        self._syncing = False
        self._reload()

    def _fit_columns(self, n_tokens: int, max_id: int, max_cell: int) -> None:
        fm = self.table.fontMetrics()
        for col, widest in ((0, n_tokens), (1, max_id), (3, max_cell)):
            text = max(str(widest), self.model.HEADERS[col], key=len)
            self.table.setColumnWidth(col, fm.horizontalAdvance(text + "00"))

    def _reload(self) -> None:
        self.model.reset()
        res, idx = self.doc.result, self.doc.index
        tokens = doc_tokens(self.doc)
        if res is not None:
            max_cell = max((t.table.count for t in idx.tables), default=0) if idx is not None else 0
            self._fit_columns(len(tokens), max(tokens, default=0), max_cell)
        if res is None:
            self.summary.setText("")
            return
        given = self.doc.given_tokens if tokens and not res.tokens else None
        if given is not None:
            parts = [f"{count_text(given)} given ({TOKENS_ACTION}): the blob carries none"]
        elif not tokens and self.doc.takes_tokens():
            parts = [f"0 tokens: a state blob carries none; give the ones it was made of with {TOKENS_ACTION}"]
        else:
            parts = [plural(len(tokens), "token")]
        if res.token_payload is not None:
            parts.append("unpacked from a llama-server token payload")
        if self.doc.profile is not None and tokens:
            text = self.doc.profile.detokenize(tokens)
            parts.append(f"text: {text[:300]!r}" + ("…" if len(text) > 300 else ""))
        elif self.doc.profile is None:
            parts.append("token text " + NEEDS_MODEL)
        if idx is not None and (idx.token_link is not None or res.tokens):
            parts.append(idx.token_link_text())
        self.summary.setText(" · ".join(parts))

    def _on_current(self, current: QModelIndex, _prev: QModelIndex) -> None:
        if self._syncing or not current.isValid() or self.doc.index is None:
            return
        self.doc.bus.select(self.doc.index.for_token(current.row()), origin=self)

    def _on_selection(self, sel: Selection) -> None:
        if sel.origin is self:
            return
        self._syncing = True
        try:
            if sel.token is not None and sel.token < self.model.rowCount():
                idx = self.model.index(sel.token, 0)
                self.table.selectionModel().setCurrentIndex(
                    idx, QItemSelectionModel.SelectionFlag.ClearAndSelect | QItemSelectionModel.SelectionFlag.Rows)
                self.table.scrollTo(idx)
            else:
                self.table.selectionModel().clearSelection()
        finally:
            self._syncing = False

    # -- copy, menu, export ------------------------------------------------------------------------
    def copy_rows(self) -> str:
        """Copy the selected tokens as tab-separated lines: index, id, text, cell."""
        rows = selected_rows(self.table)
        self.doc.message.emit(f"copied {len(rows):,} token" + ("" if len(rows) == 1 else "s"))
        return copy_text(rows_text(self.model, rows))

    def copy_ids(self) -> str:
        toks = self.model.tokens
        return copy_text(" ".join(str(toks[r]) for r in selected_rows(self.table) if r < len(toks)))

    def copy_token_text(self) -> str | None:
        prof = self.doc.profile
        if prof is None:
            return None
        toks = self.model.tokens
        return copy_text(prof.detokenize([toks[r] for r in selected_rows(self.table) if r < len(toks)]))

    def show_in_hex(self) -> None:
        rows = selected_rows(self.table)
        node = self.doc.index.tokens_node if self.doc.index is not None else None
        if rows and node is not None and node.size == 4 * len(self.model.tokens):
            self.doc.bus.select(Selection(node.offset + 4 * rows[0], 4 * (rows[-1] - rows[0] + 1), node, token=rows[0]),
                                origin=self)
            self.showBytes.emit()

    def build_menu(self) -> QMenu:
        """The context menu of the selected tokens (returned for tests)."""
        n = len(selected_rows(self.table))
        menu = QMenu(self)
        menu.addAction("Copy", self.copy_rows)
        menu.addAction("Copy ids", self.copy_ids).setEnabled(n > 0)
        text = menu.addAction("Copy text", self.copy_token_text)
        text.setEnabled(n > 0 and self.doc.profile is not None)
        if self.doc.profile is None:
            text.setToolTip(NEEDS_MODEL)
        menu.addSeparator()
        menu.addAction("Show bytes in Hex", self.show_in_hex).setEnabled(n > 0)
        menu.addSeparator()
        menu.addAction("Export as CSV…", self.export_button.ask_csv)
        menu.addAction("Export view as PNG…", self.export_button.ask_png)
        return menu

    def export_widget(self) -> QWidget:
        return self.table

    def csv_table(self) -> CsvTable | None:
        """Every token: index, id, text (with a model), cell (where tokens map to cells)."""
        res, idx, prof = self.doc.result, self.doc.index, self.doc.profile
        tokens = doc_tokens(self.doc)
        if res is None or not tokens:
            return None
        cells = [idx.cell_of_token(i) if idx is not None else None for i in range(len(tokens))]
        texts = [prof.token_text(t) if prof is not None else None for t in tokens]
        return (["index", "id", "text", "cell"],
                ([i, t, "" if x is None else x, "" if c is None else c]
                 for i, (t, x, c) in enumerate(zip(tokens, texts, cells, strict=True))))
