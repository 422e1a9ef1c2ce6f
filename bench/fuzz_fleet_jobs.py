"""The long fuzz's ``jobs_links`` family (#31 items 11, 14, 15): ``--jobs``, links leaving SOURCE, ``--scheduler``.

Each case draws a command (``scan`` or ``migrate``), a SOURCE of one to six real fixtures with zero to
three links to folders drawn from: ``/``, ``/proc/self``, an ancestor of SOURCE, SOURCE itself and a
folder of SOURCE (loops), a folder outside SOURCE holding a state file; ``--jobs`` drawn from
{0, 1, 2, huge, negative}; one case in ten on kvscope's own Dask cluster; and, one case in four,
``--executor dask --scheduler`` with a hostile address (no port, a port out of range, a bad scheme,
control and bidi characters, a path, user:password, an empty host, a very long name). It runs the real
command in this process (``run_cli``) while a sampler thread counts the worker processes it starts, and
checks:

- ``--jobs`` below 1, and every hostile ``--scheduler``: exit 2, one line starting ``kvscope: ``, within
  a few seconds (no connection tried), no worker started;
- otherwise: the run ends within :data:`BOUND_S` s, exit 0 or 1; one line per file of SOURCE and one per
  link leaving SOURCE (``skipped``, ``link leaves SOURCE``), no line for anything outside SOURCE, none
  twice; loops inside SOURCE add nothing; the workers started are at most the lines (never more than
  files, however large ``--jobs``) and at most the job limit; a huge ``--jobs`` is said in one note;
- no traceback, and no stray process left (``stray_processes``).

``case_jobs_links(rng, work)`` is the family's case.
"""

from __future__ import annotations

import os
import random
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import psutil
from fuzz_fleet_common import DATA, FIXTURES, check, run_cli, stray_processes

from kvscope.core.fleet.executors import job_limit

BOUND_S = 90.0  # a case's command ends within this (a few files on 2 loaded cores)
USAGE_S = 10.0  # a usage error comes within this
LINKS = ("root", "proc_self", "ancestor", "loop_self", "loop_inside", "outside")
LEAVING = {"root", "proc_self", "ancestor", "outside"}
JOBS = ("0", "1", "2", "huge", "negative")
HOSTILE_SCHEDULERS = (
    "tcp://127.0.0.1", "127.0.0.1", "tcp://", "tcp://:8786", "tcp://127.0.0.1:0", "tcp://127.0.0.1:65536",
    "tcp://127.0.0.1:99999999999", "tcp://127.0.0.1:-1", "tcp://127.0.0.1:port", "http://127.0.0.1:8786",
    "inproc://x", "ucx://127.0.0.1:8786", "tcp://127.0.0.1:8786/path", "tcp://127.0.0.1:8786?q=1",
    "tcp://u:p@127.0.0.1:8786", "tcp://\x1b[31mhost\x1b[0m:8786", "tcp://a\u202eb:8786", "tcp://[::1",
    "tcp://" + "h" * 5000 + ":8786", "", " ", "tcp://host name:8786", "tcp://127.0.0.1:8786#frag",
)


class _WorkerCounter:
    """Counts the processes started below this one while a command runs (the workers, the fork server)."""

    def __init__(self) -> None:
        self.before = {c.pid for c in psutil.Process().children(recursive=True)}
        self.seen: set[int] = set()
        self.helpers: set[int] = set()  # multiprocessing's fork server and resource tracker
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            try:
                for c in me.children(recursive=True):
                    if c.pid in self.before or c.pid in self.seen or c.pid in self.helpers:
                        continue
                    try:
                        cmd, parent = " ".join(c.cmdline()), c.ppid()
                        forked = "forkserver" in " ".join(psutil.Process(parent).cmdline())
                    except psutil.Error:
                        continue  # gone already: the next look decides for those still there
                    if forked:  # a worker: forked by the fork server (its command line is the server's)
                        self.seen.add(c.pid)
                    elif "forkserver" in cmd or "resource_tracker" in cmd:
                        self.helpers.add(c.pid)
                    else:
                        self.seen.add(c.pid)
            except psutil.Error:
                pass
            time.sleep(0.005)

    def __enter__(self) -> _WorkerCounter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _source(rng: random.Random, work: Path) -> tuple[Path, list[str], dict[str, str]]:
    """SOURCE with real fixtures and drawn links: (root, the files' rels, link rel -> kind)."""
    src = work / "source"
    rels = []
    for i in range(rng.randint(1, 6)):
        rel = f"{rng.choice(['a', 'b', 'a/deep'])}/f{i}.bin"
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(DATA / rng.choice(FIXTURES), src / rel)
        rels.append(rel)
    outside = work / "elsewhere"
    outside.mkdir()
    shutil.copyfile(DATA / FIXTURES[0], outside / "not-in-source.bin")
    links: dict[str, str] = {}
    for n, kind in enumerate(rng.sample(LINKS, rng.randint(0, 3))):
        folder = rng.choice(sorted({r.rsplit("/", 1)[0] for r in rels}) + [""])
        rel = f"{folder}/link{n}-{kind}" if folder else f"link{n}-{kind}"
        target = {"root": "/", "proc_self": "/proc/self", "ancestor": str(work), "loop_self": str(src),
                  "loop_inside": str(src / rels[0].split("/")[0]), "outside": str(outside)}[kind]
        os.symlink(target, src / rel)
        links[rel] = kind
    return src, sorted(rels), links


