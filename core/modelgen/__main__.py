"""``python -m kvscope.core.modelgen``: write generated models into a folder."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvscope.core.modelgen import SEED, load_recipe, model_keys, realistic_llama, write_model


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvscope.core.modelgen",
                                 description="Write tiny random-weight GGUF models (one per llama.cpp memory class).")
    ap.add_argument("--out", type=Path, required=True, help="folder to write <key>.gguf into")
    ap.add_argument("--only", nargs="+", metavar="KEY", help="model keys (default: all)")
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--realistic", action="store_true", help="also write the benchmark-size llama model")
    ap.add_argument("--layers", type=int, default=12, help="--realistic: layers (default 12)")
    ap.add_argument("--embd", type=int, default=1024, help="--realistic: width (default 1024)")
    args = ap.parse_args(argv)
    try:
        recipes = [load_recipe(k) for k in (args.only or ([] if args.realistic else model_keys()))]
        if args.realistic:
            recipes.append(realistic_llama(n_layer=args.layers, n_embd=args.embd, n_head=max(1, args.embd // 64),
                                           n_head_kv=max(1, args.embd // 128)))
        args.out.mkdir(parents=True, exist_ok=True)
        for rec in recipes:
            path = args.out / f"{rec.model}.gguf"
            digest = write_model(rec, path, args.seed)
            print(f"{path}  {path.stat().st_size} bytes  sha256 {digest}")
    except (KeyError, ValueError, OSError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"modelgen: {msg}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
