"""Long differential fuzz of the memory core against real llama.cpp (the CI test's cases, many more).

Every case is a random corruption (the lab catalog's kinds with random offsets, fields, counts, values
and truncation points; ``tests/engine_fuzz.py`` defines them, shared with
``tests/lab/test_fuzz_engine.py``) of a real input of one source (a tiny model of every memory class
the core supports, plus tests/data/gen-models when it exists), restored from the same live context in
the core (policy ``contained``) and in llama.cpp; the two must agree on the return value, the
per-component outcome, the other sequences, the whole state afterwards byte for byte and recovery.
Case ``i`` is a pure function of ``(--seed, i)``: ``--replay i`` re-runs one and prints it.

Unexplained disagreements are written to ``--out`` (``<signature>-<i>.bin`` with a ``.json``: source,
build, kind, corruption, the disagreements; at most ``--keep`` per signature). The summary (counts per
source, input kind and corruption kind, outcomes, disagreements, engine restarts, seconds) is printed
as JSON and written to ``--out/summary-<build>.json``. Exit status 1 when anything disagreed.

Usage::

    nice .venv/bin/python bench/fuzz_engine.py --cases 10000 --build b11434   # tests/data/gen-models included
    .venv/bin/python bench/fuzz_engine.py --cases 10000 --build 0c1e5709 --seed 3
    .venv/bin/python bench/fuzz_engine.py --build b11434 --replay 1234
    .venv/bin/python bench/fuzz_engine.py --quick --build 0c1e5709                   # a smoke run: 12 cases
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
from kvharness.engine_fuzz import Arena, CaseResult, CorruptionError, arena, draw_case, sources  # noqa: E402

DRAWS = 40  # redraws for a corruption that does not apply to the input


def _case(seed: int, i: int, arenas: list[Arena]) -> CaseResult:
    rnd = random.Random(f"{seed}:{i}")
    ar = arenas[i % len(arenas)]
    for _ in range(DRAWS):
        kind, c = draw_case(rnd.randint, ar)
        try:
            ar.mutate(kind, c)
        except CorruptionError:
            continue
        return ar.case(kind, c)
    kind = sorted(ar.runners)[0]
    data = ar.clean(kind)
    cut = rnd.randint(0, len(data) - 1)
    return ar.case(kind, None, data[:cut], f"cut at byte {cut} (no drawn corruption applied)")


def _signature(r: CaseResult) -> str:
    return f"{r.source}-{r.kind}-" + "+".join(sorted({d.field.split('.')[0] for d in r.unexplained()}))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--cases", type=int, default=10_000)
    ap.add_argument("--build", default="b11434", help="0c1e5709 or b11434")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sources", help="comma-separated source keys (default: all)")
    ap.add_argument("--models", type=Path, help="a folder of generated models to fuzz too (default: "
                    "tests/data/gen-models when it exists; python -m kvscope.core.modelgen --out DIR writes one)")
    ap.add_argument("--replay", type=int, metavar="I", help="re-run case I and print it")
    ap.add_argument("--out", type=Path, default=ROOT / "bench/out/engine-fuzz")
    ap.add_argument("--keep", type=int, default=3, help="inputs kept per disagreement signature")
    ap.add_argument("--every", type=int, default=250, help="progress line every N cases")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 12 cases (every source set up, a few restored)")
    args = ap.parse_args(argv)
    if args.quick:
        args.cases, args.every = 12, 4
    t0 = time.perf_counter()
    wanted = set(args.sources.split(",")) if args.sources else None
    arenas: list[Arena] = []
    skipped: dict[str, str] = {}
    kinds_skipped: dict[str, dict[str, str]] = {}
    for src in sources(args.models):
        if wanted is not None and src.key not in wanted:
            continue
        a = arena(src.key, args.build, args.models)
        if isinstance(a, str):
            skipped[src.key] = a
            continue
        arenas.append(a)
        if a.skipped:
            kinds_skipped[src.key] = dict(a.skipped)
    if not arenas:
        print(json.dumps({"error": "no source can run", "skipped": skipped}, indent=1))
        return 2
    setup_s = time.perf_counter() - t0
    if args.replay is not None:
        r = _case(args.seed, args.replay, arenas)
        print(json.dumps(r.to_json(), indent=1))
        return 1 if r.unexplained() else 0
    args.out.mkdir(parents=True, exist_ok=True)
    counts: dict[str, Counter[str]] = {k: Counter() for k in ("source", "kind", "corruption", "outcome", "field")}
    kept: Counter[str] = Counter()
    n_bad = 0
    t1 = time.perf_counter()
    for i in range(args.cases):
        r = _case(args.seed, i, arenas)
        counts["source"][r.source] += 1
        counts["kind"][r.kind] += 1
        counts["corruption"][r.spec.split(":")[0]] += 1
        outcome = ("aborted" if r.engine.aborted else "hazard" if r.core.restore.failed_check == "short_read_hazard"
                   else "restored" if r.core.restore.ok else "refused")
        counts["outcome"][outcome] += 1
        bad = r.unexplained()
        if bad:
            n_bad += 1
            for d in bad:
                counts["field"][d.field] += 1
            sig = _signature(r)
            if kept[sig] < args.keep:
                kept[sig] += 1
                stem = args.out / f"{args.build}-{sig}-{i}"
                stem.with_suffix(".bin").write_bytes(r.data)
                stem.with_suffix(".json").write_text(json.dumps(r.to_json() | {"index": i, "seed": args.seed},
                                                                indent=1))
        if args.every and (i + 1) % args.every == 0:
            rate = (i + 1) / (time.perf_counter() - t1)
            print(f"{i + 1}/{args.cases} cases, {n_bad} disagreeing, {rate:.1f} cases/s", file=sys.stderr, flush=True)
    summary: dict[str, Any] = {
        "build": args.build, "seed": args.seed, "cases": args.cases, "disagreeing_cases": n_bad,
        "sources": [a.source.key for a in arenas], "skipped_sources": skipped, "skipped_kinds": kinds_skipped,
        "engine_restarts": {a.source.key: a.restarts for a in arenas},
        "counts": {k: dict(sorted(v.items())) for k, v in counts.items()},
        "setup_s": round(setup_s, 1), "seconds": round(time.perf_counter() - t0, 1),
    }
    (args.out / f"summary-{args.build}.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    for a in arenas:
        a.close()
    return 1 if n_bad else 0


if __name__ == "__main__":
    sys.exit(main())
