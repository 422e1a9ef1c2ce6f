"""One document's page: banners, structure tree, byte map and the view tabs, all on one selection bus.

The page opens on the Overview. Above every view: the model banner, a "damaged" banner while the
file has error findings, a "changed: Reload" banner when the file changed on disk, and a banner saying
why Verify could not run. The byte map has its Export button beside it.
"""

from __future__ import annotations

from PySide6.QtCore import QByteArray, Qt
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QHBoxLayout, QSplitter, QStackedWidget, QTabWidget, QVBoxLayout, QWidget

from kvscope.app.base.theme import Theme
from kvscope.app.base.widgets import plain_label
from kvscope.app.document.banners import ChangedBanner, CorruptedBanner, DamageBanner, VerifyBanner
from kvscope.app.document.document import Document
from kvscope.app.document.missing_records import dropped_records
from kvscope.app.document.model_banner import ModelBanner
from kvscope.app.lab.view import LabView
from kvscope.app.views.bytes.bytemap import ByteMap
from kvscope.app.views.bytes.hex_view import HexView
from kvscope.app.views.cells.cellmap import CellMapView
from kvscope.app.views.diff.diff_view import DiffView
from kvscope.app.views.export import doc_export_button
from kvscope.app.views.findings.findings_view import FindingsView
from kvscope.app.views.layers.layer_view import LayerView
from kvscope.app.views.overview.overview_view import OverviewView
from kvscope.app.views.structure.tree_view import StructureView
from kvscope.app.views.tokens.tokens_view import TokensView, doc_tokens
from kvscope.core.analysis.verdict import plural

# The views shown as tabs, in order (VIEW_NAMES, what --view and the View menu accept, adds the tree and
# the byte map, which are always shown).
TAB_VIEWS = ("overview", "hex", "cells", "layers", "tokens", "findings", "diff", "lab")
TAB_TITLES = {"overview": "Overview", "hex": "Hex", "cells": "Cells", "layers": "Layers", "tokens": "Tokens",
              "findings": "Findings", "diff": "Diff", "lab": "Lab"}


