"""kvscope verify runs real llama.cpp: the pinned builds are built first when missing, and without
llama-cpp-python (the engine extra) this folder is not collected (tests/engine does the same)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvscope.core.engine.builds import InstalledBuild
from tests.support.llama_builds import BUILD_NAMES, HAVE_BINDING, ensure_builds, need_build

HERE = Path(__file__).parent

if not HAVE_BINDING:
    collect_ignore_glob = ["test_*.py"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any(HERE in Path(str(item.path)).parents for item in items):
        ensure_builds()


@pytest.fixture(scope="session")
def builds() -> dict[str, InstalledBuild]:
    return {name: need_build(name) for name in BUILD_NAMES}
