"""Lab benchmark: wall time of a full standard-catalog matrix per tiny fixture model.

For each model's default lab scenario (``tests/data/lab/<build>/<model>``: llama, mamba, gemma2, lfm2)
it measures, in one process:

* ``load``: ``load_scenario(folder)`` (model profile, context.json, live context restored);
* ``prepare``: ``LabRunner(scenario)`` (catalog applied, baseline probes, clean references);
* ``matrix``: ``runner.run()``, every case x policy (contained, legacy, transactional) x reader (buffer, file);

goal: load + prepare + matrix under 10 s per model on 2 cores. The matrix is the best of
``--repeat`` runs (the first touch of torch is slower); load and prepare are measured once, cold.
``--quick`` runs three cases per model (a smoke test; the goal is not meaningful). The exit status is
0 unless ``--strict`` is given and a goal is missed.

Usage::

    .venv/bin/python bench/bench_lab.py
    .venv/bin/python bench/bench_lab.py --build llamacpp-2026-08-16 --repeat 3
    .venv/bin/python bench/bench_lab.py --quick
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from kvscope.core.lab.runner import LabRunner, parse_case
from kvscope.core.lab.scenario import load_scenario

ROOT = Path(__file__).resolve().parent.parent
LAB = ROOT / "tests" / "data" / "lab"
MODELS = ("llama", "mamba", "gemma2", "lfm2")
GOAL_S = 10.0
QUICK_CASES = ("truncated_half", "nan_rows_late_fail", "cell_count_huge")


@dataclass
class Row:
    model: str
    cases: int
    cells: int
    load_s: float
    prepare_s: float
    matrix_s: float

    @property
    def total_s(self) -> float:
        return self.load_s + self.prepare_s + self.matrix_s

    @property
    def ok(self) -> bool:
        return self.total_s < GOAL_S


def measure(folder: Path, quick: bool, repeat: int) -> Row:
    t0 = time.perf_counter()
    scenario = load_scenario(folder)
    t1 = time.perf_counter()
    runner = LabRunner(scenario, [parse_case(c) for c in QUICK_CASES] if quick else None)
    t2 = time.perf_counter()
    best = float("inf")
    for _ in range(max(1, repeat)):
        t = time.perf_counter()
        run = runner.run()
        best = min(best, time.perf_counter() - t)
        errors = [r for r in run.results if r.error]
        if errors:
            raise SystemExit(f"{folder.name}: {errors[0].corruption} / {errors[0].policy}: {errors[0].error}")
    return Row(folder.name, len(runner.cases), len(run.results), t1 - t0, t2 - t1, best)


def table(rows: list[Row]) -> str:
    head = ("model", "cases", "cells", "load", "prepare", "matrix", "per cell", "total", "goal", "result")
    body = [(r.model, str(r.cases), str(r.cells), f"{r.load_s:.2f} s", f"{r.prepare_s:.2f} s",
             f"{r.matrix_s:.2f} s", f"{r.matrix_s / max(1, r.cells) * 1e3:.1f} ms", f"{r.total_s:.2f} s",
             f"< {GOAL_S:.0f} s", "PASS" if r.ok else "MISS") for r in rows]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(c) + " |" for c in body]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--build", default="llamacpp-2026-10-01", help="lab build folder under tests/data/lab")
    ap.add_argument("--model", action="append", choices=MODELS, help="only these models (repeatable)")
    ap.add_argument("--repeat", type=int, default=1, help="matrix runs per model; the best counts")
    ap.add_argument("--quick", action="store_true", help=f"only {len(QUICK_CASES)} cases per model (smoke test)")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a goal is missed")
    args = ap.parse_args(argv)
    print(f"kvscope lab benchmark: {args.build}, {os.cpu_count()} CPUs, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    rows = []
    for model in args.model or MODELS:
        rows.append(measure(LAB / args.build / model, args.quick, args.repeat))
        print(f"  {model}: {rows[-1].cells} cells in {rows[-1].matrix_s:.2f} s", flush=True)
    print()
    print(table(rows))
    print()
    missed = [r for r in rows if not r.ok]
    quick = " (--quick: a smoke run, the goal is not meaningful)" if args.quick else ""
    print(f"{len(rows) - len(missed)} goals met, {len(missed)} missed{quick}")
    return 1 if args.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())
