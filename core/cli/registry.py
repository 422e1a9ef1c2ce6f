"""Which subcommands exist and where each is defined: one literal list.

* **core commands**: :data:`COMMAND_MODULES`, one module per command in ``kvscope.core.cli``, each named
  ``<command>_command`` and defining ``COMMANDS`` (its name) and ``register(subparsers)``. A search for
  where ``kvscope repair`` is defined finds ``core/cli/repair_command.py`` and this list. Each module
  imports only the standard library at module level (tests/cli/test_cli_plumbing.py holds them to it)
  and is imported when the parser is built; the listed order is the help's.
* **other layers' commands** (the app's ``gui``): the ``kvscope.commands`` entry-point
  group. They are loaded only when the command asked for is not a core one (or none is asked for: the
  full help), and then only the one asked for if it is there, so ``kvscope verify --help`` never
  imports Qt. An entry point named like a core command is left out: the core's command stands (an
  install's metadata from before ``report`` moved to the core still names the app's).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvscope.core.errors import error_line

Registrar = Callable[[Any], None]  # adds subcommands to argparse's subparsers object
ENTRY_POINT_GROUP = "kvscope.commands"
# command -> its module, in the order the help lists them (tests/cli/test_cli_plumbing.py checks that every
# core/cli/*_command.py module is here and registers just its command)
COMMAND_MODULES: dict[str, str] = {
    "inspect": "kvscope.core.cli.inspect_command",
    "diff": "kvscope.core.cli.diff_command",
    "verify": "kvscope.core.cli.verify_command",
    "repair": "kvscope.core.cli.repair_command",
    "rewrite": "kvscope.core.cli.rewrite_command",
    "corrupt": "kvscope.core.cli.corrupt_command",
    "lab": "kvscope.core.cli.lab_command",
    "report": "kvscope.core.cli.report_command",
    "scan": "kvscope.core.cli.scan_command",
    "migrate": "kvscope.core.cli.migrate_command",
    "llama-build": "kvscope.core.cli.llama_build_command",
}


@dataclass(frozen=True)
class FrontEnd:
    """A core module that registers subcommands."""

    module: str  # dotted name
    commands: tuple[str, ...]
    register: Registrar


def core_front_ends() -> list[FrontEnd]:
    """Every core command's module, imported, with the commands it declares (in :data:`COMMAND_MODULES`'s
    order)."""
    out = []
    for name in dict.fromkeys(COMMAND_MODULES.values()):
        mod = importlib.import_module(name)
        out.append(FrontEnd(name, tuple(mod.COMMANDS), mod.register))
    return out


def core_commands() -> dict[str, FrontEnd]:
    """Command name -> the front-end that registers it."""
    return {c: fe for fe in core_front_ends() for c in fe.commands}


def core_command_names() -> set[str]:
    """The core commands' names, nothing imported."""
    return set(COMMAND_MODULES)


def plugin_commands(wanted: str | None, core: set[str] | None = None) -> dict[str, Registrar]:
    """The entry-point commands to register for a run that asks for ``wanted``.

    None when ``wanted`` is a core command; else the one named ``wanted`` if it is there, else all
    (for the help, or for argparse to say the command does not exist), those named like a core command
    left out. A plugin that fails to load is reported on stderr and left out.
    """
    core = core if core is not None else core_command_names()
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
