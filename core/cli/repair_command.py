"""``kvscope repair``: rebuild a healthy state of the same kind from a file's own tokens.

::

    kvscope repair FILE --model GGUF -o OUT [--build NAME] [--tokens IDS] [--timeout S] [--json]

The tokens are re-prefilled in the pinned build that writes the file's layout generation, saved as
the file was (a llama-server slot through llama-server's own slot save), verified, and only then
written to OUT atomically; OUT never names FILE, the model or the ``--tokens @FILE`` (by any path),
and an OUT that exists and is not a regular file (a FIFO, a device, a folder) is refused before
the state or the model is read. Exit codes: 0 written; 2 usage errors and a file that cannot be
rebuilt (one line on stderr: media chunks, a blob without tokens and no ``--tokens``, no build for
its layout, a rebuilt state that does not verify, an OUT refused). Nothing heavy is imported until
the command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from kvscope.core.errors import EXIT_BAD_INPUT, EXIT_OK, UsageError, error_line

COMMANDS = ("repair",)


def register(subparsers: Any) -> None:
    """Add the ``repair`` subcommand to an argparse subparsers object."""
    from kvscope.core.engine.cli_options import seconds  # stdlib only

    p = subparsers.add_parser(
        "repair", help="rebuild a healthy state of the same kind from the file's own tokens",
        description="Re-prefill FILE's tokens in the pinned llama.cpp build that writes its layout generation, save "
                    "the state of the same kind and sequence (a llama-server slot through llama-server's slot "
                    "save), verify it, and only then write it to OUT (atomically; never over FILE).")
    p.add_argument("file", metavar="FILE", help="a session file, sequence (slot) file, or state blob")
    p.add_argument("--model", required=True, metavar="GGUF", help="the model the state was written with")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="the rebuilt file (never FILE, the "
                   "model or the --tokens @FILE, by any path; a new name or a regular file, replaced)")
    p.add_argument("--build", metavar="NAME", help="the pinned build to rebuild with (default: the one that writes "
                   "the file's layout generation)")
    p.add_argument("--tokens", metavar="IDS", help="the tokens (a blob carries none): comma-separated ids, or @FILE "
                   "holding a JSON list or {seq: [ids]}")
    p.add_argument("--timeout", type=seconds(), default=600.0, metavar="S",
                   help="seconds per engine call (default 600)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_repair)


def cmd_repair(args: argparse.Namespace) -> int:
    """Rebuild, verify, write; 0 written, 2 not (one line on stderr)."""
    from kvscope.core.verify.prefill import parse_tokens
    from kvscope.core.verify.repair import RepairError, repair

    tokens_file = [args.tokens[1:]] if args.tokens is not None and args.tokens.startswith("@") else []
    try:
        res = repair(args.file, args.model, args.output, tokens=parse_tokens(args.tokens), build=args.build,
                     timeout_s=args.timeout, inputs=tokens_file)
    except (UsageError, RepairError) as e:
        print(error_line(e), file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.json:
        sys.stdout.write(json.dumps(res.to_json(), indent=1, allow_nan=False) + "\n")
    else:
        sys.stdout.write(res.text())
    return EXIT_OK
