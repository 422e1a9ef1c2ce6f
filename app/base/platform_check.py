"""Before the QApplication: can Qt's xcb platform plugin load here? One line naming what to install if not.

Without one of the X11 libraries Qt's xcb plugin needs, Qt prints several lines ("Could not load the Qt
platform plugin "xcb" ... This application failed to start because no Qt platform plugin could be
initialized. Reinstalling the application may fix this problem.") and aborts the process. On Linux, when
the platform will be xcb, :func:`xcb_problem` does what Qt does first, loading the plugin
(``dlopen``, through :mod:`ctypes`), and when that fails, names the Debian/Ubuntu packages of the
libraries that cannot be loaded (:data:`SONAME_PACKAGES`, the list of ``.ci/run`` and
docs/reference.md); :func:`display_problem` connects to the X display as the plugin would (an unset or
unreachable ``DISPLAY`` makes Qt abort the same way). :func:`check_platform` runs both in a child process
(about 0.1 s) and raises what it finds as a :class:`~kvscope.core.errors.SetupError`, which the command
prints as one line (exit code 2). No Qt class is created here.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvscope.core.errors import SetupError

# the shared libraries Qt's xcb plugin (libqxcb.so, libQt6XcbQpa.so.6) loads, and their Debian packages
SONAME_PACKAGES: dict[str, str] = {
    "libxcb-cursor.so.0": "libxcb-cursor0",
    "libxcb-icccm.so.4": "libxcb-icccm4",
    "libxcb-keysyms.so.1": "libxcb-keysyms1",
    "libxcb-image.so.0": "libxcb-image0",
    "libxcb-randr.so.0": "libxcb-randr0",
    "libxcb-render-util.so.0": "libxcb-render-util0",
    "libxcb-render.so.0": "libxcb-render0",
    "libxcb-shape.so.0": "libxcb-shape0",
    "libxcb-shm.so.0": "libxcb-shm0",
    "libxcb-sync.so.1": "libxcb-sync1",
    "libxcb-xfixes.so.0": "libxcb-xfixes0",
    "libxcb-xkb.so.1": "libxcb-xkb1",
    "libxcb-util.so.1": "libxcb-util1",
    "libxcb.so.1": "libxcb1",
    "libX11-xcb.so.1": "libx11-xcb1",
    "libX11.so.6": "libx11-6",
    "libxkbcommon-x11.so.0": "libxkbcommon-x11-0",
    "libxkbcommon.so.0": "libxkbcommon0",
    "libGL.so.1": "libgl1",
    "libEGL.so.1": "libegl1",
    "libfontconfig.so.1": "libfontconfig1",
    "libfreetype.so.6": "libfreetype6",
    "libdbus-1.so.3": "libdbus-1-3",
    "libglib-2.0.so.0": "libglib2.0-0",
    "libgthread-2.0.so.0": "libglib2.0-0",
}
# what docs/reference.md has a desktop install (the xcb plugin's libraries; .ci/run adds xvfb and xauth)
ALL_PACKAGES = (
    "libxcb-cursor0", "libxcb-icccm4", "libxcb-keysyms1", "libxcb-image0", "libxcb-randr0", "libxcb-render-util0",
    "libxcb-shape0", "libxcb-shm0", "libxcb-sync1", "libxcb-xfixes0", "libxcb-xkb1", "libxcb-glx0", "libxcb-util1",
    "libx11-xcb1", "libxkbcommon-x11-0", "libxkbcommon0", "libegl1", "libgl1", "libfontconfig1", "libfreetype6",
    "libdbus-1-3", "libglib2.0-0")
Loader = Callable[[str], Any]


def platform_is_xcb(env: dict[str, str] | None = None, platform: str | None = None) -> bool:
    """Whether Qt will start on its xcb platform: ``QT_QPA_PLATFORM`` says xcb first, or names nothing on
    Linux outside a Wayland session (where Qt 6 picks wayland)."""
    env = dict(os.environ) if env is None else env
    platform = sys.platform if platform is None else platform
    if not platform.startswith("linux"):
        return False
    named = env.get("QT_QPA_PLATFORM", "").strip()
    if named:
        return named.split(";")[0].split(":")[0].strip() == "xcb"
    return not (env.get("WAYLAND_DISPLAY") and env.get("XDG_SESSION_TYPE") == "wayland")


def xcb_plugin() -> Path | None:
    """The xcb platform plugin Qt would load (PySide6's own), None where there is none."""
    from PySide6.QtCore import QLibraryInfo

    folders = [os.environ["QT_QPA_PLATFORM_PLUGIN_PATH"]] if os.environ.get("QT_QPA_PLATFORM_PLUGIN_PATH") else []
    folders.append(os.path.join(QLibraryInfo.path(QLibraryInfo.LibraryPath.PluginsPath), "platforms"))
    for folder in folders:
        plugin = Path(folder) / "libqxcb.so"
        if plugin.is_file():
            return plugin
    return None


def _loads(load: Loader, name: str) -> str | None:
    """None when ``name`` loads, else the loader's reason."""
    try:
        load(name)
    except OSError as e:
        return str(e) or type(e).__name__
    return None


def xcb_problem(plugin: Path | None, load: Loader | None = None) -> str | None:
    """Why Qt's xcb plugin cannot load, as one line naming the packages to install; None when it loads (or
    when there is no plugin to try: Qt then says so itself)."""
    load = load if load is not None else ctypes.CDLL
    if plugin is None:
        return None
    why = _loads(load, str(plugin))
    if why is None:
        return None
    missing = [so for so in SONAME_PACKAGES if _loads(load, so) is not None]
    named = next((so for so in SONAME_PACKAGES if why.startswith(so + ":")), None)
    if named is not None and named not in missing:
        missing.insert(0, named)
    if missing:
        packages = list(dict.fromkeys(SONAME_PACKAGES[so] for so in missing))
        return (f"the desktop app cannot start: Qt's X11 (xcb) platform needs {', '.join(missing)}, which "
                f"cannot be loaded: install {'it' if len(packages) == 1 else 'them'} "
                f"(Debian/Ubuntu: apt-get install {' '.join(packages)})")
    return (f"the desktop app cannot start: Qt's X11 (xcb) platform plugin {plugin} cannot be loaded ({why}); "
            f"the libraries it needs are in these Debian/Ubuntu packages: apt-get install {' '.join(ALL_PACKAGES)}")


def display_problem(display: str | None, load: Loader | None = None) -> str | None:
    """Why no X display can be reached (Qt aborts there too), as one line; None when it can (or when libxcb
    cannot be asked: Qt then says it)."""
    if not display:
        return ("the desktop app cannot start: no X display (DISPLAY is not set): run it in a desktop session or "
                "under Xvfb (xvfb-run); --screenshot needs no display")
    load = load if load is not None else ctypes.CDLL
    try:
        xcb = load("libxcb.so.1")
        xcb.xcb_connect.restype = ctypes.c_void_p
        xcb.xcb_connect.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
        xcb.xcb_connection_has_error.argtypes = [ctypes.c_void_p]
        xcb.xcb_disconnect.argtypes = [ctypes.c_void_p]
        conn = xcb.xcb_connect(display.encode(), None)  # what Qt's xcb plugin does first
        error = int(xcb.xcb_connection_has_error(conn)) if conn else 1
        if conn:
            xcb.xcb_disconnect(conn)
    except (OSError, AttributeError):
        return None
    if error:
        return (f"the desktop app cannot start: cannot connect to the X display {display!r} (DISPLAY): is the X "
                f"server running, and may this user connect to it (xauth)?")
    return None


def probe_main(argv: list[str]) -> int:
    """The child process of :func:`check_platform`: ``PLUGIN DISPLAY`` in, the problem's line (or nothing) out."""
    plugin, display = (argv + ["", ""])[:2]
    problem = xcb_problem(Path(plugin) if plugin else None) or display_problem(display or None)
    if problem is not None:
        print(problem)
    return 0


PROBE = "import sys; from kvscope.app.base.platform_check import probe_main; sys.exit(probe_main(sys.argv[1:]))"


def check_platform() -> None:
    """SetupError (one line) when Qt will start on xcb and its plugin cannot load, or the X display cannot be
    reached: Qt would print several lines and abort. The plugin is loaded and the display reached in a child
    process (loading them here first made Qt's own connection fail now and then); a child that cannot run,
    or a frozen bundle, leaves it to Qt."""
    if not platform_is_xcb() or getattr(sys, "frozen", False):
        return
    plugin = xcb_plugin()
    try:
        p = subprocess.run([sys.executable, "-c", PROBE, str(plugin or ""), os.environ.get("DISPLAY", "")],
                           capture_output=True, text=True, timeout=60, check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return
    line = p.stdout.strip()
    if p.returncode == 0 and line:
        raise SetupError(line.splitlines()[-1])
