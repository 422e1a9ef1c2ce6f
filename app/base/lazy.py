"""Widgets that build their heavy parts (pyqtgraph plots) a moment after they are made, or when first used.

A pyqtgraph ``PlotItem`` costs 5–15 ms to construct (it builds its option menus), and a document page
holds a dozen of them; built together they would stall the GUI thread when a file opens. A view that
mixes in :class:`LazyParts` makes only its light widgets in ``__init__``, calls :meth:`~LazyParts.defer_build`
first thing, and creates the rest in ``build_steps``: a generator that yields between pieces (one plot
each). One queue for the whole application builds one piece per turn of the event loop, whichever widget
it belongs to (a widget's pieces in a row, widgets in the order they asked), so no turn takes long even
when a page's views ask at the same moment; when code touches
one of the names in ``lazy_parts`` before that, the remaining pieces are built at once. The last piece
brings the parts up to date; until then drawing methods check :attr:`~LazyParts.built` and do nothing.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Iterator
from typing import Any

import shiboken6
from PySide6.QtCore import QObject, QTimer

STEP_GAP_MS = 5  # between two pieces: the event loop handles what came in meanwhile


class _BuildQueue:
    """Widgets waiting to build a piece; one piece per timer shot, never two in one turn."""

    def __init__(self) -> None:
        self.waiting: deque[weakref.ref[LazyParts]] = deque()
        self.timer: QTimer | None = None

    def add(self, part: LazyParts) -> None:
        self.waiting.append(weakref.ref(part))
        self._arm()

    def _arm(self) -> None:
        if self.timer is None:
            self.timer = QTimer()
            self.timer.setSingleShot(True)
            self.timer.setInterval(STEP_GAP_MS)
            self.timer.timeout.connect(self._run)
        if self.waiting and not self.timer.isActive():
            self.timer.start()

    def _run(self) -> None:
        while self.waiting:
            part = self.waiting[0]()
            if part is None or not shiboken6.isValid(part) or part.built:
                self.waiting.popleft()
                continue
            if not part._step():
                self.waiting.popleft()
            break
        self._arm()


_QUEUE = _BuildQueue()


class LazyParts:
    """Mix-in (before the Qt class) for a widget whose ``lazy_parts`` are made by ``build_steps``."""

    lazy_parts: frozenset[str] = frozenset()

    def defer_build(self, delay_ms: int) -> None:
        """Start building ``delay_ms`` after the event loop next runs (or earlier, when a part is first used)."""
        self.__dict__["_built"] = False
        self.__dict__["_steps"] = None
        assert isinstance(self, QObject)
        QTimer.singleShot(delay_ms, self, lambda: _QUEUE.add(self))

    @property
    def built(self) -> bool:
        return bool(self.__dict__.get("_built", True))

    def _steps_iter(self) -> Iterator[None]:
        steps: Iterator[None] | None = self.__dict__.get("_steps")
        if steps is None:
            steps = iter(self.build_steps())
            self.__dict__["_steps"] = steps
        return steps

    def _step(self) -> bool:
        """Build the next piece; False when there was none left."""
        if self.built:
            return False
        try:
            next(self._steps_iter())
        except StopIteration:
            self.__dict__["_built"] = True
            return False
        return True

    def ensure_built(self) -> None:
        """Build what is left now."""
        if self.built:
            return
        for _ in self._steps_iter():
            pass
        self.__dict__["_built"] = True

    def build_steps(self) -> Iterator[None]:
        """Create the parts named in ``lazy_parts``, yielding between pieces; the last one brings them up to
        date (it runs with :attr:`built` still False: set it first when the update needs it)."""
        raise NotImplementedError

    def finish(self) -> None:
        """Mark the parts built (for the last step, before it draws)."""
        self.__dict__["_built"] = True

    def __getattr__(self, name: str) -> Any:
        if name in type(self).lazy_parts and not self.__dict__.get("_built", True):
            self.ensure_built()
            if name in self.__dict__:
                return self.__dict__[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
