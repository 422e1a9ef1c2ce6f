"""A private X server (Xvfb) for the GUI tests that run on Qt's xcb platform.

``pytest --qt-platform=xcb`` (tests/conftest.py) starts one Xvfb for the whole run, points
``DISPLAY`` at it and sets ``QT_QPA_PLATFORM=xcb`` before any QApplication exists, so the same
pytest-qt tests that run offscreen by default drive real X11 windows. Xvfb is the Debian/Ubuntu
package ``xvfb``; the Qt xcb plugin's own libraries are listed in README.md.
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import time
from dataclasses import dataclass

SCREEN = "1920x1080x24"


class XServerError(RuntimeError):
    """Xvfb is missing or did not come up."""


@dataclass
class XServer:
    process: subprocess.Popen[bytes]
    display: str

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def start_xvfb(screen: str = SCREEN, timeout: float = 20.0) -> XServer:
    """Start ``Xvfb`` on a free display number (``-displayfd``) and wait until it accepts clients."""
    exe = shutil.which("Xvfb")
    if exe is None:
        raise XServerError("Xvfb not found: install the Debian/Ubuntu package 'xvfb' (apt-get install xvfb)")
    read_fd, write_fd = os.pipe()
    try:
        proc = subprocess.Popen(
            [exe, "-displayfd", str(write_fd), "-screen", "0", screen, "-nolisten", "tcp", "-noreset"],
            pass_fds=(write_fd,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE)
    finally:
        os.close(write_fd)
    number = b""
    deadline = time.monotonic() + timeout
    try:
        while not number.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([read_fd], [], [], left)[0]:
                break
            chunk = os.read(read_fd, 16)
            if not chunk:
                break
            number += chunk
    finally:
        os.close(read_fd)
    if not number.strip().isdigit():
        proc.kill()
        err = proc.communicate(timeout=10)[1].decode(errors="replace").strip().splitlines()
        raise XServerError(f"Xvfb did not start: {err[-1] if err else 'no display number'}")
    return XServer(proc, f":{number.strip().decode()}")
