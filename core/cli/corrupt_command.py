"""``kvscope corrupt``: write a damaged copy of a state file, addressed by its structure.

::

    kvscope corrupt FILE --corrupt SPEC [--corrupt SPEC ...] -o OUT [--model GGUF]
    kvscope corrupt --list

SPEC is what ``kvscope lab --corrupt`` takes (:mod:`kvscope.core.lab.corruptions`): a catalog name
(``truncated_half``) or ``KIND:key=value,...`` (``fill:value=nan,role=v,index=1,cells=3-5``); several
are applied in order, each to the result of the one before. Each mutation finds its target through
the parsed structure, never through offsets typed by hand, and its line says what it did and to
which input bytes. The copy is then what ``inspect``, ``verify``, ``repair`` and the app take.

FILE is opened read-only and never written; OUT never names it or the model (by any path), is never
a FIFO, a device or a folder (refused before anything is read), and appears atomically.
Exit codes: 0 written; 2 bad input (unreadable file, not a state file, a spec that does not apply to
it, OUT naming FILE or the model, OUT not a regular file), one line on stderr. Nothing heavy is
imported until the command runs.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kvscope.core.errors import EXIT_BAD_INPUT, EXIT_OK, error_line

COMMANDS = ("corrupt",)


class _ListCatalog(argparse.Action):
    """``--list``: print the catalog and exit, as ``--help`` does (the other arguments are not needed)."""

    def __init__(self, option_strings: list[str], dest: str, **kw: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        sys.stdout.write("\n".join(_catalog_lines()) + "\n")
        parser.exit(EXIT_OK)


def register(subparsers: Any) -> None:
    """Add the ``corrupt`` subcommand to an argparse subparsers object."""
    p = subparsers.add_parser(
        "corrupt", help="write a damaged copy of a state file (the lab's corruptions, addressed by structure)",
        description="Apply the lab's corruptions to FILE's bytes, in order, and write the result to OUT "
                    "(atomically; never over FILE). SPEC: a catalog name (--list) or KIND:key=value,...")
    p.add_argument("file", metavar="FILE", help="a session file, sequence (slot) file, or state blob")
    p.add_argument("--corrupt", action="append", required=True, metavar="SPEC", help="a catalog name or "
                   "KIND:key=value,... (repeatable: applied in order)")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="the damaged copy (never FILE or the "
                   "model, by any path; a new name or a regular file, replaced)")
    p.add_argument("--model", metavar="GGUF", help="the model that wrote the state (layer numbers for il=, "
                   "per-layer types)")
    p.add_argument("--list", action=_ListCatalog, help="print the catalog's names and specs, and exit")
    p.set_defaults(func=cmd_corrupt)


def _catalog_lines() -> list[str]:
    from kvscope.core.lab.corruptions import CATALOG, KINDS, spec_of

    width = max(len(n) for n in CATALOG)
    lines = [f"{name:<{width}}  {spec_of(c)}" for name, c in CATALOG.items()]
    return [*lines, f"kinds: {', '.join(KINDS)} (KIND:key=value,...; docs/reference.md has the keys)"]


def cmd_corrupt(args: argparse.Namespace) -> int:
    """Write the damaged copy; 0 written, 2 not (one line on stderr)."""
    from kvscope.core.lab.damaged_copy import CorruptCopyError, corrupt_file

    try:
        done = corrupt_file(args.file, args.output, args.corrupt, args.model)
    except CorruptCopyError as e:
        print(error_line(e), file=sys.stderr)
        return EXIT_BAD_INPUT
    sys.stdout.write("".join(f"{line}\n" for line in done.lines()))
    return EXIT_OK
