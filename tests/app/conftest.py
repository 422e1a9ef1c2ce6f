"""Fixtures for the Qt layer's tests: Qt platform, isolated settings, a window, fixture paths.

The platform is offscreen unless pytest runs with ``--qt-platform=xcb`` (tests/conftest.py starts a
private Xvfb then); the ``qt_platform`` fixture names the one in use. Mark a test
``@pytest.mark.xserver`` to have it run in the real X server too during a normal run
(test_gui_xserver.py re-runs the marked tests under Xvfb). The files that drive real llama.cpp from the
app (:data:`ENGINE_TESTS`) need llama-cpp-python (the engine extra): without it they are not collected,
as tests/verify is not; with it, a pinned build missing from the cache is built first (nothing skips).
"""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import importlib.util  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from tests.support.gui_helpers import model  # noqa: E402

ENGINE_TESTS = ("test_gui_verify_engine.py", "test_gui_lab_engine.py", "test_gui_repair.py",
                "test_gui_blob_tokens_engine.py", "test_gui_engine_job_engine.py")

if importlib.util.find_spec("PySide6") is None or importlib.util.find_spec("pytestqt") is None:
    collect_ignore_glob = ["test_*.py"]  # the core suite runs without Qt
else:
    from tests.support.llama_builds import HAVE_BINDING, ensure_builds

    if not HAVE_BINDING:
        collect_ignore = list(ENGINE_TESTS)

    def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
        if any(Path(str(item.path)).name in ENGINE_TESTS for item in items):
            ensure_builds()

    from PySide6.QtCore import QSettings

    from tests.support.qt_settings import isolated_settings  # noqa: F401  (autouse fixture)

    @pytest.fixture
    def qt_platform(qapp) -> str:  # type: ignore[no-untyped-def]
        """The Qt platform plugin the tests run on: ``offscreen`` or ``xcb``."""
        from PySide6.QtGui import QGuiApplication

        return str(QGuiApplication.platformName())

    @pytest.fixture
    def app_settings(isolated_settings: QSettings):  # type: ignore[no-untyped-def]  # noqa: F811
        from kvscope.app.shell.settings import AppSettings

        return AppSettings(isolated_settings)

    @pytest.fixture
    def window(qtbot, app_settings):  # type: ignore[no-untyped-def]
        from kvscope.app.base.application import ensure_app
        from kvscope.app.base.theme import Theme
        from kvscope.app.shell.main_window import MainWindow

        ensure_app()
        win = MainWindow(app_settings, Theme("light"))
        qtbot.addWidget(win)
        win.resize(1300, 850)
        win.show()
        yield win
        win.runner.shutdown(5000)

    @pytest.fixture
    def open_doc(qtbot, window):  # type: ignore[no-untyped-def]
        """``open_doc(path, model=None)``: open a file and wait for parse and statistics."""

        def _open(path: str | Path, model_key: str | None = None):  # type: ignore[no-untyped-def]
            w = window.open_file(str(path), model=model(model_key) if model_key else None)
            assert w is not None
            qtbot.waitUntil(lambda: w.doc.result is not None and not w.doc.busy, timeout=15000)
            assert window.wait_idle(15000)
            return w

        return _open
