"""``kvscope`` command line: the entry point.

The subcommands are listed in :data:`kvscope.core.cli.registry.COMMAND_MODULES`: one module per core
command in this package (``repair`` is ``repair_command.py``; ``report`` among them: it loads its pictures
from the app when it runs), then the ``kvscope.commands`` entry points of the app (``gui``), loaded only
when asked for, so this module never imports the Qt layer. Every command runs through
:func:`kvscope.core.cli.plumbing.run_command`: exit codes 0 clean, 1 findings, 2 unreadable input, usage
error or an output that cannot be written (``> /dev/full``), 3 an internal error (a bug: the traceback goes
to a file the one line names; ``KVSCOPE_DEBUG=1`` prints it too), 130 interrupted; always a one-line reason
on stderr, never a traceback. :func:`main` applies the same handling to the parsing and the help text
(``kvscope --help > /dev/full``). ``docs/cli.md`` lists every command, its options and exit codes.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kvscope.core.cli.plumbing import (
    EXIT_BAD_INPUT,
    OneLineParser,
    flush_stdout,
    run_command,
    version,
)
from kvscope.core.cli.registry import Registrar, core_front_ends, plugin_commands

__all__ = ["build_parser", "main", "plugin_commands"]


def build_parser(extra: dict[str, Registrar] | None = None) -> argparse.ArgumentParser:
    """The whole parser: every core command, then ``extra`` (name -> register function, e.g. the plugins)."""
    ap = OneLineParser(prog="kvscope", description="Inspect llama.cpp saved state (slot, sequence, session files "
                       "and state blobs).", epilog="exit status: 0 clean, 1 findings, 2 bad input or usage, "
                       "3 internal error; docs/cli.md has each command's")
    ap.add_argument("--version", action="version", version=f"kvscope {version()}")
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


def _command_parser(ap: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser:
    """The parser of ``command`` (``ap`` itself without one)."""
    for a in ap._actions:
        if isinstance(a, argparse._SubParsersAction) and command in a.choices:
            return a.choices[command]  # type: ignore[no-any-return]
    return ap


def _parse(argv: list[str]) -> argparse.Namespace | int:
    """The parsed arguments, or the exit code that ``--help``, ``--version`` or a usage error ends with."""
    ap = build_parser(plugin_commands(_wanted(argv)))
    try:
        args, unknown = ap.parse_known_args(argv)
        if unknown:  # as parse_args, but said by the command's own parser: "kvscope: inspect: unrecognized ..."
            _command_parser(ap, getattr(args, "command", None)).error(f"unrecognized arguments: {' '.join(unknown)}")
    except SystemExit as e:
        flush_stdout()  # the help text, written to a full disk, fails here and not at the interpreter's exit
        return int(e.code) if isinstance(e.code, int) else EXIT_BAD_INPUT
    if not getattr(args, "func", None):
        ap.print_help(sys.stderr)
        return EXIT_BAD_INPUT
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parsed: list[argparse.Namespace] = []

    def parse(_: argparse.Namespace) -> int:  # through run_command: its handlers for the parser's failures too
        got = _parse(argv)
        if isinstance(got, int):
            return got
        parsed.append(got)
        return 0

    code = run_command(parse, argparse.Namespace(command=_wanted(argv)))
    if not parsed:
        return code
    return run_command(parsed[0].func, parsed[0])


if __name__ == "__main__":
    sys.exit(main())
