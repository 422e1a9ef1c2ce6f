"""Long fuzz of what happens around the reader: hostile servers, links, dying workers, signals.

The reader's long fuzz (``bench/fuzz_long.py``) feeds bytes to a parser in-process; the families
here drive whole commands and real processes, so an input costs seconds, not microseconds.
Ten families, each input a pure function of ``(--seed, family, index)``; the four below live here, the
six of #31 in modules of their own, whose docstrings say what each draws and checks:

``outputs`` (``fuzz_fleet_outputs.py``)
    ``-o`` of repair, corrupt, rewrite and report naming an input by any path, a FIFO, a device, a folder.
``ctx_params`` (``fuzz_fleet_ctxparams.py``, the pinned build)
    verify of a healthy slot with hostile ``--ctx-param``/``--next-token``/``--timeout`` and a model cut,
    swapped or not fitting: never a verdict charged to the file.
``corrupt_specs`` (``fuzz_fleet_corrupt.py``)
    hostile corruption specs (the copy equals the catalog's mutation, or one line) and hostile
    ``--tokens @FILE`` (a FIFO, ``/dev/zero``, deep nesting, past the cap) refused before any engine.
``jobs_links`` (``fuzz_fleet_jobs.py``)
    scan/migrate with ``--jobs`` extremes, links leaving SOURCE (``/``, ``/proc/self``, loops) and hostile
    ``--scheduler`` addresses: bounded workers, bounded walk, one line.
``messages`` (``fuzz_fleet_messages.py``)
    every command with nan/inf/100,000-digit values, hostile names, folders/FIFOs/devices where files go,
    stdout on ``/dev/full``: exit 0/1/2, one printable line, no exception names.
``signals_repair_lab`` (``fuzz_fleet_signals2.py``, the pinned build)
    signals during repair and the engine lab (a llama-server of the user's included): nothing left behind.

``server``
    ``kvscope verify --engine server`` of a real llama-server slot through the misbehaving proxy of
    ``kvharness/fake_server.py`` before a real llama-server (0c1e5709, the tiny llama): one to
    three faults drawn over every endpoint and every kind it offers (HTTP errors with hostile
    messages, silence, closed connections, bodies that are not JSON, JSON of wrong types, trickled
    heads and bodies, huge bodies, and the saved slot replaced by a link, a FIFO, a folder, a
    sparse giant or cut bytes). Checks: a verdict or one printable line (``VerifyError``), within
    the bound of its timeouts, no copy left in the slot folder, RSS growth under 512 MiB.
``trees``
    ``kvscope migrate`` then ``scan`` over a generated SOURCE of real fixtures with links drawn
    from: DEST/a -> SOURCE/a, DEST/a -> elsewhere, DEST/x/file -> SOURCE/x/file or elsewhere,
    SOURCE/link -> DEST, SOURCE/link -> DEST/a, SOURCE/x/file -> elsewhere. Checks: SOURCE and the
    elsewhere folder unchanged byte for byte (modes and mtimes too), nothing new outside DEST,
    every output a plain file physically inside DEST, no temporary left, one line per file, no
    traceback, and a rerun stable (what was written is ``already``, the rest answers the same, DEST
    unchanged).
``workers``
    ``kvscope scan`` on the local executor or Dask while a worker reading a slow real-format file
    is sent SIGKILL or SIGSTOP after a drawn delay (``--file-timeout`` short). Checks: one line per
    file, every other file's line equal to a scan in this process, the victim's line its result or
    ``worker died``/``timed out``, no stopped or stray process left.
``signals``
    scan / migrate (local and Dask), ``report`` and (with the pinned builds) ``verify`` as real
    children in their own session and ``TMPDIR``, sent SIGINT, SIGTERM, SIGHUP or SIGKILL at a drawn
    time. After INT/TERM/HUP: exit 130 / 128+signal (or the command was done first, or the signal
    came before it began) with no traceback, and nothing left: no process of the session, nothing
    in its TMPDIR (``pymp-*``, ``kvscope-dask-*``, verify's folders), no ``.kvscope-tmp-*`` in
    DEST or beside the report. After SIGKILL the session is killed whole and a rerun must end
    normally with no temporary in DEST (migrate: the same outputs as a run never interrupted).

A case that runs past 10 minutes is a failure too (``Hang``: a command that never ends). A failure
prints the replay command (``--replay FAMILY:INDEX`` with the same ``--seed``) and is
written to ``--out`` (default ``bench/out/fuzz-failures/fleet/``) as ``FAMILY-sSEED-INDEX.json``:
the drawn case, the error and the traceback; keep it in ``tests/data/fuzz-regressions/fleet/`` once
fixed. The exit status is 1 when anything failed.

Usage::

    .venv/bin/python bench/fuzz_fleet.py --family trees --inputs 100 --seed 1
    .venv/bin/python bench/fuzz_fleet.py --family all --inputs 40      # 40 of each family
    .venv/bin/python bench/fuzz_fleet.py --family outputs,messages --inputs 300 --seed 2
    .venv/bin/python bench/fuzz_fleet.py --seed 1 --replay trees:17
    .venv/bin/python bench/fuzz_fleet.py --quick                        # a smoke run: one input of each family
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import stat
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fuzz_fleet_server  # noqa: E402
from fuzz_fleet_common import (  # noqa: E402  (bench/ is on sys.path when a bench script runs)
    DATA,
    FAMILIES,
    FIXTURES,
    MODEL,
    NEEDS_BUILD,
    OUT,
    case_rng,
    check,
    copy_fixtures,
    outside_names,
    run_cli,
    stray_processes,
)
from fuzz_fleet_corrupt import case_corrupt_specs  # noqa: E402
from fuzz_fleet_ctxparams import case_ctx_params  # noqa: E402
from fuzz_fleet_jobs import case_jobs_links  # noqa: E402
from fuzz_fleet_messages import case_messages  # noqa: E402
from fuzz_fleet_outputs import case_outputs  # noqa: E402
from fuzz_fleet_server import case_server  # noqa: E402
from fuzz_fleet_signals2 import case_signals_repair_lab  # noqa: E402

from kvharness.fleet_tree import Killer, tree_digest, write_slow_state  # noqa: E402
from kvharness.proc_runs import kill_session, leftovers, run_until, temporaries  # noqa: E402

# -- trees ---------------------------------------------------------------------------------------
LINKS = ("dest_dir_to_source", "dest_dir_elsewhere", "dest_file_to_source", "dest_file_elsewhere",
         "source_to_dest", "source_to_dest_sub", "source_file_elsewhere")


def _no_link_above(p: Path, top: Path) -> bool:
    q = p
    while q != top:
        if q.is_symlink():
            return False
        q = q.parent
    return True


def case_trees(rng: random.Random, work: Path) -> dict[str, Any]:
    src, dest, elsewhere = work / "source", work / "dest", work / "elsewhere"
    folders = ["a", "b", "a/deep", "c/d/e"]
    rels = copy_fixtures(rng, src, rng.randint(3, 9), folders)
    elsewhere.mkdir()
    (elsewhere / "keep.bin").write_bytes(b"not yours")
    shutil.copyfile(DATA / FIXTURES[0], elsewhere / "state.bin")
    dest.mkdir()
    links = rng.sample(LINKS, rng.randint(1, 3))
    made = []
    for kind in links:
        top = rng.choice(sorted({r.split("/")[0] for r in rels}))
        rel = rng.choice(rels)
        if kind in ("dest_dir_to_source", "dest_dir_elsewhere"):
            at = dest / top
            if not os.path.lexists(at):
                os.symlink(src / top if kind == "dest_dir_to_source" else elsewhere, at)
                made.append(f"DEST/{top} -> {'SOURCE/' + top if kind == 'dest_dir_to_source' else 'elsewhere'}")
        elif kind in ("dest_file_to_source", "dest_file_elsewhere"):
            at = dest / rel
            if not os.path.lexists(at) and _no_link_above(at.parent, dest):
                at.parent.mkdir(parents=True, exist_ok=True)
                os.symlink(src / rel if kind == "dest_file_to_source" else elsewhere / "state.bin", at)
                made.append(f"DEST/{rel} -> {'SOURCE/' + rel if kind == 'dest_file_to_source' else 'elsewhere'}")
        elif kind == "source_to_dest":
            os.symlink(dest, src / f"to-dest-{len(made)}")
            made.append("SOURCE/to-dest -> DEST")
        elif kind == "source_to_dest_sub":
            os.symlink(dest / top, src / f"to-dest-{top}-{len(made)}")
            made.append(f"SOURCE/to-dest-{top} -> DEST/{top}")
        else:
            at = src / Path(rel).parent / f"ext-{len(made)}.bin"
            os.symlink(elsewhere / "state.bin", at)
            made.append(f"SOURCE/{Path(rel).parent}/ext.bin -> elsewhere")
    layout = rng.choice(["v4", "2026-10"])
    executor = "dask" if rng.random() < 0.15 else "local"
    info: dict[str, Any] = {"files": len(rels), "links": made, "layout": layout, "executor": executor}
    before_src, before_else = tree_digest(src), tree_digest(elsewhere)
    before_out = outside_names(work, (src, dest, elsewhere))
    args = ["migrate", str(src), "--layout", layout, "--out", str(dest), "--jobs", "2", "--executor", executor]
    rc, docs, _ = run_cli(args)
    check(rc in (0, 1), f"migrate exit {rc}")
    lines = {d["rel"]: d for d in docs[:-1]}
    check(len(lines) == len(docs) - 1, "a file got two lines")
    check(set(rels) <= set(lines), f"files without a line: {sorted(set(rels) - set(lines))}")
    check(tree_digest(src) == before_src, "SOURCE changed")
    check(tree_digest(elsewhere) == before_else, "the folder outside DEST changed")
    check(outside_names(work, (src, dest, elsewhere)) == before_out, "something appeared outside DEST")
    real_dest = os.path.realpath(dest)
    for dirpath, _, filenames in os.walk(dest):
        for n in filenames:
            p = Path(dirpath) / n
            if p.is_symlink():
                continue  # the user's own links, left as they are
            check(stat.S_ISREG(p.lstat().st_mode), f"{p} is not a plain file")
            check(os.path.realpath(p).startswith(real_dest + "/"), f"{p} outside DEST")
    check(not temporaries(dest) and not temporaries(src) and not temporaries(elsewhere), "a temporary was left")
    dest_digest = {k: v for k, v in tree_digest(dest).items() if not k.startswith(".kvscope-migrate")}
    rc2, docs2, _ = run_cli(args)
    again = {d["rel"]: d for d in docs2[:-1]}
    check(set(lines) <= set(again), f"the rerun lost files: {sorted(set(lines) - set(again))[:5]}; links {made}")
    for rel in set(again) - set(lines):  # a SOURCE link that was broken until the first run made its DEST folder
        a = again[rel]
        check(rel.startswith("to-dest-") and a["action"] not in ("migrated", "copied", "already")
              and "DEST" in str(a.get("reason")), f"the rerun walked a new file: {a}; links {made}")
    for rel, r in lines.items():
        a = again[rel]
        if r["action"] in ("migrated", "copied"):
            check(a["action"] == "already", f"rerun: {rel} was {r['action']}, now {a['action']}")
        else:
            check(a["action"] == r["action"], f"rerun: {rel} was {r['action']}, now {a['action']}: {a.get('reason')}")
    check(rc2 == rc, f"rerun exit {rc2}, first {rc}")
    check({k: v for k, v in tree_digest(dest).items() if not k.startswith(".kvscope-migrate")} == dest_digest,
          "the rerun changed DEST")
    check(tree_digest(src) == before_src and tree_digest(elsewhere) == before_else, "the rerun changed SOURCE")
    rc3, sdocs, _ = run_cli(["scan", str(src), "--jobs", "2", "--target", layout])
    paths = [d["path"] for d in sdocs[:-1]]
    check(rc3 in (0, 1) and len(paths) == len(set(paths)), f"scan exit {rc3}, {len(paths)} lines")
    check(tree_digest(src) == before_src, "scan changed SOURCE")
    info["actions"] = dict(Counter(r["action"] for r in lines.values()))
    return info


# -- workers -------------------------------------------------------------------------------------
def case_workers(rng: random.Random, work: Path) -> dict[str, Any]:
    from kvscope.core.fleet.scanfile import scan_file

    root = work / "root"
    copy_fixtures(rng, root, rng.randint(3, 8), ["a", "b", "a/deep"])
    (root / "s").mkdir()
    slows = [write_slow_state(root / "s" / f"slow{i}.seqstate", cells=rng.choice([400_000, 800_000, 1_500_000]))
             for i in range(rng.randint(1, 3))]
    victim = rng.choice(slows)
    sig = rng.choice([signal.SIGKILL, signal.SIGSTOP])
    executor = "dask" if rng.random() < 0.3 else "local"
    delay = round(rng.uniform(0.0, 0.4), 3)
    info: dict[str, Any] = {"executor": executor, "signal": signal.Signals(sig).name, "delay": delay,
                            "slow": len(slows), "victim": victim.name}
    killer = Killer(victim, sig, delay=delay, timeout=90)
    killer.start()
    try:
        rc, docs, _ = run_cli(["scan", str(root), "--jobs", "2", "--executor", executor, "--file-timeout", "4"])
    finally:
        killer.stop()
        killer.join()
    info["hit"] = killer.victim is not None
    lines = {d["path"]: d for d in docs[:-1]}
    files = {str(p) for p in root.rglob("*") if p.is_file()}
    check(len(lines) == len(docs) - 1 and set(lines) == files,
          f"not one line per file: {len(docs) - 1} lines, {len(lines)} paths, {len(files)} files; without a line "
          f"{sorted(files - set(lines))[:4]}, not files {sorted(set(lines) - files)[:4]}; summary {docs[-1]}"[:1500])
    for path, r in lines.items():
        if path == str(victim) and r["status"] == "error":
            check(r["reason"].startswith(("worker died", "timed out")), f"victim's reason: {r['reason']}")
            info["victim_charged"] = r["reason"][:40]
            continue
        check(r == scan_file(path), f"{path}: {r.get('status')} {r.get('reason', '')}"[:300])
    check(rc in (0, 1), f"scan exit {rc}")
    left = stray_processes()
    check(not left, f"processes left: {left}")
    return info


# -- signals -------------------------------------------------------------------------------------
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGKILL)
COMMANDS = ("scan", "migrate", "report", "verify")
DURATION = {"scan": 4.0, "migrate": 5.0, "report": 8.0, "verify": 25.0}  # about how long each runs here


def _builds_ready() -> bool:
    try:
        from kvscope.core.engine.builds import by_name, installed

        return installed(by_name("0c1e5709")) is not None
    except Exception:
        return False


def case_signals(rng: random.Random, work: Path) -> dict[str, Any]:
    commands = [c for c in COMMANDS if c != "verify" or _builds_ready()]
    cmd = rng.choice(commands)
    sig = rng.choice(SIGNALS)
    executor = "dask" if cmd in ("scan", "migrate") and rng.random() < 0.3 else "local"
    delay = round(rng.uniform(0.05, DURATION[cmd] * (2.0 if executor == "dask" else 1.0)), 3)
    root, dest, rep = work / "root", work / "dest", work / "reports" / "r"
    rels = copy_fixtures(rng, root, rng.randint(4, 10), ["a", "b", "a/deep"])
    write_slow_state(root / "a" / "slow.seqstate", cells=600_000)
    one = root / rng.choice(rels)
    if cmd == "scan":
        args = ["scan", str(root), "--json", "--jobs", "2", "--executor", executor]
    elif cmd == "migrate":
        args = ["migrate", str(root), "--layout", "v4", "--out", str(dest), "--json", "--jobs", "2",
                "--executor", executor]
    elif cmd == "report":
        rep.parent.mkdir(parents=True)
        args = ["report", str(one), "-o", str(rep), "--model", str(MODEL)]
    else:
        seq = DATA / "llamacpp-2026-10-01" / "llama-f16-fa0-unified0-seq1.seqstate"
        args = ["verify", str(seq), "--model", str(MODEL)]
    info: dict[str, Any] = {"command": cmd, "executor": executor, "signal": signal.Signals(sig).name, "delay": delay}
    tmp = work / "tmp"
    rc, out, err, sid = run_until(args, tmp, delay=delay, sig=sig)
    name = signal.Signals(sig).name
    why = f"{cmd} {name} after {delay} s: exit {rc}: {err[-1200:]}"
    if sig == signal.SIGKILL:
        kill_session(sid)
        info["outcome"] = "killed" if rc == -sig else f"done first ({rc})"
        info["tmp_left_after_kill"] = len(list(tmp.rglob("*"))) if tmp.exists() else 0
        rc2, _, err2, sid2 = run_until(args, work / "tmp2", wait=300)
        check(rc2 in (0, 1) and "Traceback" not in err2, f"rerun after SIGKILL: exit {rc2}: {err2[-1200:]}")
        procs, names = leftovers(sid2, work / "tmp2")
        check(not procs and not names, f"rerun left {procs} {names[:10]}")
        if cmd == "migrate":
            check(not temporaries(dest), f"temporaries after the rerun: {temporaries(dest)[:5]}")
            clean = work / "clean"
            rc3, _, _, _ = run_until(["migrate", str(root), "--layout", "v4", "--out", str(clean), "--json",
                                      "--jobs", "2"], work / "tmp3", wait=300)
            check(_outputs(dest) == _outputs(clean), "the rerun's outputs differ from a clean run's")
        if cmd == "report":
            check((rep / "report.json").is_file(), "the rerun wrote no report")
        return info
    began = not (rc == -sig or (sig == signal.SIGINT and err.rstrip().endswith("KeyboardInterrupt") and not out))
    expected = 130 if sig == signal.SIGINT else 128 + sig
    if not began:
        info["outcome"] = "before the command began"
    elif rc in (0, 1):
        info["outcome"] = "done first"
    else:
        info["outcome"] = "stopped"
        check(rc == expected, f"exit {rc}, expected {expected}: {why}")
        check("Traceback" not in err and "leaked" not in err, f"traceback or leak warning: {why}")
    procs, names = leftovers(sid, tmp)
    check(not procs, f"processes of the session left: {procs}: {why}")
    check(not names, f"left in TMPDIR: {names[:10]}: {why}")
    check(not temporaries(dest), f"temporaries in DEST: {temporaries(dest)[:5]}")
    if rep.parent.exists():
        check(not temporaries(rep.parent), f"temporaries beside the report: {temporaries(rep.parent)}")
    return info


def _outputs(dest: Path) -> dict[str, bytes]:
    return {p.relative_to(dest).as_posix(): p.read_bytes() for p in dest.rglob("*")
            if p.is_file() and not p.name.startswith(".kvscope-migrate")}


CASES: dict[str, Callable[[random.Random, Path], dict[str, Any]]] = {
    "server": case_server, "trees": case_trees, "workers": case_workers, "signals": case_signals,
    "outputs": case_outputs, "ctx_params": case_ctx_params, "corrupt_specs": case_corrupt_specs,
    "jobs_links": case_jobs_links, "messages": case_messages, "signals_repair_lab": case_signals_repair_lab}


# -- driver --------------------------------------------------------------------------------------
class Hang(BaseException):
    """A case ran past HANG_S (the run goes on with the next one). A BaseException: the command's own
    ``except Exception`` (its internal-error line) must not turn it into an exit status."""


HANG_S = 600  # a case that takes longer is a finding (a scan that never ends), not a reason to stop the run


def _on_alarm(signum: int, frame: Any) -> None:
    raise Hang(f"no end after {HANG_S} s")


def run_case(seed: int, family: str, index: int) -> dict[str, Any]:
    rng = case_rng(seed, family, index)
    work = Path(tempfile.mkdtemp(prefix=f"kvscope-fuzz-{family}-"))
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(HANG_S)
    try:
        return CASES[family](rng, work)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        shutil.rmtree(work, ignore_errors=True)


def save_failure(out: Path, seed: int, family: str, index: int, exc: BaseException) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{family}-s{seed}-{index}.json"
    path.write_text(json.dumps({"family": family, "seed": seed, "index": index,
                                "replay": f"bench/fuzz_fleet.py --seed {seed} --replay {family}:{index}",
                                "error": f"{type(exc).__name__}: {exc}",
                                "traceback": traceback.format_exception(exc)}, indent=1))
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--family", default="all", help=f"one of {', '.join(FAMILIES)}, a comma list, or all")
    ap.add_argument("--inputs", type=int, default=50, help="inputs per family (default 50)")
    ap.add_argument("--seed", type=int, default=0, help="run seed: input i of a family is a function of (seed, i)")
    ap.add_argument("--start", type=int, default=0, help="first index")
    ap.add_argument("--out", type=Path, default=OUT, help="where failing cases go")
    ap.add_argument("--replay", metavar="FAMILY:INDEX", help="run one case again, with its traceback")
    ap.add_argument("--quick", action="store_true", help="a smoke run: one input of each family asked for")
    args = ap.parse_args(argv)
    if args.quick:
        args.inputs = 1
    warnings_off()
    try:
        if args.replay:
            family, _, index = args.replay.partition(":")
            print(json.dumps(run_case(args.seed, family, int(index)), default=str))
            print("ok")
            return 0
        families = FAMILIES if args.family == "all" else tuple(args.family.split(","))
        unknown = set(families) - set(FAMILIES)
        if unknown:
            ap.error(f"unknown family {sorted(unknown)}")
        total_fail = 0
        for family in families:
            if family in NEEDS_BUILD and not _builds_ready():
                print(f"{family}: skipped: the pinned build 0c1e5709 is not installed (kvscope llama-build)")
                continue
            stats: Counter[str] = Counter()
            fails: list[str] = []
            t0 = time.monotonic()
            for index in range(args.start, args.start + args.inputs):
                try:
                    info = run_case(args.seed, family, index)
                    if "actions" in info:  # trees: the migrations' actions, and the link kinds drawn
                        stats.update({f"action {k}": v for k, v in info["actions"].items()})
                        stats.update(f"link {x.split(' -> ')[0].split('/')[0]} -> {x.split(' -> ')[1].split('/')[0]}"
                                     for x in info["links"])
                    else:
                        hit = {True: "signalled", False: "missed (the file was done first)"}.get(info.get("hit"))
                        if "hits" in info:  # server: did any drawn fault meet its request
                            hit = f"{len(info['hits'])} fault(s) served" if info["hits"] else "no fault reached"
                        stats[" ".join(str(info.get(k)) for k in ("command", "executor", "signal", "outcome",
                                                                   "victim_charged") if k in info)
                              + (f" {hit}" if hit else "") or "ok"] += 1
                except (Exception, Hang) as e:  # anything at all is a finding
                    path = save_failure(args.out, args.seed, family, index, e)
                    fails.append(f"{index}: {type(e).__name__}: {str(e)[:200]} ({path.name})")
                    print(f"  FAIL {family}:{index}: {type(e).__name__}: {str(e)[:300]}\n"
                          f"    replay: bench/fuzz_fleet.py --seed {args.seed} --replay {family}:{index}", flush=True)
                done = index - args.start + 1
                if done % 10 == 0:
                    print(f"  {family}: {done}/{args.inputs}, {len(fails)} failures, "
                          f"{time.monotonic() - t0:.0f} s", flush=True)
            dt = time.monotonic() - t0
            print(f"{family}: {args.inputs} inputs in {dt:.0f} s ({dt / max(args.inputs, 1):.1f} s each), "
                  f"{len(fails)} failures, seed {args.seed}")
            for k, n in stats.most_common(40):
                print(f"    {n:>5}  {k}")
            for f in fails:
                print(f"    FAIL {f}")
            total_fail += len(fails)
        print(f"SUMMARY: {total_fail} failures")
        return 1 if total_fail else 0
    finally:
        fuzz_fleet_server.close()


def warnings_off() -> None:
    import warnings

    warnings.filterwarnings("ignore", category=RuntimeWarning)


if __name__ == "__main__":
    sys.exit(main())
