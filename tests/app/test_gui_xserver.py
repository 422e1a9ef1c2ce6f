"""The GUI tests marked ``xserver`` run once more in a real X server (Xvfb, Qt's xcb platform).

A normal (offscreen) run starts ``pytest --qt-platform=xcb -m xserver`` on tests/app and
tests/report in a subprocess: the same tests, driving X11 windows. Needs the Debian/Ubuntu
package ``xvfb`` and the xcb plugin's libraries named in README.md (``.ci/run`` installs them).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QLabel

pytestmark = pytest.mark.slow  # the xserver tests again in Xvfb

ROOT = Path(__file__).resolve().parent.parent.parent


@pytest.mark.xserver
def test_windows_map_on_the_requested_platform(qtbot, qt_platform: str) -> None:  # type: ignore[no-untyped-def]
    assert qt_platform == os.environ["QT_QPA_PLATFORM"]
    label = QLabel("kvscope")
    qtbot.addWidget(label)
    label.resize(200, 40)
    label.show()
    qtbot.waitExposed(label)
    assert label.isVisible() and label.windowHandle() is not None
    if qt_platform == "xcb":  # the private Xvfb's screen (tests/xserver.py)
        assert QGuiApplication.primaryScreen().size().toTuple() == (1920, 1080)


def test_marked_gui_tests_pass_in_a_real_x_server(qt_platform: str) -> None:
    if qt_platform == "xcb":
        pytest.skip("this run is already the X server run")  # only reached with --qt-platform=xcb
    env = {k: v for k, v in os.environ.items() if k not in ("QT_QPA_PLATFORM", "DISPLAY")}
    env.pop("KVSCOPE_TEST_QT_PLATFORM", None)
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "--qt-platform=xcb", "-m", "xserver", "-q", "-p", "no:cacheprovider",
         "tests/app", "tests/report"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-6000:]
    passed = re.search(r"(\d+) passed", out)
    assert passed and int(passed.group(1)) >= 1, out[-3000:]
    assert " skipped" not in out.splitlines()[-1], out[-3000:]
