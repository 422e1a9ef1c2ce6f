"""``kvscope verify``: restore a state file in real llama.cpp and check it against a fresh prefill.

::

    kvscope verify FILE --model GGUF [--engine llama.cpp|server|torch] [--build NAME | --lib PATH]
                   [--server URL --slot-dir DIR | --server-bin PATH] [--ctx-param KEY=VALUE]...
                   [--tokens IDS] [--next-token ID] [--json]

Exit codes: 0 verdict ``ok``; 1 any other verdict (``damaged``, ``stale``, ``incompatible``, ``diverges``); 2 usage
or setup errors (one line on stderr, e.g. how to install the engine). Nothing heavy is imported
until the command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from kvscope.core.engine.choices import VERIFY_ENGINES
from kvscope.core.engine.cli_options import add_engine_location, parse_pairs, seconds
from kvscope.core.errors import EXIT_BAD_INPUT as EXIT_SETUP
from kvscope.core.errors import EXIT_FINDINGS as EXIT_VERDICT
from kvscope.core.errors import EXIT_OK, UsageError, error_line

COMMANDS = ("verify",)


def register(subparsers: Any) -> None:
    """Add the ``verify`` subcommand to an argparse subparsers object."""
    p = subparsers.add_parser(
        "verify", help="restore a state file in real llama.cpp and compare it with a fresh prefill of its tokens",
        description="Restore FILE in a real llama.cpp (libllama or llama-server), re-prefill the file's tokens in "
                    "an empty context with the same parameters, compare the two states record by record and cell "
                    "by cell within the engine's own variation (the same tokens prefilled under other schedules), "
                    "compare a short continuation's distributions step by step, and give a verdict: ok, damaged, "
                    "stale, incompatible or diverges.")
    p.add_argument("file", metavar="FILE", help="a session file, sequence (slot) file, or state blob")
    p.add_argument("--model", required=True, metavar="GGUF", help="the model the state was written with")
    p.add_argument("--engine", default=VERIFY_ENGINES[0], choices=VERIFY_ENGINES,
                   help="llama.cpp: libllama in a child process (default); server: llama-server over HTTP; torch: "
                        "the memory core (restore only)")
    add_engine_location(p, "the build that writes the file's layout generation, else the binding's own (0c1e5709)")
    p.add_argument("--ctx-param", action="append", metavar="KEY=VALUE", help="override a context parameter (n_ctx, "
                   "n_batch, n_ubatch, n_seq_max, kv_unified, flash_attn=true|false|auto, type_k, type_v, swa_full, "
                   "n_threads, env.NAME); repeatable")
    p.add_argument("--tokens", metavar="IDS", help="the tokens to re-prefill (a blob carries none): comma-separated "
                   "ids, or @FILE holding a JSON list or {seq: [ids]}")
    p.add_argument("--next-token", type=int, metavar="ID", help="the token decoded after the restore and after the "
                   "prefill (default: the last token)")
    p.add_argument("--steps", type=int, default=8, metavar="N", help="tokens of the continuation decoded after the "
                   "restore and after the prefill, compared step by step (default 8; the first is the next token)")
    p.add_argument("--no-calibrate", action="store_true", help="skip the calibration (the prefills under other "
                   "schedules that measure the engine's own variation): the fixed tolerances decide")
    p.add_argument("--timeout", type=seconds(), default=600.0, metavar="S",
                   help="seconds per engine call (default 600)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_verify)


def cmd_verify(args: argparse.Namespace) -> int:
    """Run the verification and print it; 0 ok, 1 another verdict, 2 setup or usage error."""
    from kvscope.core.verify.prefill import parse_tokens
    from kvscope.core.verify.result import result_text
    from kvscope.core.verify.run import Verifier, VerifyError

    try:
        if args.engine != "server" and (args.server or args.slot_dir or args.server_bin):
            raise UsageError("--server, --slot-dir and --server-bin go with --engine server")
        if args.server and args.server_bin:
            raise UsageError("give either --server URL (a running server) or --server-bin PATH, not both")
        if args.server and not args.slot_dir:
            raise UsageError("--server needs --slot-dir (the server's --slot-save-path folder)")
        verifier = Verifier(args.file, args.model, engine=args.engine, build=args.build, lib_path=args.lib,
                            server_url=args.server, slot_dir=args.slot_dir, server_bin=args.server_bin,
                            overrides=parse_pairs(args.ctx_param, "--ctx-param"), tokens=parse_tokens(args.tokens),
                            next_token=args.next_token, timeout_s=args.timeout, steps=args.steps,
                            calibrate=not args.no_calibrate)
        res = verifier.run()
    except (UsageError, VerifyError) as e:
        print(error_line(e), file=sys.stderr)
        return EXIT_SETUP
    if args.json:
        sys.stdout.write(json.dumps(res.to_json(), indent=1, allow_nan=False) + "\n")
    else:
        sys.stdout.write(result_text(res))
    return EXIT_OK if res.verdict == "ok" else EXIT_VERDICT


def main(argv: list[str] | None = None) -> int:
    """Standalone entry: ``python -m kvscope.core.verify.cli FILE --model GGUF ...``."""
    parser = argparse.ArgumentParser(prog="kvscope")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(["verify", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
