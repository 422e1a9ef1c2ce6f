"""``kvscope inspect``: one state file's structure, findings and verdict.

``inspect`` scans the tensor values by default (NaN/Inf, zero rows, extremes: their findings count in the
verdict, as in the app and the report); ``--no-stats`` skips the scan and the verdict says
``(values not scanned)``. The file goes through the one inspection pipeline
(:func:`kvscope.core.analysis.inspection.inspect_file`).

``--target RELEASE`` (``b10644``, ``0.3.14``, ``2026-08-30``: :mod:`kvscope.core.reader.releases`) adds what
that release does with the file and the ``kvscope rewrite`` that migrates it (the JSON's ``target``); an
unknown name or a release older than the first known is a usage error.

Exit codes: 0 clean, 1 error findings or a file a newer llama.cpp wrote (verdict ``newer``), 2 unreadable
input, an unknown release name, or not a state file, with one line on stderr.
Only the standard library is imported until the command runs.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kvscope.core.errors import EXIT_BAD_INPUT, EXIT_FINDINGS, EXIT_OK, InputError, error_line
from kvscope.core.reader.state_kinds import ALL_KINDS

COMMANDS = ("inspect",)


def register(subparsers: Any) -> None:
    """Add ``inspect`` to an argparse subparsers object."""
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
    p.add_argument("--target", metavar="RELEASE",
                   help="also answer what one llama.cpp release does with the file (loads, refuses with llama.cpp's "
                   "message, crashes, unknown) and how to migrate it: bNNNN, a llama-cpp-python version (0.3.14) "
                   "or a date (2026-08-30)")
    p.add_argument("--tree", action="store_true", help="with --json: include the full structure tree")
    p.add_argument("--pretty", action="store_true", help="with --json: indent")
    p.set_defaults(func=cmd_inspect)



def load_profile(path: str | None) -> Any:
    """The model profile of ``--model PATH`` (None without one); :class:`InputError` naming the model."""
    if path is None:
        return None
    from kvscope.core.model.profile import load_model_or

    return load_model_or(path, InputError)


def cmd_inspect(args: argparse.Namespace) -> int:
    from kvscope.core.analysis.inspection import inspect_file

    release = None
    if args.target is not None:  # a bad release name is a usage error before any work
        from kvscope.core.reader.releases import parse_release

        release = parse_release(args.target)
    profile = load_profile(args.model)
    found = inspect_file(args.file, profile, kind=args.kind, layout=args.layout, stats=args.stats)
    target = None
    if release is not None and found.is_state:
        from kvscope.core.analysis.release_answers import target_answer

        target = target_answer(found.result, profile, found.compatibility or [], release, args.file)
    if args.json:
        from kvscope.core.jsonout import write_json

        doc = found.to_json(tree=args.tree, lazy=True)
        if target is not None:
            doc["target"] = target
        write_json(doc, sys.stdout, indent=1 if args.pretty else None)
        sys.stdout.write("\n")
    else:
        text = found.to_text(markdown=args.markdown)
        if target is not None:
            from kvscope.core.analysis.release_answers import target_text
            from kvscope.core.textsafe import markdown_text, safe_text

            esc = markdown_text if args.markdown else safe_text
            text += "\n" + ("## " if args.markdown else "") + esc(target_text(target)) + "\n"
        sys.stdout.write(text)
    if not found.is_state:
        print(error_line(f"{args.file}: {found.not_state_reason()}"), file=sys.stderr)
        return EXIT_BAD_INPUT
    # a file a newer llama.cpp wrote ("newer") is worth attention as an error is: kvscope read it as an older layout
    return EXIT_FINDINGS if found.result.n_errors or found.verdict.level == "newer" else EXIT_OK
