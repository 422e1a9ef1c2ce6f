"""Reader benchmark on a ~2 GiB synthetic sequence-state file, against a plain read of it.

Writes a current-layout ("2026-10", version 3) ``llama_state_seq_save_file`` file: 'ggsq',
version 3, the tokens, one KV stream of ``--cells`` cells (pos i, one sequence id 0), then F16 K
and V records for ``--n-layer`` layers with a row size chosen so the file is about
``--size-gib`` (V plain, or transposed with ``--v-trans``). The payload is random F16 bit
patterns without Inf/NaN, generated and written in 8 MiB chunks (never the whole file in RAM).

Then it measures, each against a baseline taken in the same run:

* sequential read of the whole file in 8 MiB chunks into one reusable buffer (the baseline),
  cold (the file dropped from the page cache with ``posix_fadvise(DONTNEED)``) and warm;
* index time: ``read_state(path)``, goal at most 5 % of one read;
* ``inspect --json`` beyond the index: the analysis (:func:`~kvscope.core.analysis.inspection.inspect_file`
  with the compatibility table, the llama-server reuse prediction, the per-consumer answers), goal at
  most 5 % of one read, and the whole JSON text as the CLI writes it (no goal: it lists every cell),
  each also as a multiple of the index alone;
* cell table: ``scan_cells`` on an in-memory table of 262,144 records, goal at most 50 ms;
* ``--stats`` throughput: ``scan_stats(res)`` bytes/s against the read's bytes/s, goal at least 50 %;
* peak RSS of a process that imports kvscope and indexes the file, goal at most 150 MiB;
* peak RSS and time of ``kvscope inspect --json`` on a real sequence file extended with a hole
  to 1 GB and to 50 GB (a sparse giant tail: a few KB on disk), goal at most 150 MiB whatever the
  tail's size (the trailing-bytes check looks at a bounded number of records);
* start-up: wall time of ``kvscope inspect --json`` on a small fixture beside ``python -c pass``,
  goal at most 0.5 s, and whether torch / PySide6 / pyqtgraph got imported (they must not).

The result is one table (measurement, value, baseline, ratio, goal, PASS/MISS). ``--quick`` runs
everything on a 16 MiB file in a few seconds (a smoke test; its goals mean nothing). The exit
status is 0 unless ``--strict`` is given and a goal is missed. ``--profile index|stats`` prints
the top of a cProfile of that step.

Usage::

    .venv/bin/python bench/bench_reader.py                 # 2 GiB in a temp dir, deleted afterwards
    .venv/bin/python bench/bench_reader.py --v-trans --dir /mnt/scratch --keep
    .venv/bin/python bench/bench_reader.py --quick
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kvscope.core.analysis.inspection import inspect_file
from kvscope.core.analysis.stats import scan_stats
from kvscope.core.jsonout import write_json
from kvscope.core.reader.cells import scan_cells
from kvscope.core.reader.parse import read_state
from kvscope.core.reader.source import ByteSource

ROOT = Path(__file__).resolve().parent.parent
from kvharness.page_cache import drop_cache  # noqa: E402  (bench_rotation uses it as br.drop_cache)

SMALL_FIXTURE = ROOT / "tests" / "data" / "llamacpp-2026-10-01" / "llama-f16-fa0-unified0-seq0.seqstate"
SEQ_MAGIC = 0x67677371
SEQ_VERSION = 3
GGML_TYPE_F16 = 1
CHUNK = 8 << 20
TABLE_CELLS = 262_144
FORBIDDEN = ("torch", "PySide6", "pyqtgraph")
MIB = 1 << 20


# -- the synthetic file ----------------------------------------------------------------------


@dataclass
class Layout:
    cells: int
    n_layer: int
    n_embd: int  # n_embd_k_gqa = n_embd_v_gqa
    v_trans: bool

    @property
    def row_bytes(self) -> int:
        return 2 * self.n_embd

    @property
    def header_bytes(self) -> int:
        tokens = 12 + 4 * self.cells
        meta = 4 + 4 + 12 * self.cells + 8
        return tokens + meta

    @property
    def size(self) -> int:
        per_record = 12 + self.cells * self.row_bytes
        return self.header_bytes + 2 * self.n_layer * per_record


def choose_layout(size: int, cells: int, n_layer: int, v_trans: bool) -> Layout:
    """The row size (a multiple of 32 F16 values) that brings the file closest to ``size``."""
    per_value = 2 * n_layer * cells * 2  # K and V, F16
    n_embd = max(32, round(size / per_value / 32) * 32)
    return Layout(cells, n_layer, n_embd, v_trans)


def write_state(path: Path, lay: Layout, seed: int) -> None:
    """Write the file in chunks; payload = random F16 without Inf/NaN (bit 14 cleared: |x| < 2)."""
    rng = np.random.default_rng(seed)
    n = lay.cells
    with open(path, "wb", buffering=0) as fh:
        head = struct.pack("<III", SEQ_MAGIC, SEQ_VERSION, n)
        fh.write(head + (np.arange(n, dtype=np.int32) % 32000).tobytes())
        cells = np.zeros((n, 3), dtype=np.int32)
        cells[:, 0] = np.arange(n)
        cells[:, 1] = 1
        fh.write(struct.pack("<II", 1, n) + cells.tobytes())
        fh.write(struct.pack("<II", int(lay.v_trans), lay.n_layer))
        buf = np.empty(CHUNK // 2, dtype=np.uint16)

        def payload(nbytes: int) -> None:
            left = nbytes
            while left:
                m = min(left, CHUNK) // 2
                part = buf[:m]
                np.bitwise_and(np.frombuffer(rng.bytes(2 * m), np.uint16), np.uint16(0xBFFF), out=part)
                fh.write(part.data)
                left -= 2 * m

        for _ in range(lay.n_layer):  # K
            fh.write(struct.pack("<iQ", GGML_TYPE_F16, lay.row_bytes))
            payload(n * lay.row_bytes)
        for _ in range(lay.n_layer):  # V
            if lay.v_trans:
                fh.write(struct.pack("<iII", GGML_TYPE_F16, 2, lay.n_embd))
            else:
                fh.write(struct.pack("<iQ", GGML_TYPE_F16, lay.row_bytes))
            payload(n * lay.row_bytes)
        os.fsync(fh.fileno())


# -- measuring -----------------------------------------------------------------------------


def read_file(path: Path) -> float:
    """Seconds to read ``path`` sequentially in 8 MiB chunks into one reusable buffer."""
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as fh:
        while fh.readinto(view):
            pass
    return time.perf_counter() - t0


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def best(fn: Callable[[], Any], repeat: int) -> float:
    return min(timed(fn)[0] for _ in range(repeat))


def cell_table(n: int) -> ByteSource:
    t = np.zeros((n, 3), dtype=np.int32)
    t[:, 0] = np.arange(n)
    t[:, 1] = 1
    return ByteSource(t.tobytes(), "<cells>")


def python_wall(args: list[str], repeat: int, env: dict[str, str] | None = None) -> float:
    """Median wall time of a subprocess (output discarded)."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=False)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# Peak RSS of a fresh process, in KiB. ru_maxrss is not used as the value: Linux carries the
