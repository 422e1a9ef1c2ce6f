"""Rotation tests: the real-engine checks need llama-cpp-python (the engine extra) and the pinned builds.

Without the binding the real-engine file is not collected (the core-only CI venv), as in tests/engine.
"""

from __future__ import annotations

import importlib.util

from tests.engine.conftest import builds  # noqa: F401  (the pinned llama.cpp builds, by name)

if importlib.util.find_spec("llama_cpp") is None:
    collect_ignore = ["test_rotation_real_engine.py"]
