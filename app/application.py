"""The QApplication kvscope runs in: names used by QSettings, ini-format settings, pyqtgraph options."""

from __future__ import annotations

import sys

from PySide6.QtCore import QCoreApplication, QSettings
from PySide6.QtWidgets import QApplication

ORGANIZATION = "kvscope"
APPLICATION = "kvscope"


def ensure_app(argv: list[str] | None = None) -> QApplication:
    """The running QApplication (created when there is none), configured for kvscope."""
    from kvscope.app.compat import immortalize_singletons

    immortalize_singletons()
    app = QApplication.instance()
    if not isinstance(app, QApplication):
        app = QApplication(argv if argv is not None else [sys.argv[0] if sys.argv else "kvscope"])
    QCoreApplication.setOrganizationName(ORGANIZATION)
    QCoreApplication.setApplicationName(APPLICATION)
    QApplication.setApplicationDisplayName("kvscope")
    QSettings.setDefaultFormat(QSettings.Format.IniFormat)
    import pyqtgraph as pg

    pg.setConfigOptions(antialias=True)
    return app
