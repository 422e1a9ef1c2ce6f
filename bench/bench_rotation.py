"""``--stats`` of every KV cache type against one read of the file, and the rotated (v4) reader.

Writes, in one run, synthetic ``llama_state_seq_save_file`` files of about ``--size-gib`` each:

* the reader benchmark's F16 file (layout 2026-10, ``bench_reader.write_state``), with plain and
  with transposed V;
* v4 files (version 4), one KV stream, K and V records of bf16, f32, q8_0 and q4_0 (random finite
  values; random quants under finite scales), and q8_0 and q4_0 files whose data header carries
  ``n_rot_k = 128, n_rot_v = 64`` (head size 128): rows stored Hadamard-rotated,

and measures, each against a baseline taken in the same run:

* per type, ``--stats`` (``scan_stats(read_state(path))``) cold and warm against one cold read of
  the file (8 MiB chunks): goal at least 100 % of the read cold, and 2,000 MiB/s warm for f16; beside
  them one cold ``O_DIRECT`` read of the file (four 8 MiB reads in flight, what the scan's feed
  reads it with: how close the scan comes to the disk itself);
* index time of the rotated q8_0 file against one read of it, cold and warm (goal at most 5 %);
* the warm ``--stats`` throughput of the de-rotated q8_0 file against the f16 file's (goal >= 50 %);
* kvscope's q8_0 decode against gguf-py's.

Every type's statistics come from the compiled kernel (``core/_derotate.c``) where it runs (x86-64
with AVX2 and F16C) and from numpy elsewhere; the bench prints which, and ``--numpy`` measures the
numpy path on a machine with the kernel (the kernel's gain).

Usage::

    .venv/bin/python bench/bench_rotation.py              # 2 GiB each in a temp dir, deleted afterwards
    .venv/bin/python bench/bench_rotation.py --size-gib 1 --only f16,q8_0
    .venv/bin/python bench/bench_rotation.py --quick      # 32 MiB each, a smoke test
"""

from __future__ import annotations

import argparse
import math
import mmap
import os
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_reader as br  # noqa: E402
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType  # noqa: E402
from gguf.quants import dequantize  # noqa: E402

from kvscope.core import derotate_kernel  # noqa: E402
from kvscope.core.analysis.cold_feed import is_cold  # noqa: E402
from kvscope.core.analysis.record_values import dequantize_rows  # noqa: E402
from kvscope.core.analysis.stats import scan_stats  # noqa: E402
from kvscope.core.derotate_kernel import kernel  # noqa: E402
from kvscope.core.reader.parse import read_state  # noqa: E402
from kvscope.core.reader.records import LayerRecord  # noqa: E402

GGML_TYPE_Q8_0 = int(GGMLQuantizationType.Q8_0)
Q8_BLOCK, Q8_BYTES = GGML_QUANT_SIZES[GGMLQuantizationType.Q8_0]
HEAD = 128
F16_GOAL = 2000.0  # MiB/s warm for f16
_BLOCKS = (GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q4_0)


@dataclass
class V4Layout:
    cells: int
    n_layer: int
    n_embd: int  # K and V row elements (a multiple of 128)
    qt: GGMLQuantizationType = GGMLQuantizationType.Q8_0
    rotated: bool = True

    @property
    def row_bytes(self) -> int:
        bs, ts = GGML_QUANT_SIZES[self.qt]
        return self.n_embd // bs * ts

    @property
    def size(self) -> int:
        tokens = 12 + 4 * self.cells
        meta = 4 + 4 + 12 * self.cells + 16
        return tokens + meta + 2 * self.n_layer * (12 + self.cells * self.row_bytes)


def choose_v4(size: int, cells: int, n_layer: int, qt: GGMLQuantizationType = GGMLQuantizationType.Q8_0,
              rotated: bool = True) -> V4Layout:
    bs, ts = GGML_QUANT_SIZES[qt]
    per_elem = 2 * n_layer * cells * ts / bs
    n_embd = max(HEAD, round(size / per_elem / HEAD) * HEAD)
    return V4Layout(cells, n_layer, n_embd, qt, rotated)


