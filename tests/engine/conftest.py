"""Fixtures for the real-llama.cpp engine tests: the pinned builds, built first when missing.

When any test in this folder is collected and a pinned build is not in the cache, it is built here
(:func:`tests.support.llama_builds.ensure_builds`, about 6 minutes per build on 2 cores, outside every
test's timeout); a failed build makes the tests that need it fail with the command that builds it.
Nothing here skips. The files that drive libllama or the trained model's servers need llama-cpp-python
(the ``engine`` extra): without it they are not collected, as tests/app is not without Qt, so the
core-only CI venv runs the rest.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvscope.core.engine.builds import InstalledBuild
from tests.support.llama_builds import BUILD_NAMES, HAVE_BINDING, ensure_builds, need_build

HERE = Path(__file__).parent

if not HAVE_BINDING:
    # the binding drives libllama in these (and the trained model's server runs belong with the engine
    # suite: CI's core-only run has no engine extra, its full run has)
    collect_ignore = ["test_llamacpp_process.py", "test_build_integrity.py", "test_consumers.py",
                      "test_reuse_fixtures.py", "test_reuse_trained.py", "test_trained_model.py",
                      "test_engine_session.py"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any(HERE in Path(str(item.path)).parents for item in items):
        ensure_builds()


@pytest.fixture(scope="session")
def builds() -> dict[str, InstalledBuild]:
    """Both pinned builds, by name."""
    return {name: need_build(name) for name in BUILD_NAMES}
