"""``kvscope lab``: run the corrupt-and-restore matrix over a live context and print it.

::

    kvscope lab --context CTX --restore STATE --into SEQ --model GGUF [--corrupt SPEC]... [--policy P]...
                [--reader R]... [--as-is] [--engine torch|llama.cpp|server|both] [--build NAME | --lib PATH]
                [--server URL --slot-dir DIR | --server-bin PATH] [--json | --markdown]

``CTX`` is a whole-context state (``context.state.bin``; a ``context.json`` beside it gives the exact
context parameters, else they are inferred), a lab scenario folder, or its ``context.json``. Without
``--corrupt`` the standard catalog runs (the entries that apply to the memory). ``--as-is`` adds a row
that restores ``STATE`` unchanged. Output: Markdown (default) or ``--json`` (``{"results": [...]}``).
``--engine`` runs the cases in real llama.cpp (``kvscope.core.lab.engine_lab``: the live context is
decoded from the scenario's prompt tokens), in a llama-server (plus the poisoned-slot check), or in
both the core and llama.cpp, listing every disagreement (with its explanation where the lab has one: a case
where llama.cpp failed on its own, which the report names with the evidence). Exit codes: 0 ran, 1
``--engine both`` found a disagreement it cannot explain, 2 bad input or no engine (one line on stderr). torch
is imported only when the command runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from kvscope.core.engine.choices import LAB_ENGINES
from kvscope.core.engine.cli_options import add_engine_location, parse_pairs
from kvscope.core.errors import EXIT_BAD_INPUT, EXIT_OK, KvscopeError, UsageError, error_line
from kvscope.core.errors import EXIT_FINDINGS as EXIT_DISAGREE
from kvscope.core.textsafe import safe_text

COMMANDS = ("lab",)
__all__ = ["EXIT_BAD_INPUT", "EXIT_DISAGREE", "EXIT_OK", "cmd_lab", "main", "register"]


def register(subparsers: Any) -> None:
    """Add the ``lab`` subcommand to an argparse subparsers object."""
    p = subparsers.add_parser("lab", help="corrupt-and-restore lab: restore corrupted copies of a state into a live "
                              "context under each failure policy and reader kind")
    p.add_argument("--context", required=True, metavar="CTX", help="the live context: a whole-context state file, a "
                   "lab scenario folder or its context.json")
    p.add_argument("--restore", metavar="STATE", help="the clean state to corrupt and restore (default: the "
                   "scenario's seq<SEQ>.clean.seqdata.bin)")
    p.add_argument("--into", type=int, default=0, metavar="SEQ", help="destination sequence (default 0)")
    p.add_argument("--model", metavar="GGUF", help="the model that wrote the states (default: the one context.json "
                   "names)")
    p.add_argument("--corrupt", action="append", metavar="SPEC", help="a catalog name, KIND:key=value,... or "
                   "NAME_then_seq_rm (repeatable; default: the standard catalog)")
    p.add_argument("--policy", action="append", metavar="P", help="contained, legacy, transactional (repeatable; "
                   "default: all)")
    p.add_argument("--reader", action="append", metavar="R", help="buffer, file (repeatable; default: both)")
    p.add_argument("--as-is", action="store_true", help="also restore STATE unchanged")
    p.add_argument("--prompt", action="append", metavar="TEXT", help="write a new scenario into CTX (a folder that "
                   "must not exist) with llama.cpp first: sequence N decodes the Nth prompt (repeatable; needs "
                   "--model; the context: n_seq_max = the number of prompts and --ctx-param; the build: --build), "
                   "then run on it")
    p.add_argument("--empty-target", action="store_true", help="with --prompt: the live context holds the other "
                   "prompts' sequences, the target's (--into) is decoded only for its clean inputs, so the restore "
                   "goes into an empty sequence (as in a fresh context) and its logits are judged against a prefill")
    p.add_argument("--live-seq", action="append", metavar="SEQ=FILE", help="build the live context from "
                   "per-sequence files instead of CTX's whole state (repeatable)")
    p.add_argument("--layout", metavar="GEN", help="layout generation of the context (default: from the files)")
    p.add_argument("--ctx-param", action="append", metavar="KEY=VALUE", help="override a context parameter "
                   "(n_ctx, n_seq_max, kv_unified, flash_attn, type_k, type_v, swa_full, n_batch, n_ubatch, ...)")
    p.add_argument("--engine", default=LAB_ENGINES[0], choices=LAB_ENGINES,
                   help="torch: the memory core (default); llama.cpp: libllama in a child process; server: a "
                   "llama-server (with the poisoned-slot check); both: the core and llama.cpp, with every disagreement")
    add_engine_location(p, "the one that writes the scenario's layout")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help='print {"results": [...]}, one entry per matrix cell')
    out.add_argument("--markdown", action="store_true", help="print the matrix as a Markdown table (default)")
    p.set_defaults(func=cmd_lab)


def _ctx_overrides(items: list[str] | None) -> dict[str, Any]:
    from kvscope.core.memory import ContextParams

    types = {f.name: str(f.type) for f in dataclasses.fields(ContextParams)}
    out: dict[str, Any] = {}
    for key, value in parse_pairs(items, "--ctx-param").items():
        if key not in types:
            raise UsageError(f"--ctx-param {key}: not a context parameter ({', '.join(types)})")
        t = types[key]
        if t == "bool":
            low = value.lower()
            if low not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise UsageError(f"--ctx-param {key}={value}: expected true or false")
            out[key] = low in ("1", "true", "yes", "on")
        elif t.startswith("int"):
            try:
                out[key] = None if value.lower() == "none" and "None" in t else int(value, 0)
            except ValueError:
                raise UsageError(f"--ctx-param {key}={value}: expected an integer") from None
        else:
            out[key] = value
    return out


def _run(args: argparse.Namespace) -> tuple[str, int]:
    from kvscope.core.lab.corruptions import CorruptionError
    from kvscope.core.lab.report import render_markdown, run_to_json
    from kvscope.core.lab.runner import AS_IS, POLICIES, READERS, LabError, LabRunner, parse_case
    from kvscope.core.lab.scenario import ScenarioError, load_scenario

    policies = tuple(args.policy or POLICIES)
    readers = tuple(args.reader or READERS)
    for p in policies:
        if p not in POLICIES:
            raise UsageError(f"--policy {p}: unknown ({', '.join(POLICIES)})")
    for r in readers:
        if r not in READERS:
            raise UsageError(f"--reader {r}: unknown ({', '.join(READERS)})")
    try:
        live_seqs = {int(k): v for k, v in parse_pairs(args.live_seq, "--live-seq").items()}
    except ValueError:
        raise UsageError("--live-seq: the sequence id must be an integer") from None
    if args.prompt:
        _new_scenario(args)
    elif args.empty_target:
        raise UsageError("--empty-target goes with --prompt (it says how the new scenario is written)")
    try:
        scenario = load_scenario(args.context, model=args.model, restore=args.restore, into=args.into,
                                 live_seqs=live_seqs or None, layout=args.layout,
                                 overrides=_ctx_overrides(args.ctx_param))
        cases = None
        if args.corrupt or args.as_is:
            cases = ([parse_case(AS_IS)] if args.as_is else []) + [parse_case(s) for s in args.corrupt or []]
        runner = LabRunner(scenario, cases, policies, readers)
        for case in runner.cases:
            runner.prepare(case)
    except (ScenarioError, LabError, CorruptionError, ValueError) as e:
        raise UsageError(str(e)) from None
    if args.engine != "torch":
        return _run_engine(args, scenario, cases)
    run = runner.run()
    if args.json:
        return json.dumps(run_to_json(run), indent=1), EXIT_OK
    return render_markdown(run), EXIT_OK


def _new_scenario(args: argparse.Namespace) -> None:
    """``--prompt``: the scenario folder CTX, written by llama.cpp (one line on stderr says what was written)."""
    from kvscope.core.lab.engine_live import EngineLabError
    from kvscope.core.lab.new_scenario import write_scenario
    from kvscope.core.memory import ContextParams, ParamsError

    if args.empty_target and len(args.prompt) < 2:
        raise UsageError("--empty-target needs a second --prompt for the live context")
    if not args.model:
        raise UsageError("--prompt needs --model (the GGUF llama.cpp decodes the prompts with)")
    if args.live_seq or args.layout:
        raise UsageError("--prompt writes a new scenario: --live-seq and --layout describe an existing one")
    try:
        params = dataclasses.replace(ContextParams(n_seq_max=len(args.prompt)), **_ctx_overrides(args.ctx_param))
    except (ParamsError, TypeError) as e:
        raise UsageError(f"--ctx-param: {e}") from None
    args.ctx_param = None  # the scenario's context.json records them now
    try:
        out = write_scenario(args.context, args.model, params, prompts=dict(enumerate(args.prompt)), build=args.build,
                             lib_path=args.lib, target=args.into, empty_target=args.empty_target)
    except EngineLabError as e:
        raise UsageError(str(e)) from None
    print(f"kvscope lab: wrote the scenario {safe_text(out)} ({len(args.prompt)} sequences, context "
          f"{params.n_ctx} cells)", file=sys.stderr)


def _run_engine(args: argparse.Namespace, scenario: Any, cases: Any) -> tuple[str, int]:
    from kvscope.core.lab.engine_lab import EngineLabRunner
    from kvscope.core.lab.engine_live import EngineLabError
    from kvscope.core.lab.engine_report import engine_run_to_json, render_engine_markdown

    if args.policy or args.reader:
        raise UsageError("--policy and --reader choose the core's cells; a real engine restores with its own code "
                        "(--engine both runs the core with policy contained and the reader of the input's API)")
    if args.engine != "server" and (args.server or args.slot_dir or args.server_bin):
        raise UsageError("--server, --slot-dir and --server-bin go with --engine server")
    try:
        runner = EngineLabRunner(scenario, args.engine, cases, build=args.build, lib_path=args.lib,
                                 server_url=args.server, slot_dir=args.slot_dir, server_bin=args.server_bin,
                                 model=args.model)
    except (EngineLabError, ValueError) as e:
        raise UsageError(str(e)) from None
    try:
        er = runner.run()
    finally:
        runner.close()
    code = EXIT_DISAGREE if er.unexplained else EXIT_OK
    if args.json:
        return json.dumps(engine_run_to_json(er), indent=1), code
    return render_engine_markdown(er), code


def cmd_lab(args: argparse.Namespace) -> int:
    """Run the matrix and print it; 0 ran, 1 disagreements (--engine both); bad input raises UsageError (2)."""
    text, code = _run(args)
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return code


def main(argv: list[str] | None = None) -> int:
    """Standalone entry (``python -m kvscope.core.cli.lab_command lab ...``); ``kvscope lab`` is the same command."""
    parser = argparse.ArgumentParser(prog="kvscope")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(argv)
    try:
        return cmd_lab(args)
    except KvscopeError as e:
        print(error_line(e), file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
