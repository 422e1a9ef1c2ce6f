"""Fixtures for the generated-model and generated-fixture tests.

test_models_in_builds.py drives the pinned llama.cpp builds through llama-cpp-python (the engine
extra): without the binding it is not collected, as tests/engine's process tests are not. A
missing build fails those tests with the command that builds it; nothing here skips.
"""

from __future__ import annotations

import importlib.util

import pytest

from kvscope.core.engine.builds import BUILDS, InstalledBuild, installed

if importlib.util.find_spec("llama_cpp") is None:
    collect_ignore = ["test_models_in_builds.py"]


@pytest.fixture(scope="session")
def pinned_builds() -> dict[str, InstalledBuild]:
    """Both pinned builds by name; a missing one fails the test with the command that builds it."""
    out = {}
    for b in BUILDS:
        have = installed(b)
        if have is None:
            pytest.fail(f"llama.cpp build {b.name} is not built; build it with `kvscope llama-build --build {b.name}`")
        out[b.name] = have
    return out
