"""Smoke runs of every bench and fuzzer in ``--quick`` mode (#32): each must end with exit 0, print
no traceback and print every row of its table; no figure is asserted (figures belong in the benches).

Each script runs as a user runs it, ``python bench/NAME.py --quick``, from a folder outside the
checkout (a bench imports what it needs from the package or ``bench/`` itself, never from ``tests/``).
The engine benches need llama-cpp-python (the engine extra) and the pinned builds, the GUI bench
PySide6: without them those files are not collected (the core-only suite), and with the engine extra
a missing pinned build is built first, so on a machine where the README's first command ran nothing
skips.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.llama_builds import HAVE_BINDING, ensure_builds

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
BENCH = ROOT / "bench"

collect_ignore_glob: list[str] = []
if not HAVE_BINDING:
    collect_ignore_glob.append("test_bench_smoke_engine.py")
if importlib.util.find_spec("PySide6") is None:
    collect_ignore_glob.append("test_bench_smoke_gui.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any(Path(str(item.path)).name == "test_bench_smoke_engine.py" for item in items):
        ensure_builds()


def run_bench(script: str, *args: str, cwd: Path, timeout: float = 600, ok: tuple[int, ...] = (0,),
              env: dict[str, str] | None = None) -> str:
    """``python bench/SCRIPT --quick ARGS`` run from ``cwd``: its stdout and stderr together, after
    checking the exit status is in ``ok`` and nothing printed a traceback."""
    p = subprocess.run([sys.executable, str(BENCH / script), "--quick", *args], capture_output=True, text=True,
                       timeout=timeout, cwd=cwd, check=False, env={**os.environ, **(env or {})})
    text = p.stdout + p.stderr
    assert p.returncode in ok, f"{script} exited {p.returncode}:\n{text[-6000:]}"
    assert "Traceback" not in text, text[-6000:]
    return text


def assert_rows(text: str, rows: tuple[str, ...] | list[str]) -> None:
    missing = [r for r in rows if r not in text]
    assert not missing, f"rows missing from the table: {missing}\n{text[-6000:]}"
