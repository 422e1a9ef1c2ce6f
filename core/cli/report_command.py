"""``kvscope report``: a state file's report as Markdown and JSON, and with the gui extra as HTML with PNG pictures.

::

    kvscope report FILE [--model GGUF] [--compare OTHER] [--lab [--lab-context CTX] [--lab-into SEQ]]
                   [--verify [verify's engine options] | --verify-json PATH] [--full-paths] -o DIR

What the report says is the core's (:mod:`kvscope.core.report`); the pictures and report.html are drawn by
the Qt layer, :data:`PICTURES`, imported only when the command runs (on the ``offscreen`` platform unless
QT_QPA_PLATFORM is set) and only where it can be: without the gui extra (no PySide6 or pyqtgraph) the
report is report.md and report.json, and one line on stderr says what the gui extra would add.
``--verify`` runs ``kvscope verify`` on FILE first (with ``--model`` and verify's own engine options,
:func:`kvscope.core.cli.verify_command.add_run_options`), ``--verify-json PATH`` takes what an earlier
``kvscope verify --json`` printed (:mod:`kvscope.core.report.verified` checks it is about FILE): every format
then leads with the verdict Verify measured. Where Verify cannot run (no engine, a missing model) or the
result is malformed or about another file, one line on stderr and exit 2, no report.
Exit codes, as ``kvscope inspect``: 0 written and the file has no error findings (and, with a Verify
result, its verdict is ``ok``), 1 written and the file has error findings, its verdict is ``newer`` (a
llama.cpp newer than kvscope wrote it) or Verify's verdict is another one, 2 bad input, a Verify that
cannot run or an unwritable destination (one line on stderr, no report written). Files are named by their
base name (with size and sha256) unless ``--full-paths``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kvscope.core.errors import EXIT_BAD_INPUT, EXIT_FINDINGS, EXIT_OK, KvscopeError, UsageError, error_line
from kvscope.core.report.model import GUI_EXTRA

if TYPE_CHECKING:
    from kvscope.core.report.model import Progress, ReportOptions

COMMANDS = ("report",)
# The Qt layer's part: draw(data, progress) -> (pictures, report.html's renderer). Named, not imported: the
# core never imports the app (pyproject.toml's import contract), it loads this module when it is there.
PICTURES = "kvscope.app.report.builder"
EPILOG = ("exit status: 0 the report is written and the file has no error findings, 1 it is written and the "
          "file has error findings (or, with --verify or --verify-json, Verify's verdict is not ok), 2 bad input, "
          "a Verify that cannot run (no engine, no model), a --verify-json result that is malformed or about "
          "another file, or an unwritable destination (nothing is written)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="the state file to report on")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="report folder to write (new, empty, or "
                   "an earlier report: only the report's own files are replaced, anything else in it is kept)")
    p.add_argument("--model", metavar="GGUF", help="the model that wrote the state (model checks, token text, heads)")
    p.add_argument("--compare", metavar="OTHER", help="add a structural diff against OTHER")
    p.add_argument("--lab", action="store_true", help="run the lab's standard catalog with FILE as the state to "
                   "restore (needs a live context: FILE's lab scenario folder, or --lab-context)")
    p.add_argument("--lab-context", metavar="CTX", help="live context for --lab (implies it): a whole-context state, "
                   "a lab scenario folder or its context.json")
    p.add_argument("--lab-into", type=int, default=0, metavar="SEQ", help="sequence FILE is restored into (default 0)")
    p.add_argument("--full-paths", action="store_true", help="print the files' paths as given; by default the report "
                   "names them by base name, with size and sha256 (reports end up in public bug trackers)")
    from kvscope.core.cli.verify_command import add_run_options

    which = p.add_mutually_exclusive_group()
    which.add_argument("--verify", action="store_true", help="run kvscope verify on FILE (with --model) and lead the "
                       "report with its verdict: the file restored in real llama.cpp against a fresh prefill")
    which.add_argument("--verify-json", metavar="PATH", help="lead the report with the verdict of an earlier "
                       "`kvscope verify FILE --json > PATH` (refused when it is about another file)")
    add_run_options(p.add_argument_group("how --verify runs (kvscope verify's options)"))


def register(subparsers: Any) -> None:
    """Add the ``report`` subcommand to the core CLI's subparsers."""
    p = subparsers.add_parser("report", help="write a Markdown / JSON report of a state file (with the gui extra: "
                              "HTML and pictures too)",
                              description="Write a report of a llama.cpp state file: report.md and report.json, "
                              f"and with the gui extra ({GUI_EXTRA}) report.html and PNG pictures.", epilog=EPILOG)
    add_arguments(p)
    p.set_defaults(func=cmd_report)


def _use_offscreen() -> None:
    """The report draws without a window: the offscreen platform unless the user chose one."""
    if not os.environ.get("QT_QPA_PLATFORM"):
        os.environ["QT_QPA_PLATFORM"] = "offscreen"


