"""What ``kvscope scan`` and ``kvscope migrate`` share: their executor and model options, the checks of
those options, the executor session over a source, the progress and the executor's notes on stderr.

``--executor local|dask`` picks the process pool the per-file work runs on (:func:`make_executor`);
``--engine`` is its old name, still accepted for one release with a one-line note on stderr ("engine"
is llama.cpp's). Importing this module costs only the standard library; the executors, the reader and
fsspec load when a command runs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from kvscope.core.errors import EXIT_BAD_INPUT, UsageError, error_line

EXECUTORS = ("local", "dask")
DEFAULT_FILE_TIMEOUT = 600.0  # seconds one file may take on a worker before the worker is called hung


def executor_args(p: argparse.ArgumentParser) -> None:
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


def stats_arg(p: argparse.ArgumentParser, without: str) -> None:
    p.add_argument("--stats", action="store_true", help="also scan every file's tensor values (NaN/Inf, zero rows: "
                   f"errors in the verdict, as kvscope inspect does by default; slower). Without it {without}")


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


def usage_failure(message: str) -> int:
    print(error_line(message), file=sys.stderr)
    return EXIT_BAD_INPUT


def stopped_status(e: Any) -> int:
    """A command stopped by SIGTERM/SIGHUP (all cleaned up): one line, exit status 128 + the signal."""
    from kvscope.core.stopsignals import exit_status

    print(f"kvscope: stopped by {e.name}", file=sys.stderr)
    return exit_status(e)


def generation_name(name: str) -> str:
    from kvscope.core.reader.layouts import GENERATION_BY_NAME, generation_named

    gen = generation_named(name)
    if gen is None:
        raise UsageError(f"unknown layout {name!r}; known: {', '.join(GENERATION_BY_NAME)}")
    return gen.name


def target_name(name: str) -> str:
    """``scan --target``: a layout generation's name (as :func:`generation_name`), else a release name
    (:func:`kvscope.core.reader.releases.parse_release`: bNNNN, a llama-cpp-python version, a date), kept
    as given; :class:`UsageError` for neither."""
    from kvscope.core.reader.layouts import generation_named
    from kvscope.core.reader.releases import parse_release

    gen = generation_named(name)
    if gen is not None:
        return gen.name
    try:
        parse_release(name)
    except UsageError as e:  # neither: say both, in one line
        from kvscope.core.reader.layouts import GENERATION_BY_NAME

        raise UsageError(f"--target: unknown layout generation ({', '.join(GENERATION_BY_NAME)}) and {e}") from None
    return name.strip()


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


def check_common(args: argparse.Namespace) -> None:
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
def executor_session(args: argparse.Namespace, dest: str | None = None) -> Iterator[tuple[Any, Any]]:
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


def stdout_writer() -> Callable[[str], None]:
    def write(line: str) -> None:
        sys.stdout.write(line)
        sys.stdout.flush()

    return write


def progress_line(source: Any, verb: str) -> Any:
    from kvscope.core.fleet.progress import Progress

    return Progress(sys.stderr, source.count, verb)


def print_notes(executor: Any, shown: int) -> int:
    """Print the executor's new events (its fork server died and it restarted) on stderr, once each;
    returns how many have been shown."""
    events = list(getattr(executor, "events", ()))
    for e in events[shown:]:
        print(f"kvscope: note: {e}", file=sys.stderr)
    return len(events)


def executor_report(s: dict[str, Any], executor: Any, died: Any, name: Callable[[Any], str], what: str) -> None:
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


def stopped_by_executor(died: Any, s: dict[str, Any], what: str, done: int) -> Exception:
    from kvscope.core.fleet.executors import ExecutorError

    n = s[f"not_{what}"]
    return ExecutorError(f"{died}: stopped; {n} file{'' if n == 1 else 's'} not {what}, {done} done "
                         "(the summary above; --json names them)")


