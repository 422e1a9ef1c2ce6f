"""Helpers of the reliability tests: big synthetic states, sparse files, peak RSS of a child ``kvscope``.

``write_seq_state`` writes a current-layout ("2026-10", version 3) ``llama_state_seq_save_file``
file as ``bench/bench_reader.py`` does: the tokens, one KV stream of ``cells`` cells (pos i,
sequence 0), then F16 K and V records of ``n_layer`` layers; the payload is random F16 without
Inf/NaN, written in pieces (or holes, ``sparse``). ``run_kvscope`` runs the real command in a child and reports its
exit status, output and peak RSS (VmHWM of the child itself).
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SEQ_MAGIC = 0x67677371
F16 = 1

# Runs kvscope's main() in this child and prints {"rc", "hwm_kib"} as the last stderr line.
_CHILD = """
import json, sys
from kvscope.core.cli.main import main
try:
    rc = main(sys.argv[1:])
finally:
    hwm = 0
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                hwm = int(line.split()[1])
    sys.stdout.flush()
    print(json.dumps({"hwm_kib": hwm}), file=sys.stderr)
sys.exit(rc)
"""


def write_seq_state(path: Path, cells: int, n_layer: int, n_embd: int, seed: int = 0, sparse: bool = False) -> int:
    """Write the synthetic state; returns its size in bytes. ``sparse``: every payload left as a hole (as big
    as asked, written in an instant, read back as zeros)."""
    rng = np.random.default_rng(seed)
    row = 2 * n_embd
    with open(path, "wb") as fh:
        fh.write(struct.pack("<III", SEQ_MAGIC, 3, cells) + np.arange(cells, dtype=np.int32).tobytes())
        meta = np.zeros((cells, 3), np.int32)
        meta[:, 0] = np.arange(cells)
        meta[:, 1] = 1
        fh.write(struct.pack("<II", 1, cells) + meta.tobytes() + struct.pack("<II", 0, n_layer))
        piece = np.empty(min(cells * n_embd, 4 << 20), np.uint16)

        def payload() -> None:
            left = cells * n_embd
            while left:
                m = min(left, piece.size)
                np.bitwise_and(rng.integers(0, 1 << 16, m, dtype=np.uint16), np.uint16(0xBFFF), out=piece[:m])
                fh.write(piece[:m].tobytes())
                left -= m

        for _ in range(2 * n_layer):  # K records, then plain (not transposed) V records
            fh.write(struct.pack("<iQ", F16, row))
            if sparse:
                fh.seek(cells * row, os.SEEK_CUR)
            else:
                payload()
        fh.truncate()
    return path.stat().st_size


def sparse_copy(src: Path, dst: Path, size: int) -> bool:
    """``dst`` = ``src`` extended with a hole to ``size`` bytes; False when the file system keeps no holes."""
    dst.write_bytes(src.read_bytes())
    os.truncate(dst, size)
    return dst.stat().st_blocks * 512 < (1 << 24)


@dataclass
class Run:
    rc: int
    out: str
    err: str  # stderr without the child's own last line
    hwm_mib: float


def run_kvscope(*argv: str, timeout: float = 300, stdout_to: Path | None = None) -> Run:
    """``kvscope ARGV`` in a child process: exit status, stdout (or written to ``stdout_to``),
    stderr and peak RSS."""
    cmd = [sys.executable, "-c", _CHILD, *argv]
    if stdout_to is None:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        out, err = p.stdout, p.stderr
    else:
        with open(stdout_to, "w") as fh:
            p = subprocess.run(cmd, stdout=fh, stderr=subprocess.PIPE, text=True, timeout=timeout, check=False)
        out, err = "", p.stderr
    lines, hwm = [], 0.0
    for line in err.splitlines():
        if line.startswith('{"hwm_kib"'):
            hwm = json.loads(line)["hwm_kib"] / 1024
        else:
            lines.append(line)
    return Run(p.returncode, out, "\n".join(lines), hwm)
