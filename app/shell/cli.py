"""``kvscope gui``: the command that opens the window (and, with ``--screenshot``, saves a picture of it).

The core CLI finds :func:`register` through the ``kvscope.commands`` entry-point group; this
module imports Qt only when the command runs, so ``kvscope inspect`` never pays for it.

Exit codes: 0 the window was closed (``--screenshot``: the picture is saved); 2 a FILE, model or
``--diff`` file that is not a regular file, no PySide6, or a picture that could not be taken (one
line on stderr). A file that opens but is not a state file is shown in the window, not refused here.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from kvscope.core.engine.choices import VERIFY_ENGINES
from kvscope.core.errors import EXIT_BAD_INPUT, KvscopeError, UsageError, error_line, path_kind

# the views of a file's page, in tab order (the page, app/shell/document_widget.py, takes them from here)
VIEW_NAMES = ("overview", "tree", "bytemap", "hex", "cells", "layers", "tokens", "findings", "diff", "lab")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="*", metavar="FILE", help="state files to open (each in its own tab)")
    p.add_argument("--model", metavar="GGUF", help="read the files with this model (remembered per file)")
    p.add_argument("--diff", metavar="OTHER", help="compare the first FILE with OTHER")
    p.add_argument("--screenshot", metavar="OUT.png", help="render the window, save it as a PNG and exit")
    p.add_argument("--view", choices=VIEW_NAMES, help="view to show first (with --screenshot: the one pictured)")
    p.add_argument("--theme", choices=("system", "light", "dark"), help="colour scheme (default: the saved one)")
    p.add_argument("--lab-restore", metavar="STATE", help="with --view lab: the state to restore into the first FILE "
                   "(default: the clean sequence-0 blob of its lab scenario folder)")
    p.add_argument("--size", metavar="WxH", default="1400x900", help="window size for --screenshot (default 1400x900)")
    p.add_argument("--verify", action="store_true", help="verify the first FILE once it is read (Tools → Verify: "
                   "restore in real llama.cpp, re-prefill, compare; needs --model or a remembered model); with "
                   "--screenshot, before the picture")
    p.add_argument("--engine", choices=VERIFY_ENGINES, help="the engine Verify runs in (remembered "
                   "like Tools → Engine Settings; default: the saved one, llama.cpp)")


def register(subparsers: Any) -> None:
    """Add the ``gui`` subcommand to the core CLI's subparsers."""
    p = subparsers.add_parser("gui", help="open state files in the graphical inspector")
    add_arguments(p)
    p.set_defaults(func=cmd_gui)


def _no_display() -> bool:
    if os.environ.get("QT_QPA_PLATFORM"):
        return False
    if sys.platform.startswith("linux"):
        return not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
    return False


MAX_SIDE = 8192  # pixels per side of a --screenshot (Qt's raster engine needs 4 bytes a pixel: 256 MiB here)


def _parse_size(text: str) -> tuple[int, int]:
    """``WxH`` for ``--size``: each side 1 to :data:`MAX_SIDE` (raised to the window's least, 400x300);
    UsageError otherwise, before Qt starts (a 100000x100000 window printed thousands of Qt warnings)."""
    parts = text.strip().lower().split("x")
    if len(parts) != 2 or not all(p.strip().isdecimal() and p.strip().isascii() for p in parts):
        raise UsageError(f"--size {text}: expected WIDTHxHEIGHT in pixels, such as 1400x900")
    w, h = (int(p) if len(p.strip()) <= 9 else MAX_SIDE + 1 for p in parts)  # no int() of 100,000 digits
    if not (0 < w <= MAX_SIDE and 0 < h <= MAX_SIDE):
        raise UsageError(f"--size {text}: each side must be 1 to {MAX_SIDE} pixels")
    return max(400, w), max(300, h)


def cmd_gui(args: argparse.Namespace) -> int:
    """Run the window (``--screenshot``: render, save, exit). Returns a process exit code."""
    for f in [*args.files, *([args.model] if args.model else []), *([args.diff] if args.diff else []),
              *([args.lab_restore] if args.lab_restore else [])]:
        if not os.path.isfile(f):  # a folder, a FIFO or a device says what it is, not "no such file"
            print(error_line(f"{f}: {path_kind(f)}"), file=sys.stderr)
            return EXIT_BAD_INPUT
    if args.screenshot:  # the one output rule: never an input (by any path), never a FIFO, device or folder
        from kvscope.core.fsutil import output_problem

        refused = output_problem(args.screenshot, [*args.files, args.model, args.diff, args.lab_restore])
        if refused is not None:
            print(f"kvscope: {refused}", file=sys.stderr)
            return EXIT_BAD_INPUT
    if args.screenshot:
        _parse_size(args.size)  # a bad --size is refused before Qt starts
    if args.screenshot and _no_display():
        os.environ["QT_QPA_PLATFORM"] = "offscreen"
    try:
        import pyqtgraph  # noqa: F401
        import PySide6  # noqa: F401
    except ImportError as e:
        print(f"kvscope: the GUI needs PySide6 and pyqtgraph (pip install 'kvscope[gui]'): {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.screenshot:
        with tempfile.TemporaryDirectory(prefix="kvscope-shot-") as tmp:
            return _run(args, os.path.join(tmp, "settings.ini"))
    return _run(args, None)


def _run(args: argparse.Namespace, settings_file: str | None) -> int:
    from PySide6.QtCore import QCoreApplication, QEvent, QSettings

    from kvscope.app.base.application import ensure_app
    from kvscope.app.base.theme import Theme
    from kvscope.app.shell.main_window import MainWindow
    from kvscope.app.shell.settings import AppSettings

    app = ensure_app()
    qs = QSettings(settings_file, QSettings.Format.IniFormat) if settings_file else QSettings()
    settings = AppSettings(qs)
    theme = Theme(args.theme or settings.theme())
    theme.apply()
    if args.engine:
        from dataclasses import replace

        settings.set_engine(replace(settings.engine(), engine=args.engine))
    win = MainWindow(settings, theme)
    opened = [w for f in args.files if (w := win.open_file(f, model=args.model)) is not None]
    if args.screenshot:
        from kvscope.app.shell.screenshot import take_screenshot

        rc = take_screenshot(win, args.screenshot, args.view, args.diff, _parse_size(args.size), args.lab_restore,
                             verify=args.verify)
        win.runner.shutdown()
        win.deleteLater()
        # tear the window down now: left to Python's exit, pyqtgraph views resize half-deleted items (SIGSEGV)
        QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete.value)
        return int(rc)
    if args.diff and opened:
        first = opened[0]

        def diff_once() -> None:
            first.doc.loaded.disconnect(diff_once)
            win.compare_with(args.diff, first)

        first.doc.loaded.connect(diff_once)
    if args.verify and opened:
        first = opened[0]

        def verify_once() -> None:
            first.doc.loaded.disconnect(verify_once)
            win.verify(first)

        first.doc.loaded.connect(verify_once)
    if args.view:
        for w in opened:
            w.show_view(args.view)
    win.show()
    return int(app.exec())


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kvscope-gui`` script."""
    ap = argparse.ArgumentParser(prog="kvscope-gui", description="Graphical inspector for llama.cpp saved state.")
    add_arguments(ap)
    try:
        args = ap.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as e:
        return int(e.code) if isinstance(e.code, int) else EXIT_BAD_INPUT
    try:
        return cmd_gui(args)
    except KvscopeError as e:
        print(error_line(e), file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