class DocumentWidget(QWidget):
    """Lays out every view of one :class:`Document`."""

    def __init__(self, doc: Document, theme: Theme, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.doc = doc
        self.banner = ModelBanner(doc)
        self.damage_banner = DamageBanner(doc, theme)
        self.changed_banner = ChangedBanner(doc)
        self.verify_banner = VerifyBanner(doc, theme)
        self.corrupted_banner = CorruptedBanner(doc)  # shown on a copy the hex view corrupted
        self.overview = OverviewView(doc, theme)
        self.tree = StructureView(doc)
        self.bytemap = ByteMap(doc)
        self.hex = HexView(doc)
        self.cells = CellMapView(doc, theme)
        self.layers = LayerView(doc, theme)
        self.tokens = TokensView(doc)
        self.findings = FindingsView(doc)
        self.diff = DiffView(doc, theme)
        self.lab = LabView(doc, theme)
        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        for name in TAB_VIEWS:
            self.tabs.addTab(getattr(self, name), TAB_TITLES[name])
        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.setSpacing(2)
        map_row = QHBoxLayout()
        map_row.setContentsMargins(0, 0, 0, 0)
        map_row.addWidget(self.bytemap, 1)
        self.bytemap_export = doc_export_button(self.bytemap, doc)
        self.bytemap_export.setToolTip("save the byte map as a PNG picture, or its regions (offset, size, node, "
                                       "status) as CSV")
        map_row.addWidget(self.bytemap_export, 0, Qt.AlignmentFlag.AlignTop)
        self.bytemap.exporter = self.bytemap_export
        rl.addLayout(map_row)
        rl.addWidget(self.tabs, 1)
        self.split = QSplitter(Qt.Orientation.Horizontal)
        self.split.addWidget(self.tree)
        self.split.addWidget(right)
        self.split.setStretchFactor(1, 1)
        self.split.setSizes([self.TREE_DEFAULT, 930])
        self.split.setCollapsible(0, True)
        self._split_by_hand = False  # the user dragged the split (or it was restored): it is left as it is
        self._auto_tree: int | None = None  # the tree's width as fit_tree (or give_hex_room) last set it
        self.split.splitterMoved.connect(self._on_split_moved)
        self.error = plain_label()
        self.error.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.error.setWordWrap(True)
        self.stack = QStackedWidget()
        self.stack.addWidget(self.split)
        self.stack.addWidget(self.error)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(2)
        lay.addWidget(self.banner)
        lay.addWidget(self.changed_banner)
        lay.addWidget(self.damage_banner)
        lay.addWidget(self.verify_banner)
        lay.addWidget(self.corrupted_banner)
        lay.addWidget(self.stack, 1)
        for src in (self.overview, self.damage_banner):
            src.jumpRequested.connect(self.show_view)
        doc.loaded.connect(self._on_loaded)
        doc.loaded.connect(self.fit_tree)  # after the tree sized its columns for the file
        doc.statsReady.connect(self._update_titles)
        doc.tokensChanged.connect(self._update_titles)
        for sig in (doc.loaded, doc.statsReady, doc.verifyChanged):  # after the tree's own reload (connected first)
            sig.connect(self._flag_tree)
        doc.diffReady.connect(lambda: self.show_view("diff"))
        for view in (self.tree, self.findings, self.tokens):  # "Show bytes in Hex" of their context menus
            view.showBytes.connect(lambda: self.show_view("hex"))
        doc.failed.connect(self._on_failed)
        theme.changed.connect(lambda dark: self.hex.model.set_colors(self.hex.palette().highlight().color(), dark))
        self.error.setText(f"Reading {doc.name}…")
        self.stack.setCurrentWidget(self.error)
        self._tree_sizes: list[int] | None = None  # the split before the Lab folded the tree away
        self.tabs.currentChanged.connect(self._on_tab)
        self.diff.pages.currentChanged.connect(lambda _i: self.give_hex_room())  # the side-by-side bytes

    def _on_tab(self, index: int) -> None:
        """The Lab is a workspace of its own: in front, it takes the tree's width and the byte map's height
        (its matrix and controls fit at 1280x800); the tree and byte map come back as they were after."""
        lab = 0 <= index < len(TAB_VIEWS) and TAB_VIEWS[index] == "lab"
        if 0 <= index < len(TAB_VIEWS) and TAB_VIEWS[index] in ("hex", "diff"):
            self.give_hex_room()
        self.bytemap.setVisible(not lab)
        self.bytemap_export.setVisible(not lab)
        sizes = self.split.sizes()
        if lab and self._tree_sizes is None:
            self._tree_sizes = sizes
            self.split.setSizes([0, sum(sizes)])
        elif not lab and self._tree_sizes is not None:
            if sizes[0] == 0:  # not opened again by hand meanwhile
                self.split.setSizes(self._tree_sizes)
            self._tree_sizes = None

    TREE_MIN = 120  # the tree's narrowest when it gives way to the hex dump
    TREE_DEFAULT = 470  # the tree's width where the window has no room for more (1280x800)
    TREE_SHARE = 0.36  # the most of the page's width the tree takes to show its columns whole

    def _on_split_moved(self, _pos: int, _index: int) -> None:
        self._split_by_hand = True

    def fit_tree(self) -> None:
        """Widen the tree until its columns show whole (not past :attr:`TREE_SHARE` of the page, nor below
        :attr:`TREE_DEFAULT`): at 1920x1080 its kind and status columns were cut. A split the user dragged,
        restored from the settings, or set by other code since is left alone, as is the Lab's fold."""
        sizes = self.split.sizes()
        if self._split_by_hand or len(sizes) != 2 or sizes[0] == 0 or self._tree_sizes is not None:
            return
        if self._auto_tree is not None and sizes[0] != self._auto_tree:
            return
        total = sum(sizes)
        if total < 2 * self.TREE_DEFAULT:
            return
        want = max(self.TREE_DEFAULT, min(self.tree.wanted_width(), int(total * self.TREE_SHARE)))
        if want != sizes[0]:
            self.split.setSizes([want, total - want])
        self._auto_tree = self.split.sizes()[0]

    def give_hex_room(self) -> None:
        """Narrow the tree (not below :attr:`TREE_MIN`) until the hex view shows all 16 hex and ASCII columns
        beside its inspector, or the Diff view's side-by-side bytes all their columns; on a window too narrow
        for that they scroll sideways."""
        sizes, right = self.split.sizes(), self.split.widget(1)
        if len(sizes) != 2 or sizes[0] == 0 or right is None:
            return
        i = self.tabs.currentIndex()
        name = TAB_VIEWS[i] if 0 <= i < len(TAB_VIEWS) else ""
        view: QWidget  # the hex view or the diff view, whichever shows a hex dump
        if name == "hex":
            view, wanted = self.hex, self.hex.wanted_width()
        elif name == "diff" and self.diff.pages.currentWidget() is self.diff.hexdiff:
            view, wanted = self.diff, self.diff.hexdiff.wanted_width() + 8
        else:
            return
        extra = right.width() - view.width() if view.width() > 0 else 0
        want = wanted + max(0, extra)
        if sizes[1] >= want:
            return
        tree = max(self.TREE_MIN, sizes[0] - (want - sizes[1]))
        if tree < sizes[0]:
            by_us = self._auto_tree is not None and sizes[0] == self._auto_tree
            self.split.setSizes([tree, sum(sizes) - tree])
            if by_us:
                self._auto_tree = self.split.sizes()[0]

    def resizeEvent(self, e: QResizeEvent) -> None:
        super().resizeEvent(e)
        self.fit_tree()
        self.give_hex_room()

    def _on_loaded(self) -> None:
        self.stack.setCurrentWidget(self.split)
        self._update_titles()
        self.banner.setVisible(True)

    def _on_failed(self, message: str) -> None:
        self.error.setText(f"Cannot read {self.doc.path}:\n{message}")
        self.stack.setCurrentWidget(self.error)
        self.banner.hide()
        self.damage_banner.hide()
        self.verify_banner.hide()

    def _flag_tree(self) -> None:
        """Flag the tree nodes findings point at; list what a truncated file is missing as its own row."""
        res, verdict = self.doc.result, self.doc.verdict()
        if res is None or verdict is None:
            return
        model = self.tree.model
        model.set_problems(res.findings, verdict.missing, dropped_records(res, self.doc.verify))
        if model.missing_node is not None:
            self.tree.tree.expand(model.index(1, 0))

    def _update_titles(self) -> None:
        res = self.doc.result
        n = len(res.findings) if res is not None else 0
        errors = res.n_errors if res is not None else 0
        i = TAB_VIEWS.index("findings")
        self.tabs.setTabText(i, f"Findings ({n:,})" if n else "Findings")
        self.tabs.setTabToolTip(i, plural(errors, "error") if errors else "")
        i = TAB_VIEWS.index("tokens")
        tokens = doc_tokens(self.doc)  # a blob's: those given for it
        self.tabs.setTabText(i, f"Tokens ({len(tokens):,})" if tokens else "Tokens")

    def show_view(self, name: str) -> None:
        """Bring view ``name`` (one of :data:`VIEW_NAMES`) to the front."""
        if name in TAB_VIEWS:
            self.tabs.setCurrentIndex(TAB_VIEWS.index(name))
        elif name == "tree":
            self.tree.tree.setFocus()
        elif name == "bytemap":
            self.bytemap.setFocus()

    def current_view(self) -> str:
        return TAB_VIEWS[self.tabs.currentIndex()]

    def save_layout(self) -> QByteArray:
        """The split as the user set it (empty where it is the page's own fit, so that the next window fits
        the tree to its own width)."""
        if not self._split_by_hand:
            return QByteArray()
        if self._tree_sizes is not None:  # the tree as the user left it, not folded by the Lab
            folded = self.split.sizes()
            self.split.setSizes(self._tree_sizes)
            state = self.split.saveState()
            self.split.setSizes(folded)
            return state
        return self.split.saveState()

    def restore_layout(self, state: QByteArray | None) -> None:
        if state is not None and self.split.restoreState(state):
            self._split_by_hand = True
