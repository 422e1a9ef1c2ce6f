"""The one selection model of a document: every view listens to and writes into its bus."""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal

from kvscope.app.document.doc_index import Selection


class SelectionBus(QObject):
    """Holds the current :class:`Selection` of a document; ``changed`` tells every view.

    A view that publishes a selection sets itself as ``origin`` and ignores the echo, so
    selections never ping-pong between views.
    """

    changed = Signal(object)  # Selection

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.current: Selection | None = None

    def select(self, sel: Selection, origin: object | None = None) -> None:
        if origin is not None:
            sel = sel.with_origin(origin)
        self.current = sel
        self.changed.emit(sel)

    def clear(self) -> None:
        self.current = None
