"""The import structure of the source tree: no import cycles, layered app packages, a core without Qt.

Read from the sources with ``ast`` (no module is imported, so this runs without Qt too). Every import
counts, in the app and the core alike: module level, inside functions, and under ``if TYPE_CHECKING:``
(a cycle hidden in a type-only or deferred import is still a cycle). Both trees' packages are layered.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).parent.parent
PACKAGES = {"core": "kvscope.core", "app": "kvscope.app"}
# kvscope.app's packages, bottom up: a module may import its own layer and the ones below it.
APP_LAYERS = ("base", "document", "views", "lab", "report", "shell")
QT_MODULES = ("PySide6", "PySide2", "PyQt5", "PyQt6", "pyqtgraph", "shiboken6")


@dataclass(frozen=True)
class Imported:
    name: str  # the module named, or for ``from M import N`` also ``M.N``
    type_only: bool  # under ``if TYPE_CHECKING:``


def _modules() -> dict[str, Path]:
    found = {}
    for folder, package in PACKAGES.items():
        for py in sorted((ROOT / folder).rglob("*.py")):
            parts = py.relative_to(ROOT / folder).with_suffix("").parts
            found[".".join([package, *(parts[:-1] if parts[-1] == "__init__" else parts)])] = py
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(module: str, path: Path) -> Iterator[Imported]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def walk(node: ast.AST, type_only: bool) -> Iterator[Imported]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    yield from walk_one(stmt, True)
                for stmt in child.orelse:
                    yield from walk_one(stmt, type_only)
            else:
                yield from walk_one(child, type_only)

    def walk_one(node: ast.AST, type_only: bool) -> Iterator[Imported]:
        if isinstance(node, ast.Import):
            yield from (Imported(a.name, type_only) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            yield Imported(base, type_only)
            yield from (Imported(f"{base}.{a.name}", type_only) for a in node.names)
        else:
            yield from walk(node, type_only)

    yield from walk(ast.parse(path.read_text(), str(path)), False)


MODULES = _modules()
IMPORTS = {m: list(_imports(m, p)) for m, p in MODULES.items()}


def _graph(prefix: str, type_only: bool) -> dict[str, set[str]]:
    """Module -> the project modules it imports, for the modules under ``prefix``."""
    return {m: {i.name for i in imps if i.name in MODULES and i.name != m and i.name.startswith(prefix)
                and (type_only or not i.type_only)}
            for m, imps in IMPORTS.items() if m.startswith(prefix)}


def find_cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(cycles)


def test_the_cycle_finder_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert find_cycles(graph) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_the_sources_are_found() -> None:
    assert {"kvscope.app.shell.main_window", "kvscope.app.shell.menus", "kvscope.app.report.export",
            "kvscope.core.reader.parse"} <= set(MODULES)
    assert "kvscope.app.shell.menus" in _graph("kvscope.app.", True)["kvscope.app.shell.main_window"]


def test_no_import_cycle_in_the_app() -> None:
    assert find_cycles(_graph("kvscope.app", type_only=True)) == []


def test_no_import_cycle_in_the_core() -> None:
    """Type-only imports included: a cycle that only the type checker follows still ties the modules together."""
    assert find_cycles(_graph("kvscope.core", type_only=True)) == []


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return APP_LAYERS.index(parts[2]) if len(parts) > 2 and parts[2] in APP_LAYERS else None


def test_every_app_module_sits_in_a_layer() -> None:
    stray = [m for m in MODULES if m.startswith("kvscope.app.") and _layer(m) is None]
    assert stray == [], f"modules outside {APP_LAYERS}: {stray}"


def test_app_packages_import_only_their_layer_and_the_ones_below() -> None:
    upward = [f"{m} imports {d}" for m, deps in _graph("kvscope.app.", True).items() for d in sorted(deps)
              if (lm := _layer(m)) is not None and (ld := _layer(d)) is not None and ld > lm]
    assert upward == []


def test_the_core_never_imports_qt_or_the_app() -> None:
    bad = [f"{m} imports {i.name}" for m, imps in IMPORTS.items() if m.startswith("kvscope.core")
           for i in imps if i.name.split(".")[0] in QT_MODULES or i.name.startswith("kvscope.app")]
    assert bad == []


# kvscope.core's packages (and its loose leaf modules), bottom up: a module may import its own
# package, and any package of a lower layer; the packages of one layer do not import each other.
# pyproject.toml's import-linter contract says the same for the run-time graph.
CORE_LAYERS: tuple[frozenset[str], ...] = tuple(frozenset(layer.split()) for layer in (
    "textsafe",
    "errors findings ggml_types fileio fsutil jsonout derotate_kernel pinned_builds modelgen stopsignals",
    "model",
    "reader",
    "memory",
    "convert",
    "analysis",
    "engine",
    "verify fleet",
    "lab",
    "report",
    "cli",
))


def _core_part(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["kvscope", "core"] else None


def _core_layer(module: str) -> int | None:
    part = _core_part(module)
    return next((i for i, layer in enumerate(CORE_LAYERS) if part in layer), None)


def test_every_core_module_sits_in_a_layer() -> None:
    stray = sorted({m for m in MODULES if m.startswith("kvscope.core.") and _core_layer(m) is None})
    assert stray == [], f"core modules outside the layers {CORE_LAYERS}: {stray}"


def test_core_packages_import_only_the_layers_below_them() -> None:
    """Type-only and function-level imports count: an arrow that runs upward is an arrow all the same."""
    wrong = [f"{m} imports {d}" for m, deps in _graph("kvscope.core.", True).items() for d in sorted(deps)
             if (lm := _core_layer(m)) is not None and (ld := _core_layer(d)) is not None
             and _core_part(m) != _core_part(d) and ld >= lm]
    assert wrong == []


def test_the_core_layer_check_sees_an_upward_import() -> None:
    assert _core_layer("kvscope.core.reader.parse") == 3 and _core_layer("kvscope.core.analysis.stats") == 6
    assert _core_layer("kvscope.core.textsafe") == 0 and _core_layer("kvscope.core.errors") == 1
    assert _core_layer("kvscope.core.findings") == 1 and _core_layer("kvscope.core.nonesuch") is None
    assert _core_layer("kvscope.core.verify.run") == _core_layer("kvscope.core.fleet.migrate")
    assert (_core_layer("kvscope.core.lab.runner"), _core_layer("kvscope.core.report.collect"),
            _core_layer("kvscope.core.cli.main")) == (9, 10, 11)  # the report sits between the lab and the CLI


# the engine's drivers: above core/engine only the engine session (core/engine/session.py) drives them, so verify,
# the lab and repair run a state through one set of operations (#30 item 6)
ENGINE_DRIVERS = ("kvscope.core.engine.llamacpp", "kvscope.core.engine.server", "kvscope.core.engine.worker",
                  "kvscope.core.engine.protocol")


def _drives_the_engine_directly(imports: Mapping[str, list[Imported]]) -> list[str]:
    return [f"{m} imports {i.name}" for m, imps in sorted(imports.items())
            if (_core_layer(m) or 0) > CORE_LAYERS.index(frozenset({"engine"}))
            for i in imps if i.name in ENGINE_DRIVERS or i.name.startswith(tuple(d + "." for d in ENGINE_DRIVERS))]


def test_only_the_engine_session_drives_llama_cpp() -> None:
    """core/verify, core/lab (and every layer above the engine) import the engine session, never LlamaProcess's or
    llama-server's modules: one restore/prefill/logits/save/clear for verify's engines, the lab's live context and
    repair's rebuild."""
    assert _drives_the_engine_directly(IMPORTS) == []


