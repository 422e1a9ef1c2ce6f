"""Small widget helpers shared by the views."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel


def plain_label(text: str = "", wrap: bool = False) -> QLabel:
    """A QLabel that never interprets its text as HTML (token text such as ``<s>`` is data, not markup)."""
    label = QLabel(text)
    label.setTextFormat(Qt.TextFormat.PlainText)
    label.setWordWrap(wrap)
    return label
