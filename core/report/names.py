"""How a report names files: by base name (with size and sha256) unless ``--full-paths`` is given.

Reports are pasted into public bug trackers; absolute paths there give away user names and the
layout of someone's disk. :class:`PathNames` knows every path the report was built from (the
state, the model, the compared file, the lab context) and rewrites each, wherever it occurs in a
text or a JSON value, to its base name. With ``full_paths`` it leaves everything as it is. No Qt.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any


@dataclass
class PathNames:
    """Base names for ``paths`` (absolute and as given), or no rewriting with ``full_paths``."""

    paths: list[str]
    full_paths: bool = False
    _pairs: list[tuple[str, str]] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        seen: dict[str, str] = {}
        for p in self.paths:
            if not p:
                continue
            base = os.path.basename(os.path.normpath(p)) or p
            for form in {os.path.abspath(p), os.path.realpath(p), p}:
                if form != base and os.sep in form:
                    seen.setdefault(form, base)
        self._pairs = sorted(seen.items(), key=lambda kv: -len(kv[0]))  # longest first: a folder after its files

    def name(self, path: str | None) -> str | None:
        """How the report shows ``path``."""
        if path is None or self.full_paths:
            return path
        return os.path.basename(os.path.normpath(path)) or path

    def text(self, s: str) -> str:
        """``s`` with every known path replaced by its base name."""
        if self.full_paths:
            return s
        for full, base in self._pairs:
            if full in s:
                s = s.replace(full, base)
        return s

    def markdown(self, s: str) -> str:
        """Markdown the core already escaped (``inspect --markdown``'s), with every known path, as that
        escaping writes it, replaced by its base name escaped the same way."""
        if self.full_paths:
            return s
        from kvscope.core.textsafe import markdown_text

        for full, base in self._pairs:
            shown = markdown_text(full)
            if shown in s:
                s = s.replace(shown, markdown_text(base))
        return s

    def json(self, value: Any) -> Any:
        """A JSON value with :meth:`text` applied to every string in it (keys included)."""
        if self.full_paths:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.text(k) if isinstance(k, str) else k: self.json(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.json(v) for v in value]
        if isinstance(value, tuple):
            return [self.json(v) for v in value]
        return value
