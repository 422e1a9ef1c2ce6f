"""``kvscope diff``: two states compared, section by section, record by record, down to the first byte.

Both files go through the one inspection pipeline (:func:`kvscope.core.analysis.inspection.inspect_source`,
without the compatibility table, which a diff does not show) and the two parses are compared by
:func:`kvscope.core.analysis.diff.diff_states` while the files are still open.

Exit codes: 0 identical, 1 different, 2 unreadable input or not a state file, with one line on stderr.
Only the standard library is imported until the command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import ExitStack
from typing import Any

from kvscope.core.cli.inspect_command import load_profile
from kvscope.core.errors import EXIT_FINDINGS, EXIT_OK, InputError

COMMANDS = ("diff",)


def register(subparsers: Any) -> None:
    """Add ``diff`` to an argparse subparsers object."""
    p = subparsers.add_parser("diff", help="structural diff of two states")
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--model", metavar="GGUF")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_diff)


def _inspected(path: str, profile: Any, files: ExitStack) -> tuple[Any, Any]:
    """``(inspection, source)`` of ``path``, its source kept open in ``files`` for the byte comparison;
    :class:`InputError` naming ``path`` when it cannot be read, changed while read, or is not a state."""
    from kvscope.core.analysis.inspection import inspect_source, open_state
    from kvscope.core.reader.source import FileChangedError

    src = open_state(path)
    files.callback(src.close)
    try:
        found = inspect_source(src, profile, compat=False)
    except FileChangedError as e:
        raise InputError(f"{path}: {e}") from None
    if not found.is_state:
        raise InputError(f"{path}: {found.not_state_reason()}")
    return found, src


def cmd_diff(args: argparse.Namespace) -> int:
    from kvscope.core.analysis.diff import diff_states
    from kvscope.core.reader.source import FileChangedError

    profile = load_profile(args.model)
    with ExitStack() as files:
        a, sa = _inspected(args.a, profile, files)
        b, sb = _inspected(args.b, profile, files)
        try:
            d = diff_states(a.result, b.result, sa, sb)
        except FileChangedError as e:
            arg = args.a if e.path == sa.path else args.b
            raise InputError(f"{arg}: {e}") from None
    if args.json:
        json.dump(d.to_json(), sys.stdout)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(d.to_text())
    return EXIT_OK if d.identical else EXIT_FINDINGS
