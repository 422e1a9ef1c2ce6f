"""The QApplication kvscope runs in: names used by QSettings, ini-format settings, pyqtgraph options,
a Qt message filter that drops the one note Qt's offscreen platform prints for every window, a check
before the QApplication that Qt's xcb plugin can load (:mod:`kvscope.app.base.platform_check`: one line
naming the X11 packages, not Qt's abort), and the
core's cleanup on SIGINT/SIGTERM/SIGHUP (``kvscope.core.fsutil.install_signal_cleanup``): the app writes
exports, reports and screenshots from worker threads, whose temporary files must not outlive a kill.
Python runs a signal handler only when it gets control, so a light timer lets it in while Qt's event
loop waits."""

from __future__ import annotations

import importlib.resources
import sys
from typing import Any

from PySide6.QtCore import QCoreApplication, QMessageLogContext, QSettings, QTimer, QtMsgType, qInstallMessageHandler
from PySide6.QtGui import QGuiApplication, QIcon
from PySide6.QtWidgets import QApplication

ORGANIZATION = "kvscope"
APPLICATION = "kvscope"
APP_ID = "io.github.kvscope.kvscope"  # the .desktop / AppStream / MIME file names in resources/


# Printed by the offscreen platform for every top-level window shown (``--screenshot``, reports):
# that platform has no window manager to pass size hints to, so the note says nothing to a user.
QUIET_MESSAGES = frozenset({"This plugin does not support propagateSizeHints()"})
_previous_handler: Any = None
_filter_installed = False
SIGNAL_POLL_MS = 250  # how often Python gets control in the event loop, to run a signal handler
_signal_timer: QTimer | None = None


def _message_handler(kind: QtMsgType, context: QMessageLogContext, message: str) -> None:
    if message in QUIET_MESSAGES:
        return
    if _previous_handler is not None:
        _previous_handler(kind, context, message)
    else:
        sys.stderr.write(message + "\n")


def install_message_filter() -> None:
    """Drop the messages in :data:`QUIET_MESSAGES`; every other Qt message goes where it went before."""
    global _previous_handler, _filter_installed
    if not _filter_installed:
        _previous_handler = qInstallMessageHandler(_message_handler)
        _filter_installed = True


def install_signal_cleanup(app: QApplication) -> None:
    """Once per process: the core's signal cleanup, and a timer that lets Python run its handlers."""
    global _signal_timer
    if _signal_timer is not None:
        return
    from kvscope.core.fsutil import install_signal_cleanup as core_cleanup

    core_cleanup()
    _signal_timer = QTimer(app)
    _signal_timer.setInterval(SIGNAL_POLL_MS)
    _signal_timer.timeout.connect(lambda: None)
    _signal_timer.start()


def ensure_app(argv: list[str] | None = None) -> QApplication:
    """The running QApplication (created when there is none), configured for kvscope."""
    from kvscope.app.base.compat import immortalize_singletons

    immortalize_singletons()
    install_message_filter()
    app = QApplication.instance()
    if not isinstance(app, QApplication):
        from kvscope.app.base.platform_check import check_platform

        check_platform()  # one line naming the X11 packages to install, not Qt's abort
        app = QApplication(argv if argv is not None else [sys.argv[0] if sys.argv else "kvscope"])
    QCoreApplication.setOrganizationName(ORGANIZATION)
    QCoreApplication.setApplicationName(APPLICATION)
    QApplication.setApplicationDisplayName("kvscope")
    QGuiApplication.setDesktopFileName(APP_ID)  # lets the desktop match windows to the .desktop file
    icon = importlib.resources.files("kvscope.resources") / f"{APP_ID}.svg"
    if icon.is_file():
        app.setWindowIcon(QIcon(str(icon)))
    QSettings.setDefaultFormat(QSettings.Format.IniFormat)
    install_signal_cleanup(app)
    import pyqtgraph as pg

    pg.setConfigOptions(antialias=True)
    return app
