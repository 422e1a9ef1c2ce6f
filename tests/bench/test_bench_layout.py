"""Every bench and fuzzer script has a ``--quick`` mode that the smoke tests run, and nothing under
``bench/`` imports from ``tests/`` (a bench runs from any folder, #32)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.bench.conftest import BENCH, HERE

SCRIPTS = sorted(p for p in BENCH.glob("*.py") if p.name.startswith(("bench_", "fuzz_"))
                 and "__main__" in p.read_text(encoding="utf-8"))


def _imported(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_the_scripts_are_found() -> None:
    names = {p.name for p in SCRIPTS}
    assert {"bench_reader.py", "bench_rotation.py", "fuzz_long.py", "fuzz_fleet.py"} <= names, names


def test_nothing_under_bench_imports_tests() -> None:
    offenders = {str(p.relative_to(BENCH)): sorted(m for m in _imported(p) if m == "tests" or m.startswith("tests."))
                 for p in BENCH.rglob("*.py") if "out" not in p.relative_to(BENCH).parts}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_every_script_has_quick_and_a_smoke_test() -> None:
    smoke = "\n".join(p.read_text(encoding="utf-8") for p in HERE.glob("test_bench_smoke_*.py"))
    for script in SCRIPTS:
        assert '"--quick"' in script.read_text(encoding="utf-8"), f"{script.name} has no --quick mode"
        assert f'"{script.name}"' in smoke, f"{script.name} is not run by a smoke test"


def test_the_finder_sees_a_tests_import(tmp_path: Path) -> None:
    p = tmp_path / "x.py"
    p.write_text("import os\nfrom tests.support import y\nimport tests.support.z as w\nfrom . import q\n")
    assert {m for m in _imported(p) if m.startswith("tests")} == {"tests.support", "tests.support.z"}