def _jobs(rng: random.Random) -> tuple[str, str]:
    kind = rng.choice(JOBS)
    value = {"0": "0", "1": "1", "2": "2", "huge": str(rng.choice([10**9, 2**31 - 1, 10**18, job_limit() + 1])),
             "negative": str(rng.choice([-1, -2, -(10**9)]))}[kind]
    return kind, value


def case_jobs_links(rng: random.Random, work: Path) -> dict[str, Any]:
    cmd = rng.choice(["scan", "migrate"])
    src, rels, links = _source(rng, work)
    jobs_kind, jobs = _jobs(rng)
    scheduler = rng.choice(HOSTILE_SCHEDULERS) if rng.random() < 0.25 else None
    args = [cmd, str(src), f"--jobs={jobs}"]
    if cmd == "migrate":
        args += ["--layout", "v4", "--out", str(work / "dest")]
    executor = "dask" if scheduler is not None or rng.random() < 0.1 else "local"
    if scheduler is not None:
        args += ["--executor", "dask", f"--scheduler={scheduler}"]
    elif executor == "dask":  # kvscope's own cluster: started with no more workers than the files
        args += ["--executor", "dask"]
    info: dict[str, Any] = {"command": cmd, "executor": executor, "files": len(rels), "links": sorted(links.values()),
                            "jobs": jobs_kind,
                            "scheduler": scheduler[:40] if scheduler is not None else None}
    t0 = time.monotonic()
    with _WorkerCounter() as counter:
        rc, docs, err = run_cli(args)
    took = time.monotonic() - t0
    info["seconds"] = round(took, 2)
    info["workers"] = len(counter.seen)
    usage = jobs_kind in ("0", "negative") or scheduler is not None
    if usage:
        lines = [ln for ln in err.splitlines() if ln]
        check(rc == 2 and len(lines) == 1 and lines[0].startswith("kvscope: ") and not docs,
              f"{args[1:]!r}: exit {rc}, stderr {err[-600:]!r}, {len(docs)} documents")
        check("\x1b" not in err and "\u202e" not in err, f"an unescaped control character in {err!r}")
        check(took < USAGE_S, f"a usage error after {took:.1f} s")
        check(not counter.seen, f"{len(counter.seen)} workers started for a usage error")
        info["outcome"] = "usage error"
        check(not stray_processes(), "a process was left")
        return info
    check(rc in (0, 1), f"exit {rc}: {err[-800:]}")
    check(took < BOUND_S, f"{cmd} took {took:.1f} s")
    key = "rel" if cmd == "migrate" else "path"
    got = [d[key] if cmd == "migrate" else os.path.relpath(d["path"], src) for d in docs[:-1]]
    check(len(got) == len(set(got)), f"a line twice: {sorted(got)}")
    leaving = {rel for rel, kind in links.items() if kind in LEAVING}
    check(set(got) == set(rels) | leaving, f"lines {sorted(got)}; want {sorted(set(rels) | leaving)}; links {links}")
    for d in docs[:-1]:
        rel = d[key] if cmd == "migrate" else os.path.relpath(d["path"], src)
        if rel in leaving:
            status = d.get("action") if cmd == "migrate" else d.get("status")
            check(status == "skipped" and str(d.get("reason", "")).startswith("link leaves SOURCE"),
                  f"the link {rel} ({links[rel]}) got {d}")
    summary = docs[-1]["summary"]
    check(summary["files"] == len(got), f"summary counts {summary['files']} files, {len(got)} lines")
    bound = min(len(got), job_limit(), int(jobs))
    check(len(counter.seen) <= bound, f"{len(counter.seen)} workers for {len(got)} lines with --jobs {jobs}")
    if jobs_kind == "huge" and int(jobs) > job_limit():
        check(f"--jobs {jobs} capped to {job_limit()}" in err, f"no note of the cap: {err[-400:]!r}")
    check(not stray_processes(), "a process was left")
    info["outcome"] = f"exit {rc}, {len(got)} lines"
    return info
