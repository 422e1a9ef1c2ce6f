"""``kvscope inspect`` and ``kvscope diff``: one state file's structure, findings and verdict; two states compared.

``inspect`` scans the tensor values by default (NaN/Inf, zero rows, extremes: their findings count in the
verdict, as in the app and the report); ``--no-stats`` skips the scan and the verdict says
``(values not scanned)``.

Exit codes: 0 clean (diff: identical), 1 error findings (diff: different), 2 unreadable input or not a
state file, with one line on stderr. Only the standard library is imported until a command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kvscope.core.errors import EXIT_BAD_INPUT, EXIT_FINDINGS, EXIT_OK, InputError, error_line
from kvscope.core.reader.state_kinds import ALL_KINDS

COMMANDS = ("inspect", "diff")


def register(subparsers: Any) -> None:
    """Add ``inspect`` and ``diff`` to an argparse subparsers object."""
    p = subparsers.add_parser("inspect", help="parse a state file and report its structure and findings")
    p.add_argument("file")
    p.add_argument("--model", metavar="GGUF", help="the model that wrote the state (enables model checks)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true",
                     help="one JSON object (big arrays such as cells and tokens are streamed as written)")
    fmt.add_argument("--markdown", action="store_true", help="Markdown summary")
    scan = p.add_mutually_exclusive_group()
    scan.add_argument("--stats", dest="stats", action="store_true", default=True,
                      help="scan the tensor values: NaN/Inf, zero rows, min/max/mean/RMS (the default; kept for "
                      "scripts that pass it)")
    scan.add_argument("--no-stats", dest="stats", action="store_false",
                      help="skip the value scan (faster on big files): the verdict then says the values were "
                      "not scanned, and NaN/Inf or zero rows go unseen")
    p.add_argument("--kind", choices=[str(k) for k in ALL_KINDS],
                   help="override kind detection")
    p.add_argument("--layout", metavar="GEN", help="force a layout generation (e.g. 2026-10, 2025-05)")
    p.add_argument("--tree", action="store_true", help="with --json: include the full structure tree")
    p.add_argument("--pretty", action="store_true", help="with --json: indent")
    p.set_defaults(func=cmd_inspect)

    p = subparsers.add_parser("diff", help="structural diff of two states")
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--model", metavar="GGUF")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_diff)


def _load_profile(path: str | None) -> Any:
    if path is None:
        return None
    from kvscope.core.model.profile import load_model_or

    return load_model_or(path, InputError)


def _open(path: str) -> Any:
    """The input file as a ByteSource (read with pread; InputError when it cannot be opened)."""
    from kvscope.core.analysis.inspection import open_state

    return open_state(path)


def _read(path: str, profile: Any, kind: str | None = None, layout: str | None = None) -> tuple[Any, Any]:
    """Parse ``path``: ``(result, source)``; the source is checked for a change after the parse."""
    from kvscope.core.reader.parse import read_state

    src = _open(path)
    try:
        res = read_state(src, profile=profile, kind=kind, layout=layout)
    except ValueError as e:
        raise InputError(str(e)) from None
    src.check()
    return res, src


@contextmanager
def _changed_means_exit(*paths: str) -> Iterator[None]:
    """A FileChangedError while reading one of ``paths`` (as given) becomes ``PATH: the file changed...``."""
    from pathlib import Path

    from kvscope.core.reader.source import FileChangedError

    try:
        yield
    except FileChangedError as e:
        arg = next((p for p in paths if str(Path(p)) == e.path), e.path)
        raise InputError(f"{arg}: {e}") from None


def cmd_inspect(args: argparse.Namespace) -> int:
    from kvscope.core.analysis.inspection import inspect_file

    profile = _load_profile(args.model)
    found = inspect_file(args.file, profile, kind=args.kind, layout=args.layout, stats=args.stats)
    if args.json:
        from kvscope.core.jsonout import write_json

        write_json(found.to_json(tree=args.tree, lazy=True), sys.stdout, indent=1 if args.pretty else None)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(found.to_text(markdown=args.markdown))
    if not found.is_state:
        print(error_line(f"{args.file}: {found.not_state_reason()}"), file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_FINDINGS if found.result.n_errors else EXIT_OK


def cmd_diff(args: argparse.Namespace) -> int:
    from kvscope.core.analysis.diff import diff_states

    profile = _load_profile(args.model)
    with _changed_means_exit(args.a, args.b):
        a, sa = _read(args.a, profile)
        b, sb = _read(args.b, profile)
        for r, p in ((a, args.a), (b, args.b)):
            if r.kind == "unknown":
                raise InputError(f"{p}: {r.findings[0].message if r.findings else 'not a state file'}")
        d = diff_states(a, b, sa, sb)
    sa.close()
    sb.close()
    if args.json:
        json.dump(d.to_json(), sys.stdout)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(d.to_text())
    return EXIT_OK if d.identical else EXIT_FINDINGS
