"""The main window: documents in tabs, menus and shortcuts, drag and drop, status bar, persistence."""

from __future__ import annotations

import os

from PySide6.QtCore import QElapsedTimer, QEventLoop, QRect, QSize, Qt, QTimer
from PySide6.QtGui import QCloseEvent, QDragEnterEvent, QDropEvent, QScreen, QShowEvent
from PySide6.QtWidgets import (
    QApplication,
    QFileDialog,
    QInputDialog,
    QMainWindow,
    QMessageBox,
    QProgressBar,
    QTabWidget,
    QToolButton,
)

from kvscope.app.base.tasks import TaskRunner
from kvscope.app.base.theme import Theme
from kvscope.app.base.widgets import plain_label
from kvscope.app.document.doc_index import Selection
from kvscope.app.document.document import Document
from kvscope.app.document.verify_job import EngineChoice
from kvscope.app.report.export import ReportExporter, export_document
from kvscope.app.shell.document_widget import DocumentWidget
from kvscope.app.shell.engine_dialog import EngineDialog, edit_engine
from kvscope.app.shell.menus import build_menus
from kvscope.app.shell.open_dialog import StateFileDialog, state_file_dialog
from kvscope.app.shell.repair_dialog import open_repaired, repair_document
from kvscope.app.shell.settings import AppSettings
from kvscope.app.shell.tokens_dialog import tokens_document
from kvscope.core.textsafe import safe_text

GGUF_FILTER = "GGUF model (*.gguf);;All files (*)"
DEFAULT_SIZE = QSize(1400, 900)  # the first window's size where the screen has room for it


