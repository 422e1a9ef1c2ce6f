"""Fleet scan benchmark: 100,000 small state files, the local executor against ``--executor dask``, in one run.

Builds a slot store of ``--files`` files in ``bench/out/`` (``--dir``) by copying the small real
llama.cpp fixtures of ``tests/data`` (every state file under 6 KiB, all five generations) into
folders of 1,000, then runs ``kvscope scan SOURCE --json --jobs N`` in a child process for each
executor, stdout to /dev/null, and reports wall time, files per second and the client's peak RSS
(VmHWM of the ``kvscope`` process itself: for ``--executor dask`` that process also holds the
scheduler of the LocalCluster it starts; the worker processes are not counted), each as a ratio
to the local executor. With ``--baseline CHECKOUT`` (a checkout of kvscope from before the fleet
executors, e.g. ``git worktree add /tmp/wt-fleet 944bf8a``) the old ``kvscope scan`` is measured
the same way in the same run, and the local executor must stay at or above its rate.

It also measures the per-file cost of the pure function (``scan_file`` in this process, on a
sample) and the CPU seconds of every process of each run (sampled with psutil), which tells
the executors' cost per file beyond the function apart from the load of a shared machine; the
scale-out expectation in the README is computed from those. The tree is deleted at the end
unless ``--keep``. ``--quick`` runs 200 files (a smoke test; its numbers mean little). The
exit status is 0 unless ``--strict`` is given and the local executor is slower than a baseline.

Usage::

    .venv/bin/python bench/bench_fleet.py --baseline /tmp/wt-fleet
    .venv/bin/python bench/bench_fleet.py --quick
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
PER_FOLDER = 1000
SAMPLE = 0.1  # seconds between CPU-time samples of a child's process tree
BEFORE = "scan before the fleet executors (--baseline checkout)"
OLD_LOOP = "the old scan loop, today's scan_file"
SMALL = 6000

# the end of every child: its last stderr line is {"rc", "wall_s", "hwm_kib"} of its own process
_REPORT = """
import resource
sys.stdout.flush()
hwm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux: VmHWM
print(json.dumps({"rc": rc, "wall_s": time.perf_counter() - t0, "hwm_kib": hwm}), file=sys.stderr)
"""

# kvscope's main() in a child
_CHILD = """
import json, sys, time
t0 = time.perf_counter()
from kvscope.core.cli.main import main
rc = main(sys.argv[1:])
""" + _REPORT


# The scan loop of kvscope before the fleet executors (one ProcessPoolExecutor future per file, every
# result kept for the summary), around today's per-file function: the executor alone, compared.
_OLD_LOOP = """
import json, os, sys, time
from concurrent.futures import ProcessPoolExecutor
t0 = time.perf_counter()
from kvscope.core.fleet.tree_scan import scan_file, summarise
root, jobs = sys.argv[1], int(sys.argv[2])
files = []
for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
    files += [os.path.join(dirpath, n) for n in sorted(filenames)]
results = []
with ProcessPoolExecutor(max_workers=jobs) as pool:
    for fut in [pool.submit(scan_file, p) for p in files]:
        results.append(fut.result())
        sys.stdout.write(json.dumps(results[-1]) + "\\n")
