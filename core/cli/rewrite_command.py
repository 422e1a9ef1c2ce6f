"""``kvscope rewrite``: write a state file back in its own layout (byte-identical) or in another
generation where the file holds everything that layout writes (:mod:`kvscope.core.convert.rewrite`).

Exit codes: 0 written; 1 the result cannot be exact (what is missing is named); 2 bad input
(unreadable or damaged file, a file a newer llama.cpp wrote, unusable model, unknown layout). Errors
are one line on stderr.
The input is never modified; the output appears atomically (a temporary file in the same
directory, then ``os.replace``); an output naming the file or the model (by any path), or one that
exists and is not a regular file (a FIFO, a device, a folder), is refused before either is read.
Framing-only conversions (v3 <-> v4) are streamed without torch; others need the memory core,
imported only when the command runs.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kvscope.core.errors import EXIT_BAD_INPUT, EXIT_OK, error_line
from kvscope.core.errors import EXIT_FINDINGS as EXIT_INEXACT
from kvscope.core.textsafe import safe_text

COMMANDS = ("rewrite",)
__all__ = ["EXIT_BAD_INPUT", "EXIT_INEXACT", "EXIT_OK", "cmd_rewrite", "register"]


def register(subparsers: Any) -> None:
    """Add the ``rewrite`` subcommand to an argparse subparsers object."""
    p = subparsers.add_parser("rewrite", help="write a state file back through the memory core (same or another "
                              "layout generation)")
    p.add_argument("file")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="file to write (never the file or the "
                   "model, by any path; a new name or a regular file, replaced)")
    p.add_argument("--model", metavar="GGUF", help="the model that wrote the state (layer mapping, sliding window, "
                   "partial blobs)")
    p.add_argument("--layout", metavar="GEN", help="target layout generation (default: the file's own)")
    p.add_argument("--seq-id", type=int, metavar="N", help="source sequence id, for layouts that do not record it")
    p.add_argument("--drop-trailing", action="store_true", help="accept losing bytes that follow the state")
    p.add_argument("--rotation", choices=["auto", "on", "off"], default="auto",
                   help="how the source build rotated K/V (v3 -> v4): auto infers it from the model and cache types, "
                   "off = it ran with LLAMA_ATTN_ROT_DISABLE=1")
    p.add_argument("--via-core", action="store_true", help="convert through the torch memory core even when only "
                   "framing changes (a self-check of the core)")
    p.set_defaults(func=cmd_rewrite)


def cmd_rewrite(args: argparse.Namespace) -> int:
    """Run ``kvscope rewrite``; returns the exit code (0 ok, 1 cannot be exact, 2 bad input)."""
    from kvscope.core.convert.rewrite import rewrite_file
    from kvscope.core.fsutil import output_problem

    refused = output_problem(args.output, [args.file, args.model])  # before the model is read
    if refused is not None:
        print(error_line(refused), file=sys.stderr)
        return EXIT_BAD_INPUT
    profile = None
    if args.model is not None:
        from kvscope.core.model.profile import ModelProfileError, load_model_profile

        try:
            profile = load_model_profile(args.model)
        except (ModelProfileError, OSError) as e:
            print(error_line(f"cannot use model {args.model}: {e}"), file=sys.stderr)
            return EXIT_BAD_INPUT
    try:
        outcome = rewrite_file(args.file, args.output, args.layout, profile, rotation=args.rotation,
                               seq_id=args.seq_id, drop_trailing=args.drop_trailing, via_core=args.via_core,
                               inputs=[args.model] if args.model is not None else [])
    except OSError as e:
        print(error_line(f"{e.filename or args.output}: {e.strerror}"), file=sys.stderr)
        return EXIT_BAD_INPUT
    except ImportError as e:
        print(error_line(f"this conversion needs the memory core and torch (pip install 'kvscope[memory]'): {e}"),
              file=sys.stderr)
        return EXIT_BAD_INPUT
    for note in outcome.notes:
        print(error_line(f"note: {note}"), file=sys.stderr)
    if not outcome.ok:
        print(error_line(outcome.message), file=sys.stderr)
        return outcome.code
    print(safe_text(outcome.message))  # it names OUT: a name's control and bidi characters are escaped
    return EXIT_OK
