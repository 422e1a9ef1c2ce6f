"""Memory-core benchmark: ``state_write`` / ``state_read`` of a ~1 GiB state against a plain copy.

Builds a synthetic llama-style context in the core (``--n-layer`` layers, K and V rows of
``--n-embd`` f16 elements, one stream of ``cells`` cells sized so the state is about ``--size-gib``),
fills every cell of sequence 0 with random bytes, then measures in one run:

* ``seq_save_file``: the current-layout sequence file streamed to ``--dir`` (FileSink: no copy of
  the state in memory), against a plain copy of the same bytes into a new buffer (what producing
  the bytes costs at least);
* ``seq_load_file`` into the same, cleared context (FileReader: payloads copied from memory-mapped
  windows straight into the tensors), against a plain copy of the same bytes into an existing
  buffer; the restored tensors are checked against CRCs taken before the write;
* peak RSS of each, above the RSS the process had before the context existed: goal at most
  1.3 x the state size (the context itself holds about 1 x);
* for information, the in-memory blob API (``seq_get_data`` / ``seq_set_data``; by design two
  copies of the state in RAM).

Times are the best of ``--repeat`` runs (this machine's first touch of fresh memory is slow and
noisy); the baselines are ``numpy.copyto`` over the same tensors, best of the same number of runs.
Peak RSS comes from ``VmHWM`` (reset through ``/proc/self/clear_refs``), or from sampling
``VmRSS`` every 2 ms where the reset is not allowed.

Usage::

    .venv/bin/python bench/bench_memory.py                  # ~1 GiB in the temp dir
    .venv/bin/python bench/bench_memory.py --v-trans --dir /mnt/scratch
    .venv/bin/python bench/bench_memory.py --quick          # 32 MiB smoke run; the goals mean nothing
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from kvscope.core.memory import ContextParams, MemoryContext, MemorySpec, Ubatch
from kvscope.core.memory.spec import AttnLayer

T = TypeVar("T")
GIB = 1 << 30
MIB = 1 << 20
GOAL_RATIO = 0.5
GOAL_RSS = 1.3


def _status(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


class PeakRss:
    """Peak resident set size during a block, in bytes."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._hwm = self._can_reset()

    @staticmethod
    def _can_reset() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as fh:
                fh.write("5")
            return True
        except OSError:
            return False

    def __enter__(self) -> PeakRss:
        if self._hwm:
            self._can_reset()
        else:
            self.peak = _status("VmRSS")
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, _status("VmRSS"))

    def __exit__(self, *exc: object) -> None:
        if self._hwm:
            self.peak = _status("VmHWM")
        else:
            self._stop.set()
            assert self._thread is not None
            self._thread.join()
            self.peak = max(self.peak, _status("VmRSS"))


@dataclass
class Row:
    what: str
    value: str
    baseline: str
    ratio: float | None
    goal: str
    ok: bool | None


def _timed(fn: Callable[[], T]) -> tuple[float, T]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def _build(cells: int, n_layer: int, n_embd: int, v_trans: bool) -> MemoryContext:
    spec = MemorySpec("llama", n_layer, "kv", tuple(AttnLayer(i, n_embd, n_embd) for i in range(n_layer)))
    params = ContextParams(n_ctx=cells, n_seq_max=1, kv_unified=True, flash_attn=not v_trans, kv_size=cells)
    ctx = MemoryContext.create(spec, params)
    ctx.memory.apply(Ubatch(list(range(cells)), [[0]] * cells))
    block = np.random.default_rng(1).integers(0, 256, 16 * MIB, dtype=np.uint8)
    for t in ctx.memory.kv().tensors():
        flat = t.view(-1).numpy()
        for i in range(0, flat.size, block.size):
            n = min(block.size, flat.size - i)
            flat[i : i + n] = block[:n]
            block = np.roll(block, 4097)
    return ctx


def _crcs(ctx: MemoryContext) -> list[int]:
    return [zlib.crc32(t.view(-1).numpy().data) for t in ctx.memory.kv().tensors()]


def _copy_seconds(ctx: MemoryContext, repeat: int) -> tuple[float, float]:
    """Best times to copy every cache tensor into new buffers / into one reused, warm buffer."""
    tensors = [t.view(-1).numpy() for t in ctx.memory.kv().tensors()]
    warm = np.ones(max(t.size for t in tensors), dtype=np.uint8)
    fresh_best = warm_best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for t in tensors:
            dst = np.empty_like(t)
            np.copyto(dst, t)
            del dst
        fresh_best = min(fresh_best, time.perf_counter() - t0)
        t0 = time.perf_counter()
        for t in tensors:
            np.copyto(warm[: t.size], t)
        warm_best = min(warm_best, time.perf_counter() - t0)
    return fresh_best, warm_best


