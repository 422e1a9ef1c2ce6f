"""Reader benchmark on a ~2 GiB v4 (2026-10-v4) file with quantized, Hadamard-rotated K/V.

Writes, in one run, two synthetic ``llama_state_seq_save_file`` files of about ``--size-gib``:

* the reader benchmark's F16 file (layout 2026-10, ``bench_reader.write_state``): today's baseline;
* a v4 file (version 4): one KV stream, ``q8_0`` K and V records whose data header carries
  ``n_rot_k = 128, n_rot_v = 64`` (head size 128), random q8_0 blocks (finite scales).

and measures, each against a baseline taken in the same run:

* index time of the v4 file against one read of it, cold and warm (goal at most 5 % of a read);
* ``--stats`` throughput on the v4 file (every row de-rotated before min/max/mean; RMS and zero
  rows are rotation-invariant) against one read of it;
* the same ``--stats`` throughput on the F16 file, and the ratio of the two: de-rotation must not
  bring ``--stats`` below half of the F16 throughput (goal >= 50 %).

The de-rotated statistics come from the compiled kernel (``core/_derotate.c``) where it runs
(x86-64 with AVX2) and from numpy elsewhere; the bench prints which, and ``--numpy`` measures the
numpy path on a machine with the kernel (the kernel's gain, against the same f16 baseline).

Usage::

    .venv/bin/python bench/bench_rotation.py              # 2 GiB each in a temp dir, deleted afterwards
    .venv/bin/python bench/bench_rotation.py --quick      # 32 MiB each, a smoke test
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_reader as br  # noqa: E402
from gguf import GGMLQuantizationType  # noqa: E402
from gguf.quants import dequantize  # noqa: E402

from kvscope.core import derotate_kernel  # noqa: E402
from kvscope.core.analysis.record_values import dequantize_rows  # noqa: E402
from kvscope.core.analysis.stats import scan_stats  # noqa: E402
from kvscope.core.derotate_kernel import kernel  # noqa: E402
from kvscope.core.reader.parse import read_state  # noqa: E402
from kvscope.core.reader.records import LayerRecord  # noqa: E402

GGML_TYPE_Q8_0 = 8
Q8_BLOCK, Q8_BYTES = 32, 34
HEAD = 128


@dataclass
class V4Layout:
    cells: int
    n_layer: int
    n_embd: int  # K and V row elements (a multiple of 128)

    @property
    def row_bytes(self) -> int:
        return self.n_embd // Q8_BLOCK * Q8_BYTES

    @property
    def size(self) -> int:
        tokens = 12 + 4 * self.cells
        meta = 4 + 4 + 12 * self.cells + 16
        return tokens + meta + 2 * self.n_layer * (12 + self.cells * self.row_bytes)


def choose_v4(size: int, cells: int, n_layer: int) -> V4Layout:
    per_elem = 2 * n_layer * cells * Q8_BYTES / Q8_BLOCK
    n_embd = max(HEAD, round(size / per_elem / HEAD) * HEAD)
    return V4Layout(cells, n_layer, n_embd)


def write_v4(path: Path, lay: V4Layout, seed: int) -> None:
    """Write the v4 file in chunks; q8_0 blocks with a finite f16 scale (|d| < 2) and random quants."""
    rng = np.random.default_rng(seed)
    n = lay.cells
    with open(path, "wb", buffering=0) as fh:
        fh.write(struct.pack("<III", br.SEQ_MAGIC, 4, n) + (np.arange(n, dtype=np.int32) % 32000).tobytes())
        cells = np.zeros((n, 3), dtype=np.int32)
        cells[:, 0] = np.arange(n)
        cells[:, 1] = 1
        fh.write(struct.pack("<II", 1, n) + cells.tobytes())
        fh.write(struct.pack("<IIII", 0, lay.n_layer, HEAD, 64))  # v_trans 0, n_layer, n_rot_k, n_rot_v
        blocks_per_chunk = br.CHUNK // Q8_BYTES

        def payload(nbytes: int) -> None:
            left = nbytes // Q8_BYTES
            while left:
                m = min(left, blocks_per_chunk)
                raw = np.frombuffer(rng.bytes(m * Q8_BYTES), np.uint8).reshape(m, Q8_BYTES).copy()
                d = raw[:, :2].copy().view(np.uint16)
                np.bitwise_and(d, np.uint16(0x3BFF), out=d)  # exponent <= 14: finite, |d| < 2
                raw[:, :2] = d.view(np.uint8)
                fh.write(raw.data)
                left -= m

        for _ in range(2 * lay.n_layer):  # K records, then V records
            fh.write(struct.pack("<iQ", GGML_TYPE_Q8_0, lay.row_bytes))
            payload(n * lay.row_bytes)
        os.fsync(fh.fileno())


def run(args: argparse.Namespace, folder: Path) -> list[br.Row]:
    size = int(args.size_gib * (1 << 30))
    f16_lay = br.choose_layout(size, args.cells, args.n_layer, False)
    v4_lay = choose_v4(size, args.cells, args.n_layer)
    f16, v4 = folder / "f16-v3.seqstate", folder / "q8_0-rotated-v4.seqstate"
    print(f"writing {f16} ({f16_lay.size / br.MIB:,.0f} MiB) and {v4} ({v4_lay.size / br.MIB:,.0f} MiB): "
          f"{args.cells:,} cells, {args.n_layer} layers, q8_0 rows of {v4_lay.n_embd} values", flush=True)
    br.write_state(f16, f16_lay, args.seed)
    write_v4(v4, v4_lay, args.seed)
    assert v4.stat().st_size == v4_lay.size
    reps = 1 if args.quick else 3
    rows: list[br.Row] = []
    read_state(v4)
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
    for label, t, base in (("cold", t_idx_cold, t_read_cold), ("warm", t_idx_warm, t_read_warm)):
        r = t / base
        rows.append(br.Row(f"v4 q8_0 index ({label})", br.fmt_s(t), br.fmt_s(base), f"{100 * r:.2f}%",
                           "<= 5% of read", r <= 0.05))

    rates: dict[str, float] = {}
    for name, path in (("v4 q8_0 rotated", v4), ("v3 f16", f16)):
        br.drop_cache(path)
        t_cold_read = br.read_file(path)
        br.drop_cache(path)
        t_cold, rep = br.timed(lambda p=path: scan_stats(read_state(p)))
        parsed = read_state(path)
        t_warm = min(br.timed(lambda p=parsed: scan_stats(p))[0] for _ in range(reps))
        n = path.stat().st_size
        if name.startswith("v4"):
            assert all(ls.derotated for ls in rep.layers)
        rates[name] = n / t_warm
        rows.append(br.Row(f"--stats {name} (cold)", br.fmt_rate(n, t_cold), br.fmt_rate(n, t_cold_read),
                           f"{100 * t_cold_read / t_cold:.0f}%", "of read", None))
        rows.append(br.Row(f"--stats {name} (warm)", br.fmt_rate(n, t_warm), "", "", "", None))
    ratio = rates["v4 q8_0 rotated"] / rates["v3 f16"]
    rows.append(br.Row("--stats de-rotated q8_0 / f16 (warm)", f"{100 * ratio:.0f}%", "", "", ">= 50% of f16",
                       ratio >= 0.5))
    per_value = ratio * 2 / (Q8_BYTES / Q8_BLOCK)  # f16 holds 2 bytes a value, q8_0 34/32
    rows.append(br.Row("  the same, per value", f"{100 * per_value:.0f}%", "", "", "", None))
    rows.append(decode_row(v4, recs[-1], reps))
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-gib", type=float, default=2.0)
    ap.add_argument("--cells", type=int, default=131_072)
    ap.add_argument("--n-layer", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dir", type=Path, help="folder for the files (default: a temp dir)")
    ap.add_argument("--quick", action="store_true", help="32 MiB files: a smoke test")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a goal is missed")
    ap.add_argument("--numpy", action="store_true", help="de-rotate with numpy even where the compiled kernel runs")
    args = ap.parse_args(argv)
    if args.quick:
        args.size_gib, args.cells, args.n_layer = 1 / 32, 4096, 4
    if args.numpy:
        derotate_kernel.disable()
    print(f"de-rotation: {'compiled kernel (' + str(kernel()) + ')' if kernel() and not args.numpy else 'numpy'}")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        rows = run(args, Path(tmp))
    br.print_table(rows)
    return 1 if args.strict and any(r.ok is False for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
