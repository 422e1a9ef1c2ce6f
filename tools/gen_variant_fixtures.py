"""Generate real state files of model variants the committed recipes do not cover, through the pinned builds.

``tools/gen_fixtures.py`` writes one or more tiny models per memory class; some classes change
their byte layout with a model option that none of those models sets. This tool derives such
variants from the committed recipes and runs them through the same machinery (``ModelRun``:
the covering design, the load-API round trips, the failed-restore cases and the independent byte
walker), into ``tests/data/variants-<build>/`` with a ``manifest.json`` of the same form; the
models go to ``tests/data/variants-models/``. The folders are not named ``gen-*``, so the suites
that walk every generated fixture keep their inputs; ``tests/reader/test_reader_variants.py``
reads these.

Variants:

- ``qwen4exp-nople``: qwen4exp without per-layer embeddings (PLE). Its attention cache keeps the
  12-byte cell extension (M-RoPE), but the QSA indexer cache has none: llama.cpp builds the
  indexer with ``hparams_idx.rope_type = LLAMA_ROPE_TYPE_NONE`` (``llama-memory-hybrid-idx.cpp``),
  and ``llama_kv_cache::has_cell_ext()`` is ``n_pos_per_embd() > 1 || ple_n_heads > 0``. The byte
  walker's plan has one extension size for every KV section, so for this tool its indexer section
  is walked with none unless the model has PLE layers (the same rule).

Usage::

    python tools/gen_variant_fixtures.py [--out DIR] [--build NAME ...]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import state_walker  # noqa: E402
from fixture_run import DATA, SESSION_VERSIONS, GenError, ModelRun  # noqa: E402
from fixture_scenarios import SLOT_SCENARIO, scenarios_for  # noqa: E402
from gen_fixtures import dump_manifest  # noqa: E402

from kvscope.core.engine import builds  # noqa: E402
from kvscope.core.engine.llamacpp import EngineError  # noqa: E402
from kvscope.core.modelgen.recipes import Recipe, load_recipe  # noqa: E402
from kvscope.core.modelgen.write import write_model  # noqa: E402

MODELS_DIR = "variants-models"


def qwen4exp_nople() -> Recipe:
    """qwen4exp less its PLE metadata and tensors (llama.cpp loads PLE only when ple.layers is set)."""
    base = load_recipe("qwen4exp")
    drop_meta = (".ple.", ".embedding_length_per_layer_input")
    meta = tuple(m for m in base.metadata if not any(d in m[0] for d in drop_meta))
    tensors = tuple(t for t in base.tensors if "ple_" not in t[0] and not t[0].startswith("per_layer_token_embd"))
    return replace(base, model="qwen4exp-nople", metadata=meta, tensors=tensors)


VARIANTS = {"qwen4exp-nople": qwen4exp_nople}

_walk_kv_section = state_walker._kv_section


def _kv_section(c: Any, role: str, plan: state_walker.Plan) -> dict[str, Any]:
    """The walker's KV section with the indexer's own cell extension (none without PLE, see above)."""
    if role == "kv_idx" and not plan.ple_layers:
        plan = replace(plan, cell_ext_bytes=0)
    return _walk_kv_section(c, role, plan)


def generate(out: Path, build_names: list[str]) -> None:
    state_walker._kv_section = _kv_section  # type: ignore[assignment]
    mdir = out / MODELS_DIR
    mdir.mkdir(parents=True, exist_ok=True)
    models: dict[str, Any] = {}
    recipes = {key: make() for key, make in VARIANTS.items()}
    for key, rec in recipes.items():
        path = mdir / f"{key}.gguf"
        digest = write_model(rec, path)
        models[key] = {"file": path.name, "size": path.stat().st_size, "sha256": digest,
                       "architecture": rec.architecture, "memory_class": rec.memory,
                       "derived_from": "qwen4exp", "change": "no PLE layers"}
    (mdir / "models.json").write_text(json.dumps({"generated_by": "tools/gen_variant_fixtures.py",
                                                  "models": models}, indent=1, sort_keys=True) + "\n")
    for bn in build_names:
        b = builds.by_name(bn)
        if builds.installed(b) is None:
            raise GenError(f"llama.cpp build {bn} is not built: run `kvscope llama-build --build {bn}`")
        final = out / f"variants-{bn}"
        work = Path(tempfile.mkdtemp(prefix=".variants-tmp-", dir=out))
        try:
            files: list[dict[str, Any]] = []
            observations: list[dict[str, Any]] = []
            skipped: list[dict[str, Any]] = []
            for key, rec in recipes.items():
                run = ModelRun(bn, rec, mdir / f"{key}.gguf", f"../{MODELS_DIR}/{key}.gguf", work)
                for sc in scenarios_for(rec):
                    run.scenario(sc)
                run.slot(next(sc for sc in scenarios_for(rec) if sc.name == SLOT_SCENARIO))
                obs, skip = run.restores()
                files += run.entries
                observations += obs
                skipped += skip
                print(f"  {bn} {key}: {len(run.entries)} files", file=sys.stderr, flush=True)
            sv, qv = SESSION_VERSIONS[bn]
            man = {"generated_by": "tools/gen_variant_fixtures.py: llama.cpp through kvscope.core.engine",
                   "llama_cpp": {"build": b.name, "commit": b.commit, "date": b.date, "sdist": b.sdist,
                                 "sdist_sha256": b.sha256, "writes": b.writes, "LLAMA_SESSION_VERSION": sv,
                                 "LLAMA_STATE_SEQ_VERSION": qv},
                   "models": models, "files": files, "failed_restore_observations": observations,
                   "skipped": skipped}
            (work / "manifest.json").write_text(dump_manifest(man))
            if final.exists():
                shutil.rmtree(final)
            work.rename(final)
        finally:
            shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Generate real llama.cpp state files of model variants.")
    ap.add_argument("--out", type=Path, default=DATA, help="output folder (default: tests/data)")
    ap.add_argument("--build", nargs="+", metavar="NAME", help="pinned builds (default: all)")
    args = ap.parse_args(argv)
    try:
        generate(args.out, args.build or [b.name for b in builds.BUILDS])
    except (GenError, builds.BuildError, EngineError, KeyError, OSError) as e:
        print(f"gen_variant_fixtures: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
