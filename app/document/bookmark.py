"""A bookmark: a named byte range of a file with an optional note (an annotation), as data (no Qt).

The app keeps a file's bookmarks (:mod:`kvscope.app.document.bookmarks`) and the report lists them
(:mod:`kvscope.app.report`) when the app exports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Bookmark:
    """Bytes ``[start, end)`` of a file, a name and a note (free text, may be empty)."""

    start: int
    end: int
    name: str
    note: str = ""

    @property
    def length(self) -> int:
        return self.end - self.start

    def span_text(self) -> str:
        """``[start, end)`` with the hex offsets, as the hex view writes ranges."""
        return f"[{self.start:,}, {self.end:,}) 0x{self.start:x}-0x{self.end:x}"

    def to_json(self) -> dict[str, Any]:
        return {"start": self.start, "end": self.end, "length": self.length, "name": self.name, "note": self.note}

    @classmethod
    def from_json(cls, obj: object) -> Bookmark | None:
        """A bookmark from :meth:`to_json`'s form; None for anything malformed (settings edited by hand)."""
        if not isinstance(obj, dict):
            return None
        start, end, name, note = obj.get("start"), obj.get("end"), obj.get("name"), obj.get("note", "")
        if not (isinstance(start, int) and isinstance(end, int) and isinstance(name, str) and isinstance(note, str)):
            return None
        if isinstance(start, bool) or isinstance(end, bool) or not 0 <= start < end:
            return None
        return cls(start, end, name, note)
