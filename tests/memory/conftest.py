"""Memory-core tests: test_mem_class_engine.py compares the core with real llama.cpp, so it needs
llama-cpp-python (the engine extra) and the pinned builds.

Without the binding that file is not collected (the core-only CI venv), as in tests/engine; a
missing build fails its tests with the command that builds it. Nothing here skips.
"""

from __future__ import annotations

import importlib.util

from tests.engine.conftest import builds  # noqa: F401  (the pinned llama.cpp builds, by name)

if importlib.util.find_spec("llama_cpp") is None:
    collect_ignore = ["test_mem_class_engine.py"]