def fitted_rect(avail: QRect, size: QSize, frame: QSize | None = None) -> QRect:
    """The window's client rectangle: ``size`` (with ``frame``, the window manager's frame, around it) cut
    down to ``avail``, centred on it."""
    frame = frame if frame is not None else QSize(0, 0)
    w = max(400, min(size.width(), avail.width() - frame.width()))
    h = max(300, min(size.height(), avail.height() - frame.height()))
    x = avail.x() + max(0, (avail.width() - w - frame.width()) // 2)
    y = avail.y() + max(0, (avail.height() - h - frame.height()) // 2)
    return QRect(x, y, w, h)


class MainWindow(QMainWindow):
    """kvscope's window. ``settings`` may be given (tests pass an isolated one)."""

    def __init__(self, settings: AppSettings | None = None, theme: Theme | None = None) -> None:
        super().__init__()
        self.settings = settings if settings is not None else AppSettings()
        self.theme = theme if theme is not None else Theme(self.settings.theme(), self)
        self.runner = TaskRunner(self)
        self.last_message = ""  # the last warning shown (tests and scripts read it)
        self._shown_once = False
        self._fitted: QSize | None = None  # the size the window was given at the start
        self.setWindowTitle("kvscope")
        self.setAcceptDrops(True)
        self.tabs = QTabWidget()
        self.tabs.setTabsClosable(True)
        self.tabs.setMovable(True)
        self.tabs.tabCloseRequested.connect(self.close_tab)
        self.tabs.currentChanged.connect(self._on_tab_changed)
        self.welcome = plain_label("Open a llama.cpp state file: File → Open (Ctrl+O), or drop files here.\n"
                              "Slot files, sequence state files and blobs, session files.")
        self.welcome.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.setCentralWidget(self.tabs)
        self._show_welcome(True)
        self._build_status_bar()
        self.exporter = ReportExporter(self.runner, self.statusBar().showMessage, self)
        self.exporter.failed.connect(self._on_export_failed)
        self.actions_ = build_menus(self)
        self.runner.activeChanged.connect(self._on_active)
        self.runner.progressed.connect(self._on_progress)
        self._restore_window()
        self._update_actions()

    # -- layout helpers ------------------------------------------------------------------------------
    def _show_welcome(self, on: bool) -> None:
        if on and self.centralWidget() is not self.welcome:
            self.takeCentralWidget()
            self.setCentralWidget(self.welcome)
        elif not on and self.centralWidget() is not self.tabs:
            self.takeCentralWidget()
            self.setCentralWidget(self.tabs)

    def _build_status_bar(self) -> None:
        sb = self.statusBar()
        self.offset_label = plain_label()
        self.size_label = plain_label()
        self.path_label = plain_label()
        self.path_label.setMinimumWidth(200)
        self.progress = QProgressBar()
        self.progress.setMaximumWidth(160)
        self.progress.setTextVisible(False)
        self.cancel_button = QToolButton()
        self.cancel_button.setText("Cancel")
        self.cancel_button.setToolTip("Cancel background work")
        self.cancel_button.clicked.connect(self.runner.cancel_all)
        for w in (self.path_label, self.offset_label, self.size_label, self.progress, self.cancel_button):
            sb.addPermanentWidget(w)
        self.progress.hide()
        self.cancel_button.hide()

    # -- documents -----------------------------------------------------------------------------------
    @property
    def documents(self) -> list[DocumentWidget]:
        return [w for i in range(self.tabs.count()) if isinstance(w := self.tabs.widget(i), DocumentWidget)]

    def current(self) -> DocumentWidget | None:
        w = self.tabs.currentWidget()
        return w if isinstance(w, DocumentWidget) else None

    def open_file(self, path: str, model: str | None = None) -> DocumentWidget | None:
        """Open ``path`` in a new tab (or switch to it); ``model`` overrides the remembered model."""
        path = os.path.abspath(path)
        if not os.path.isfile(path) or not os.access(path, os.R_OK):
            why = "no such file" if not os.path.exists(path) else "not a readable file"
            self._warn(f"Cannot open {path}: {why}.")
            return None
        for w in self.documents:
            if w.doc.path == path:
                self.tabs.setCurrentWidget(w)
                if model is not None and model != w.doc.model_path:
                    self.set_model(w, model)
                return w
        if model is not None:
            self.settings.set_model_for(path, model)
        doc = Document(path, self.runner, model or self.settings.model_for(path), self, self.settings.qs)
        w = DocumentWidget(doc, self.theme)
        w.restore_layout(self.settings.bytes_value("layout/document_split"))
        w.banner.modelChosen.connect(lambda m, w=w: self.set_model(w, m))
        w.banner.browseRequested.connect(lambda w=w: self.choose_model(w))
        w.diff.compareRequested.connect(lambda w=w: self.compare_with(None, w))
        w.verify_banner.modelRequested.connect(lambda w=w: self.choose_model(w))
        w.verify_banner.settingsRequested.connect(self.engine_settings)
        w.overview.verifyRequested.connect(lambda w=w: self.verify(w))
        w.hex.copyWritten.connect(lambda p, what, w=w: self.open_corrupted(w, p, what))
        w.corrupted_banner.verifyRequested.connect(lambda w=w: self.verify(w))
        w.corrupted_banner.labRequested.connect(lambda w=w: self.send_to_lab(w))
        w.overview.cancelVerifyRequested.connect(w.doc.cancel_verify)
        w.overview.repairRequested.connect(lambda w=w: repair_document(self, w))
        w.overview.openRequested.connect(lambda p, w=w: open_repaired(self, w, p))
        w.overview.repair.changed.connect(self._update_actions)
        w.overview.tokensRequested.connect(lambda w=w: tokens_document(self, w))
        w.lab.engine_choice = self.settings.engine
        doc.verify_engine = self.settings.engine().describe()
        doc.verifyChanged.connect(self._update_actions)
        doc.tokensChanged.connect(self._update_actions)
        doc.message.connect(lambda text: self.statusBar().showMessage(text, 8000))
        doc.failed.connect(lambda msg, p=path: self._on_load_failed(p, msg))
        doc.bus.changed.connect(lambda sel, d=doc: self._on_selection(d, sel))
        doc.loaded.connect(self._update_actions)
        doc.loaded.connect(lambda d=doc: self._forget_unfit_model(d))
        w.banner.recall = self.settings.arch_models
        i = self.tabs.addTab(w, doc.name)
        self.tabs.setTabToolTip(i, safe_text(path))
        self.tabs.setCurrentIndex(i)
        self._show_welcome(False)
        self.settings.add_recent(path)
        self.settings.set_last_dir(os.path.dirname(path))
        doc.load()
        return w

    def open_corrupted(self, source: DocumentWidget, path: str, what: str) -> DocumentWidget | None:
        """Open the corrupted copy ``path`` of ``source``'s file in a new tab (with its model), headed by what was
        done and one click to Verify it or send it to the Lab."""
        model = source.doc.model_path if source.doc.profile is not None else None
        w = self.open_file(path, model=model)
        if w is not None:
            w.corrupted_banner.show_copy(source.doc.path, what)
        return w

    def send_to_lab(self, w: DocumentWidget) -> None:
        """The Lab of ``w`` with its file as the state to restore, into the scenario its source sits in."""
        from kvscope.app.lab.jobs import scenario_folder

        source = w.corrupted_banner.source or w.doc.path
        folder = scenario_folder(source)
        if folder is not None:
            w.lab.controls.add_folder(folder)
        w.lab.controls.set_restore(w.doc.path)
        w.show_view("lab")

    def _on_load_failed(self, path: str, message: str) -> None:
        self.statusBar().showMessage(f"Cannot read {safe_text(os.path.basename(path))}: {message}", 10000)
        self._warn(f"Cannot read {safe_text(path)}:\n{message}")

    def _warn(self, text: str) -> None:
        """A non-blocking message box (never a modal loop that tests or scripts could hang on)."""
        self.statusBar().showMessage(text.splitlines()[0], 10000)
        box = QMessageBox(QMessageBox.Icon.Warning, "kvscope", text, QMessageBox.StandardButton.Ok, self)
        box.setTextFormat(Qt.TextFormat.PlainText)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.setModal(False)
        box.show()
        self.last_message = text

    def close_tab(self, index: int) -> None:
        w = self.tabs.widget(index)
        if isinstance(w, DocumentWidget):
            self.settings.set_bytes_value("layout/document_split", w.save_layout())
            w.doc.close()
            self.tabs.removeTab(index)
            w.deleteLater()
            w.doc.deleteLater()
        if self.tabs.count() == 0:
            self._show_welcome(True)
        self._update_actions()

    def close_current(self) -> None:
        if self.tabs.count():
            self.close_tab(self.tabs.currentIndex())

    # -- file actions ------------------------------------------------------------------------------------
    def open_dialog(self) -> StateFileDialog:
        """File → Open: state files by content or extension (a slot file named ``chat1`` shows); never blocks."""
        dlg = state_file_dialog(self, "Open state files", self.settings.last_dir(), many=True)
        dlg.filesSelected.connect(lambda paths: [self.open_file(p) for p in paths])
        return dlg

    def set_model(self, w: DocumentWidget, model: str | None) -> None:
        """Read ``w``'s file with ``model`` (None: without one) and remember the choice."""
        self.settings.set_model_for(w.doc.path, model)
        w.doc.set_model(model)

    def _forget_unfit_model(self, doc: Document) -> None:
        """A model the file does not fit (the verdict's ``model_mismatch``) is not remembered for it; one it
        fits is remembered for its architecture (offered to the next file of it that has no model yet)."""
        v = doc.verdict()
        if doc.profile is None or doc.model_path is None or v is None or doc.result is None:
            return
        if v.state != "model_mismatch" and doc.result.kind != "unknown":
            self.settings.set_arch_model(doc.profile.arch, doc.model_path)
        elif self.settings.model_for(doc.path) == os.path.abspath(doc.model_path):
            self.settings.set_model_for(doc.path, None)

    def choose_model(self, w: DocumentWidget | None = None) -> None:
        w = w or self.current()
        if w is None:
            return
        start = os.path.dirname(w.doc.model_path or w.doc.path)
        path, _ = QFileDialog.getOpenFileName(self, f"Model for {w.doc.name}", start, GGUF_FILTER)
        if path:
            self.set_model(w, path)

    def compare_with(self, path: str | None = None, w: DocumentWidget | None = None) -> None:
        """Diff ``w`` (default: the current document) against ``path`` (asks for a file when None)."""
        w = w or self.current()
        if w is None or w.doc.result is None:
            return
        if path is None:
            dlg = state_file_dialog(self, f"Compare {w.doc.name} with", os.path.dirname(w.doc.path), many=False)
            dlg.fileSelected.connect(lambda p, w=w: self.compare_with(p, w) if p else None)
            return
        w.show_view("diff")
        w.doc.compare_with(path)

    def export_report(self, dest: str | None = None) -> None:
        """File → Export report: the current file's report (asks for the folder and options when ``dest`` is None)."""
        w = self.current()
        if w is not None:
            export_document(self.exporter, w.doc, self, self.settings.last_dir() or os.path.dirname(w.doc.path), dest)

    def _on_export_failed(self, _message: str) -> None:
        self.last_message = self.exporter.last_message

    # -- verify -----------------------------------------------------------------------------------------
    def verify(self, w: DocumentWidget | None = None) -> None:
        """Tools → Verify: verify ``w``'s file (default: the current one) in the engine of the settings, in
        the background; the Overview shows the progress and then the result, a banner why it cannot run."""
        w = w or self.current()
        if w is None or w.doc.result is None:
            return
        w.show_view("overview")
        task = w.doc.start_verify(self.settings.engine())
        if task is None and w.doc.verify_error:
            self.statusBar().showMessage(w.doc.verify_error.splitlines()[0], 10000)
            self.last_message = w.doc.verify_error
        self._update_actions()

    def cancel_verify(self) -> None:
        w = self.current()
        if w is not None:
            w.doc.cancel_verify()

    def engine_settings(self) -> EngineDialog:
        """Tools → Engine Settings (window-modal); OK saves the choice."""
        dlg = edit_engine(self.settings.engine(), self)
        dlg.accepted.connect(lambda: self._set_engine(dlg.choice()))
        return dlg

    def _set_engine(self, choice: EngineChoice) -> None:
        self.settings.set_engine(choice)
        for w in self.documents:
            if not w.doc.verifying:
                w.doc.verify_engine = choice.describe()
                w.overview.refresh()

    def goto_offset(self, offset: int | None = None) -> None:
        """Select the byte at ``offset`` in the current document (asks when None)."""
        w = self.current()
        if w is None or w.doc.index is None:
            return
        if offset is None:
            text, ok = QInputDialog.getText(self, "Go to offset", "Offset (decimal or 0x hex):")
            if not ok or not text.strip():
                return
            try:
                offset = int(text.strip().replace("_", "").replace(",", ""), 0)
            except ValueError:
                self.statusBar().showMessage(f"not an offset: {text!r}", 5000)
                return
        size = int(w.doc.data.size)
        if not 0 <= offset < size:
            self.statusBar().showMessage(f"offset {offset:,} is outside the file (0..{size - 1:,})", 5000)
            return
        w.doc.bus.select(w.doc.index.for_offset(offset), origin=self)
        w.show_view("hex")

    def step_finding(self, delta: int) -> None:
        w = self.current()
        if w is not None:
            w.show_view("findings")
            w.findings.step(delta)

    def step_difference(self, delta: int) -> None:
        w = self.current()
        if w is not None:
            w.show_view("diff")
            w.diff.step(delta)

    def find_in_tree(self) -> None:
        """Find (Ctrl+F): the hex view's find bar when the hex view is in front, else the tree's find box."""
        w = self.current()
        if w is not None and w.current_view() == "hex":
            w.hex.focus_find()
        elif w is not None:
            w.tree.focus_find()

    def show_view(self, name: str) -> None:
        w = self.current()
        if w is not None:
            w.show_view(name)

    def set_theme(self, name: str) -> None:
        self.settings.set_theme(name)
        self.theme.set_preference(name)

    # -- status ---------------------------------------------------------------------------------------
    def _on_selection(self, doc: Document, sel: Selection) -> None:
        w = self.current()
        if w is None or w.doc is not doc:
            return
        self.offset_label.setText(f"offset {sel.at:,} (0x{sel.at:x})")
        self.size_label.setText(f"size {sel.length:,}")
        path = sel.node.path if sel.node is not None else ""
        if sel.cell is not None:
            path += f" · cell {sel.cell}"
        self.path_label.setText(path)

    def _on_tab_changed(self, _index: int) -> None:
        w = self.current()
        sel = w.doc.bus.current if w is not None else None
        if w is not None and sel is not None:
            self._on_selection(w.doc, sel)
        else:
            for label in (self.offset_label, self.size_label, self.path_label):
                label.setText("")
        self.setWindowTitle(f"{w.doc.name} — kvscope" if w is not None else "kvscope")
        self._update_actions()

    def _on_active(self, n: int) -> None:
        self.progress.setVisible(n > 0)
        self.cancel_button.setVisible(n > 0)
        if n > 0:
            self.progress.setRange(0, 0)

    def _on_progress(self, label: str, fraction: object, text: str) -> None:
        if isinstance(fraction, float):
            self.progress.setRange(0, 1000)
            self.progress.setValue(int(fraction * 1000))
        else:
            self.progress.setRange(0, 0)
        self.statusBar().showMessage(f"{label}: {text}", 4000)

    def _update_actions(self) -> None:
        if hasattr(self, "actions_"):
            self.actions_.update(self.current())

    # -- drag and drop -----------------------------------------------------------------------------------
    def dragEnterEvent(self, e: QDragEnterEvent) -> None:
        if e.mimeData().hasUrls() and any(u.isLocalFile() for u in e.mimeData().urls()):
            e.acceptProposedAction()

    def dropEvent(self, e: QDropEvent) -> None:
        paths = [u.toLocalFile() for u in e.mimeData().urls() if u.isLocalFile()]
        for p in paths:
            cur = self.current()
            if p.lower().endswith(".gguf") and cur is not None:
                self.set_model(cur, p)  # a dropped model applies to the file in front
            else:
                self.open_file(p)
        e.acceptProposedAction()

    # -- persistence --------------------------------------------------------------------------------------
    def _screen(self) -> QScreen | None:
        return self.screen() or QApplication.primaryScreen()

    def fits_screen(self) -> bool:
        """Whether the window (its frame too, where the window manager has drawn one) lies within the
        available geometry of the screen it is on."""
        screen = self._screen()
        if screen is None:
            return True
        frame = self.frameGeometry() if self.isVisible() else self.geometry()
        return screen.availableGeometry().contains(frame)

    def fit_to_screen(self) -> None:
        """The first window's size (:data:`DEFAULT_SIZE`), cut down to the available geometry of its screen
        (a 1280x800 laptop screen, less its panels), centred on it."""
        screen = self._screen()
        frame = self.frameGeometry().size() - self.geometry().size() if self.isVisible() else QSize(0, 0)
        size = self.size() if self.isVisible() else DEFAULT_SIZE
        if screen is None:
            self.resize(size)
        else:
            self.setGeometry(fitted_rect(screen.availableGeometry(), size, frame))
        self._fitted = self.size()

    def _restore_window(self) -> None:
        """The saved geometry where it fits the screen the window opens on (a window saved on a larger
        monitor is not restored half off a laptop's screen), else the default fitted to it."""
        geo = self.settings.bytes_value("window/geometry")
        restored = geo is not None and self.restoreGeometry(geo)
        if restored and not self.isMaximized() and not self.fits_screen():
            restored = False
        if not restored:
            self.fit_to_screen()
        self._fitted = self.size()
        state = self.settings.bytes_value("window/state")
        if state is not None:
            self.restoreState(state)

    def showEvent(self, e: QShowEvent) -> None:
        super().showEvent(e)
        if not self._shown_once:  # the frame a window manager adds is known once shown: keep it on screen
            self._shown_once = True
            QTimer.singleShot(0, self._keep_on_screen)

    def _keep_on_screen(self) -> None:
        """Once shown, the window with its frame: cut down again where the frame pushes it off the screen (a
        size set by the caller since, such as ``--screenshot --size``, is left as it is)."""
        if (self.isVisible() and self._fitted is not None and self.size() == self._fitted
                and not self.isMaximized() and not self.isFullScreen() and not self.fits_screen()):
            self.fit_to_screen()

    def save_settings(self) -> None:
        self.settings.set_bytes_value("window/geometry", self.saveGeometry())
        self.settings.set_bytes_value("window/state", self.saveState())
        w = self.current()
        if w is not None:
            self.settings.set_bytes_value("layout/document_split", w.save_layout())
        self.settings.sync()

    def closeEvent(self, e: QCloseEvent) -> None:
        self.save_settings()
        self.runner.shutdown()
        super().closeEvent(e)

    # -- scripting and tests ------------------------------------------------------------------------------
    def wait_idle(self, timeout_ms: int = 30000) -> bool:
        """Process events until no background task is left (True) or ``timeout_ms`` passes (False)."""
        timer = QElapsedTimer()
        timer.start()
        quiet = 0
        while timer.elapsed() < timeout_ms:
            QApplication.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 50)
            quiet = quiet + 1 if not self.runner.active else 0
            if quiet >= 3:
                return True
            loop = QEventLoop()
            QTimer.singleShot(20, loop.quit)
            loop.exec()
        return False