def load_pictures() -> tuple[Any, str]:
    """The Qt layer's ``draw`` (:data:`PICTURES`), or None and why it cannot be had (no PySide6 or pyqtgraph,
    Qt's libraries missing, no app layer installed). An ImportError of another kvscope module is a bug: raised."""
    import importlib

    try:
        return importlib.import_module(PICTURES).draw, ""
    except ImportError as e:
        name = e.name or ""
        if name.startswith("kvscope.") and not f"{PICTURES}.".startswith(f"{name}."):
            raise
        return None, str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _progress() -> Any:
    """Progress on stderr when it is a terminal, else nothing."""
    if not sys.stderr.isatty():
        return lambda _f, _t: None

    def show(fraction: float | None, text: str) -> None:
        pct = f"{fraction * 100:3.0f}% " if isinstance(fraction, float) else ""
        sys.stderr.write(f"\r\033[K{pct}{text[:100]}")
        sys.stderr.flush()

    return show


def _clear_progress() -> None:
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K")
        sys.stderr.flush()


def cmd_report(args: argparse.Namespace) -> int:
    """Write the report; 0 written (no error findings), 1 written (error findings), 2 bad input (one line on
    stderr). Without the gui extra: report.md and report.json, and one line on stderr saying so."""
    from kvscope.core.report.build import build_report
    from kvscope.core.report.model import ReportError, ReportOptions
    from kvscope.core.report.summary import summary_line

    if args.lab_into < 0:
        print(error_line("--lab-into must be a sequence id (0 or more)"), file=sys.stderr)
        return EXIT_BAD_INPUT
    options = ReportOptions(args.file, args.model, args.compare, bool(args.lab or args.lab_context),
                            args.lab_context, args.lab_into, bool(args.full_paths))
    progress = _progress()
    try:
        verify = _verify(args, options, progress)
    except KvscopeError as e:
        _clear_progress()
        print(error_line(e), file=sys.stderr)
        return EXIT_BAD_INPUT
    _use_offscreen()
    draw, why_not = load_pictures()
    try:
        data, _ = build_report(options, args.output, progress, draw, verify)
    except ReportError as e:
        _clear_progress()
        print(error_line(e), file=sys.stderr)
        return EXIT_BAD_INPUT
    _clear_progress()
    if draw is None:
        print(error_line(f"note: wrote report.md and report.json only: the pictures and report.html need the gui "
                         f"extra ({GUI_EXTRA}): {why_not}"), file=sys.stderr)
    if data.lab is not None and data.lab.run is None:
        print(error_line(f"note: the lab did not run: {data.lab.reason}"), file=sys.stderr)
    print(summary_line(data, args.output))
    verified = verify is None or verify.get("verdict") == "ok"
    newer = data.overview.verdict.level == "newer"  # written by a llama.cpp newer than kvscope knows: as inspect
    return EXIT_FINDINGS if data.result.n_errors or newer or not verified else EXIT_OK


def _verify(args: argparse.Namespace, options: ReportOptions, progress: Progress) -> dict[str, Any] | None:
    """The Verify result the report leads with (``--verify``: run now; ``--verify-json``: read), None without
    either; KvscopeError (one line, exit 2) when it cannot be had: verify's options without ``--verify``, no
    ``--model``, an engine that cannot run, a malformed result."""
    from pathlib import Path

    from kvscope.core.cli.verify_command import run_options_given, verifier_from_args
    from kvscope.core.report.atomic import check_destination, report_inputs
    from kvscope.core.report.collect import check_inputs, verify_for_report
    from kvscope.core.report.verified import SOURCE_RUN, load_verify_json
    from kvscope.core.verify.run import VerifyError

    given = run_options_given(args)
    if given and not args.verify:
        raise UsageError(f"{given[0]} says how --verify runs: give --verify too")
    if args.verify_json is not None:
        result = load_verify_json(args.verify_json)
        return verify_for_report(result, f"kvscope verify --json ({os.path.basename(args.verify_json)})")
    if not args.verify:
        return None
    if args.model is None:
        raise UsageError("--verify needs --model (the model the state was written with)")
    check_inputs(options)  # the report's one-line refusals first, and before the engine's work
    check_destination(Path(os.path.abspath(args.output)), report_inputs(options))

    def verify_progress(done: int, total: int, label: str) -> None:
        progress(done / total if total else None, f"verify: {label}")

    try:
        res = verifier_from_args(args.file, args.model, args, verify_progress).run()
    except VerifyError as e:
        raise VerifyError(f"--verify cannot run: {e.message}") from None
    return verify_for_report(res.to_json(), SOURCE_RUN)


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry (``python -m kvscope.core.cli.report_command``)."""
    ap = argparse.ArgumentParser(prog="kvscope report", description="Write a report of a llama.cpp state file.",
                                 epilog=EPILOG)
    add_arguments(ap)
    try:
        args = ap.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as e:
        return int(e.code) if isinstance(e.code, int) else EXIT_BAD_INPUT
    return cmd_report(args)


if __name__ == "__main__":
    sys.exit(main())
