"""``kvscope verify`` of a long llama-server slot of the trained model, calibration included, in one run (#17).

The model is the cached Gemma 3 270M Q4_K_M (``kvscope llama-build --model-only``). For each cache
type of ``--cache-types`` (default f16, q8_0 and q4_0, K and V alike; flash attention on for the
quantized ones, which need it for V, off for f16) a pinned llama-server (``--build``, default b11434;
``--swa-full`` so the sliding-window cache keeps every cell) gets a ``--tokens`` (default 1,000) token
plain-English prompt and 8 greedy tokens, and saves the slot: the state under test. Then, in the same
run:

* **baseline**: what llama.cpp itself needs for the same work: a child with the context verify
  derives from the file, ``state_seq_load_file`` of the slot (restore) and one prefill of its
  tokens in an emptied context, timed inside the child's calls;
* **verify**: ``Verifier(...).run()`` end to end in a fresh interpreter: the prefill, the 8-step
  continuation, the calibration's schedules (``kvscope.core.verify.calibrate``: a one-at-a-time tail
  of a quarter of the tokens, 8 to 64, the last quarter in four chunks and in 16-token chunks) with the
  continuation after each, the restore and its continuation, the comparison.

Goal: verify <= 2 x (restore + prefill) (``bench_verify.GOAL``, which says why 2) for every cache type.
Peak RSS (``VmHWM``) of kvscope's process and of its llama.cpp child are stated (sampled every 20 ms).
Prints one JSON object (one entry per cache type); exit 1 when a verdict is not ok.

Usage::

    .venv/bin/python bench/bench_verify_trained.py                 # 1,000 tokens, f16 q8_0 q4_0, b11434
    .venv/bin/python bench/bench_verify_trained.py --tokens 4096 --build 0c1e5709 --cache-types f16
    .venv/bin/python bench/bench_verify_trained.py --quick         # a smoke run: a 256-token f16 slot
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TEXT = ("the river runs past the old mill and under the stone bridge where the children wait for the evening "
        "light to fall across the water while the baker closes his shop and the dogs sleep in the square")


def _slot(model: Path, build: str, n_tokens: int, out: Path, cache_type: str = "f16") -> list[int]:
    from kvscope.core.engine.server import ServerProcess

    slot_dir = out / "slots"
    slot_dir.mkdir()
    fa = "off" if cache_type == "f16" else "on"  # a quantized V cache needs flash attention
    args = ["-ctk", cache_type, "-ctv", cache_type, "-fa", fa, "--swa-full", "--no-warmup", "--no-kv-unified"]
    with ServerProcess(model, build=build, n_ctx=n_tokens + 512, n_parallel=1, slot_dir=slot_dir, args=args,
                       timeout_s=600.0) as srv:
        c = srv.client(timeout_s=3600.0)
        words = " ".join([TEXT] * (n_tokens // 20 + 4))
        toks = c.tokenize(words)[:n_tokens]
        c.complete(toks, n_predict=8, id_slot=0, temperature=0.0)
        saved = c.slot_save(0, "slot0.bin")
        shutil.copy(slot_dir / "slot0.bin", out / "slot0.bin")
    return [int(saved.get("n_saved") or 0)]


def child_verify() -> int:
    """The verify run (a fresh interpreter, so its peak RSS is verify's own); stdout: one JSON object."""
    import resource

    sys.path.insert(0, str(ROOT / "bench"))
    from bench_verify import PeakRSS

    from kvscope.core.verify.run import Verifier

    state, model, build = sys.argv[2], sys.argv[3], sys.argv[4]
    with PeakRSS() as peak:
        t0 = time.perf_counter()
        r = Verifier(state, model, build=build, timeout_s=3600).run()
        total = time.perf_counter() - t0
    beh = r.behaviour
    spreads = [x for x in (r.comparison.records if r.comparison else []) if x.spread_rms_rel is not None]
    print(json.dumps({
        "verdict": r.verdict, "reasons": r.reasons[:3], "seconds": total,
        "steps": {k: round(v, 3) for k, v in r.seconds.items()},
        "kvscope_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "llama_child_peak_mb": peak.child_kb / 1024,
        "continuation_kl_max": max((s.kl or 0.0 for s in beh.steps), default=None) if beh else None,
        "schedules_kl": beh.spread_kl if beh else None,
        "records_varying": len(spreads),
        "spread_rms_rel_max": max((x.spread_rms_rel or 0.0 for x in spreads), default=None),
        "rms_rel_max": max((x.rms_rel or 0.0 for x in spreads), default=None)}))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--build", default="b11434")
    ap.add_argument("--cache-types", default="f16,q8_0,q4_0", help="comma-separated K/V cache types, one slot each")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: a 256-token f16 slot (the ratio means little)")
    args = ap.parse_args(argv)
    if args.quick:
        args.tokens, args.cache_types = 256, "f16"
    types = [t.strip() for t in args.cache_types.split(",") if t.strip()]
    results = [_one(args.build, args.tokens, t) for t in types]
    print(json.dumps({"build": args.build, "tokens": args.tokens, "runs": results,
                      "ratio_max": max(r["ratio"] for r in results),
                      "within_goal": all(r["within_goal"] for r in results)}, indent=1))
    return 0 if all(r["verify"]["verdict"] == "ok" for r in results) else 1


def _one(build: str, n_tokens: int, cache_type: str) -> dict[str, Any]:
    """One slot of ``cache_type``: written, timed against llama.cpp's restore + prefill, verified."""
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_verify import GOAL, PeakRSS, _baseline

    from kvscope.core.engine.trained_model import GEMMA3_270M, require_model
    from kvscope.core.model.profile import load_model_profile
    from kvscope.core.reader.parse import read_state
    from kvscope.core.verify.context_plan import context_for

    model = require_model(GEMMA3_270M)
    prof = load_model_profile(model)
    tmp = Path(tempfile.mkdtemp(prefix="kvscope-bench-verify-trained-"))
    try:
        t0 = time.perf_counter()
        _slot(model, build, n_tokens, tmp, cache_type)
        make_s = time.perf_counter() - t0
        state = tmp / "slot0.bin"
        res = read_state(state, profile=prof)
        tokens = list(res.tokens)
        plan = context_for(res, prof, len(tokens))
        with PeakRSS() as peak:
            base = _baseline(model, state, tokens, build, plan.ctx)
        code = (f"import sys; sys.argv = ['x', '--child-verify', {str(state)!r}, {str(model)!r}, {build!r}]; "
                f"sys.path.insert(0, {str(ROOT / 'bench')!r}); import bench_verify_trained as b; "
                "sys.exit(b.child_verify())")
        t1 = time.perf_counter()
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        v: dict[str, Any] = json.loads(p.stdout)
        v["wall_s"] = time.perf_counter() - t1
        ratio = v["seconds"] / base["restore_prefill"]
        return {"cache_type": cache_type, "build": build, "model": model.name, "tokens": len(tokens),
               "state_mb": round(state.stat().st_size / 2**20, 1), "slot_written_s": round(make_s, 1),
               "baseline": {k: round(x, 3) for k, x in base.items()},
               "baseline_child_peak_mb": round(peak.child_kb / 1024, 1), "verify": v, "ratio": round(ratio, 3),
               "goal_ratio": GOAL, "within_goal": ratio <= GOAL}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
