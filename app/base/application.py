"""The QApplication kvscope runs in: names used by QSettings, ini-format settings, pyqtgraph options."""

from __future__ import annotations

import importlib.resources
import sys

from PySide6.QtCore import QCoreApplication, QSettings
from PySide6.QtGui import QGuiApplication, QIcon
from PySide6.QtWidgets import QApplication

ORGANIZATION = "kvscope"
APPLICATION = "kvscope"
APP_ID = "io.github.kvscope.kvscope"  # the .desktop / AppStream / MIME file names in resources/


def ensure_app(argv: list[str] | None = None) -> QApplication:
    """The running QApplication (created when there is none), configured for kvscope."""
    from kvscope.app.base.compat import immortalize_singletons

    immortalize_singletons()
    app = QApplication.instance()
    if not isinstance(app, QApplication):
        app = QApplication(argv if argv is not None else [sys.argv[0] if sys.argv else "kvscope"])
    QCoreApplication.setOrganizationName(ORGANIZATION)
    QCoreApplication.setApplicationName(APPLICATION)
    QApplication.setApplicationDisplayName("kvscope")
    QGuiApplication.setDesktopFileName(APP_ID)  # lets the desktop match windows to the .desktop file
    icon = importlib.resources.files("kvscope.resources") / f"{APP_ID}.svg"
    if icon.is_file():
        app.setWindowIcon(QIcon(str(icon)))
    QSettings.setDefaultFormat(QSettings.Format.IniFormat)
    import pyqtgraph as pg

    pg.setConfigOptions(antialias=True)
    return app
