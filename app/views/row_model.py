"""A read-only table model over a Python list: one row per item, named columns.

The findings table and the diff list share it; a subclass only says what a cell shows
(``cell(item, column, role)``).
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, Qt

T = TypeVar("T")
Index = QModelIndex | QPersistentModelIndex
RIGHT = int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)


class RowTableModel(QAbstractTableModel, Generic[T]):
    """Rows are ``self.rows``; ``columns`` name the columns (and are their headers)."""

    columns: tuple[str, ...] = ()

    def __init__(self, parent: Any = None) -> None:
        super().__init__(parent)
        self.rows: list[T] = []

    def set_rows(self, rows: list[T]) -> None:
        self.beginResetModel()
        self.rows = list(rows)
        self.endResetModel()

    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.rows)

    def columnCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.columns)

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return self.columns[section]
        return None

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid():
            return None
        return self.cell(self.rows[index.row()], self.columns[index.column()], role)

    def cell(self, item: T, column: str, role: int) -> Any:
        """What ``item`` shows in ``column`` for ``role`` (None: nothing)."""
        raise NotImplementedError
