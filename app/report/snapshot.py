"""Rendering a view off screen into a PNG (GUI thread only).

A view is shown with ``WA_DontShowOnScreen`` (it counts as visible, so views that draw only when
shown do draw, but no window appears even in the running app), given the light palette, sized,
left to finish its background work, then painted into a QImage at device pixel ratio 1, so the
same report comes out of the command line and of the app whatever the screen.
"""

from __future__ import annotations

from PySide6.QtCore import QBuffer, QByteArray, QElapsedTimer, QEventLoop, QIODevice, Qt, QTimer
from PySide6.QtGui import QImage
from PySide6.QtWidgets import QApplication, QWidget

from kvscope.app.base.tasks import TaskRunner
from kvscope.app.base.theme import light_palette

SETTLE_TIMEOUT_MS = 120000


def settle(runner: TaskRunner, timeout_ms: int = SETTLE_TIMEOUT_MS) -> bool:
    """Process events until ``runner`` has no task left (True) or ``timeout_ms`` passes (False)."""
    timer = QElapsedTimer()
    timer.start()
    quiet = 0
    while timer.elapsed() < timeout_ms:
        QApplication.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 50)
        quiet = quiet + 1 if not runner.active else 0
        if quiet >= 3:
            return True
        loop = QEventLoop()
        QTimer.singleShot(10, loop.quit)
        loop.exec()
    return False


def prepare(widget: QWidget, width: int, height: int) -> None:
    """Light palette, fixed size, shown without a window on screen."""
    widget.setAttribute(Qt.WidgetAttribute.WA_DontShowOnScreen, True)
    widget.setPalette(light_palette())
    widget.setAutoFillBackground(True)
    widget.resize(width, height)
    widget.show()


def grab(widget: QWidget) -> QImage:
    """``widget`` painted into an ARGB32 image of its size (device pixel ratio 1)."""
    img = QImage(widget.size(), QImage.Format.Format_ARGB32)
    img.setDevicePixelRatio(1.0)
    img.fill(widget.palette().window().color())
    widget.render(img)
    return img


def png_bytes(img: QImage) -> bytes:
    """``img`` encoded as PNG."""
    data = QByteArray()
    buf = QBuffer(data)
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    if not img.save(buf, "PNG"):  # type: ignore[call-overload]  # the stubs want bytes; PySide6 wants str
        raise OSError("cannot encode a PNG")
    buf.close()
    return bytes(data.data())


def dispose(widget: QWidget) -> None:
    """Hide and schedule deletion of a rendered view."""
    widget.hide()
    widget.deleteLater()
