"""Tools › Engine Settings: the engine Verify runs in (and the build or server the Lab's real-engine runs use).

llama.cpp: a pinned build (or the one that writes the file's layout), or the user's own libllama folder.
llama-server: one kvscope starts (the pinned build's binary, or a binary given here), or a running one
(its URL and ``--slot-save-path`` folder). torch: the memory core, restore only. The pinned builds are
listed from :mod:`kvscope.core.engine.builds` (stdlib only), with whether each is built here.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QButtonGroup, QComboBox, QFileDialog, QFormLayout, QLineEdit, QRadioButton, QWidget

from kvscope.app.base.form_dialog import FormDialog, browse_button, path_row
from kvscope.app.base.widgets import plain_label
from kvscope.app.document.verify_job import ENGINE_TITLES, EngineChoice
from kvscope.core.engine.choices import VERIFY_ENGINES

AUTO_BUILD = "automatic: the build that writes the file's layout"


def pinned_builds() -> list[tuple[str, str]]:
    """(name, label) of the pinned llama.cpp builds, saying which are built in the cache."""
    from kvscope.core.engine.builds import BUILDS, installed

    out = []
    for b in BUILDS:
        state = "built" if installed(b) is not None else f"not built: kvscope llama-build --build {b.name}"
        out.append((b.name, f"{b.name} ({b.date}, writes {b.writes}; {state})"))
    return out


class EngineDialog(FormDialog):
    """Edits an :class:`EngineChoice`; :meth:`choice` reads it back."""

    def __init__(self, choice: EngineChoice, parent: QWidget | None = None) -> None:
        super().__init__("Engine settings", parent)
        self.engine_combo = QComboBox()
        for name in VERIFY_ENGINES:
            self.engine_combo.addItem(ENGINE_TITLES[name], name)
        self.build_combo = QComboBox()
        self.build_combo.addItem(AUTO_BUILD, None)
        for name, label in pinned_builds():
            self.build_combo.addItem(label, name)
        self.own_lib = QRadioButton("your own libllama folder")
        self.pinned = QRadioButton("a pinned build")
        self.lib_edit = QLineEdit()
        self.lib_edit.setPlaceholderText("folder holding libllama.so (its ABI is checked)")
        self.lib_pick = browse_button()
        self.start_server = QRadioButton("kvscope starts one (127.0.0.1, a temporary slot folder)")
        self.running_server = QRadioButton("a running llama-server")
        self.bin_edit = QLineEdit()
        self.bin_edit.setPlaceholderText("llama-server binary (empty: the build's)")
        self.bin_pick = browse_button()
        self.url_edit = QLineEdit()
        self.url_edit.setPlaceholderText("http://127.0.0.1:8080")
        self.slot_edit = QLineEdit()
        self.slot_edit.setPlaceholderText("the server's --slot-save-path folder")
        self.slot_pick = browse_button()
        # two groups: radio buttons of one parent are otherwise one exclusive set, and checking the server's
        # option unchecked the pinned build's
        self.lib_group, self.server_group = QButtonGroup(self), QButtonGroup(self)
        for group, buttons in ((self.lib_group, (self.pinned, self.own_lib)),
                               (self.server_group, (self.start_server, self.running_server))):
            for b in buttons:
                group.addButton(b)
        self.note = plain_label(" ", wrap=True)
        self._layout()
        self.set_choice(choice)
        for sig in (self.engine_combo.currentIndexChanged, self.own_lib.toggled, self.running_server.toggled,
                    self.url_edit.textChanged, self.slot_edit.textChanged):
            sig.connect(self._update)
        self.lib_pick.clicked.connect(lambda: self._pick_dir(self.lib_edit, "libllama folder"))
        self.slot_pick.clicked.connect(lambda: self._pick_dir(self.slot_edit, "slot folder of the server"))
        self.bin_pick.clicked.connect(self._pick_bin)
        self._update()

    def _layout(self) -> None:
        form = QFormLayout()
        form.addRow("Engine", self.engine_combo)
        form.addRow("llama.cpp", self.pinned)
        form.addRow("", self.build_combo)
        form.addRow("", self.own_lib)
        form.addRow("", path_row(self.lib_edit, self.lib_pick))
        form.addRow("llama-server", self.start_server)
        form.addRow("", path_row(self.bin_edit, self.bin_pick))
        form.addRow("", self.running_server)
        form.addRow("URL", self.url_edit)
        form.addRow("Slot folder", path_row(self.slot_edit, self.slot_pick))
        self.finish_layout(form, self.note)

    def set_choice(self, c: EngineChoice) -> None:
        self.engine_combo.setCurrentIndex(max(0, self.engine_combo.findData(c.engine)))
        i = self.build_combo.findData(c.build) if c.build else 0
        self.build_combo.setCurrentIndex(max(0, i))
        (self.own_lib if c.lib_path else self.pinned).setChecked(True)
        self.lib_edit.setText(c.lib_path or "")
        (self.running_server if c.server_url else self.start_server).setChecked(True)
        self.bin_edit.setText(c.server_bin or "")
        self.url_edit.setText(c.server_url or "")
        self.slot_edit.setText(c.slot_dir or "")

    def choice(self) -> EngineChoice:
        """The settings as edited: blanks as None; the server's fields are kept while Verify uses llama.cpp (the
        Lab's llama-server runs use them), those of the options not chosen dropped."""
        engine = self.engine_combo.currentData()
        build = self.build_combo.currentData()
        running = self.running_server.isChecked()
        return EngineChoice(
            engine=engine if isinstance(engine, str) else "llama.cpp",
            build=build if isinstance(build, str) else None,
            lib_path=self.lib_edit.text() if self.own_lib.isChecked() else None,
            server_url=self.url_edit.text() if running else None,
            slot_dir=self.slot_edit.text() if running else None,
            server_bin=None if running else self.bin_edit.text(),
        ).stripped()

    def _update(self) -> None:
        engine = self.engine_combo.currentData()
        llama, server = engine == "llama.cpp", engine == "server"
        own = self.own_lib.isChecked()
        running = self.running_server.isChecked()
        groups: list[tuple[tuple[QWidget, ...], bool]] = [
            ((self.pinned, self.own_lib), llama),
            ((self.build_combo,), (llama and not own) or (server and not running)),
            ((self.lib_edit, self.lib_pick), llama and own),
            ((self.start_server, self.running_server), server),
            ((self.bin_edit, self.bin_pick), server and not running),
            ((self.url_edit, self.slot_edit, self.slot_pick), server and running)]
        for widgets, on in groups:
            for w in widgets:
                w.setEnabled(on)
        self.note.setText({"llama.cpp": "Verify restores the file in libllama (a child process: a crash in llama.cpp "
                                        "is an outcome), re-prefills its tokens and compares record by record.",
                           "server": "llama-server restores slot files (sequence state files) only.",
                           "torch": "The memory core restores with llama.cpp's checks but has no forward pass: "
                                    "nothing is re-prefilled or compared."}.get(str(engine), ""))
        self.set_problem(self.choice().problem())

    def _pick_dir(self, edit: QLineEdit, title: str) -> None:
        folder = QFileDialog.getExistingDirectory(self, title, edit.text())
        if folder:
            edit.setText(folder)

    def _pick_bin(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "llama-server binary", self.bin_edit.text())
        if path:
            self.bin_edit.setText(path)


def edit_engine(choice: EngineChoice, parent: QWidget | None = None) -> EngineDialog:
    """Open the dialog (window-modal, never a blocking loop); the caller connects ``accepted``."""
    dlg = EngineDialog(choice, parent)
    dlg.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    dlg.open()
    return dlg
