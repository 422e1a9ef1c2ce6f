"""A document's bookmarks: kept per file in the app's settings, changed through one object with a signal.

They are stored under ``bookmarks/<sha1 of the absolute path>`` in the app's QSettings (nothing is
written next to the file: inputs are never touched), as JSON with the file's path and its size when they
were saved; a file whose size has changed since keeps its bookmarks, and :attr:`Bookmarks.stale` says so.
"""

from __future__ import annotations

import hashlib
import json
import os

from PySide6.QtCore import QObject, QSettings, Signal

from kvscope.app.document.bookmark import Bookmark


def settings_key(path: str) -> str:
    """The settings key of ``path``'s bookmarks (a hash: a path's slashes would make settings groups)."""
    return "bookmarks/" + hashlib.sha1(os.path.abspath(path).encode("utf-8", "surrogateescape")).hexdigest()[:20]


class Bookmarks(QObject):
    """The bookmarks of the file at ``path`` (``size`` bytes now); ``settings`` None: kept in memory only."""

    changed = Signal()

    def __init__(self, path: str, size: int = 0, settings: QSettings | None = None,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.path, self.size, self.settings = os.path.abspath(path), size, settings
        self.items: list[Bookmark] = []
        self.saved_size: int | None = None  # the file's size when the bookmarks were saved
        self.load()

    @property
    def stale(self) -> str | None:
        """Why the offsets may no longer be where they were (the file's size changed), or None."""
        if self.saved_size is not None and self.size and self.saved_size != self.size:
            return f"saved when the file was {self.saved_size:,} bytes; it is {self.size:,} now"
        return None

    def set_size(self, size: int) -> None:
        self.size = size
        self.changed.emit()

    def load(self) -> None:
        self.items, self.saved_size = [], None
        if self.settings is None:
            return
        raw = self.settings.value(settings_key(self.path))
        try:
            obj = json.loads(raw) if isinstance(raw, str) else None
        except ValueError:
            obj = None
        if isinstance(obj, dict) and obj.get("path") == self.path:
            self.items = [b for b in (Bookmark.from_json(x) for x in obj.get("items", [])) if b is not None]
            size = obj.get("size")
            self.saved_size = size if isinstance(size, int) else None

    def _save(self) -> None:
        if self.settings is not None:
            key = settings_key(self.path)
            if self.items:
                self.saved_size = self.size
                self.settings.setValue(key, json.dumps({"path": self.path, "size": self.size,
                                                        "items": [b.to_json() for b in self.items]}))
            else:
                self.settings.remove(key)
            self.settings.sync()
        self.changed.emit()

    def add(self, start: int, end: int, name: str, note: str = "") -> Bookmark:
        """Bookmark bytes ``[start, end)``; kept in offset order."""
        b = Bookmark(start, max(start + 1, end), name.strip() or f"bytes {start:,}-{end:,}", note)
        self.items.append(b)
        self.items.sort(key=lambda x: (x.start, x.end))
        self._save()
        return b

    def update(self, i: int, name: str | None = None, note: str | None = None) -> None:
        """Rename bookmark ``i`` or change its note."""
        b = self.items[i]
        self.items[i] = Bookmark(b.start, b.end, b.name if name is None else (name.strip() or b.name),
                                 b.note if note is None else note)
        self._save()

    def remove(self, i: int) -> None:
        del self.items[i]
        self._save()

    def at(self, offset: int) -> list[Bookmark]:
        """The bookmarks holding byte ``offset``."""
        return [b for b in self.items if b.start <= offset < b.end]
