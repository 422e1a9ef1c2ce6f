"""The pinned llama.cpp builds for test folders outside tests/engine (verify, the lab against the engine).

``ensure_builds()`` builds a missing pinned build once per run (about 6 minutes each on 2 cores),
``need_build(name)`` gives an installed build or fails the test with the command that builds it.
``HAVE_BINDING`` tells a conftest whether llama-cpp-python (the engine extra) is installed: without
it the engine test files are not collected, as in tests/engine, so the core-only venv runs the rest.
Nothing here skips.
"""

from __future__ import annotations

import importlib.util
import sys

import pytest

from kvscope.core.engine.builds import BUILDS, BuildError, InstalledBuild, ensure_build, installed

HAVE_BINDING = importlib.util.find_spec("llama_cpp") is not None
BUILD_NAMES = tuple(b.name for b in BUILDS)
_ERRORS: dict[str, str] = {}


def ensure_builds() -> None:
    for b in BUILDS:
        if installed(b) is None and b.name not in _ERRORS:
            print(f"\nkvscope tests: building llama.cpp {b.name} (about 6 minutes) ...", file=sys.stderr, flush=True)
            try:
                ensure_build(b)
            except BuildError as e:
                _ERRORS[b.name] = str(e)


def need_build(name: str) -> InstalledBuild:
    b = next(b for b in BUILDS if b.name == name)
    have = installed(b)
    if have is None:
        why = _ERRORS.get(name, "not in the cache")
        pytest.fail(f"llama.cpp build {name} is missing ({why}); build it with `kvscope llama-build --build {name}`")
    return have
