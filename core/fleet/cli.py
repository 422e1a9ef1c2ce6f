"""``kvscope scan`` and ``kvscope migrate``: a fleet's slot store, on this machine or a Dask cluster.

``scan SOURCE`` prints one line (``--json``: one JSON object) per file as results complete, then
the summary (counts by status, kind, layout, verdict and target compatibility; the worst files).
``--target GEN`` adds whether each file loads in that layout generation and, if not, whether it
can be migrated exactly. ``migrate SOURCE --layout GEN --out DEST`` writes every file that loads
or can be migrated exactly into DEST (:mod:`kvscope.core.fleet.migrate`). ``--executor local|dask``
picks the process pool the per-file work runs on; ``--engine`` is its old name, still accepted
for one release with a one-line note on stderr ("engine" is llama.cpp's). Over a whole store the
value scan stays opt-in (``--stats``: NaN/Inf and zero rows, which ``kvscope inspect`` scans by default);
without it the summary says the values were not scanned.

Exit codes (both): 0 nothing to act on; 1 a file is damaged, unreadable, or (scan with
``--target``, and migrate) will not load in the target and could not be migrated; 2 bad input
or usage (one line on stderr, no traceback). Importing this module costs only the standard
library; the executors, the reader and fsspec load when a command runs.
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

from kvscope.core.errors import EXIT_BAD_INPUT, EXIT_FINDINGS, EXIT_OK, UsageError, error_line

COMMANDS = ("scan", "migrate")  # what register() adds (found by kvscope.core.cli.registry)
EXECUTORS = ("local", "dask")
LISTED_PROBLEMS = 50  # problem files repeated at the end of a migration
DEFAULT_FILE_TIMEOUT = 600.0  # seconds one file may take on a worker before the worker is called hung


def _executor_args(p: argparse.ArgumentParser) -> None:
    from kvscope.core.engine.cli_options import seconds  # stdlib only: the one check of every option in seconds

    p.add_argument("--executor", choices=EXECUTORS, default=None,
                   help="local: worker processes on this machine (default); dask: a dask.distributed cluster")
    # the name before --executor ("engine" is llama.cpp); accepted, with a note, for one release
    p.add_argument("--engine", choices=EXECUTORS, default=None, dest="old_engine", help=argparse.SUPPRESS)
    p.add_argument("--scheduler", metavar="ADDR", help="with --executor dask: the scheduler (tcp://host:8786); "
                   "default: a local cluster started for the run")
    p.add_argument("--jobs", type=int, metavar="N", help="worker processes (default: all cores; with --scheduler: "
                   "the cluster's own)")
    p.add_argument("--batch", type=int, metavar="N", help="with --executor dask: files per task (default 16)")
    p.add_argument("--file-timeout", type=seconds("no limit"), default=DEFAULT_FILE_TIMEOUT, metavar="S",
                   help="a worker with no result for one file after S seconds (stopped, hung) is killed and "
                   f"that file reported (default {DEFAULT_FILE_TIMEOUT:g}; 0: no limit; with --scheduler: the "
                   "cluster's own worker-ttl applies)")
    p.add_argument("--model", metavar="GGUF", help="the model that wrote the states (workers read it at this path)")
    p.add_argument("--json", action="store_true", help="one JSON object per line, then a summary object")


def _stats_arg(p: argparse.ArgumentParser, without: str) -> None:
    p.add_argument("--stats", action="store_true", help="also scan every file's tensor values (NaN/Inf, zero rows: "
                   f"errors in the verdict, as kvscope inspect does by default; slower). Without it {without}")


def register(subparsers: Any) -> None:
    """Add ``scan`` and ``migrate`` to an argparse subparsers object."""
    p = subparsers.add_parser("scan", help="scan every state file under a folder or fsspec URL (e.g. a "
                              "--slot-save-path), locally or on a Dask cluster")
    p.add_argument("source", metavar="SOURCE", help="a folder, file://..., or any fsspec URL (s3://bucket/slots)")
    p.add_argument("--target", metavar="GEN", help="also tell whether each file loads in this layout generation "
                   "(e.g. 2026-10-v4, v4, b11434) and, if not, whether it migrates exactly")
    _stats_arg(p, "the values are not scanned, and the summary says so")
    _executor_args(p)
    p.set_defaults(func=cmd_scan)

    p = subparsers.add_parser("migrate", help="write every state file of SOURCE into DEST in another layout "
                              "generation (exact conversions only; restartable)")
    p.add_argument("source", metavar="SOURCE", help="a folder, file://..., or any fsspec URL")
    p.add_argument("--layout", required=True, metavar="GEN", help="the target layout generation (e.g. 2026-10-v4)")
    p.add_argument("--out", required=True, metavar="DEST", help="a local folder (created; never inside SOURCE)")
    p.add_argument("--rotation", choices=["auto", "on", "off"], default="auto",
                   help="how the source build rotated K/V (v3 -> v4), as for kvscope rewrite")
    p.add_argument("--drop-trailing", action="store_true", help="accept losing bytes that follow a state")
    _stats_arg(p, "the values are not scanned (a file with NaN rows is migrated as it is), and the summary says so")
    _executor_args(p)
    p.set_defaults(func=cmd_migrate)


def make_executor(name: str, jobs: int | None = None, scheduler: str | None = None, batch: int | None = None,
                  timeout: float | None = None) -> Any:
    """The executor called ``name`` (``local`` or ``dask``); :class:`ExecutorError` for an unknown one."""
    from kvscope.core.fleet.executors import ExecutorError, default_jobs

    if name == "local":
        if scheduler is not None:
            raise ExecutorError("--scheduler needs --executor dask")
        from kvscope.core.fleet.localpool import LocalPool

        return LocalPool(jobs or default_jobs(), timeout)
    if name == "dask":
        from kvscope.core.fleet.daskpool import DaskPool

        return DaskPool(scheduler=scheduler, jobs=jobs, batch=batch, timeout=timeout)
    raise ExecutorError(f"unknown executor {name!r}; known: {', '.join(EXECUTORS)}")



# -- shared ------------------------------------------------------------------------------------------
def _fail(message: str) -> int:
    print(error_line(message), file=sys.stderr)
    return EXIT_BAD_INPUT


def _stopped(e: Any) -> int:
    """A command stopped by SIGTERM/SIGHUP (all cleaned up): one line, exit status 128 + the signal."""
    from kvscope.core.stopsignals import exit_status

    print(f"kvscope: stopped by {e.name}", file=sys.stderr)
    return exit_status(e)


def _generation(name: str) -> str:
    from kvscope.core.reader.layouts import GENERATION_BY_NAME, generation_named

    gen = generation_named(name)
    if gen is None:
        raise UsageError(f"unknown layout {name!r}; known: {', '.join(GENERATION_BY_NAME)}")
    return gen.name


DEPRECATED_ENGINE = ("--engine is deprecated: it is now --executor (the engine is llama.cpp); "
                     "--engine goes in the next release")


def _choose_executor(args: argparse.Namespace) -> None:
    """``args.executor`` from ``--executor``, or the deprecated ``--engine`` (with a note on stderr)."""
    old = getattr(args, "old_engine", None)
    if old is not None:
        print(f"kvscope: note: {DEPRECATED_ENGINE}", file=sys.stderr)
        if args.executor is not None and args.executor != old:
            raise UsageError(f"--engine {old} and --executor {args.executor} disagree (give --executor only)")
        args.executor = args.executor or old
    args.executor = args.executor or "local"


SCHEDULER_SCHEMES = ("tcp", "tls", "ws", "wss")  # dask.distributed's network transports


def _host_name_ok(host: str) -> bool:
    """An IP address, or a DNS name whose labels are 1-63 characters and which is at most 253 in all (the
    resolver's idna codec raises UnicodeError past those: an internal error, found by the jobs_links fuzz)."""
    import ipaddress

    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    name = host[:-1] if host.endswith(".") else host
    return 0 < len(name) <= 253 and all(0 < len(label) <= 63 for label in name.split("."))


def check_scheduler(address: str) -> str:
    """``--scheduler``'s address checked before anything connects: ``[SCHEME://]HOST:PORT`` with SCHEME one of
    :data:`SCHEDULER_SCHEMES` (default tcp), a host name or IP address, a port 1-65535, nothing else.
    :class:`UsageError` (one line) otherwise: dask took ``tcp://127.0.0.1`` (no port) for an address, stalled
    for a minute and ended in its own traceback. Returns the address with its scheme."""
    from urllib.parse import urlsplit

    from kvscope.core.textsafe import safe_text

    shown = safe_text(address, 200)
    scheme, sep, _ = address.partition("://")
    full = address if sep else f"tcp://{address}"
    scheme = scheme.lower() if sep else "tcp"
    if scheme not in SCHEDULER_SCHEMES:
        raise UsageError(f"--scheduler {shown}: unknown scheme {safe_text(scheme, 40)!r} (give tcp://HOST:PORT; "
                         f"known: {', '.join(SCHEDULER_SCHEMES)})")
    try:
        parts = urlsplit(full)
        port = parts.port
    except ValueError as e:
        raise UsageError(f"--scheduler {shown}: not an address: {e} (give tcp://HOST:PORT)") from None
    host = parts.hostname or ""
    if not host or parts.username is not None or parts.password is not None \
            or any(not (c.isascii() and (c.isalnum() or c in "-._:")) for c in host):
        raise UsageError(f"--scheduler {shown}: no host name (give tcp://HOST:PORT)")
    if not _host_name_ok(host):
        raise UsageError(f"--scheduler {shown}: not a host name (labels of 1-63 characters, 253 in all; "
                         "give tcp://HOST:PORT)")
    if port is None or port == 0:
        raise UsageError(f"--scheduler {shown}: no port (give tcp://HOST:PORT, e.g. tcp://{host}:8786)")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise UsageError(f"--scheduler {shown}: only SCHEME://HOST:PORT, no path or query")
    return f"{scheme}://{parts.netloc}"


def _check_common(args: argparse.Namespace) -> None:
    _choose_executor(args)
    if args.jobs is not None and args.jobs < 1:
        raise UsageError("--jobs must be at least 1")
    if args.batch is not None and args.batch < 1:
        raise UsageError("--batch must be at least 1")
    if not 0 <= args.file_timeout < float("inf"):  # the parser's type checks it; a caller's Namespace may not
        raise UsageError("--file-timeout must be 0 (no limit) or a number of seconds")
    if args.scheduler is not None and args.executor != "dask":
        raise UsageError("--scheduler needs --executor dask")
    if args.scheduler is not None:
        args.scheduler = check_scheduler(args.scheduler)
    if args.jobs is not None and args.scheduler is None:
        from kvscope.core.fleet.executors import JOBS_PER_CORE, MIN_JOB_LIMIT, job_limit

        limit = job_limit()
        if args.jobs > limit:  # and the local executor starts no more workers than there are files
            print(f"kvscope: note: --jobs {args.jobs} capped to {limit} worker processes ({JOBS_PER_CORE} per core, "
                  f"at least {MIN_JOB_LIMIT})", file=sys.stderr)
            args.jobs = limit
    if args.model is not None:
        from kvscope.core.model.profile import load_model_or

        load_model_or(args.model, UsageError)  # fail early with one message, not once per file


@contextmanager
def _session(args: argparse.Namespace, dest: str | None = None) -> Iterator[tuple[Any, Any]]:
    """``(source, executor)`` for a command; SourceError and ExecutorError become UsageError.
    With ``dest`` (migrate's), the walk never enters DEST, however a link of SOURCE leads there."""
    from kvscope.core.fleet.executors import ExecutorError
    from kvscope.core.fleet.source import SourceError, open_source
    from kvscope.core.stopsignals import stopped_by_signals

    with stopped_by_signals():  # SIGTERM/SIGHUP raise Stopped: the finally below closes the executor first
        try:
            source = open_source(args.source)
            if dest is not None and source.local:
                source.exclude(dest, "a link into DEST (--out): not walked, so no run migrates its own outputs")
            jobs = args.jobs
            if args.executor == "dask" and args.scheduler is None:  # its cluster starts first: no more
                from itertools import islice  # workers than the files it will have

                from kvscope.core.fleet.executors import bounded_jobs

                jobs = max(1, sum(1 for _ in islice(source.walk(), bounded_jobs(jobs))))
            executor = make_executor(args.executor, jobs, args.scheduler, args.batch, args.file_timeout or None)
        except (SourceError, ExecutorError) as e:
            raise UsageError(str(e)) from None
        try:
            executor.__enter__()
        except ExecutorError as e:
            raise UsageError(str(e)) from None
        except BaseException:  # Stopped while a cluster starts: what started is stopped
            executor.__exit__(None, None, None)
            raise
        try:
            yield source, executor
        except ExecutorError as e:
            raise UsageError(str(e)) from None
        finally:
            executor.__exit__(None, None, None)


def _writer() -> Callable[[str], None]:
    def write(line: str) -> None:
        sys.stdout.write(line)
        sys.stdout.flush()

    return write


def _progress(source: Any, verb: str) -> Any:
    from kvscope.core.fleet.progress import Progress

    return Progress(sys.stderr, source.count, verb)


def _notes(executor: Any, shown: int) -> int:
    """Print the executor's new events (its fork server died and it restarted) on stderr, once each;
    returns how many have been shown."""
    events = list(getattr(executor, "events", ()))
    for e in events[shown:]:
        print(f"kvscope: note: {e}", file=sys.stderr)
    return len(events)


def _executor_report(s: dict[str, Any], executor: Any, died: Any, name: Callable[[Any], str], what: str) -> None:
    """The executor's restarts and events in summary ``s``; with ``died`` (an ExecutorDied), also how many
    files got no result (``not_<what>``) and their names (``not_<what>_files``), the rest of the walk included."""
    s["executor_restarts"] = int(getattr(executor, "restarts", 0))
    events = list(getattr(executor, "events", ()))
    if events:
        s["executor_events"] = events
    if died is not None:
        names = [name(x) for x in died.pending] + [name(x) for x in died.rest]
        s[f"not_{what}"] = len(names)
        s[f"not_{what}_files"] = names


def _stopped_by_executor(died: Any, s: dict[str, Any], what: str, done: int) -> Exception:
    from kvscope.core.fleet.executors import ExecutorError

    n = s[f"not_{what}"]
    return ExecutorError(f"{died}: stopped; {n} file{'' if n == 1 else 's'} not {what}, {done} done "
                         "(the summary above; --json names them)")


# -- scan -------------------------------------------------------------------------------------------------
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
            shown = _notes(executor, shown)
            write((json.dumps(r) if as_json else format_line(r, source.relative(r["path"]))) + "\n")
            if progress is not None:
                progress.step()
    except ExecutorDied as e:
        died = e
    if progress is not None:
        progress.clear()
    _notes(executor, shown)
    s = summary.to_json()
    _executor_report(s, executor, died, lambda entry: str(entry.ref), "scanned")
    elapsed = time.monotonic() - started
    s["executor"] = executor.name
    s["elapsed_s"] = round(elapsed, 3)
    s["files_per_s"] = round(s["files"] / elapsed, 1) if elapsed > 0 else None
    s["workers_lost"] = max(s["workers_lost"], int(getattr(executor, "workers_lost", 0)))
    write((json.dumps({"summary": s}) if as_json else format_summary(s, source.relative)) + "\n")
    if died is not None:
        raise _stopped_by_executor(died, s, "scanned", s["files"])
    return s


def cmd_scan(args: argparse.Namespace) -> int:
    from kvscope.core.fleet.summary import exit_code
    from kvscope.core.stopsignals import Stopped

    try:
        _check_common(args)
        target = _generation(args.target) if args.target is not None else None
        with _session(args) as (source, executor):
            s = run_scan(source, executor, args.model, target, args.json, _writer(), _progress(source, "scan"),
                         stats=args.stats)
    except UsageError as e:
        return _fail(str(e))
    except Stopped as e:
        return _stopped(e)
    return exit_code(s)


# -- migrate ----------------------------------------------------------------------------------------------
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
            shown = _notes(executor, shown)
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
    _notes(executor, shown)
    elapsed = time.monotonic() - started
    s = {"files": sum(actions.values()), "actions": dict(actions), "layouts_from": dict(layouts),
         "target": opts.layout, "dest": opts.dest, "problems": n_problems, "problem_files": problems,
         "executor": executor.name, "elapsed_s": round(elapsed, 3),
         "workers_lost": int(getattr(executor, "workers_lost", 0)), "temporaries_removed": swept,
         "values_scanned": bool(getattr(opts, "stats", False))}
    _executor_report(s, executor, died, lambda item: str(item.entry.rel), "migrated")
    write((json.dumps({"summary": s}) if as_json else _migrate_summary(s)) + "\n")
    if died is not None:
        raise _stopped_by_executor(died, s, "migrated", s["files"])
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
        _check_common(args)
        layout = _generation(args.layout)
        from kvscope.core.fleet.source import SourceError, open_source

        try:
            dest = _check_dest(open_source(args.source), args.out)
        except SourceError as e:
            raise UsageError(str(e)) from None
        opts = MigrateOptions(dest, layout, args.model, args.rotation, args.drop_trailing, args.stats)
        with _dest_locked(dest) as (manifest, swept), _session(args, dest) as (source, executor):
            s = run_migrate(source, executor, opts, manifest, swept, args.json, _writer(),
                            _progress(source, "migrate"))
    except UsageError as e:
        return _fail(str(e))
    except Stopped as e:
        return _stopped(e)
    return EXIT_FINDINGS if s["problems"] else EXIT_OK
