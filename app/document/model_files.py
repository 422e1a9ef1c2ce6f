"""Which GGUF model goes with a state file: suggestions from the files beside it, and whether one fits (no Qt).

:func:`suggest_models` ranks the GGUF files beside a state file by name; :func:`model_fit` reads the
state file with one of them and says whether it fits: a model the file does not fit (the verdict's
``model_mismatch``: another architecture, layer count, row size; or most token ids outside its
vocabulary, even where its plan also finds the file cut short) is never proposed, nor remembered for
the file.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

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


@dataclass(frozen=True)
class ModelFit:
    """Whether the state file fits one model: ``why`` says why not ("" when it fits)."""

    path: str
    fits: bool
    why: str = ""


def model_fit(state_path: str, model_path: str) -> ModelFit:
    """Read ``state_path`` with ``model_path`` and say whether it fits (a model that cannot be read does
    not; a damaged file fits every model its damage does not rule out)."""
    from kvscope.core.analysis.inspection import inspect_file
    from kvscope.core.analysis.verdict import model_mismatch_reason, vocabulary_mismatch
    from kvscope.core.model.profile import ModelProfileError, load_model_profile

    try:
        profile = load_model_profile(model_path)
    except (ModelProfileError, OSError) as e:
        return ModelFit(model_path, False, f"not a usable model: {e}")
    found = inspect_file(state_path, profile, compat=False)  # the pipeline's parse with this model
    res = found.result
    if not found.is_state:
        return ModelFit(model_path, False, "the file is not a llama.cpp state file")
    # a larger vocabulary says "another model" even where the model's plan also finds the file cut short
    why = model_mismatch_reason(res, profile) or vocabulary_mismatch(res, profile)
    return ModelFit(model_path, why is None, why or "")
