"""Generate the real llama.cpp state fixtures in ``tests/data/gen-*`` through the pinned builds.

For each pinned build (``kvscope.core.engine.builds``: 0c1e5709 and b11434) and each tiny model of
``kvscope.core.modelgen`` (one or more per llama.cpp memory class), the generator decodes 2-3
prompts of different lengths in one context per scenario of a covering design (K/V types f16,
q8_0, q4_0; rotation on and off; flash attention on and off; unified on and off:
``tools/fixture_scenarios.py``) and writes, through the build's own API (one ``LlamaProcess``
child per context):

- ``<model>-<tag>-seq<N>.seqstate``: ``llama_state_seq_save_file``;
- ``<model>-<tag>-seq<N>.seqdata.bin`` / ``-seq<N>-partial.seqdata.bin``: ``llama_state_seq_get_data_ext``
  with flags 0 / PARTIAL_ONLY (partial files where the memory class honours the flag, and in
  scenario A for every class);
- ``<model>-<tag>-ctx.state.bin``: ``llama_state_get_data``; ``<model>-<tag>-ctx.session``:
  ``llama_state_save_file`` (scenario B, or A where there is no B);
- ``<model>-<tag>-slot.seqstate``: a genuine llama-server slot save (``POST /slots/0?action=save``
  on 127.0.0.1, ``ServerProcess``), scenario A, every model.

``manifest.json`` in each build's folder records for every file what the build did: context
parameters and what llama.cpp built (caches, rotation from the context-creation log), the API's
return sizes (equal to the file sizes), a round trip through the load API into a fresh context of
the same parameters (return value, re-saved bytes identical, positions, next-token logits), and
``generator_parse``: the byte layout by ``tools/state_walker.py`` (independent of
``kvscope.core.reader``; it accounts for every byte). ``failed_restore_observations`` hold the
failed-restore outcomes of ``tools/fixture_restore.py``. The models are written into
``gen-models/`` (``models.json`` lists their sha256).

Usage::

    python tools/gen_fixtures.py [--out DIR] [--build NAME ...] [--only MODEL ...]
    python tools/gen_fixtures.py --check       # regenerate into a temp dir, compare with tests/data
    python tools/gen_fixtures.py --stamp       # print the hash of the generator's inputs
    python tools/gen_fixtures.py --stamp-check # exit 1 when tests/data/gen-INPUTS.sha256 is stale

``--out`` defaults to ``tests/data``; every folder is built in a temporary folder and renamed into
place. ``--only`` regenerates some models and keeps the others' files. The output is deterministic:
``--check`` compares byte for byte. ``tests/data/gen-INPUTS.sha256`` holds the hash of the inputs
(this script, the model runner, the walker, the scenario and restore modules, ``core/modelgen/`` and
``core/engine/``, which pins the builds) the committed data was made from.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fixture_run import DATA, SESSION_VERSIONS, GenError, ModelRun  # noqa: E402
from fixture_scenarios import (  # noqa: E402
    MODELS,
    SLOT_SCENARIO,
    scenarios_for,
)

from kvscope.core.engine import builds  # noqa: E402
from kvscope.core.engine.llamacpp import EngineError  # noqa: E402
from kvscope.core.modelgen.recipes import load_recipe  # noqa: E402
from kvscope.core.modelgen.write import write_model  # noqa: E402

STAMP = "gen-INPUTS.sha256"
MODELS_DIR = "gen-models"
INPUTS = (
    "tools/gen_fixtures.py",
    "tools/fixture_run.py",
    "tools/fixture_scenarios.py",
    "tools/fixture_restore.py",
    "tools/state_walker.py",
    "core/modelgen",
    "core/engine",
)


def inputs_hash(root: Path = ROOT) -> str:
    """sha256 over the generator's inputs (paths and contents, sorted)."""
    h = hashlib.sha256()
    files: list[Path] = []
    for rel in INPUTS:
        p = root / rel
        if p.is_dir():
            files += [f for f in p.rglob("*") if f.is_file() and "__pycache__" not in f.parts and f.suffix in
                      (".py", ".json")]
        else:
            files.append(p)
    for f in sorted(files):
        h.update(str(f.relative_to(root)).encode() + b"\0" + hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# folders


def write_models(out: Path, models: list[str]) -> dict[str, Any]:
    """Write every model into ``out`` and return the models.json document."""
    out.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"generated_by": "kvscope.core.modelgen (tools/gen_fixtures.py)", "models": {}}
    for key in models:
        rec = load_recipe(key)
        path = out / f"{key}.gguf"
        digest = write_model(rec, path)
        doc["models"][key] = {"file": path.name, "size": path.stat().st_size, "sha256": digest,
                              "architecture": rec.architecture, "memory_class": rec.memory}
    (out / "models.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return doc


def generate_build(build: str, models: list[str], models_dir: Path, out: Path, log: Any) -> dict[str, Any]:
    """Write every fixture of ``build`` into ``out`` (a fresh folder); returns the manifest."""
    b = builds.by_name(build)
    if builds.installed(b) is None:
        raise GenError(f"llama.cpp build {build} is not built: run `kvscope llama-build --build {build}`")
    out.mkdir(parents=True, exist_ok=True)
    files: list[dict[str, Any]] = []
    observations: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    model_docs = json.loads((models_dir / "models.json").read_text())["models"]
    for key in models:
        t0 = time.monotonic()
        rec = load_recipe(key)
        run = ModelRun(build, rec, models_dir / f"{key}.gguf", f"../{MODELS_DIR}/{key}.gguf", out)
        for sc in scenarios_for(rec):
            run.scenario(sc)
        run.slot(next(sc for sc in scenarios_for(rec) if sc.name == SLOT_SCENARIO))
        obs, skip = run.restores()
        files += run.entries
        observations += obs
        skipped += skip
        print(f"  {build} {key}: {len(run.entries)} files, {len(obs)} restore cases, "
              f"{time.monotonic() - t0:.1f} s", file=log, flush=True)
    sv, qv = SESSION_VERSIONS[build]
    return {
        "generated_by": "tools/gen_fixtures.py: llama.cpp through kvscope.core.engine (LlamaProcess, ServerProcess)",
        "llama_cpp": {"build": b.name, "commit": b.commit, "date": b.date, "sdist": b.sdist, "sdist_sha256": b.sha256,
                      "writes": b.writes, "LLAMA_SESSION_VERSION": sv, "LLAMA_STATE_SEQ_VERSION": qv},
        "models": {k: model_docs[k] for k in models},
        "scenarios": {sc.name: {"tag": sc.tag, "type_k": sc.type_k, "type_v": sc.type_v, "flash_attn": sc.flash_attn,
                                "kv_unified": sc.kv_unified, "rotation": sc.rotation} for sc in scenarios_for(
                                    load_recipe("llama"))},
        "files": files,
        "failed_restore_observations": observations,
        "skipped": skipped,
    }


def _merge(old_dir: Path, new_dir: Path, manifest: dict[str, Any], models: list[str]) -> dict[str, Any]:
    """--only: keep the other models' files and manifest entries of ``old_dir``."""
    old_path = old_dir / "manifest.json"
    if not old_path.is_file():
        return manifest
    old = json.loads(old_path.read_text())
    keep = [e for e in old["files"] if e["model_key"] not in models]
    for e in keep:
        shutil.copy2(old_dir / e["file"], new_dir / e["file"])
    order = {m: i for i, m in enumerate(MODELS)}
    manifest["files"] = sorted(keep + manifest["files"], key=lambda e: order.get(e["model_key"], 99))
    for key in ("failed_restore_observations", "skipped"):
        manifest[key] = sorted([o for o in old.get(key, []) if o["model_key"] not in models] + manifest[key],
                               key=lambda o: order.get(o["model_key"], 99))
    manifest["models"] = {**old.get("models", {}), **manifest["models"]}
    manifest["models"] = {k: manifest["models"][k] for k in MODELS if k in manifest["models"]}
    return manifest


def dump_manifest(man: dict[str, Any]) -> str:
    """The manifest as JSON text: top-level keys one per line, list items (files, observations)
    one per line, compact inside (small, and a regenerated file diffs by entry)."""
    def one(v: Any) -> str:
        return json.dumps(v, separators=(",", ":"), sort_keys=False)

    lines = ["{"]
    items = list(man.items())
    for i, (k, v) in enumerate(items):
        end = "," if i < len(items) - 1 else ""
        if isinstance(v, list):
            body = ",\n".join("  " + one(x) for x in v)
            lines.append(f"{json.dumps(k)}: [\n{body}\n]{end}" if v else f"{json.dumps(k)}: []{end}")
        else:
            lines.append(f"{json.dumps(k)}: {one(v)}{end}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _swap(tmp: Path, final: Path) -> None:
    """Replace ``final`` by ``tmp`` (two renames; the old folder is removed afterwards)."""
    old = final.with_name(f".{final.name}.old")
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        os.rename(final, old)
    os.rename(tmp, final)
    if old.exists():
        shutil.rmtree(old)


def generate(out: Path, build_names: list[str], models: list[str], log: Any, partial: bool) -> dict[str, float]:
    out.mkdir(parents=True, exist_ok=True)
    seconds: dict[str, float] = {}
    work = Path(tempfile.mkdtemp(prefix=".gen-tmp-", dir=out))
    try:
        t0 = time.monotonic()
        mdir = work / MODELS_DIR
        doc = write_models(mdir, list(MODELS) if partial else models)
        seconds["models"] = time.monotonic() - t0
        for bn in build_names:
            t0 = time.monotonic()
            bdir = work / f"gen-{bn}"
            man = generate_build(bn, models, mdir, bdir, log)
            if partial:
                man = _merge(out / f"gen-{bn}", bdir, man, models)
                man["models"] = {k: doc["models"][k] for k in MODELS if k in man["models"]}
            text = dump_manifest(man)
            if json.loads(text) != man:
                raise GenError("the manifest does not survive a JSON round trip")
            (bdir / "manifest.json").write_text(text)
            seconds[bn] = time.monotonic() - t0
        _swap(mdir, out / MODELS_DIR)
        for bn in build_names:
            _swap(work / f"gen-{bn}", out / f"gen-{bn}")
        (out / STAMP).write_text(inputs_hash() + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return seconds


def compare(a: Path, b: Path) -> list[str]:
    """Differences between two generated folders (relative paths; first differing byte)."""
    diffs = []
    fa = {p.relative_to(a) for p in a.rglob("*") if p.is_file()}
    fb = {p.relative_to(b) for p in b.rglob("*") if p.is_file()}
    for rel in sorted(fa - fb):
        diffs.append(f"only in {a}: {rel}")
    for rel in sorted(fb - fa):
        diffs.append(f"only in {b}: {rel}")
    for rel in sorted(fa & fb):
        x, y = (a / rel).read_bytes(), (b / rel).read_bytes()
        if x != y:
            n = next((i for i in range(min(len(x), len(y))) if x[i] != y[i]), min(len(x), len(y)))
            diffs.append(f"{rel}: differs at byte {n} (sizes {len(x)} / {len(y)})")
    return diffs


def compare_models(committed: Path, fresh: Path, models: list[str]) -> list[str]:
    """Differences for ``models`` only between a committed and a regenerated build folder: their
    files and their manifest entries and observations."""
    diffs: list[str] = []
    man = {}
    for side, d in (("committed", committed), ("regenerated", fresh)):
        path = d / "manifest.json"
        if not path.is_file():
            return [f"{path}: missing"]
        man[side] = json.loads(path.read_text())
    for key in ("files", "failed_restore_observations", "skipped"):
        a = sorted(json.dumps(e, sort_keys=True) for e in man["committed"].get(key, []) if e["model_key"] in models)
        b = sorted(json.dumps(e, sort_keys=True) for e in man["regenerated"].get(key, []) if e["model_key"] in models)
        if a != b:
            only_a, only_b = set(a) - set(b), set(b) - set(a)
            diffs.append(f"{committed.name}/manifest.json: {key}: {len(only_a)} committed entries differ from "
                         f"{len(only_b)} regenerated ones")
            for e in sorted(only_a)[:3]:
                diffs.append(f"  committed:   {e[:300]}")
            for e in sorted(only_b)[:3]:
                diffs.append(f"  regenerated: {e[:300]}")
    names_a = {e["file"] for e in man["committed"]["files"] if e["model_key"] in models}
    names_b = {e["file"] for e in man["regenerated"]["files"] if e["model_key"] in models}
    for n in sorted(names_a - names_b):
        diffs.append(f"only committed: {committed.name}/{n}")
    for n in sorted(names_b - names_a):
        diffs.append(f"only regenerated: {committed.name}/{n}")
    for n in sorted(names_a & names_b):
        x, y = (committed / n).read_bytes(), (fresh / n).read_bytes()
        if x != y:
            i = next((i for i in range(min(len(x), len(y))) if x[i] != y[i]), min(len(x), len(y)))
            diffs.append(f"{committed.name}/{n}: differs at byte {i} (sizes {len(x)} / {len(y)})")
    return diffs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Generate real llama.cpp state fixtures through the pinned builds.")
    ap.add_argument("--out", type=Path, default=DATA, help="output folder (default: tests/data)")
    ap.add_argument("--build", nargs="+", metavar="NAME", help="pinned builds (default: all)")
    ap.add_argument("--only", nargs="+", metavar="MODEL", help=f"models (default: all of {', '.join(MODELS)})")
    ap.add_argument("--check", action="store_true", help="regenerate into a temporary folder and compare with --out")
    ap.add_argument("--stamp", action="store_true", help="print the hash of the generator's inputs")
    ap.add_argument("--stamp-check", action="store_true", help=f"exit 1 when --out/{STAMP} is not the inputs' hash")
    args = ap.parse_args(argv)
    if args.stamp:
        print(inputs_hash())
        return 0
    if args.stamp_check:
        have = (args.out / STAMP).read_text().strip() if (args.out / STAMP).is_file() else None
        if have != inputs_hash():
            print(f"gen_fixtures: {args.out / STAMP} is stale: the generator's inputs changed", file=sys.stderr)
            return 1
        return 0
    build_names = args.build or [b.name for b in builds.BUILDS]
    models = args.only or list(MODELS)
    try:
        for bn in build_names:
            builds.by_name(bn)
        for m in models:
            if m not in MODELS:
                raise GenError(f"unknown model {m!r} (known: {', '.join(MODELS)})")
            load_recipe(m)
        if args.check:
            with tempfile.TemporaryDirectory(prefix="kvscope-gencheck-") as td:
                seconds = generate(Path(td), build_names, models, sys.stderr, partial=False)
                if args.only:
                    diffs = []
                    for m in models:
                        name = f"{m}.gguf"
                        if (args.out / MODELS_DIR / name).read_bytes() != (Path(td) / MODELS_DIR / name).read_bytes():
                            diffs.append(f"{MODELS_DIR}/{name}: differs")
                    for bn in build_names:
                        diffs += compare_models(args.out / f"gen-{bn}", Path(td) / f"gen-{bn}", models)
                else:
                    diffs = []
                    for sub in [MODELS_DIR] + [f"gen-{bn}" for bn in build_names]:
                        diffs += compare(args.out / sub, Path(td) / sub)
            for d in diffs:
                print(d)
            took = ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items())
            print(f"gen_fixtures --check: {len(diffs)} differences ({took})", file=sys.stderr)
            return 1 if diffs else 0
        seconds = generate(args.out, build_names, models, sys.stderr, partial=args.only is not None)
    except (GenError, builds.BuildError, EngineError, KeyError, OSError) as e:
        print(f"gen_fixtures: {e}", file=sys.stderr)
        return 1
    print("gen_fixtures: " + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items()), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