sys.stdout.write(json.dumps({"summary": summarise(results)}) + "\\n")
rc = 0
""" + _REPORT


def small_fixtures() -> list[Path]:
    out = []
    for p in sorted(DATA.glob("llamacpp-*/*")):
        if p.is_file() and p.stat().st_size < SMALL and p.suffix not in (".json", ".gguf"):
            out.append(p)
    return out


def build(root: Path, n: int) -> list[Path]:
    """``n`` copies of the small fixtures in folders of :data:`PER_FOLDER`; the fixtures used."""
    src = small_fixtures()
    for i in range(n):
        folder = root / f"host{i // PER_FOLDER:03d}"
        if i % PER_FOLDER == 0:
            folder.mkdir(parents=True, exist_ok=True)
        s = src[i % len(src)]
        shutil.copyfile(s, folder / f"{i:06d}-{s.name}")
    return src


def run_child(args: list[str], env: dict[str, str] | None = None, cwd: Path = ROOT, code: str = _CHILD
              ) -> dict[str, Any]:
    """Run a child; its report plus ``cpu_s``: CPU seconds of it and every process under it (sampled)."""
    import psutil

    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    cpu: dict[int, float] = {}
    assert proc.stderr is not None
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read() if proc.stderr else ""), daemon=True)
    reader.start()
    try:
        top = psutil.Process(proc.pid)
        while proc.poll() is None:
            try:
                procs = [top, *top.children(recursive=True)]
            except psutil.NoSuchProcess:
                break
            for q in procs:
                try:
                    t = q.cpu_times()
                    cpu[q.pid] = max(cpu.get(q.pid, 0.0), t.user + t.system)
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
            time.sleep(SAMPLE)
    finally:
        proc.wait()
        reader.join()
    text = "".join(err).strip()
    last = text.splitlines()[-1] if text else "{}"
    try:
        out: dict[str, Any] = json.loads(last)
    except ValueError:
        raise SystemExit(f"child failed ({proc.returncode}): {text[-2000:]}") from None
    out["cpu_s"] = sum(cpu.values())
    return out


def baseline_env(checkout: Path, shim: Path) -> dict[str, str]:
    """Environment that imports ``kvscope.core`` from ``checkout`` (a package dir shim first on the path)."""
    (shim / "kvscope").mkdir(parents=True, exist_ok=True)
    link = shim / "kvscope" / "core"
    if not link.exists():
        link.symlink_to(checkout / "core")
    env = dict(os.environ)
    env["PYTHONPATH"] = str(shim)
    return env


def per_file_cost(files: list[Path], repeat: int = 3) -> float:
    """CPU seconds per file of the pure per-file function in this process (best of ``repeat``)."""
    from kvscope.core.fleet.scanfile import scan_file

    for f in files[:20]:
        scan_file(str(f))
    best = float("inf")
    for _ in range(repeat):
        t = time.process_time()
        for f in files:
            scan_file(str(f))
        best = min(best, (time.process_time() - t) / len(files))
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--jobs", type=int, default=2, help="worker processes of each executor (default 2)")
    ap.add_argument("--batch", type=int, default=None, help="files per dask task (default: the executor's)")
    ap.add_argument("--baseline", type=Path, help="a checkout of kvscope before the fleet executors, to measure too")
    ap.add_argument("--dir", type=Path, default=ROOT / "bench" / "out", help="where the tree is built")
    ap.add_argument("--keep", action="store_true", help="keep the tree")
    ap.add_argument("--quick", action="store_true", help="200 files: a smoke run (its numbers mean little)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each executor, interleaved; the fastest counts")
    ap.add_argument("--strict", action="store_true", help="exit 1 when the local executor is slower than the baseline")
    args = ap.parse_args(argv)
    n = 200 if args.quick else args.files
    args.dir.mkdir(parents=True, exist_ok=True)
    tree = Path(tempfile.mkdtemp(prefix="fleet-", dir=args.dir))
    best: dict[str, dict[str, Any]] = {}
    shim = Path(tempfile.mkdtemp(prefix="fleet-shim-", dir=args.dir))
    try:
        t = time.perf_counter()
        build(tree, n)
        print(f"tree: {n:,} files in {tree} ({time.perf_counter() - t:.1f} s to copy)", flush=True)
        sample = sorted(tree.glob("host000/*"))[:1000]
        cost = per_file_cost(sample)
        print(f"per-file cost of scan_file, one process: {cost * 1e3:.2f} ms of CPU ({1 / cost:,.0f} files/s "
              "per core)", flush=True)
        common = ["scan", str(tree), "--json", "--jobs", str(args.jobs)]
        dask_args = common + ["--executor", "dask"] + (["--batch", str(args.batch)] if args.batch else [])
        plan: list[tuple[str, list[str], dict[str, str] | None, str]] = []
        if args.baseline is not None:
            plan.append((BEFORE, common, baseline_env(args.baseline.resolve(), shim), _CHILD))
        plan += [(OLD_LOOP, [str(tree), str(args.jobs)], None, _OLD_LOOP), ("local", common, None, _CHILD),
                 ("dask (LocalCluster)", dask_args, None, _CHILD)]
        for rep in range(args.repeat):  # interleaved, so a busy spell of the machine hits every executor
            for name, cmd, env, code in plan:
                r = run_child(cmd, env, code=code)
                print(f"  {name} #{rep + 1}: {r['wall_s']:.1f} s", flush=True)
                if name not in best or r["wall_s"] < best[name]["wall_s"]:
                    best[name] = r
    finally:
        if not args.keep:
            shutil.rmtree(tree, ignore_errors=True)
        shutil.rmtree(shim, ignore_errors=True)

    local = best["local"]
    rate_local = n / local["wall_s"]
    print()
    print(f"| executor ({args.jobs} workers, {n:,} files, best of {args.repeat}) | wall s | files/s | rate / local "
          "| CPU ms/file, all processes | files per CPU-s / local | client RSS MiB | RSS / local |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in best.items():
        rate = n / r["wall_s"]
        print(f"| {name} | {r['wall_s']:.1f} | {rate:,.0f} | {rate / rate_local:.2f} | {r['cpu_s'] / n * 1e3:.2f} "
              f"| {local['cpu_s'] / r['cpu_s']:.2f} | {r['hwm_kib'] / 1024:.0f} "
              f"| {r['hwm_kib'] / local['hwm_kib']:.2f} |")
    ok = True
    for name in (BEFORE, OLD_LOOP):
        if name in best:
            other = best[name]
            ratio = rate_local / (n / other["wall_s"])
            eff = other["cpu_s"] / local["cpu_s"]
            good = ratio >= 1.0 or eff >= 1.0
            ok = ok and good
            print(f"\nlocal executor / {name}: {ratio:.2f}x the rate, {eff:.2f}x the files per CPU-second, "
                  f"{local['hwm_kib'] / other['hwm_kib']:.2f}x the client RSS ({'PASS' if good else 'MISS'}: "
                  "goal >= 1.00x; the CPU figure decides on a machine shared with other jobs)")
    overhead = local["cpu_s"] / n - cost
    print(f"\nper file beyond the function: local {overhead * 1e3:.2f} ms, dask "
          f"{(best['dask (LocalCluster)']['cpu_s'] / n - cost) * 1e3:.2f} ms of CPU (client, scheduler, workers)")
    print(f"scale-out: {1 / cost:,.0f} files/s per worker core at {cost * 1e3:.2f} ms/file")
    return 1 if args.strict and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