def test_the_engine_driver_check_sees_a_direct_import() -> None:
    fake = {"kvscope.core.verify.x": [Imported("kvscope.core.engine.llamacpp", False)],
            "kvscope.core.lab.y": [Imported("kvscope.core.engine.server.ServerProcess", True)],
            "kvscope.core.verify.z": [Imported("kvscope.core.engine.session.LlamaSession", False)],
            "kvscope.core.engine.session": [Imported("kvscope.core.engine.llamacpp", False)]}
    assert _drives_the_engine_directly(fake) == [
        "kvscope.core.lab.y imports kvscope.core.engine.server.ServerProcess",
        "kvscope.core.verify.x imports kvscope.core.engine.llamacpp"]



def _sys_path_edits(source: str) -> list[int]:
    """The lines of ``source`` that change ``sys.path`` (a call on it, or an assignment to it)."""
    def is_sys_path(node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
                and node.value.id == "sys")

    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_sys_path(node.func.value):
            lines.append(node.lineno)
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(is_sys_path(t) or (isinstance(t, ast.Subscript) and is_sys_path(t.value)) for t in targets):
                lines.append(node.lineno)
    return sorted(lines)


def test_tests_import_their_helpers_without_editing_sys_path() -> None:
    """tests.support is a package and tools/ is on pytest's ``pythonpath`` (pyproject.toml)."""
    edits = [f"{py.relative_to(ROOT)}:{n}" for py in sorted((ROOT / "tests").rglob("*.py"))
             for n in _sys_path_edits(py.read_text(encoding="utf-8"))]
    assert edits == []


def test_the_sys_path_check_sees_an_edit() -> None:
    edits = "import sys\nsys.path.insert(0, 'x')\nsys.path += ['y']\nsys.path[:0] = ['z']\n"
    assert _sys_path_edits(edits) == [2, 3, 4]
    assert _sys_path_edits("import sys\nprint(sys.path)\nx = list(sys.path)\n") == []