def _units(rng: np.random.Generator, qt: GGMLQuantizationType, m: int) -> np.ndarray:
    """``m`` random finite elements (blocks) of ``qt`` as ``[m, type size]`` bytes. bf16 and f32 hold
    the values of the f16 file (random f16 bits, bit 14 cleared: |x| < 2, none below 2**-24),
    q8_0 / q4_0 random quants under random positive scales below 2 (exponent <= 14)."""
    ts = GGML_QUANT_SIZES[qt][1]
    if qt in _BLOCKS:
        raw = np.frombuffer(rng.bytes(m * ts), np.uint8).reshape(m, ts).copy()
        d = raw[:, :2].copy().view(np.uint16)
        np.bitwise_and(d, np.uint16(0x3BFF), out=d)
        raw[:, :2] = d.view(np.uint8)
        return raw
    half = np.bitwise_and(np.frombuffer(rng.bytes(2 * m), np.uint16), np.uint16(0xBFFF))
    f32 = half.view(np.float16).astype(np.float32)
    out = f32 if qt == GGMLQuantizationType.F32 else (f32.view(np.uint32) >> 16).astype(np.uint16)
    return out.view(np.uint8).reshape(m, ts)


def write_v4(path: Path, lay: V4Layout, seed: int) -> None:
    """Write the v4 file in chunks of random finite values (see :func:`_units`)."""
    rng = np.random.default_rng(seed)
    n = lay.cells
    ts = GGML_QUANT_SIZES[lay.qt][1]
    with open(path, "wb", buffering=0) as fh:
        fh.write(struct.pack("<III", br.SEQ_MAGIC, 4, n) + (np.arange(n, dtype=np.int32) % 32000).tobytes())
        cells = np.zeros((n, 3), dtype=np.int32)
        cells[:, 0] = np.arange(n)
        cells[:, 1] = 1
        fh.write(struct.pack("<II", 1, n) + cells.tobytes())
        rot_k, rot_v = (HEAD, 64) if lay.rotated else (0, 0)
        fh.write(struct.pack("<IIII", 0, lay.n_layer, rot_k, rot_v))  # v_trans 0, n_layer, n_rot_k, n_rot_v
        units_per_chunk = br.CHUNK // ts

        def payload(nbytes: int) -> None:
            left = nbytes // ts
            while left:
                m = min(left, units_per_chunk)
                fh.write(_units(rng, lay.qt, m).data)
                left -= m

        for _ in range(2 * lay.n_layer):  # K records, then V records
            fh.write(struct.pack("<iQ", int(lay.qt), lay.row_bytes))
            payload(n * lay.row_bytes)
        os.fsync(fh.fileno())


@dataclass
class Case:
    """One file of the per-type table: ``write()`` writes it at ``path``."""

    name: str
    qt: GGMLQuantizationType
    rotated: bool
    path: Path
    write: Callable[[], None]
    what: str


