"""Persistent preferences on QSettings: recent files, per-file model choice, the model last used with a file
of each architecture (offered to a new file of it), theme, window state, and the
engine ``kvscope verify`` and the Lab run in (:class:`EngineSettings`).

Modelled on Frescobaldi's ``recentfiles.py``: a capped most-recent-first list whose unreadable
entries are dropped whenever it is read. Tests isolate settings by passing their own
``QSettings`` (an ini file under a temporary folder).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, fields

from PySide6.QtCore import QByteArray, QSettings

from kvscope.app.document.verify_job import EngineChoice
from kvscope.core.engine.choices import VERIFY_ENGINES

RECENT_MAX = 10
_RECENT_KEY = "recent/files"
_MODELS_KEY = "models/by_file"  # JSON object: absolute state-file path -> absolute GGUF path
_MODELS_MAX = 500
_ARCH_MODELS_KEY = "models/by_arch"  # JSON object: architecture -> the GGUF last used with a file of it
_ARCH_MODELS_MAX = 16
_ENGINE_KEY = "engine/choice"  # JSON object: EngineChoice's fields


def _readable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.R_OK)


def _as_list(value: object) -> list[str]:
    """QSettings returns a str for a one-element list under some backends; normalise."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value if v]
    return []


class AppSettings:
    """Typed access to kvscope's QSettings."""

    def __init__(self, qsettings: QSettings | None = None) -> None:
        self.qs = qsettings if qsettings is not None else QSettings()

    # -- recent files ---------------------------------------------------------------------------
    def recent_files(self) -> list[str]:
        """Most recent first, at most :data:`RECENT_MAX`, unreadable entries dropped (and forgotten)."""
        stored = _as_list(self.qs.value(_RECENT_KEY))
        kept = [p for p in stored if _readable(p)][:RECENT_MAX]
        if kept != stored:
            self.qs.setValue(_RECENT_KEY, kept)
        return kept

    def add_recent(self, path: str) -> None:
        path = os.path.abspath(path)
        items = [p for p in _as_list(self.qs.value(_RECENT_KEY)) if p != path]
        self.qs.setValue(_RECENT_KEY, [path, *items][:RECENT_MAX])

    def clear_recent(self) -> None:
        self.qs.setValue(_RECENT_KEY, [])

    # -- model association ------------------------------------------------------------------------
    def _model_map(self) -> dict[str, str]:
        raw = self.qs.value(_MODELS_KEY, "{}")
        try:
            data = json.loads(str(raw))
        except ValueError:
            return {}
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}

    def model_for(self, state_path: str) -> str | None:
        """The GGUF remembered for ``state_path`` (None when none, or when it is gone)."""
        model = self._model_map().get(os.path.abspath(state_path))
        return model if model and _readable(model) else None

    def set_model_for(self, state_path: str, model_path: str | None) -> None:
        """Remember (or, with None, forget) the model of a state file."""
        data = self._model_map()
        key = os.path.abspath(state_path)
        data.pop(key, None)
        if model_path:
            data[key] = os.path.abspath(model_path)
        if len(data) > _MODELS_MAX:  # forget the oldest associations (dicts keep insertion order)
            data = dict(list(data.items())[-_MODELS_MAX:])
        self.qs.setValue(_MODELS_KEY, json.dumps(data))

    def _arch_map(self) -> dict[str, str]:
        try:
            data = json.loads(str(self.qs.value(_ARCH_MODELS_KEY, "{}")))
        except ValueError:
            return {}
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}

    def arch_models(self) -> list[tuple[str, str]]:
        """``(architecture, GGUF)``: the model last used with a file of each architecture, most recent first
        (models gone from disk left out)."""
        return [(a, m) for a, m in reversed(self._arch_map().items()) if _readable(m)]

    def set_arch_model(self, arch: str, model_path: str) -> None:
        """Remember ``model_path`` as the last model a file of ``arch`` was read with (and fitted)."""
        data = self._arch_map()
        data.pop(arch, None)
        data[arch] = os.path.abspath(model_path)
        if len(data) > _ARCH_MODELS_MAX:
            data = dict(list(data.items())[-_ARCH_MODELS_MAX:])
        self.qs.setValue(_ARCH_MODELS_KEY, json.dumps(data))

    # -- the engine of Verify and the Lab ---------------------------------------------------------------
    def engine(self) -> EngineChoice:
        """The engine settings (defaults: llama.cpp with the build that writes the file's layout)."""
        raw = self.qs.value(_ENGINE_KEY, "{}")
        try:
            data = json.loads(str(raw))
        except ValueError:
            data = {}
        known = {f.name for f in fields(EngineChoice)}
        kept = {k: (str(v) if v is not None else None) for k, v in data.items() if k in known} \
            if isinstance(data, dict) else {}
        choice = EngineChoice(**kept)  # type: ignore[arg-type]
        return choice if choice.engine in VERIFY_ENGINES else EngineChoice()

    def set_engine(self, choice: EngineChoice) -> None:
        self.qs.setValue(_ENGINE_KEY, json.dumps(asdict(choice)))

    # -- preferences and window state ---------------------------------------------------------------
    def theme(self) -> str:
        return str(self.qs.value("view/theme", "system"))

    def set_theme(self, name: str) -> None:
        self.qs.setValue("view/theme", name)

    def last_dir(self) -> str:
        return str(self.qs.value("files/last_dir", os.getcwd()))

    def set_last_dir(self, folder: str) -> None:
        self.qs.setValue("files/last_dir", folder)

    def bytes_value(self, key: str) -> QByteArray | None:
        value = self.qs.value(key)
        return value if isinstance(value, QByteArray) and not value.isEmpty() else None

    def set_bytes_value(self, key: str, value: QByteArray) -> None:
        self.qs.setValue(key, value)

    def sync(self) -> None:
        self.qs.sync()
