"""The lab tests that run real llama.cpp (``test_lab_engine*.py``, ``test_fuzz_engine.py``, ``test_lab_trained.py``,
which also needs the trained model): the pinned
builds are built first when missing, and without llama-cpp-python (the engine extra) those files are
not collected (tests/engine does the same); the other lab tests need no engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvscope.core.engine.builds import InstalledBuild
from tests.support.llama_builds import BUILD_NAMES, HAVE_BINDING, ensure_builds, need_build

ENGINE_TESTS = ("test_lab_engine.py", "test_lab_engine_cli.py", "test_fuzz_engine.py", "test_lab_engine_faults.py",
                "test_lab_trained.py", "test_lab_new_scenario.py")

if not HAVE_BINDING:
    collect_ignore = list(ENGINE_TESTS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any(Path(str(item.path)).name in ENGINE_TESTS for item in items):
        ensure_builds()


@pytest.fixture(scope="session")
def builds() -> dict[str, InstalledBuild]:
    return {name: need_build(name) for name in BUILD_NAMES}
