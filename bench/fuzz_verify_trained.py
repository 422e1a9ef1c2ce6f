"""Fresh real llama-server slots of the trained model under settings drawn at random, and verify's answers (#28).

Each case draws, from a seed: the pinned build, the K and V cache types (f16, q8_0, q4_0, mixed), flash
attention, ``--swa-full``, the prompt length (below or above Gemma 3's 512-token window), the prompt text and
the number of parallel slots. A real llama-server writes the slot; ``Verifier(...).run()`` judges it (it must
say ``ok``), then a damaged copy made with the corruption catalog (NaN over a V record's cells, a K record
zeroed, or a cell's position moved) is judged (it must not say ``ok``). Prints one line per case and a JSON
summary: healthy slots called anything but ok, damaged copies called ok.

This is a first, small version of the generator the issue asks for (its grid lacks threads, batch sizes,
``--cache-reuse``, chat templates and multi-turn slots).

Usage::

    .venv/bin/python bench/fuzz_verify_trained.py --cases 12 --seed 28
    .venv/bin/python bench/fuzz_verify_trained.py --quick        # 2 cases
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from kvscope.core.engine.server import ServerProcess
from kvscope.core.engine.trained_model import require_model
from kvscope.core.lab.damaged_copy import corrupt_file
from kvscope.core.verify.run import Verifier

TEXT = ("the river runs past the old mill and under the stone bridge where the children wait for the evening "
        "light to fall across the water while a boat drifts slowly toward the sea")
DAMAGES = ("fill:value=nan,role=v,index=1,cells=2-5", "fill:value=zeros,role=k,index=3",
           "set:field=pos,cell=4,value=900")


def draw(rng: random.Random) -> dict[str, object]:
    types = rng.choice([("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q8_0", "f16"), ("q4_0", "q8_0")])
    return {"build": rng.choice(["b11434", "0c1e5709"]), "ctk": types[0], "ctv": types[1],
            "fa": rng.random() < 0.6 or types[1] != "f16",  # a quantized V cache needs flash attention
            "swa_full": rng.random() < 0.5, "tokens": rng.choice([48, 96, 200, 560]),
            "salt": rng.randrange(1000), "n_parallel": rng.choice([1, 1, 2]), "damage": rng.choice(DAMAGES)}


def write_slot(model: Path, case: dict[str, object], folder: Path) -> tuple[Path, int]:
    n_par = int(case["n_parallel"])  # type: ignore[call-overload]
    args = ["-ctk", str(case["ctk"]), "-ctv", str(case["ctv"]), "-fa", "on" if case["fa"] else "off",
            "--no-warmup", "--kv-unified" if n_par > 1 else "--no-kv-unified"]
    if case["swa_full"]:
        args.append("--swa-full")
    with ServerProcess(model, build=str(case["build"]), n_ctx=1024 * n_par, n_parallel=n_par, slot_dir=folder,
                       args=args, timeout_s=180.0) as srv:
        c = srv.client(timeout_s=600.0)
        words = TEXT.split(" ")
        salt = int(case["salt"])  # type: ignore[call-overload]
        text = " ".join((words[salt % len(words):] + words) * 12)
        toks = c.tokenize(text)[: int(case["tokens"])]  # type: ignore[call-overload]
        slot = n_par - 1  # the last slot: slots 1.. are what a single-slot suite never writes
        c.complete(toks, n_predict=8, id_slot=slot, temperature=0.0)
        saved = c.slot_save(slot, "slot.bin")
    return folder / "slot.bin", int(saved["n_saved"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, default=12)
    p.add_argument("--seed", type=int, default=28)
    p.add_argument("--quick", action="store_true", help="2 cases")
    a = p.parse_args(argv)
    n = 2 if a.quick else a.cases
    rng = random.Random(a.seed)
    model = require_model()
    false_alarms, missed, rows = 0, 0, []
    with tempfile.TemporaryDirectory(prefix="kvscope-fuzz-verify-") as tmp:
        for i in range(n):
            case = draw(rng)
            folder = Path(tmp) / f"case{i}"
            folder.mkdir()
            t0 = time.monotonic()
            slot, n_saved = write_slot(model, case, folder)
            healthy = Verifier(str(slot), str(model), engine="llama.cpp", build=str(case["build"])).run()
            damaged_path = folder / "damaged.bin"
            corrupt_file(slot, damaged_path, [str(case["damage"])], model=str(model))
            damaged = Verifier(str(damaged_path), str(model), engine="llama.cpp", build=str(case["build"])).run()
            false_alarms += healthy.verdict != "ok"
            missed += damaged.verdict == "ok"
            row = {**case, "n_saved": n_saved, "healthy": healthy.verdict, "damaged": damaged.verdict,
                   "why_healthy": (healthy.reasons or [""])[0][:160], "seconds": round(time.monotonic() - t0, 1)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(json.dumps({"cases": n, "seed": a.seed, "healthy_not_ok": false_alarms, "damaged_called_ok": missed}))
    return 0 if false_alarms == 0 and missed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
