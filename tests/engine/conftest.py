"""Fixtures for the real-llama.cpp engine tests: the pinned builds, built first when missing.

When any test in this folder is collected and a pinned build is not in the cache, it is built here
(``ensure_build``, about 6 minutes per build on 2 cores, outside every test's timeout); a failed
build makes the tests that need it fail with the command that builds it. Nothing here skips.
test_llamacpp_process.py needs llama-cpp-python (the ``engine`` extra): without it, the file is
not collected, as tests/app is not without Qt, so the core-only CI venv runs the rest.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from kvscope.core.engine.builds import BUILDS, BuildError, InstalledBuild, ensure_build, installed

HERE = Path(__file__).parent
_BUILD_ERRORS: dict[str, str] = {}

if importlib.util.find_spec("llama_cpp") is None:
    # the binding drives libllama in these (and the trained model's server runs belong with the engine
    # suite: CI's core-only run has no engine extra, its full run has)
    collect_ignore = ["test_llamacpp_process.py", "test_build_integrity.py", "test_consumers.py",
                      "test_reuse_fixtures.py", "test_reuse_trained.py", "test_trained_model.py"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any(HERE in Path(str(item.path)).parents for item in items):
        return
    for b in BUILDS:
        if installed(b) is None and b.name not in _BUILD_ERRORS:
            print(f"\nkvscope tests: building llama.cpp {b.name} (about 6 minutes) ...", file=sys.stderr, flush=True)
            try:
                ensure_build(b)
            except BuildError as e:
                _BUILD_ERRORS[b.name] = str(e)


def need_build(name: str) -> InstalledBuild:
    """The installed build ``name``, or a test failure naming the command that builds it."""
    b = next(b for b in BUILDS if b.name == name)
    have = installed(b)
    if have is None:
        why = _BUILD_ERRORS.get(name, "not in the cache")
        pytest.fail(f"llama.cpp build {name} is missing ({why}); build it with `kvscope llama-build --build {name}`")
    return have


@pytest.fixture(scope="session")
def builds() -> dict[str, InstalledBuild]:
    """Both pinned builds, by name."""
    return {b.name: need_build(b.name) for b in BUILDS}
