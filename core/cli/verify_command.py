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
from typing import TYPE_CHECKING, Any

from kvscope.core.engine.choices import VERIFY_ENGINES
from kvscope.core.engine.cli_options import add_engine_location, parse_pairs, seconds
from kvscope.core.errors import EXIT_BAD_INPUT as EXIT_SETUP
from kvscope.core.errors import EXIT_FINDINGS as EXIT_VERDICT
from kvscope.core.errors import EXIT_OK, UsageError, error_line

if TYPE_CHECKING:
    from kvscope.core.verify.run import Progress, Verifier

COMMANDS = ("verify",)


DEFAULT_STEPS = 8  # --steps
DEFAULT_TIMEOUT_S = 600.0  # --timeout
# the options add_run_options adds and their defaults: the options a caller gave (run_options_given)
RUN_DEFAULTS: dict[str, tuple[str, object]] = {
    "engine": ("--engine", VERIFY_ENGINES[0]), "build": ("--build", None), "lib": ("--lib", None),
    "server": ("--server", None), "slot_dir": ("--slot-dir", None), "server_bin": ("--server-bin", None),
    "ctx_param": ("--ctx-param", None), "tokens": ("--tokens", None), "next_token": ("--next-token", None),
    "steps": ("--steps", DEFAULT_STEPS), "no_calibrate": ("--no-calibrate", False),
    "timeout": ("--timeout", DEFAULT_TIMEOUT_S),
}


def add_run_options(p: argparse.ArgumentParser | Any) -> None:
    """How verify runs: ``--engine``, the engine's location (``--build`` | ``--lib``, ``--server``, ``--slot-dir``,
    ``--server-bin``), ``--ctx-param``, ``--tokens``, ``--next-token``, ``--steps``, ``--no-calibrate``,
    ``--timeout`` (``kvscope verify``'s, and ``kvscope report --verify``'s); :func:`verifier_from_args` reads them.
    ``p``: a parser or an argument group."""
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
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, metavar="N", help="tokens of the continuation "
                   f"decoded after the restore and after the prefill, compared step by step (default {DEFAULT_STEPS}; "
                   "the first is the next token)")
    p.add_argument("--no-calibrate", action="store_true", help="skip the calibration (the prefills under other "
                   "schedules that measure the engine's own variation): the fixed tolerances decide")
    p.add_argument("--timeout", type=seconds(), default=DEFAULT_TIMEOUT_S, metavar="S",
                   help=f"seconds per engine call (default {DEFAULT_TIMEOUT_S:.0f})")


def run_options_given(args: argparse.Namespace) -> list[str]:
    """The options of :func:`add_run_options` given other than their defaults (``["--engine", "--build"]``)."""
    return [flag for dest, (flag, default) in RUN_DEFAULTS.items() if getattr(args, dest, default) != default]


def verifier_from_args(file: str, model: str, args: argparse.Namespace,
                       progress: Progress | None = None) -> Verifier:
    """The :class:`~kvscope.core.verify.run.Verifier` of ``file`` with ``model`` that the options of
    :func:`add_run_options` in ``args`` ask for; UsageError for options that do not go together, VerifyError
    (from the Verifier) for values it cannot use. ``progress(done, total, label)``: as the Verifier's."""
    from kvscope.core.verify.prefill import parse_tokens
    from kvscope.core.verify.run import Verifier

    if args.engine != "server" and (args.server or args.slot_dir or args.server_bin):
        raise UsageError("--server, --slot-dir and --server-bin go with --engine server")
    if args.server and args.server_bin:
        raise UsageError("give either --server URL (a running server) or --server-bin PATH, not both")
    if args.server and not args.slot_dir:
        raise UsageError("--server needs --slot-dir (the server's --slot-save-path folder)")
    return Verifier(file, model, engine=args.engine, build=args.build, lib_path=args.lib,
                    server_url=args.server, slot_dir=args.slot_dir, server_bin=args.server_bin,
                    overrides=parse_pairs(args.ctx_param, "--ctx-param"), tokens=parse_tokens(args.tokens),
                    next_token=args.next_token, timeout_s=args.timeout, steps=args.steps,
                    calibrate=not args.no_calibrate, progress=progress)


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
    add_run_options(p)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_verify)


def cmd_verify(args: argparse.Namespace) -> int:
    """Run the verification and print it; 0 ok, 1 another verdict, 2 setup or usage error."""
    from kvscope.core.verify.result import result_text
    from kvscope.core.verify.run import VerifyError

    try:
        res = verifier_from_args(args.file, args.model, args).run()
    except (UsageError, VerifyError) as e:
        print(error_line(e), file=sys.stderr)
        return EXIT_SETUP
    if args.json:
        sys.stdout.write(json.dumps(res.to_json(), indent=1, allow_nan=False) + "\n")
    else:
        sys.stdout.write(result_text(res))
    return EXIT_OK if res.verdict == "ok" else EXIT_VERDICT


def main(argv: list[str] | None = None) -> int:
    """Standalone entry: ``python -m kvscope.core.cli.verify_command FILE --model GGUF ...``."""
    parser = argparse.ArgumentParser(prog="kvscope")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(["verify", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
