"""The Open and Compare dialogs: state files shown by what they are, whatever their name.

Qt's own file dialog (not the platform's: only it takes a proxy model and an icon provider) with three
filters: the default lists folders and every file whose first bytes are llama.cpp state
(:mod:`kvscope.app.document.file_kind`: a slot file saved as ``chat1`` shows) or whose extension is one
llama.cpp writes; the second lists by extension only, the third everything. The Type column names the
kind ("llama.cpp session file", ...), never the mime database's "unknown". The dialogs are window-modal
and never block: the caller connects ``filesSelected``.
"""

from __future__ import annotations

import fnmatch
import threading

from PySide6.QtCore import QFileInfo, QModelIndex, QPersistentModelIndex, QSortFilterProxyModel
from PySide6.QtWidgets import QFileDialog, QFileIconProvider, QFileSystemModel, QWidget

from kvscope.app.document.file_kind import KIND_TITLES, KindCache

# What llama.cpp and llama-server name saved state: slot saves (--slot-save-path), sequence state,
# prompt caches and session files, state blobs written by hand.
STATE_EXTENSIONS = ("*.seqstate", "*.slotsave", "*.bin", "*.session", "*.state", "*.seqdata", "*.slot")
BY_CONTENT_FILTER = "llama.cpp state: any name, recognised by its first bytes (*)"
BY_EXTENSION_FILTER = f"llama.cpp state by extension: {' '.join(STATE_EXTENSIONS)} ({' '.join(STATE_EXTENSIONS)})"
ALL_FILTER = "All files (*)"
STATE_FILTERS = (BY_CONTENT_FILTER, BY_EXTENSION_FILTER, ALL_FILTER)

Index = QModelIndex | QPersistentModelIndex


def has_state_extension(name: str) -> bool:
    """Whether ``name`` ends in an extension llama.cpp's state files are given."""
    low = name.lower()
    return any(fnmatch.fnmatchcase(low, pat) for pat in STATE_EXTENSIONS)


class StateKinds:
    """The kinds of files, cached and safe to ask from the file system model's gatherer thread."""

    def __init__(self) -> None:
        self._cache = KindCache()
        self._lock = threading.Lock()

    def kind(self, path: str) -> str | None:
        with self._lock:
            return self._cache.kind(path)


class StateIconProvider(QFileIconProvider):
    """Names a state file's kind in the Type column (the mime database says "unknown")."""

    def __init__(self, kinds: StateKinds) -> None:
        super().__init__()
        self.kinds = kinds

    def type(self, info: QFileInfo) -> str:  # noqa: A003  (Qt's name)
        if info.isFile():
            kind = self.kinds.kind(info.absoluteFilePath())
            if kind is not None:
                return KIND_TITLES.get(kind, kind)
        return super().type(info)


class StateFilterProxy(QSortFilterProxyModel):
    """Under the by-content filter: folders, files with a state extension and files whose bytes are state."""

    def __init__(self, kinds: StateKinds, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.kinds = kinds
        self.by_content = True

    def set_by_content(self, on: bool) -> None:
        if on == self.by_content:
            return
        if hasattr(self, "beginFilterChange"):  # Qt 6.10+ (invalidateFilter is deprecated there)
            self.beginFilterChange()
            self.by_content = on
            self.endFilterChange(QSortFilterProxyModel.Direction.Rows)
        else:
            self.by_content = on
            self.invalidateRowsFilter()

    def filterAcceptsRow(self, source_row: int, source_parent: Index) -> bool:  # noqa: N802  (Qt's name)
        if not self.by_content:
            return True
        model = self.sourceModel()
        if not isinstance(model, QFileSystemModel):
            return True
        ix = model.index(source_row, 0, source_parent)
        if model.isDir(ix) or has_state_extension(model.fileName(ix)):
            return True
        return self.kinds.kind(model.filePath(ix)) is not None


class StateFileDialog(QFileDialog):
    """Qt's file dialog with the state filters, the kind-naming Type column and the by-content proxy."""

    def __init__(self, parent: QWidget | None, title: str, folder: str, many: bool) -> None:
        super().__init__(parent, title, folder)
        self.setOption(QFileDialog.Option.DontUseNativeDialog)  # a proxy model needs Qt's own dialog
        self.setOption(QFileDialog.Option.HideNameFilterDetails)  # the filter names say what they hold
        self.setFileMode(QFileDialog.FileMode.ExistingFiles if many else QFileDialog.FileMode.ExistingFile)
        self.kinds = StateKinds()
        self.icons = StateIconProvider(self.kinds)  # held here: the dialog does not own it
        self.setIconProvider(self.icons)
        self.proxy = StateFilterProxy(self.kinds, self)
        self.setProxyModel(self.proxy)
        self.setNameFilters(list(STATE_FILTERS))
        self.selectNameFilter(BY_CONTENT_FILTER)
        self.filterSelected.connect(lambda f: self.proxy.set_by_content(f == BY_CONTENT_FILTER))


def state_file_dialog(parent: QWidget | None, title: str, folder: str, many: bool) -> StateFileDialog:
    """The dialog, opened (window-modal, never a blocking loop); ``filesSelected`` carries the chosen paths."""
    dlg = StateFileDialog(parent, title, folder, many)
    dlg.open()
    return dlg
