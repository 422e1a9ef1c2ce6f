"""``kvscope migrate``: every state file of a slot store written into another layout generation.

``migrate SOURCE --layout GEN --out DEST`` writes every file that loads or can be migrated exactly into
DEST (:mod:`kvscope.core.fleet.migrate`), on this machine or a Dask cluster, restartable (DEST's
manifest records what is done). The value scan is opt-in (``--stats``: a file with NaN/Inf values is
then refused); without it the summary says the values were not scanned. The executor options are
:mod:`kvscope.core.cli.fleet_session`'s.

Exit codes: 0 every file loads in the target or was migrated; 1 a file is damaged, unreadable, or will
not load in the target and could not be migrated; 2 bad input or usage (one line on stderr, no
traceback). Importing this module costs only the standard library; the executors, the reader and
fsspec load when the command runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

from kvscope.core.cli.fleet_session import (
    check_common,
    executor_args,
    executor_report,
    executor_session,
    generation_name,
    print_notes,
    progress_line,
    stats_arg,
    stdout_writer,
    stopped_by_executor,
    stopped_status,
    usage_failure,
)
from kvscope.core.errors import EXIT_FINDINGS, EXIT_OK, UsageError

COMMANDS = ("migrate",)
LISTED_PROBLEMS = 50  # problem files repeated at the end of a migration


def register(subparsers: Any) -> None:
    """Add ``migrate`` to an argparse subparsers object."""
    p = subparsers.add_parser("migrate", help="write every state file of SOURCE into DEST in another layout "
                              "generation (exact conversions only; restartable)")
    p.add_argument("source", metavar="SOURCE", help="a folder, file://..., or any fsspec URL")
    p.add_argument("--layout", required=True, metavar="GEN", help="the target layout generation (e.g. 2026-10-v4)")
    p.add_argument("--out", required=True, metavar="DEST", help="a local folder (created; never inside SOURCE)")
    p.add_argument("--rotation", choices=["auto", "on", "off"], default="auto",
                   help="how the source build rotated K/V (v3 -> v4), as for kvscope rewrite")
    p.add_argument("--drop-trailing", action="store_true", help="accept losing bytes that follow a state")
    stats_arg(p, "the values are not scanned (a file with NaN rows is migrated as it is), and the summary says so")
    executor_args(p)
    p.set_defaults(func=cmd_migrate)


def migrate_error(item: Any, reason: str) -> dict[str, Any]:
    return {"path": item.entry.ref, "rel": item.entry.rel, "action": "error", "reason": reason}


def _migrate_line(r: dict[str, Any]) -> str:
    from kvscope.core.textsafe import safe_text

    rel = safe_text(r["rel"])
    a = r["action"]
    if a == "migrated":
        return f"{a:10s} {rel}: {r.get('layout_from')} -> {r['target']} ({r.get('method')})"
    if a == "copied":
        return f"{a:10s} {rel}: {r.get('layout_from')} already loads in {r['target']}"
    return f"{a:10s} {rel}: {safe_text(str(r.get('reason', '')))}"


def _check_dest(source: Any, dest: str) -> str:
    from kvscope.core.fleet.source import is_url

    if is_url(dest) and not dest.startswith("file://"):
        raise UsageError(f"--out {dest}: must be a local folder (on a cluster: one every worker mounts)")
    dest = dest[len("file://"):] if dest.startswith("file://") else dest
    if os.path.exists(dest) and not os.path.isdir(dest):
        raise UsageError(f"--out {dest}: not a directory")
    if source.local:
        a, b = os.path.realpath(source.root), os.path.realpath(dest)
        if a == b or b.startswith(a.rstrip("/") + "/") or a.startswith(b.rstrip("/") + "/"):
            raise UsageError(f"--out {dest}: must not be SOURCE, inside it, or hold it")
    try:
        os.makedirs(dest, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--out {dest}: {e.strerror or e}") from None
    return os.path.realpath(dest)  # resolved once: outputs are reached from it without following links


@contextmanager
def _dest_locked(dest: str) -> Iterator[tuple[Any, int]]:
    """``(manifest, temporaries removed)``: DEST's manifest, locked for the run, and what killed runs left
    there swept away (ours alone: the lock is held). A run that does not finish sweeps again once its
    executor is closed (a Dask worker stopped mid-file, a thread, has no signal cleanup)."""
    from kvscope.core.fleet.migrate import Manifest, sweep_temporaries

    manifest = Manifest(dest).lock().load()  # DestBusy (a UsageError) when another run holds it
    try:
        yield manifest, sweep_temporaries(dest)
    except BaseException:
        sweep_temporaries(dest)
        raise
    finally:
        manifest.close()


def run_migrate(source: Any, executor: Any, opts: Any, manifest: Any, swept: int, as_json: bool,
                write: Callable[[str], None], progress: Any = None) -> dict[str, Any]:
    """Migrate every entry, recording into ``manifest`` (locked); one line per file, then the summary
    (returned); ``swept``: the temporaries of killed runs removed before."""
    from kvscope.core.fleet.localpool import ExecutorDied
    from kvscope.core.fleet.migrate import PROBLEM_ACTIONS, items, migrate_entry

    actions: Counter[str] = Counter()
    layouts: Counter[str] = Counter()
    problems: list[dict[str, Any]] = []
    n_problems = 0
    tty = sys.stdout.isatty()
    started = time.monotonic()
    shown = 0
    died: ExecutorDied | None = None
    try:
        for r in executor.map(partial(migrate_entry, opts=opts), items(source.walk(), manifest), migrate_error):
            shown = print_notes(executor, shown)
            manifest.record(r)
            actions[r["action"]] += 1
            if r.get("layout_from"):
                layouts[r["layout_from"]] += 1
            if r["action"] in PROBLEM_ACTIONS:
                n_problems += 1
                if len(problems) < LISTED_PROBLEMS:
                    problems.append({"rel": r["rel"], "action": r["action"], "reason": r.get("reason", "")})
            if progress is not None and tty:
                progress.clear()
            write((json.dumps(r) if as_json else _migrate_line(r)) + "\n")
            if progress is not None:
                progress.step()
    except ExecutorDied as e:
        died = e
    finally:
        manifest.sync()
        if progress is not None:
            progress.clear()
    print_notes(executor, shown)
    elapsed = time.monotonic() - started
    s = {"files": sum(actions.values()), "actions": dict(actions), "layouts_from": dict(layouts),
         "target": opts.layout, "dest": opts.dest, "problems": n_problems, "problem_files": problems,
         "executor": executor.name, "elapsed_s": round(elapsed, 3),
         "workers_lost": int(getattr(executor, "workers_lost", 0)), "temporaries_removed": swept,
         "values_scanned": bool(getattr(opts, "stats", False))}
    executor_report(s, executor, died, lambda item: str(item.entry.rel), "migrated")
    write((json.dumps({"summary": s}) if as_json else _migrate_summary(s)) + "\n")
    if died is not None:
        raise stopped_by_executor(died, s, "migrated", s["files"])
    return s


def _migrate_summary(s: dict[str, Any]) -> str:
    from kvscope.core.textsafe import safe_text

    counts = ", ".join(f"{v} {k}" for k, v in sorted(s["actions"].items()))
    lines = [f"summary: {s['files']} files, {counts or 'none'} | into {safe_text(s['dest'])} as {s['target']}"]
    if s.get("temporaries_removed"):
        lines[0] += f" | removed {s['temporaries_removed']} temporaries an interrupted run left"
    if s.get("values_scanned") is False:
        from kvscope.core.analysis.verdict import NOT_SCANNED

        lines[0] += f" | {NOT_SCANNED}: a file with NaN/Inf values is migrated as it is (--stats refuses it)"
    lines += [f"executor: {safe_text(e)}" for e in s.get("executor_events", ())]
    if s.get("not_migrated"):
        lines.append(f"not migrated: {s['not_migrated']} files (the executor died; a rerun takes them up)")
    if s["problems"]:
        more = s["problems"] - len(s["problem_files"])
        lines.append(f"not migrated ({s['problems']}):")
        lines += [f"  {safe_text(p['rel'])}: {p['action']}: {safe_text(p['reason'])}" for p in s["problem_files"]]
        if more:
            lines.append(f"  ... and {more} more (see the lines above)")
    return "\n".join(lines)


def cmd_migrate(args: argparse.Namespace) -> int:
    from kvscope.core.fleet.migrate import MigrateOptions
    from kvscope.core.stopsignals import Stopped

    try:
        check_common(args)
        layout = generation_name(args.layout)
        from kvscope.core.fleet.source import SourceError, open_source

        try:
            dest = _check_dest(open_source(args.source), args.out)
        except SourceError as e:
            raise UsageError(str(e)) from None
        opts = MigrateOptions(dest, layout, args.model, args.rotation, args.drop_trailing, args.stats)
        with _dest_locked(dest) as (manifest, swept), executor_session(args, dest) as (source, executor):
            s = run_migrate(source, executor, opts, manifest, swept, args.json, stdout_writer(),
                            progress_line(source, "migrate"))
    except UsageError as e:
        return usage_failure(str(e))
    except Stopped as e:
        return stopped_status(e)
    return EXIT_FINDINGS if s["problems"] else EXIT_OK
