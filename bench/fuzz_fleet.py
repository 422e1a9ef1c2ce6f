"""Long fuzz of what happens around the reader: hostile servers, links, dying workers, signals.

The reader's long fuzz (``bench/fuzz_long.py``) feeds bytes to a parser in-process; the families
here drive whole commands and real processes, so an input costs seconds, not microseconds.
Four families, each input a pure function of ``(--seed, family, index)``:

``server``
    ``kvscope verify --engine server`` of a real llama-server slot through the misbehaving proxy of
    ``tests/support/fake_server.py`` before a real llama-server (0c1e5709, the tiny llama): one to
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
    .venv/bin/python bench/fuzz_fleet.py --seed 1 --replay trees:17
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import resource
import shutil
import signal
import stat
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvscope.core.cli.main import main as kvscope_main  # noqa: E402
from tests.support.fixtures import DATA  # noqa: E402
from tests.support.fleet_tree import TREE_FILES, Killer, tree_digest, write_slow_state  # noqa: E402
from tests.support.proc_runs import kill_session, leftovers, run_until, temporaries  # noqa: E402

OUT = ROOT / "bench" / "out" / "fuzz-failures" / "fleet"
FAMILIES = ("server", "trees", "workers", "signals")
FIXTURES = [src for src, _ in TREE_FILES if not src.endswith(".gguf")]
MODEL = DATA / "llamacpp-2026-10-01" / "tiny-llama.gguf"
HOSTILE = ("\x1b[31mred\x1b[0m", "a\u202eb\u2066c", "<script>alert(1)</script>", "&amp;\r\nx", "\x00\x07\x7f\x9b",
           "line\nbreak", "\ud7ff\ufffd", "%s%n{0}")


class CheckFailed(Exception):
    """An invariant of the family did not hold."""


def check(cond: bool, what: str) -> None:
    if not cond:
        raise CheckFailed(what)


def case_rng(seed: int, family: str, index: int) -> random.Random:
    return random.Random(f"fuzz_fleet-{seed}-{family}-{index}")


@contextlib.contextmanager
def captured() -> Iterator[tuple[io.StringIO, io.StringIO]]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        yield out, err


def run_cli(args: list[str]) -> tuple[int, list[dict[str, Any]], str]:
    """``kvscope ARGS --json`` in this process: (status, JSON documents, stderr)."""
    with captured() as (out, err):
        rc = kvscope_main([*args, "--json"])
    text = err.getvalue()
    check("Traceback" not in text, f"traceback on stderr: {text[-1500:]}")
    docs = [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]
    return rc, docs, text


def stray_processes() -> list[str]:
    """Descendants of this process other than multiprocessing's fork server and resource tracker
    (and llama-servers the family started itself), given a few seconds to go."""
    import multiprocessing.forkserver as fs

    import psutil

    end = time.monotonic() + 15
    while True:
        left = []
        server = getattr(fs._forkserver, "_forkserver_pid", None)  # the server, not the workers it forked
        for c in psutil.Process().children(recursive=True):
            try:
                cmd = " ".join(c.cmdline())
                if c.status() == psutil.STATUS_ZOMBIE or c.pid == server or "resource_tracker" in cmd \
                        or c.pid in KEEP:
                    continue
                left.append(f"{c.pid} {c.status()} {cmd[:80]}")
            except psutil.Error:
                continue
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.2)


KEEP: set[int] = set()  # pids the run keeps on purpose (the server family's llama-server and its janitor)


def copy_fixtures(rng: random.Random, root: Path, n: int, folders: list[str]) -> list[str]:
    rels = []
    for i in range(n):
        rel = f"{rng.choice(folders)}/f{i}-{rng.randrange(1000)}.bin"
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(DATA / rng.choice(FIXTURES), root / rel)
        rels.append(rel)
    return rels


def outside_names(work: Path, inside: tuple[Path, ...]) -> set[str]:
    """Everything under ``work`` but the folders ``inside`` (not following links)."""
    names = set()
    for dirpath, dirnames, filenames in os.walk(work):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if here / d not in inside]
        names |= {str((here / n).relative_to(work)) for n in dirnames + filenames}
    return names


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


# -- server --------------------------------------------------------------------------------------
ENDPOINTS = ("health", "props", "restore", "erase", "save", "prefill", "next")
KINDS = ("status", "message", "silent", "close", "invalid", "json", "trickle_head", "trickle_body", "huge", "after")
SLOT_CHANGES = ("remove", "directory", "fifo", "link_zero", "link_passwd", "link_elsewhere", "sparse", "cut", "flip")
VERIFY_TIMEOUT_S = 3.0
BOUND_S = 90.0


def _random_json(rng: random.Random, depth: int = 0) -> Any:
    pick = rng.randrange(9 if depth < 3 else 6)
    if pick == 0:
        return None
    if pick == 1:
        return rng.choice([True, False])
    if pick == 2:
        return rng.choice([0, -1, 2**31, 2**63, -(2**64), 7])
    if pick == 3:
        return rng.choice([0.5, 1e308, -0.0])
    if pick in (4, 5):
        return rng.choice(HOSTILE + ("", "ok", "7"))
    if pick in (6, 7):
        keys = ["completion_probabilities", "top_logprobs", "id", "logprob", "tokens", "n_saved", "n_restored",
                "total_slots", "default_generation_settings", "n_ctx", "build_info", "status", "error", "content"]
        return {rng.choice(keys): _random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))}
    return [_random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))]


def _slot_change(kind: str, arg: int, elsewhere: str) -> Callable[[str, str | None], None]:
    def change(slot_dir: str, name: str | None) -> None:
        if not name:
            return
        p = os.path.join(slot_dir, name)
        if not os.path.lexists(p):
            return
        if kind in ("cut", "flip", "sparse"):
            with open(p, "r+b") as fh:
                size = os.fstat(fh.fileno()).st_size
                if kind == "cut":
                    fh.truncate(arg % max(size, 1))
                elif kind == "sparse":
                    fh.truncate(size + (arg << 30))
                else:
                    fh.seek(arg % max(size, 1))
                    b = fh.read(1)
                    fh.seek(arg % max(size, 1))
                    fh.write(bytes([(b[0] if b else 0) ^ 0xFF]))
            return
        os.unlink(p)
        if kind == "directory":
            os.mkdir(p)
        elif kind == "fifo":
            os.mkfifo(p)
        elif kind != "remove":
            os.symlink({"link_zero": "/dev/zero", "link_passwd": "/etc/passwd", "link_elsewhere": elsewhere}[kind], p)
    return change


def draw_faults(rng: random.Random) -> list[tuple[str, str, Any, int, str]]:
    """(endpoint, kind, arg, nth, description) for one to three faults."""
    out = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        ep, kind, nth = rng.choice(ENDPOINTS), rng.choice(KINDS), rng.choice([1, 1, 1, 2])
        arg: Any = None
        desc = ""
        if kind == "status":
            arg = rng.choice([400, 401, 404, 500, 501, 503])
        elif kind == "message":
            arg = "".join(rng.choice(HOSTILE) for _ in range(rng.randint(1, 4)))
        elif kind == "json":
            arg = _random_json(rng)
        elif kind == "huge":
            arg = rng.choice([2 << 20, 64 << 20, 1536 << 20])
        elif kind == "after":
            ep = rng.choice(["save", "restore"])
            change = rng.choice(SLOT_CHANGES)
            n = rng.randrange(1 << 20) if change != "sparse" else rng.randint(1, 50)
            desc = f"{change}({n})"
            arg = (change, n)
        out.append((ep, kind, arg, nth, desc or repr(arg)[:60]))
    return out


class ServerBench:
    """One real llama-server and its slot for the family (started on first use)."""

    def __init__(self) -> None:
        self.srv: Any = None
        self.slot: Path | None = None
        self.elsewhere = tempfile.mkdtemp(prefix="kvscope-fuzz-elsewhere-")
        Path(self.elsewhere, "secret.bin").write_bytes(b"x" * 4096)

    def start(self) -> None:
        if self.srv is not None:
            return
        import psutil

        from kvscope.core.engine.server import ServerProcess
        from tests.support.fixtures import model_path
        from tests.support.states import PROMPT

        self.srv = ServerProcess(model_path("llama"), build="0c1e5709", n_ctx=512)
        self.srv.__enter__()
        KEEP.update(c.pid for c in psutil.Process().children(recursive=True))
        c = self.srv.client()
        c.complete(PROMPT, n_predict=0)
        c.slot_save(0, "fuzz-slot.bin")
        self.slot = Path(tempfile.mkdtemp(prefix="kvscope-fuzz-slot-")) / "slot0.bin"
        shutil.copyfile(Path(self.srv.slot_dir) / "fuzz-slot.bin", self.slot)

    def close(self) -> None:
        if self.srv is not None:
            self.srv.__exit__(None, None, None)
            shutil.rmtree(self.slot.parent if self.slot else "", ignore_errors=True)
        shutil.rmtree(self.elsewhere, ignore_errors=True)


BENCH: ServerBench | None = None


def case_server(rng: random.Random, work: Path) -> dict[str, Any]:
    from kvscope.core.verify.result import VERDICTS
    from kvscope.core.verify.run import Verifier, VerifyError
    from tests.support.fake_server import FakeServer
    from tests.support.fixtures import model_path

    global BENCH
    if BENCH is None:
        BENCH = ServerBench()
    BENCH.start()
    assert BENCH.slot is not None
    faults = draw_faults(rng)
    info: dict[str, Any] = {"faults": [f"{ep}#{nth} {kind} {desc}" for ep, kind, _, nth, desc in faults]}
    with FakeServer(BENCH.srv.url, BENCH.srv.slot_dir) as fake:
        for ep, kind, arg, nth, _ in faults:
            if kind == "after":
                arg = _slot_change(arg[0], arg[1], os.path.join(BENCH.elsewhere, "secret.bin"))
            fake.fault(ep, kind, arg, nth=nth)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.monotonic()
        try:
            r = Verifier(BENCH.slot, model_path("llama"), engine="server", server_url=fake.url,
                         slot_dir=fake.slot_dir, timeout_s=VERIFY_TIMEOUT_S).run()
            check(r.verdict in VERDICTS, f"verdict {r.verdict!r}")
            info["outcome"] = r.verdict
        except VerifyError as e:
            msg = str(e)
            check(bool(msg) and "\n" not in msg and msg.isprintable(), f"not one printable line: {msg[:300]!r}")
            info["outcome"] = "error: " + msg[:50]
        dt = time.monotonic() - t0
        info["seconds"] = round(dt, 1)
        info["hits"] = list(fake.hits)
        check(dt < BOUND_S, f"took {dt:.1f} s")
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak
        check(grown < 512 * 1024, f"RSS grew {grown} KiB")
        left = [n for n in os.listdir(fake.slot_dir) if n.startswith("kvscope-verify-")]
        check(not left, f"left in the slot folder: {left}")
        check(Path(BENCH.elsewhere, "secret.bin").read_bytes() == b"x" * 4096, "the file a link led to changed")
    for n in os.listdir(BENCH.srv.slot_dir):  # what a change made of the server's own save, for the next case
        p = os.path.join(BENCH.srv.slot_dir, n)
        if n != "fuzz-slot.bin":
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(p)
    return info


CASES: dict[str, Callable[[random.Random, Path], dict[str, Any]]] = {
    "server": case_server, "trees": case_trees, "workers": case_workers, "signals": case_signals}


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
    args = ap.parse_args(argv)
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
            if family == "server" and not _builds_ready():
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
        if BENCH is not None:
            BENCH.close()


def warnings_off() -> None:
    import warnings

    warnings.filterwarnings("ignore", category=RuntimeWarning)


if __name__ == "__main__":
    sys.exit(main())
