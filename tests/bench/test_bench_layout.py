"""Every bench and fuzzer script has a ``--quick`` mode that the smoke tests run, and nothing under
``bench/`` imports from ``tests/`` (a bench runs from any folder, #32)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.bench.conftest import BENCH, HERE

FAMILY_MODULES = sorted(BENCH.glob("fuzz_fleet_*.py"))  # the long fuzz's families: run by fuzz_fleet.py
SCRIPTS = sorted(p for p in BENCH.glob("*.py") if p.name.startswith(("bench_", "fuzz_"))
                 and p not in FAMILY_MODULES and "__main__" in p.read_text(encoding="utf-8"))


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


def test_every_fuzz_family_module_is_registered() -> None:
    """A family written in a module of its own runs in fuzz_fleet (and so in its --quick smoke run)."""
    import importlib

    fuzz_fleet = importlib.import_module("fuzz_fleet")
    from fuzz_fleet_common import FAMILIES

    assert set(fuzz_fleet.CASES) == set(FAMILIES)
    registered = set(fuzz_fleet.CASES.values())
    for module in FAMILY_MODULES:
        if module.name in ("fuzz_fleet_common.py",):
            continue
        mod = importlib.import_module(module.stem)
        cases = [v for k, v in vars(mod).items() if k.startswith("case_") and callable(v)
                 and getattr(v, "__module__", "") == module.stem]
        assert cases, f"{module.name} defines no case_ function"
        assert all(c in registered for c in cases), f"{module.name}: {cases} not all in fuzz_fleet.CASES"
