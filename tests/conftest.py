"""Test-wide set-up: ``--qt-platform`` for the Qt test folders (shared helpers live in :mod:`tests.support`).

``--qt-platform=xcb`` (or ``KVSCOPE_TEST_QT_PLATFORM=xcb``) starts a private Xvfb for the run and
makes every GUI test drive real X11 windows; the default is Qt's offscreen platform. Tests marked
``xserver`` are run once more under Xvfb by tests/app/test_gui_xserver.py during a normal run.

Tests marked ``engine`` drive libllama through llama-cpp-python; where that binding (the engine extra) is
not installed, as in CI's core-only venv, they are deselected, as whole engine test files are left
uncollected by their folders' conftests. Where the README's set-up ran, nothing is deselected.

``pytest -m "not slow"`` is the fast inner loop (docs/testing.md). ``slow`` is set on a test file that is
heavy of its own (``pytestmark``), and here on every test that runs real llama.cpp: marked ``engine``, or
using the pinned builds (the ``builds`` / ``pinned_builds`` fixtures, directly or through another fixture).
CI runs everything.
"""

import importlib.util
import os

import pytest

_XSERVER_KEY = pytest.StashKey[object]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--qt-platform", choices=("offscreen", "xcb"),
        default=os.environ.get("KVSCOPE_TEST_QT_PLATFORM", "offscreen"),
        help="Qt platform of the GUI tests: offscreen (default) or xcb in a private Xvfb")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "xserver: GUI test that is also run in a real X server (Xvfb, xcb platform)")
    if config.getoption("--qt-platform") == "xcb":
        from tests.support.xserver import start_xvfb

        server = start_xvfb()
        config.stash[_XSERVER_KEY] = server
        os.environ["DISPLAY"] = server.display
        os.environ["QT_QPA_PLATFORM"] = "xcb"
        os.environ.pop("WAYLAND_DISPLAY", None)
    else:
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


SLOW_FIXTURES = frozenset({"builds", "pinned_builds"})  # the pinned llama.cpp builds: libllama, llama-server


@pytest.hookimpl(tryfirst=True)  # before -m reads the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("engine") is not None or SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    if importlib.util.find_spec("llama_cpp") is not None:
        return
    engine = [item for item in items if item.get_closest_marker("engine") is not None]
    if engine:
        config.hook.pytest_deselected(items=engine)
        items[:] = [item for item in items if item.get_closest_marker("engine") is None]


def pytest_unconfigure(config: pytest.Config) -> None:
    server = config.stash.get(_XSERVER_KEY, None)
    if server is not None:
        server.stop()  # type: ignore[attr-defined]


def pytest_report_header(config: pytest.Config) -> str:
    return f"qt platform: {os.environ.get('QT_QPA_PLATFORM')} (display {os.environ.get('DISPLAY', '-')})"
