"""Peak memory of ``kvscope corrupt`` on a big synthetic state (issue #31 item 16).

Writes a synthetic sequence file of ``--size`` bytes (``bench_reader.write_state``: F16 K/V records, a
real format the reader parses), then runs ``kvscope corrupt`` in a child process once per spec set and
prints the child's peak RSS (``ru_maxrss`` of the reaped child) beside the input size::

    .venv/bin/python bench/bench_corrupt_memory.py --size 1024 [--v-trans] [--keep DIR]
    .venv/bin/python bench/bench_corrupt_memory.py --quick        # a smoke run: a 32 MiB input

Each run gets a fresh child, so the numbers do not mix. The output copy is removed after each run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bench_reader as br

MIB = 1 << 20
SPECS: list[list[str]] = [
    ["truncated_last_byte"],
    ["fill:value=nan,role=v,index=1,cells=3"],
    ["nan_rows_valid"],
    ["swap_k_layers_0_1"],
    ["drop:role=k,index=1"],
    ["trailer:bytes=1048576", "cell_count_plus1"],
]

_CHILD = """
import resource, sys
from kvscope.core.cli.main import main
code = main(sys.argv[1:])
print("maxrss_kib", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
sys.exit(code)
"""


def measure(path: Path, out: Path, specs: list[str]) -> tuple[int, float, int, str]:
    """(exit code, seconds, peak RSS in KiB of the child, its stderr's last line)."""
    argv = [sys.executable, "-c", _CHILD, "corrupt", str(path), "-o", str(out)]
    for s in specs:
        argv += ["--corrupt", s]
    t0 = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False)
    secs = time.perf_counter() - t0
    peak = next((int(ln.split()[1]) for ln in r.stderr.splitlines() if ln.startswith("maxrss_kib")), 0)
    last = (r.stderr.strip().splitlines() or [""])[0]
    return r.returncode, secs, peak, last


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=1024, help="input size in MiB (default 1024)")
    ap.add_argument("--v-trans", action="store_true", help="transposed V records")
    ap.add_argument("--keep", metavar="DIR", help="write the input here (kept) instead of a temporary folder")
    ap.add_argument("--quick", action="store_true", help="a smoke run: a 32 MiB input (the figures mean little)")
    args = ap.parse_args()
    if args.quick:
        args.size = 32
    with tempfile.TemporaryDirectory(prefix="kvscope-corrupt-mem-") as tmp:
        folder = Path(args.keep or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        lay = br.choose_layout(args.size * MIB, 16384, 16, args.v_trans)
        path = folder / f"synthetic-{args.size}m{'-vt' if args.v_trans else ''}.seqstate"
        if not path.exists() or path.stat().st_size != lay.size:
            br.write_state(path, lay, seed=1)
        size = path.stat().st_size
        print(f"input: {path.name} {size / MIB:,.0f} MiB ({lay})")
        for specs in SPECS:
            out = folder / "out.bin"
            code, secs, peak, last = measure(path, out, specs)
            with_out = out.stat().st_size if out.exists() else 0
            print(f"{' + '.join(specs):<45} exit {code}  {secs:6.1f} s  peak RSS {peak / 1024:8,.0f} MiB "
                  f"({peak * 1024 / size:4.2f}x input)  out {with_out / MIB:,.0f} MiB"
                  + (f"  [{last}]" if code else ""))
            if out.exists():
                os.unlink(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
