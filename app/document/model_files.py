"""Which GGUF model goes with a state file: suggestions from the files beside it (no Qt)."""

from __future__ import annotations

import os
import re

_SPLIT = re.compile(r"[-_.]+")


def _words(name: str) -> list[str]:
    return [w for w in _SPLIT.split(name.lower()) if w]


def suggest_models(state_path: str, limit: int = 8) -> list[str]:
    """GGUF files in the state file's folder, best guess first.

    A model ranks higher the more leading name parts of the state file it shares (``lfm2-f16-...``
    goes with ``tiny-lfm2.gguf`` or ``lfm2-350m.gguf``); ties sort by name.
    """
    folder = os.path.dirname(os.path.abspath(state_path))
    try:
        names = [n for n in os.listdir(folder) if n.lower().endswith(".gguf")]
    except OSError:
        return []
    state_words = _words(os.path.basename(state_path))
    head = state_words[0] if state_words else ""

    def score(name: str) -> tuple[int, int, str]:
        words = _words(name[: -len(".gguf")])
        shared = sum(1 for w in state_words[:4] if w in words)
        return (-(2 if head and head in words else 0) - shared, len(name), name)

    ranked = sorted(names, key=score)
    return [os.path.join(folder, n) for n in ranked[:limit]]


def best_match(state_path: str) -> str | None:
    """The suggestion whose name contains the state file's first name part, if exactly one does."""
    words = _words(os.path.basename(state_path))
    if not words:
        return None
    hits = [p for p in suggest_models(state_path, limit=64) if words[0] in _words(os.path.basename(p)[:-5])]
    return hits[0] if len(hits) == 1 else None