def read_direct(path: Path, streams: int = 4, chunk: int = 8 << 20) -> float:
    """Seconds to read ``path`` once with ``O_DIRECT`` (past the page cache), ``streams`` reads of
    ``chunk`` bytes in flight: what the disk gives the scan's feed, to compare it with (not the goal's
    baseline, which is :func:`bench_reader.read_file`'s plain read); ``math.nan`` where refused."""
    if not hasattr(os, "O_DIRECT"):
        return math.nan
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return math.nan
    size, lock, nxt = path.stat().st_size, threading.Lock(), [0]

    def worker() -> None:
        buf = mmap.mmap(-1, chunk)  # page-aligned
        try:
            while True:
                with lock:
                    off = nxt[0] * chunk
                    nxt[0] += 1
                if off >= size or os.preadv(fd, [buf], off) <= 0:
                    return
        finally:
            buf.close()

    t0 = time.perf_counter()
    try:
        threads = [threading.Thread(target=worker) for _ in range(streams)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        os.close(fd)
    return time.perf_counter() - t0


@dataclass
class TypeRow:
    """Seconds of one case: ``--stats`` cold and warm, one cold read, one cold O_DIRECT read (bytes:
    the file's size)."""

    case: Case
    size: int
    stats_cold: float
    read_cold: float
    stats_warm: float
    direct_cold: float = math.nan
    cached: bool = True  # the file stayed in the page cache for the warm runs (memory may be short)

    @property
    def ratio(self) -> float:
        return self.read_cold / self.stats_cold

    @property
    def warm_rate(self) -> float:
        return self.size / self.stats_warm / br.MIB

    @property
    def ok(self) -> bool:
        return self.ratio >= 1.0 and (self.case.name != "f16" or self.warm_rate >= F16_GOAL)


CASES = ("f16", "f16 transposed V", "bf16", "f32", "q8_0", "q4_0", "q8_0 rotated", "q4_0 rotated")


def cases(args: argparse.Namespace, folder: Path) -> list[Case]:
    size = int(args.size_gib * (1 << 30))
    out = []
    for name in CASES:
        path = folder / (name.replace(" ", "-") + ".seqstate")
        qt = GGMLQuantizationType.F16 if name.startswith("f16") else GGMLQuantizationType[name.split()[0].upper()]
        if qt == GGMLQuantizationType.F16:
            lay = br.choose_layout(size, args.cells, args.n_layer, "transposed" in name)
            out.append(Case(name, qt, False, path, lambda p=path, lay=lay: br.write_state(p, lay, args.seed),
                            f"v3, rows of {lay.n_embd} values"))
            continue
        v4 = choose_v4(size, args.cells, args.n_layer, qt, "rotated" in name)
        out.append(Case(name, qt, v4.rotated, path, lambda p=path, v4=v4: write_v4(p, v4, args.seed),
                        f"v4, rows of {v4.n_embd} values" + (", rotated in blocks of 128 (K) / 64 (V)"
                                                             if v4.rotated else "")))
    only = {x.strip() for x in args.only.split(",")} if args.only else None
    return [c for c in out if only is None or c.name in only or c.name.replace(" ", "-") in only]


def measure(case: Case, reps: int, cold_reps: int) -> TypeRow:
    """One cold read, one cold O_DIRECT read and a cold ``--stats`` (best of ``cold_reps``,
    alternating), then warm ``--stats``."""
    t_read = t_cold = t_direct = math.inf
    rep = None
    for _ in range(cold_reps):
        br.drop_cache(case.path)
        t_read = min(t_read, br.read_file(case.path))
        br.drop_cache(case.path)
        t_direct = min(t_direct, read_direct(case.path))
        br.drop_cache(case.path)
        t, rep = br.timed(lambda: scan_stats(read_state(case.path)))
        t_cold = min(t_cold, t)
    assert rep is not None and rep.layers
    assert all(ls.derotated == case.rotated and ls.n_values and not ls.n_nonfinite for ls in rep.layers), case.name
    parsed = read_state(case.path)
    br.read_file(case.path)  # warm: a cold --stats reads past the page cache and leaves nothing in it
    t_warm, cached = math.inf, True
    for _ in range(reps):
        cached = cached and not is_cold(str(case.path), 0, case.path.stat().st_size)
        t_warm = min(t_warm, br.timed(lambda: scan_stats(parsed))[0])
    return TypeRow(case, case.path.stat().st_size, t_cold, t_read, t_warm, t_direct, cached)


def print_types(rows: list[TypeRow]) -> None:
    head = ("type", "--stats cold", "one cold read", "ratio", "--stats warm", "O_DIRECT read", "goal", "result")
    cells = [(r.case.name, br.fmt_rate(r.size, r.stats_cold), br.fmt_rate(r.size, r.read_cold),
              f"{100 * r.ratio:.0f}%", br.fmt_rate(r.size, r.stats_warm) + ("" if r.cached else " (not cached)"),
              br.fmt_rate(r.size, r.direct_cold) if math.isfinite(r.direct_cold) else "-",
              ">= 100% of read" + (f", warm >= {F16_GOAL:,.0f} MiB/s" if r.case.name == "f16" else ""),
              "PASS" if r.ok else "MISS") for r in rows]
    w = [max(len(head[i]), *(len(c[i]) for c in cells)) for i in range(len(head))]
    line = "+" + "+".join("-" * (x + 2) for x in w) + "+"
    print(line)
    print("| " + " | ".join(h.ljust(w[i]) for i, h in enumerate(head)) + " |")
    print(line)
    for c in cells:
        print("| " + " | ".join(v.ljust(w[i]) if i == 0 else v.rjust(w[i]) for i, v in enumerate(c)) + " |")
    print(line)


def run(args: argparse.Namespace, folder: Path) -> tuple[list[TypeRow], list[br.Row]]:
    todo = cases(args, folder)
    for c in todo:
        c.write()
        print(f"wrote {c.path.name} ({c.path.stat().st_size / br.MIB:,.0f} MiB): {c.what}, {args.cells:,} cells, "
              f"{args.n_layer} layers", flush=True)
    reps = 1 if args.quick else 3
    types = [measure(c, reps, args.cold_reps) for c in todo]
    by_name = {t.case.name: t for t in types}
    rows: list[br.Row] = []
    v4 = next((c.path for c in todo if c.name == "q8_0 rotated"), None)
    if v4 is not None:
        rows += index_rows(v4, reps)
    if "q8_0 rotated" in by_name and "f16" in by_name:
        ratio = by_name["q8_0 rotated"].warm_rate / by_name["f16"].warm_rate
        rows.append(br.Row("--stats de-rotated q8_0 / f16 (warm)", f"{100 * ratio:.0f}%", "", "", ">= 50% of f16",
                           ratio >= 0.5))
        per_value = ratio * 2 / (Q8_BYTES / Q8_BLOCK)  # f16 holds 2 bytes a value, q8_0 34/32
        rows.append(br.Row("  the same, per value", f"{100 * per_value:.0f}%", "", "", "", None))
    if v4 is not None:
        rows.append(decode_row(v4, [r for _, r in read_state(v4).layer_records()][-1], reps))
    return types, rows


def index_rows(v4: Path, reps: int) -> list[br.Row]:
    """read_state of the rotated q8_0 file against one read of it, cold and warm."""
    res = read_state(v4)
    assert res.layout.name == "2026-10-v4" and not res.n_errors, [f.message for f in res.findings]
    recs = [r for _, r in res.layer_records()]
    assert recs and all(r.rotated and r.rot_block in (64, 128) for r in recs)
    br.drop_cache(v4)
    t_read_cold = br.read_file(v4)
    t_read_warm = min(br.read_file(v4) for _ in range(reps))
    br.drop_cache(v4)
    t_idx_cold, _ = br.timed(lambda: read_state(v4))
    t_idx_warm = br.best(lambda: read_state(v4), reps + 2)
    rows = []
    for label, t, base in (("cold", t_idx_cold, t_read_cold), ("warm", t_idx_warm, t_read_warm)):
        r = t / base
        rows.append(br.Row(f"v4 q8_0 index ({label})", br.fmt_s(t), br.fmt_s(base), f"{100 * r:.2f}%",
                           "<= 5% of read", r <= 0.05))
    return rows


def decode_row(path: Path, rec: LayerRecord, reps: int) -> br.Row:
    """q8_0 rows decoded by kvscope's one-pass decoder against gguf-py's: up to 64 MiB of one record."""
    n = min(64 << 20, rec.data_size) // Q8_BYTES * Q8_BYTES
    raw = np.fromfile(path, np.uint8, count=n, offset=rec.data_offset).reshape(-1, Q8_BYTES)
    ours = br.best(lambda: dequantize_rows(raw, GGML_TYPE_Q8_0), reps + 2)
    flat = raw.reshape(1, -1)  # as kvscope called gguf-py before: one row of whole blocks
    theirs = br.best(lambda: dequantize(flat, GGMLQuantizationType.Q8_0), reps + 2)
    return br.Row("decode q8_0 (kvscope / gguf-py)", br.fmt_rate(raw.size, ours), br.fmt_rate(raw.size, theirs),
                  f"{theirs / ours:.1f}x", "faster", ours < theirs)


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages (the machine may be shared: the cold ratios move with it)."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-gib", type=float, default=2.0)
    ap.add_argument("--cells", type=int, default=131_072)
    ap.add_argument("--n-layer", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dir", type=Path, help="folder for the files (default: a temp dir)")
    ap.add_argument("--quick", action="store_true", help="32 MiB files: a smoke test")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a goal is missed")
    ap.add_argument("--numpy", action="store_true", help="numpy statistics even where the compiled kernel runs")
    ap.add_argument("--only", help=f"comma-separated cases of {', '.join(CASES)} (default: all)")
    ap.add_argument("--cold-reps", type=int, default=1, help="cold read and cold --stats, alternating: the best of N")
    args = ap.parse_args(argv)
    if args.quick:
        args.size_gib, args.cells, args.n_layer = 1 / 32, 4096, 4
    if args.numpy:
        derotate_kernel.disable()
    print(f"statistics: {'compiled kernel (' + str(kernel()) + ')' if kernel() and not args.numpy else 'numpy'}")
    print(f"load average at the start: {loadavg()}; {os.cpu_count()} CPUs", flush=True)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        types, rows = run(args, Path(tmp))
    print(f"load average at the end: {loadavg()}")
    print_types(types)
    if rows:
        br.print_table(rows)
    missed = any(not t.ok for t in types) or any(r.ok is False for r in rows)
    return 1 if args.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())
