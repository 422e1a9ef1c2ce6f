"""Colours and palettes: light and dark, following the system colour scheme (Qt 6 ``colorScheme``).

One place decides every colour the views paint with (leaf kinds in the byte map and hex view,
sequences in the cell map, finding severities), so light/dark switching is one signal away.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication

from kvscope.core.analysis.verdict import VERIFY_VERDICT_LEVEL

# Leaf kinds of the structure tree (kvscope.core.reader.tree.LEAF_KINDS) -> colour.
KIND_COLORS: dict[str, str] = {
    "field": "#8da0cb",
    "tokens": "#66c2a5",
    "arch": "#a6d854",
    "outputs": "#e5c494",
    "cell_meta": "#f2c80f",
    "layer_header": "#a0a0a0",
    "k_rows": "#4e79a7",
    "v_rows": "#59a14f",
    "r_rows": "#b07aa1",
    "s_rows": "#9c755f",
    "p_rows": "#76b7b2",
    "unparsed": "#e15759",
    "trailing": "#f28e2b",
}
WARNING_COLOR = "#e15759"  # unparsed / trailing bytes, error findings
# NaN/Inf in heatmaps (the app's and the report's): magenta, in no colour map used (CET-D1 ends in red,
# viridis in yellow).
NONFINITE_RGB: tuple[int, int, int] = (255, 0, 255)
BOOKMARK_COLOR = "#e377c2"  # the underline of bookmarked bytes in the hex view
UNTRUSTED_HATCH = "#d62728"
SEVERITY_COLORS: dict[str, str] = {"error": "#d62728", "warning": "#e8871e", "info": "#1f77b4"}
# Sequence colours (tab10 without red, which means "warning" everywhere else).
SEQ_COLORS: tuple[str, ...] = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f",
)
THEMES = ("system", "light", "dark")
# Verdict levels (kvscope.core.analysis.verdict) -> (light, dark) colour: readable as text on either palette.
VERDICT_COLORS: dict[str, tuple[str, str]] = {
    "healthy": ("#2e7d32", "#7bd389"), "suspicious": ("#b35c00", "#ffb454"),
    "damaged": ("#c62828", "#ff7b7b"), "not_state": ("#6a1b9a", "#d59cff"),
    "newer": ("#1559a8", "#82b4ff"),  # written by a llama.cpp newer than kvscope knows: not damage
}

# ``kvscope verify``: verdict -> verdict level (the colour above), record status -> fill (both palettes).
VERIFY_LEVELS: dict[str, str] = dict(VERIFY_VERDICT_LEVEL)  # the core's map (diverges is damaged)
VERIFY_STATUS_COLORS: dict[str, str] = {"match": "#59a14f", "differs": "#f28e2b", "nonfinite": "#e15759",
                                        "missing": "#b07aa1", "extra": "#9c755f"}
VERIFY_STATUS_TEXT: dict[str, str] = {
    "match": "matches the engine's prefill", "differs": "differs from the engine's prefill",
    "nonfinite": "holds NaN/Inf where the engine computes finite values",
    "missing": "missing: the engine writes this record, the file does not hold it",
    "extra": "extra: the file holds a record the engine does not write"}


def verdict_color(level: str, dark: bool) -> QColor:
    """Text colour of a verdict level on the light or dark palette."""
    light, night = VERDICT_COLORS.get(level, ("#505050", "#c0c0c0"))
    return QColor(night if dark else light)


def kind_color(kind: str) -> QColor:
    """Colour of a leaf kind (grey for kinds this table does not know)."""
    return QColor(KIND_COLORS.get(kind, "#c0c0c0"))


def seq_color(seq: int) -> QColor:
    return QColor(SEQ_COLORS[seq % len(SEQ_COLORS)])


def dark_palette() -> QPalette:
    """A Fusion dark palette."""
    p = QPalette()
    base, window, text = QColor(30, 30, 32), QColor(45, 45, 48), QColor(220, 220, 220)
    p.setColor(QPalette.ColorRole.Window, window)
    p.setColor(QPalette.ColorRole.WindowText, text)
    p.setColor(QPalette.ColorRole.Base, base)
    p.setColor(QPalette.ColorRole.AlternateBase, QColor(38, 38, 41))
    p.setColor(QPalette.ColorRole.ToolTipBase, QColor(60, 60, 64))
    p.setColor(QPalette.ColorRole.ToolTipText, text)
    p.setColor(QPalette.ColorRole.Text, text)
    p.setColor(QPalette.ColorRole.Button, window)
    p.setColor(QPalette.ColorRole.ButtonText, text)
    p.setColor(QPalette.ColorRole.BrightText, QColor("#ff6b6b"))
    p.setColor(QPalette.ColorRole.Link, QColor("#6ab0ff"))
    p.setColor(QPalette.ColorRole.Highlight, QColor(42, 110, 190))
    p.setColor(QPalette.ColorRole.HighlightedText, QColor(255, 255, 255))
    p.setColor(QPalette.ColorRole.PlaceholderText, QColor(140, 140, 140))
    for role in (QPalette.ColorRole.Text, QPalette.ColorRole.ButtonText, QPalette.ColorRole.WindowText):
        p.setColor(QPalette.ColorGroup.Disabled, role, QColor(120, 120, 120))
    return p


def light_palette() -> QPalette:
    """Fusion's own light palette."""
    from PySide6.QtWidgets import QStyleFactory

    style = QStyleFactory.create("Fusion")
    return style.standardPalette() if style is not None else QPalette()


class Theme(QObject):
    """The application's light/dark state; ``changed(dark)`` fires when it flips."""

    changed = Signal(bool)

    def __init__(self, preference: str = "system", parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._preference = preference if preference in THEMES else "system"
        self._dark = False
        hints = QGuiApplication.styleHints()
        hints.colorSchemeChanged.connect(self._on_system_changed)

    @property
    def preference(self) -> str:
        return self._preference

    @property
    def dark(self) -> bool:
        return self._dark

    def set_preference(self, preference: str) -> None:
        self._preference = preference if preference in THEMES else "system"
        self.apply()

    def _on_system_changed(self, _scheme: Qt.ColorScheme) -> None:
        if self._preference == "system":
            self.apply()

    def apply(self) -> None:
        """Set Fusion with a light or dark palette on the running application."""
        if self._preference == "system":
            dark = QGuiApplication.styleHints().colorScheme() == Qt.ColorScheme.Dark
        else:
            dark = self._preference == "dark"
        app = QApplication.instance()
        if isinstance(app, QApplication):
            app.setStyle("Fusion")
            app.setPalette(dark_palette() if dark else light_palette())
        self._dark = dark
        self.changed.emit(dark)

    def plot_colors(self) -> tuple[str, str]:
        """(background, foreground) for pyqtgraph plots."""
        return ("#1e1e20", "#d0d0d0") if self._dark else ("#ffffff", "#303030")
