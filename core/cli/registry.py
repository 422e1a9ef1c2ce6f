"""Which subcommands exist and where they come from, found without a hand-kept list.

* **core front-ends**: every module of the ``kvscope.core`` tree named ``cli.py`` or ``*_cli.py`` that
  defines ``COMMANDS`` (the names it adds) and ``register(subparsers)``. They are found by listing the
  packages through the import system's finders (no package is imported for it: ``kvscope.core.memory``
  would import torch; the same listing works in the frozen desktop bundle) and
  imported when the parser is built; each imports only the standard library at module level
  (tests/cli/test_cli_plumbing.py holds them to it).
* **other layers' commands** (the app's ``gui``): the ``kvscope.commands`` entry-point
  group. They are loaded only when the command asked for is not a core one (or none is asked for: the
  full help), and then only the one asked for if it is there, so ``kvscope verify --help`` never
  imports Qt. An entry point named like a core command is left out: the core's command stands (an
  install's metadata from before ``report`` moved to the core still names the app's).
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvscope.core.errors import error_line

Registrar = Callable[[Any], None]  # adds subcommands to argparse's subparsers object
ENTRY_POINT_GROUP = "kvscope.commands"
CORE_PACKAGE = "kvscope.core"


@dataclass(frozen=True)
class FrontEnd:
    """A core module that registers subcommands."""

    module: str  # dotted name
    commands: tuple[str, ...]
    register: Registrar


def _front_end_modules() -> list[str]:
    """Dotted names of the ``cli.py`` / ``*_cli.py`` modules of the core tree, listed by the import system's
    finders (on disk, and in a frozen bundle through PyInstaller's), no package of the tree imported."""
    names: set[str] = set()

    def walk(package: str, locations: list[str]) -> None:
        for info in pkgutil.iter_modules(locations):
            full = f"{package}.{info.name}"
            if info.ispkg:
                spec = info.module_finder.find_spec(full)  # type: ignore[call-arg]
                if spec is not None and spec.submodule_search_locations:
                    walk(full, list(spec.submodule_search_locations))
            elif info.name == "cli" or info.name.endswith("_cli"):
                names.add(full)

    spec = importlib.util.find_spec(CORE_PACKAGE)
    if spec is not None and spec.submodule_search_locations:
        walk(CORE_PACKAGE, list(spec.submodule_search_locations))
    return sorted(names)


def core_front_ends() -> list[FrontEnd]:
    """Every core front-end module, imported, with the commands it declares (sorted by module name)."""
    out = []
    for name in _front_end_modules():
        mod = importlib.import_module(name)
        commands = getattr(mod, "COMMANDS", None)
        register = getattr(mod, "register", None)
        if commands and callable(register):
            out.append(FrontEnd(name, tuple(commands), register))
    return out


def core_commands() -> dict[str, FrontEnd]:
    """Command name -> the front-end that registers it."""
    return {c: fe for fe in core_front_ends() for c in fe.commands}


def plugin_commands(wanted: str | None, core: set[str] | None = None) -> dict[str, Registrar]:
    """The entry-point commands to register for a run that asks for ``wanted``.

    None when ``wanted`` is a core command; else the one named ``wanted`` if it is there, else all
    (for the help, or for argparse to say the command does not exist), those named like a core command
    left out. A plugin that fails to load is reported on stderr and left out.
    """
    core = core if core is not None else set(core_commands())
    if wanted is not None and wanted in core:
        return {}
    from importlib.metadata import entry_points

    eps = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name not in core]
    if any(ep.name == wanted for ep in eps):
        eps = [ep for ep in eps if ep.name == wanted]
    out: dict[str, Registrar] = {}
    for ep in eps:
        try:
            out[ep.name] = ep.load()
        except Exception as e:  # a broken plugin must not take the core commands down
            import sys

            print(error_line(f"command {ep.name!r} unavailable: {e}"), file=sys.stderr)
    return out