def _fmt_rate(nbytes: int, seconds: float) -> str:
    return f"{nbytes / seconds / GIB:.2f} GiB/s"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--size-gib", type=float, default=1.0)
    ap.add_argument("--n-layer", type=int, default=16)
    ap.add_argument("--n-embd", type=int, default=1024, help="K and V row elements (f16)")
    ap.add_argument("--v-trans", action="store_true", help="V stored transposed (flash attention off)")
    ap.add_argument("--dir", help="where the state file goes (default: the temp dir)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per measurement (the best counts)")
    ap.add_argument("--quick", action="store_true", help="32 MiB smoke run")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a goal is missed")
    args = ap.parse_args(argv)
    size = 32 * MIB if args.quick else int(args.size_gib * GIB)
    per_cell = args.n_layer * 2 * args.n_embd * 2
    cells = max(256, size // per_cell // 256 * 256)
    where = Path(args.dir or tempfile.gettempdir())
    rss0 = _status("VmRSS")
    ctx = _build(cells, args.n_layer, args.n_embd, args.v_trans)
    crc = _crcs(ctx)
    tokens = list(range(cells))
    t_w = t_r = t_bw = t_br = float("inf")
    intact = True
    state = 0
    rss_w = rss_r = 0
    with tempfile.TemporaryDirectory(dir=where) as tmp:
        path = Path(tmp) / "bench.seqstate"
        for i in range(args.repeat):
            path.unlink(missing_ok=True)
            with PeakRss() as peak:
                t, state = _timed(lambda: ctx.seq_save_file(path, 0, tokens))
            t_w = min(t_w, t)
            rss_w = peak.peak if i == 0 else rss_w
            ctx.memory.clear(data=True)
            with PeakRss() as peak:
                t, res = _timed(lambda: ctx.seq_load_file(path, 0))
            t_r = min(t_r, t)
            rss_r = peak.peak if i == 0 else rss_r
            assert res.ok, res
            intact = intact and _crcs(ctx) == crc
    t_fresh, t_warm = _copy_seconds(ctx, args.repeat)
    for _ in range(args.repeat):
        t, blob = _timed(lambda: ctx.seq_get_data(0))
        t_bw = min(t_bw, t)
        ctx.memory.clear(data=True)
        t, res2 = _timed(lambda b=blob: ctx.seq_set_data(b, 0))  # type: ignore[misc]
        t_br = min(t_br, t)
        intact = intact and res2.ok and _crcs(ctx) == crc
        del blob
    fresh, warm = (_fmt_rate(state, t) for t in (t_fresh, t_warm))
    rows = [
        Row("state_write -> seq file", _fmt_rate(state, t_w), f"new buf {fresh}", t_fresh / t_w,
            f">= {GOAL_RATIO}", t_fresh / t_w >= GOAL_RATIO),
        Row("state_read <- seq file", _fmt_rate(state, t_r), f"warm buf {warm}", t_warm / t_r,
            f">= {GOAL_RATIO}", t_warm / t_r >= GOAL_RATIO),
    ]
    for what, rss in (("peak RSS, write", rss_w), ("peak RSS, read", rss_r)):
        ratio = (rss - rss0) / state
        rows.append(Row(what, f"{(rss - rss0) / MIB:.0f} MiB", f"state {state / MIB:.0f} MiB", ratio,
                        f"<= {GOAL_RSS}", ratio <= GOAL_RSS))
    rows.append(Row("seq_get_data (blob, info)", _fmt_rate(state, t_bw), f"new buf {fresh}", t_fresh / t_bw, "-",
                    None))
    rows.append(Row("seq_set_data (blob, info)", _fmt_rate(state, t_br), f"warm buf {warm}", t_warm / t_br, "-",
                    None))
    rows.append(Row("restored bytes == written", "yes" if intact else "NO", "-", None, "yes", intact))
    print(f"state: {state / GIB:.3f} GiB ({cells} cells, {args.n_layer} layers, {args.n_embd}-wide f16 K/V, "
          f"V {'transposed' if args.v_trans else 'rows'}), file in {where}, best of {args.repeat}, "
          f"python {sys.version.split()[0]}")
    print(f"{'measurement':27} {'value':>11} {'baseline':>21} {'ratio':>6} {'goal':>7}  result")
    for r in rows:
        shown = f"{r.ratio:.2f}" if r.ratio is not None else "-"
        verdict = "" if r.ok is None else ("PASS" if r.ok else "MISS")
        print(f"{r.what:27} {r.value:>11} {r.baseline:>21} {shown:>6} {r.goal:>7}  {verdict}")
    missed = any(r.ok is False for r in rows)
    return 1 if (args.strict and missed) else 0


if __name__ == "__main__":
    raise SystemExit(main())
