"""``kvscope scan``: every state file of a fleet's slot store, on this machine or a Dask cluster.

``scan SOURCE`` prints one line (``--json``: one JSON object) per file as results complete, then
the summary (counts by status, kind, layout, verdict and target compatibility; the worst files).
``--target GEN`` adds whether each file loads in that layout generation and, if not, whether it
can be migrated exactly; ``--target RELEASE`` (``b10700``, ``0.3.14``, ``2026-08-30``) the same for the generation
that release reads each file as (:mod:`kvscope.core.reader.releases`; unknown where it is no kvscope generation).
Over a whole store the value scan stays opt-in (``--stats``: NaN/Inf and zero
rows, which ``kvscope inspect`` scans by default); without it the summary says the values were not
scanned. The executor options are :mod:`kvscope.core.cli.fleet_session`'s.

Exit codes: 0 nothing to act on; 1 a file is damaged, unreadable, or (with ``--target``) will not load
in the target and could not be migrated; 2 bad input or usage (one line on stderr, no traceback).
Importing this module costs only the standard library; the executors, the reader and fsspec load when
the command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from kvscope.core.cli.fleet_session import (
    check_common,
    executor_args,
    executor_report,
    executor_session,
    print_notes,
    progress_line,
    stats_arg,
    stdout_writer,
    stopped_by_executor,
    stopped_status,
    target_name,
    usage_failure,
)
from kvscope.core.errors import UsageError

COMMANDS = ("scan",)


def register(subparsers: Any) -> None:
    """Add ``scan`` to an argparse subparsers object."""
    p = subparsers.add_parser("scan", help="scan every state file under a folder or fsspec URL (e.g. a "
                              "--slot-save-path), locally or on a Dask cluster")
    p.add_argument("source", metavar="SOURCE", help="a folder, file://..., or any fsspec URL (s3://bucket/slots)")
    p.add_argument("--target", metavar="GEN|RELEASE", help="also tell whether each file loads in this layout "
                   "generation (e.g. 2026-10-v4, v4) or llama.cpp release (b10700, a llama-cpp-python version such "
                   "as 0.3.14, or a date) and, if not, whether it migrates exactly")
    stats_arg(p, "the values are not scanned, and the summary says so")
    executor_args(p)
    p.set_defaults(func=cmd_scan)


def scan_error(entry: Any, reason: str) -> dict[str, Any]:
    """The result for a file whose scan could not run (its worker died)."""
    return {"path": entry.ref, "status": "error", "reason": reason}


def run_scan(source: Any, executor: Any, model: str | None, target: str | None, as_json: bool,
             write: Callable[[str], None], progress: Any = None, stats: bool = False) -> dict[str, Any]:
    """Stream one line per file through ``write``, then the summary; returns the summary (``stats``: scan each
    file's tensor values too; without, the summary says they were not scanned). If the
    executor dies for good (:class:`~kvscope.core.fleet.localpool.ExecutorDied`), the summary of what
    was scanned is written and :class:`ExecutorError` raised (one line, exit 2)."""
    from kvscope.core.fleet.localpool import ExecutorDied
    from kvscope.core.fleet.scanfile import scan_entry
    from kvscope.core.fleet.summary import Summary, format_line, format_summary

    summary = Summary(target)
    started = time.monotonic()
    tty = sys.stdout.isatty()
    fn = partial(scan_entry, model=model, target=target, stats=stats)
    shown = 0
    died: ExecutorDied | None = None
    try:
        for r in executor.map(fn, source.walk(), scan_error):
            summary.add(r)
            if progress is not None and tty:
                progress.clear()
            shown = print_notes(executor, shown)
            write((json.dumps(r) if as_json else format_line(r, source.relative(r["path"]))) + "\n")
            if progress is not None:
                progress.step()
    except ExecutorDied as e:
        died = e
    if progress is not None:
        progress.clear()
    print_notes(executor, shown)
    s = summary.to_json()
    executor_report(s, executor, died, lambda entry: str(entry.ref), "scanned")
    elapsed = time.monotonic() - started
    s["executor"] = executor.name
    s["elapsed_s"] = round(elapsed, 3)
    s["files_per_s"] = round(s["files"] / elapsed, 1) if elapsed > 0 else None
    s["workers_lost"] = max(s["workers_lost"], int(getattr(executor, "workers_lost", 0)))
    write((json.dumps({"summary": s}) if as_json else format_summary(s, source.relative)) + "\n")
    if died is not None:
        raise stopped_by_executor(died, s, "scanned", s["files"])
    return s


def cmd_scan(args: argparse.Namespace) -> int:
    from kvscope.core.fleet.summary import exit_code
    from kvscope.core.stopsignals import Stopped

    try:
        check_common(args)
        target = target_name(args.target) if args.target is not None else None
        with executor_session(args) as (source, executor):
            s = run_scan(source, executor, args.model, target, args.json, stdout_writer(),
                         progress_line(source, "scan"), stats=args.stats)
    except UsageError as e:
        return usage_failure(str(e))
    except Stopped as e:
        return stopped_status(e)
    return exit_code(s)


