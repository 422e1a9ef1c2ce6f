"""Widgets that build their heavy parts (pyqtgraph plots) a moment after they are made, or when first used.

A pyqtgraph ``PlotItem`` costs 5–15 ms to construct (it builds its option menus), and a document page
holds a dozen of them; built together they would stall the GUI thread when a file opens. A view that
mixes in :class:`LazyParts` makes only its light widgets in ``__init__``, calls :meth:`~LazyParts.defer_build`,
and creates the rest in ``build_parts``: on a timer of its own (each view at its own moment, so the event
loop runs in between), or at once when code touches one of the names in ``lazy_parts`` first.
Call ``defer_build`` first thing after the Qt base class's ``__init__``; until the parts exist, drawing
methods check :attr:`~LazyParts.built` and ``build_parts`` brings the parts up to date.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QObject, QTimer


class LazyParts:
    """Mix-in (before the Qt class) for a widget whose ``lazy_parts`` are made by ``build_parts``."""

    lazy_parts: frozenset[str] = frozenset()

    def defer_build(self, delay_ms: int) -> None:
        """Build the parts ``delay_ms`` after the event loop next runs (or earlier, when first used)."""
        self.__dict__["_built"] = False
        assert isinstance(self, QObject)
        QTimer.singleShot(delay_ms, self, self.ensure_built)

    @property
    def built(self) -> bool:
        return bool(self.__dict__.get("_built", True))

    def ensure_built(self) -> None:
        if self.built:
            return
        self.__dict__["_built"] = True
        self.build_parts()

    def build_parts(self) -> None:
        """Create the parts named in ``lazy_parts`` and bring them up to date."""
        raise NotImplementedError

    def __getattr__(self, name: str) -> Any:
        if name in type(self).lazy_parts and not self.__dict__.get("_built", True):
            self.ensure_built()
            return self.__dict__[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
