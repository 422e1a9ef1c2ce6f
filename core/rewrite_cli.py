"""``kvscope rewrite``: read a state file into the memory core and write it back, in its own layout
(byte-identical) or in another generation where the file holds everything that layout writes.

Exit codes: 0 written; 1 the result cannot be exact (what is missing is named); 2 bad input
(unreadable or damaged file, unusable model, unknown layout). Errors are one line on stderr.
The input is never modified; the output appears atomically (a temporary file in the same
directory, then ``os.replace``). torch is imported only when the command runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from kvscope.core.fsutil import write_atomic

EXIT_OK, EXIT_INEXACT, EXIT_BAD_INPUT = 0, 1, 2


class _Exit(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def register(subparsers: Any) -> None:
    """Add the ``rewrite`` subcommand to an argparse subparsers object."""
    p = subparsers.add_parser("rewrite", help="write a state file back through the memory core (same or another "
                              "layout generation)")
    p.add_argument("file")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="file to write (never the input)")
    p.add_argument("--model", metavar="GGUF", help="the model that wrote the state (layer mapping, sliding window, "
                   "partial blobs)")
    p.add_argument("--layout", metavar="GEN", help="target layout generation (default: the file's own)")
    p.add_argument("--seq-id", type=int, metavar="N", help="source sequence id, for layouts that do not record it")
    p.add_argument("--drop-trailing", action="store_true", help="accept losing bytes that follow the state")
    p.set_defaults(func=cmd_rewrite)


def _rewrite(args: argparse.Namespace) -> str:
    from kvscope.core.model_profile import ModelProfileError, load_model_profile
    from kvscope.core.reader.parse import ReadError, read_state

    src, out = args.file, args.output
    if not os.path.isfile(src):
        raise _Exit(EXIT_BAD_INPUT, f"{src}: no such file")
    if os.path.exists(out) and os.path.samefile(src, out):
        raise _Exit(EXIT_BAD_INPUT, f"{out}: the output would overwrite the input")
    profile = None
    if args.model is not None:
        try:
            profile = load_model_profile(args.model)
        except (ModelProfileError, OSError) as e:
            raise _Exit(EXIT_BAD_INPUT, f"cannot use model {args.model}: {e}") from None
    from kvscope.core.memory.convert import conversion_problems
    from kvscope.core.memory.infer import InferError, infer_context, load, write
    from kvscope.core.memory.layout import Layout, LayoutError
    from kvscope.core.memory.spec import SpecError

    try:
        target = Layout.named(args.layout) if args.layout else None
    except LayoutError as e:
        raise _Exit(EXIT_BAD_INPUT, str(e)) from None
    try:
        res = read_state(src, profile=profile)
    except ReadError as e:
        raise _Exit(EXIT_BAD_INPUT, str(e)) from None
    if res.kind == "unknown":
        raise _Exit(EXIT_BAD_INPUT, f"{src}: {res.findings[0].message if res.findings else 'not a state file'}")
    errors = [f for f in res.findings if f.severity == "error"]
    if errors:
        raise _Exit(EXIT_BAD_INPUT, f"{src}: damaged or not from this model: {errors[0].message} "
                    f"(offset {errors[0].offset})")
    with open(src, "rb") as fh:
        data = fh.read()
    trailing = sum(f.length for f in res.findings if f.code == "trailing_bytes")
    if trailing and not args.drop_trailing:
        raise _Exit(EXIT_INEXACT, f"{src}: {trailing} bytes follow the state and would be lost (--drop-trailing "
                    "to accept)")
    try:
        inf = infer_context(res, profile, seq_id=args.seq_id)
    except (InferError, SpecError, ValueError) as e:
        raise _Exit(EXIT_INEXACT, f"{src}: the memory core cannot hold this state: {e}") from None
    loaded = load(inf, data)
    if not loaded.ok and loaded.check != "trailing":
        raise _Exit(EXIT_BAD_INPUT, f"{src}: restore failed: {loaded}")
    for note in inf.notes:
        print(f"kvscope: note: {note}", file=sys.stderr)
    lay = target or inf.layout
    missing = conversion_problems(inf, res, lay)
    if missing:
        raise _Exit(EXIT_INEXACT, f"cannot write {src} as layout {lay.name} exactly; missing: " + "; ".join(missing))
    try:
        blob = write(inf, lay)
    except (LayoutError, ValueError) as e:
        raise _Exit(EXIT_INEXACT, f"cannot write {src} as layout {lay.name}: {e}") from None
    same = lay.name == inf.layout.name
    if same and bytes(blob) != data[: len(data) - trailing]:
        raise _Exit(EXIT_INEXACT, f"{src}: the rewrite in its own layout is not byte-identical")
    write_atomic(out, blob, prefix=".kvscope-rewrite-")
    how = "byte-identical" if same else f"converted from {inf.layout.name}"
    return f"{out}: {res.kind}, layout {lay.name}, {len(blob)} bytes ({how})"


def cmd_rewrite(args: argparse.Namespace) -> int:
    """Run ``kvscope rewrite``; returns the exit code (0 ok, 1 cannot be exact, 2 bad input)."""
    try:
        print(_rewrite(args))
    except _Exit as e:
        print(f"kvscope: {e.message}", file=sys.stderr)
        return e.code
    except OSError as e:
        print(f"kvscope: {e.filename or args.output}: {e.strerror}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ImportError as e:
        print(f"kvscope: rewrite needs the memory core and torch (pip install 'kvscope[memory]'): {e}",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_OK
