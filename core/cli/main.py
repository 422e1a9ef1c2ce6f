"""``kvscope`` command line: the entry point.

The subcommands are found, not listed (:mod:`kvscope.core.cli.registry`): the core's ``cli.py`` /
``*_cli.py`` front-ends, and the ``kvscope.commands`` entry points of the app (``gui``, ``report``),
loaded only when asked for, so this module never imports the Qt layer. Every command runs through
:func:`kvscope.core.cli.plumbing.run_command`: exit codes 0 clean, 1 findings, 2 unreadable input or
usage error, always with a one-line reason on stderr and no traceback (``KVSCOPE_DEBUG=1`` prints one
for an unexpected error). ``docs/cli.md`` lists every command, its options and exit codes.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kvscope.core.cli.plumbing import EXIT_BAD_INPUT, OneLineParser, run_command
from kvscope.core.cli.registry import Registrar, core_front_ends, plugin_commands

__all__ = ["build_parser", "main", "plugin_commands"]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kvscope")
    except PackageNotFoundError:
        return "unknown"


def build_parser(extra: dict[str, Registrar] | None = None) -> argparse.ArgumentParser:
    """The whole parser: every core command, then ``extra`` (name -> register function, e.g. the plugins)."""
    ap = OneLineParser(prog="kvscope", description="Inspect llama.cpp saved state (slot, sequence, session files "
                       "and state blobs).", epilog="exit status: 0 clean, 1 findings, 2 bad input or usage; "
                       "docs/cli.md has each command's")
    ap.add_argument("--version", action="version", version=f"kvscope {_version()}")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    for fe in core_front_ends():
        fe.register(sub)
    for name, register in (extra or {}).items():
        try:
            register(sub)
        except Exception as e:  # a broken plugin must not take the core commands down
            print(f"kvscope: command {name!r} unavailable: {e}", file=sys.stderr)
    return ap


def _wanted(argv: list[str]) -> str | None:
    """The command the arguments ask for (the first that is not an option), or None."""
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = build_parser(plugin_commands(_wanted(argv)))
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:
        return int(e.code) if isinstance(e.code, int) else EXIT_BAD_INPUT
    if not getattr(args, "func", None):
        ap.print_help(sys.stderr)
        return EXIT_BAD_INPUT
    return run_command(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