# parent's high-water mark over fork+exec into the child's ru_maxrss (so a parent that has
# touched the 2 GiB file would be measured); VmHWM in /proc/self/status belongs to this process.
_RSS_CHILD = """
import json, resource, sys
from kvscope.core.reader.parse import read_state

def hwm():
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

if sys.argv[1] != "-":
    res = read_state(sys.argv[1])
    assert res.kind == "seq_file", res.kind
print(json.dumps({"peak": hwm(), "ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""

# kvscope inspect --json in this process, output discarded: {"rc", "peak" (VmHWM KiB), "seconds"}.
_SPARSE_CHILD = """
import contextlib, io, json, os, sys, time
from kvscope.core.cli.main import main
t0 = time.perf_counter()
with open(os.devnull, "w") as out, contextlib.redirect_stdout(out):
    rc = main(["inspect", "--json", sys.argv[1]])
dt = time.perf_counter() - t0
with open("/proc/self/status") as fh:
    peak = next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:"))
print(json.dumps({"rc": rc, "peak": peak, "seconds": dt}))
"""

_MODULES_CHILD = """
import contextlib, io, json, sys
from kvscope.core.cli.main import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    rc = main(["inspect", "--json", sys.argv[1]])
bad = sorted(m for m in sys.modules if m.split(".")[0] in {forbidden!r})
print(json.dumps({{"rc": rc, "forbidden": bad, "json_ok": out.getvalue().lstrip().startswith("{{")}}))
"""


def child_json(code: str, *args: str) -> dict[str, Any]:
    p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise RuntimeError(f"child failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def kvscope_command() -> list[str]:
    script = Path(sys.executable).parent / "kvscope"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "kvscope.core.cli.main"]


def profile_top(fn: Callable[[], Any], n: int = 25) -> str:
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(n)
    return s.getvalue()


# -- the table -----------------------------------------------------------------------------


@dataclass
class Row:
    name: str
    value: str
    baseline: str
    ratio: str
    goal: str
    ok: bool | None  # None: no goal (information)


def fmt_s(t: float) -> str:
    return f"{t * 1e3:.1f} ms" if t < 1 else f"{t:.2f} s"


def fmt_rate(nbytes: int, t: float) -> str:
    return f"{nbytes / t / MIB:,.0f} MiB/s" if t > 0 else "inf"


def print_table(rows: list[Row]) -> None:
    head = ("measurement", "value", "baseline", "ratio", "goal", "result")
    cells = [(r.name, r.value, r.baseline, r.ratio, r.goal, "-" if r.ok is None else "PASS" if r.ok else "MISS")
             for r in rows]
    w = [max(len(head[i]), *(len(c[i]) for c in cells)) for i in range(len(head))]
    line = "+" + "+".join("-" * (x + 2) for x in w) + "+"
    print(line)
    print("| " + " | ".join(h.ljust(w[i]) for i, h in enumerate(head)) + " |")
    print(line)
    for c in cells:
        print("| " + " | ".join(v.ljust(w[i]) if i == 0 else v.rjust(w[i]) for i, v in enumerate(c)) + " |")
    print(line)


# -- main ----------------------------------------------------------------------------------


def run(args: argparse.Namespace, path: Path) -> list[Row]:
    lay = choose_layout(int(args.size_gib * (1 << 30)), args.cells, args.n_layer, args.v_trans)
    print(f"writing {path} ({lay.size / MIB:,.1f} MiB): {lay.cells:,} cells, {lay.n_layer} layers, "
          f"n_embd_k_gqa = n_embd_v_gqa = {lay.n_embd}, F16, v_trans={int(lay.v_trans)}", flush=True)
    t_write, _ = timed(lambda: write_state(path, lay, args.seed))
    size = path.stat().st_size
    assert size == lay.size, (size, lay.size)
    print(f"  written in {t_write:.1f} s ({fmt_rate(size, t_write)})", flush=True)
    reps = 1 if args.quick else 3
    rows: list[Row] = []

    # baseline: one sequential read, cold and warm
    read_state(path)  # warm the interpreter side (imports, numpy paths) before any timing
    cold_ok = drop_cache(path)
    t_read_cold = read_file(path)
    t_read_warm = min(read_file(path) for _ in range(reps))
    rows.append(Row("read (cold, 8 MiB chunks)", fmt_s(t_read_cold), "", "", "baseline", None))
    rows.append(Row("read (warm, 8 MiB chunks)", fmt_s(t_read_warm), fmt_rate(size, t_read_warm), "", "baseline",
                    None))
    if not cold_ok:
        print("  note: posix_fadvise unavailable, 'cold' numbers are warm")

    # index
    drop_cache(path)
    t_idx_cold, res = timed(lambda: read_state(path))
    t_idx_warm = best(lambda: read_state(path), reps + 2)
    assert res.kind == "seq_file" and not res.n_errors, (res.kind, [f.message for f in res.findings])
    for label, t, base in (("cold", t_idx_cold, t_read_cold), ("warm", t_idx_warm, t_read_warm)):
        r = t / base
        rows.append(Row(f"index read_state ({label})", fmt_s(t), fmt_s(base), f"{100 * r:.2f}%", "<= 5% of read",
                        r <= 0.05))

    # inspect --json beyond the index: the analysis (the compatibility table, each layout's read path; the
    # llama-server reuse prediction and the per-consumer answers) and then the whole JSON text as the CLI
    # writes it (every cell listed: its size follows the cell count)
    def analysis() -> None:
        insp = inspect_file(path)
        assert insp.compatibility is not None and insp.reuse_prediction() and insp.consumers()

    def json_text() -> None:
        out = io.StringIO()
        write_json(inspect_file(path).to_json(lazy=True), out, indent=None)  # as `kvscope inspect --json`
        assert '"consumers"' in out.getvalue()

    for what, fn, goal in (("analysis", analysis, True), ("JSON text", json_text, False)):
        drop_cache(path)
        t_cold, _ = timed(fn)
        t_warm = best(fn, reps + 2)
        for label, t, base, idx in (("cold", t_cold, t_read_cold, t_idx_cold), ("warm", t_warm, t_read_warm,
                                                                                 t_idx_warm)):
            r = t / base
            rows.append(Row(f"inspect --json {what} ({label})", fmt_s(t), fmt_s(base),
                            f"{100 * r:.2f}% ({t / idx:.1f}x index)", "<= 5% of read" if goal else "",
                            r <= 0.05 if goal else None))

    # cell table
    src = cell_table(TABLE_CELLS)
    limit = src.size

    def cells() -> None:
        scan = scan_cells(src, 0, TABLE_CELLS, 0, limit)
        assert scan.ok and scan.table is not None and scan.table.count == TABLE_CELLS

    t_cells = best(cells, 3 if args.quick else 7)
    print(f"  scan_cells of {TABLE_CELLS:,} cells: {t_cells * 1e3:.2f} ms (best of {3 if args.quick else 7})")
    rows.append(Row(f"cell table scan_cells ({TABLE_CELLS:,})", f"{t_cells * 1e3:.2f} ms", "", "", "<= 50 ms",
                    t_cells <= 0.050))

    # --stats scan
    drop_cache(path)
    t_stats_cold, rep = timed(lambda: scan_stats(read_state(path)))
    res = read_state(path)
    read_file(path)  # the cold scan read past the page cache (O_DIRECT): bring the file in for the warm one
    t_stats_warm = min(timed(lambda: scan_stats(res))[0] for _ in range(1 if not args.quick else 2))
    n_records = len(rep.layers)
    assert n_records == 2 * lay.n_layer, n_records
    for label, t, base in (("cold", t_stats_cold, t_read_cold), ("warm", t_stats_warm, t_read_warm)):
        r = base / t
        rows.append(Row(f"--stats scan_stats ({label})", fmt_rate(size, t), fmt_rate(size, base), f"{100 * r:.0f}%",
                        ">= 50% of read", r >= 0.5))

    # peak RSS of indexing in a fresh process
    bare = child_json(_RSS_CHILD, "-")
    idx = child_json(_RSS_CHILD, str(path))
    peak = idx["peak"] / 1024
    rows.append(Row("peak RSS, index (subprocess)", f"{peak:.0f} MiB", f"{bare['peak'] / 1024:.0f} MiB imports",
                    f"+{peak - bare['peak'] / 1024:.0f} MiB", "<= 150 MiB", peak <= 150))
    print(f"  peak RSS of the index process: VmHWM {peak:.0f} MiB (ru_maxrss, inherited over fork: "
          f"{idx['ru_maxrss'] / 1024:.0f} MiB)")

    # sparse giant tails: a real seq file extended with a hole
    for tail_gb in (1, 50):
        sparse = path.parent / f"sparse-{tail_gb}g.seqstate"
        shutil.copyfile(SMALL_FIXTURE, sparse)
        os.truncate(sparse, tail_gb << 30)
        try:
            got = child_json(_SPARSE_CHILD, str(sparse))
        finally:
            sparse.unlink()
        peak_sparse = got["peak"] / 1024
        rows.append(Row(f"peak RSS, inspect --json, {tail_gb} GB sparse tail", f"{peak_sparse:.0f} MiB",
                        f"{fmt_s(got['seconds'])}", f"exit {got['rc']}", "<= 150 MiB", peak_sparse <= 150))

    # start-up of the CLI on a small fixture
    fixture = str(SMALL_FIXTURE)
    n = 1 if args.quick else 5
    t_pass = python_wall([sys.executable, "-c", "pass"], n)
    t_cli = python_wall([*kvscope_command(), "inspect", "--json", fixture], n)
    rows.append(Row("start-up: kvscope inspect --json", fmt_s(t_cli), f"{fmt_s(t_pass)} python -c pass",
                    f"{t_cli / t_pass:.1f}x", "<= 0.5 s", t_cli <= 0.5))
    mods = child_json(_MODULES_CHILD.format(forbidden=FORBIDDEN), fixture)
    bad = mods["forbidden"]
    rows.append(Row("start-up: torch/PySide6 imported", ", ".join(bad) if bad else "none", "", "", "none",
                    not bad and mods["json_ok"]))

    if args.profile == "index":
        print(profile_top(lambda: read_state(path)))
    elif args.profile == "stats":
        print(profile_top(lambda: scan_stats(read_state(path))))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--size-gib", type=float, default=2.0, help="approximate file size (default 2)")
    ap.add_argument("--cells", type=int, default=131_072, help="KV cells in the file (default 131,072)")
    ap.add_argument("--n-layer", type=int, default=8, help="layers (default 8; the row size follows from the size)")
    ap.add_argument("--v-trans", action="store_true", help="write V transposed (flash attention off)")
    ap.add_argument("--dir", type=Path, help="where to write the file (default: a new temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the file afterwards")
    ap.add_argument("--quick", action="store_true", help="a 16 MiB file, single repeats: a smoke run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--strict", action="store_true", help="exit 1 when a goal is missed")
    ap.add_argument("--profile", choices=["index", "stats"], help="print a cProfile of that step")
    args = ap.parse_args(argv)
    if args.quick:
        args.size_gib, args.cells, args.n_layer = 16 / 1024, 4096, 4

    tmp = Path(tempfile.mkdtemp(prefix="kvscope-bench-", dir=args.dir))
    path = tmp / "synthetic.seqstate"
    try:
        rows = run(args, path)
    finally:
        if args.keep:
            print(f"kept {path}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print()
    print_table(rows)
    missed = [r.name for r in rows if r.ok is False]
    quick = " (--quick: a smoke run, goals are not meaningful)" if args.quick else ""
    print(f"{len(rows) - len(missed) - sum(r.ok is None for r in rows)} goals met, {len(missed)} missed{quick}")
    return 1 if args.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())
