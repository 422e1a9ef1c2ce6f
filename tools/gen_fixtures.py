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
(this script, the walker, the scenario and restore modules, ``core/modelgen/`` and
``core/engine/``, which pins the builds) the committed data was made from.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fixture_restore import Restorer, positions, relevant_log  # noqa: E402
from fixture_scenarios import (  # noqa: E402
    MODELS,
    PARTIAL_CLASSES,
    SLOT_SCENARIO,
    Scenario,
    ctx_params,
    plan,
    prompts,
    scenarios_for,
    session_scenario,
)
from state_walker import WalkError, tokens_of, walk  # noqa: E402

from kvscope.core.engine import builds  # noqa: E402
from kvscope.core.engine.llamacpp import CtxParams, EngineError, LlamaProcess  # noqa: E402
from kvscope.core.engine.server import ServerError, ServerProcess  # noqa: E402
from kvscope.core.modelgen.recipes import Recipe, load_recipe  # noqa: E402
from kvscope.core.modelgen.write import write_model  # noqa: E402

DATA = ROOT / "tests" / "data"
STAMP = "gen-INPUTS.sha256"
MODELS_DIR = "gen-models"
PARTIAL_ONLY = 1
SESSION_VERSIONS = {"0c1e5709": (10, 3), "b11434": (11, 4)}
INPUTS = (
    "tools/gen_fixtures.py",
    "tools/fixture_scenarios.py",
    "tools/fixture_restore.py",
    "tools/state_walker.py",
    "core/modelgen",
    "core/engine",
)


class GenError(Exception):
    """The build did something the generator does not accept (one line)."""


_ROT_LINE = re.compile(
    r"(?P<who>\w+): (?P<key>attn_rot_[kv]|n_rot_[kv]) = (?P<val>\d+), n_embd_head_k_all = (?P<head>-?\d+)")


def rotation_from_log(lines: list[str]) -> list[dict[str, Any]]:
    """Per KV cache (creation order), its rotation from the context-creation log. b11434 logs
    ``n_rot_k = N``; 0c1e5709 logs only ``attn_rot_k = 0|1`` and computes the size when it builds
    the graph (``build_input_k_rot``: the largest power of two >= 64 dividing the K head size; V: 64),
    so there the sizes are inferred."""
    out: list[dict[str, Any]] = []
    cur: dict[str, Any] = {}
    for ln in lines:
        m = _ROT_LINE.search(ln)
        if not m:
            continue
        side, val, head = m["key"][-1], int(m["val"]), int(m["head"])
        if m["key"].startswith("n_rot"):
            cur[f"n_rot_{side}"], cur["inferred"] = val, False
        else:
            n = 0
            if val:
                n = 64
                while side == "k" and head % (2 * n) == 0:
                    n *= 2
            cur[f"n_rot_{side}"], cur["inferred"] = n, True
        cur["cache"] = m["who"]
        if side == "v":
            out.append(cur)
            cur = {}
    return out


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


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
# one scenario of one model


def _logits_cmp(a: np.ndarray | None, b: np.ndarray | None) -> dict[str, Any]:
    if a is None or b is None:
        return {"bit_identical": False, "max_abs_diff": None}
    return {"bit_identical": bool(np.array_equal(a, b)), "max_abs_diff": float(np.max(np.abs(a - b)))}


class ModelRun:
    """Everything one model gives in one build."""

    def __init__(self, build: str, recipe: Recipe, model_path: Path, model_file: str, out: Path) -> None:
        self.build = build
        self.recipe = recipe
        self.model_path = str(model_path)
        self.model_file = model_file
        self.out = out
        self.rot_fields = SESSION_VERSIONS[build][1] >= 4
        self.prompts = prompts(recipe)
        self.entries: list[dict[str, Any]] = []
        self.scen: dict[str, dict[str, Any]] = {}

    # -- helpers ---------------------------------------------------------------------------------
    def _walk(self, data: bytes, kind: str, flags: int, name: str) -> dict[str, Any]:
        try:
            return walk(data, kind, plan(self.recipe, self.rot_fields, flags))
        except WalkError as e:
            raise GenError(f"{self.build}/{name}: the walker cannot account for the bytes: {e}") from None

    def _entry(self, name: str, data: bytes, *, api: str, kind: str, sc: Scenario, cp: CtxParams,
               info: dict[str, Any], flags: int, seq_id: int | None, seqs: dict[str, Any],
               api_return: Any) -> dict[str, Any]:
        (self.out / name).write_bytes(data)
        layout = self._walk(data, kind, flags, name)
        toks = tokens_of(data, layout)
        return {
            "file": name,
            "size": len(data),
            "sha256": sha256(data),
            "model_file": self.model_file,
            "model_key": self.recipe.model,
            "architecture": self.recipe.architecture,
            "memory_class": self.recipe.memory,
            "api": api,
            "kind": kind,
            "scenario": sc.name,
            "context_params": self._ctx_json(cp, info),
            "flags": flags,
            "seq_id": seq_id,
            "seqs": seqs,
            "token_payload": {"n_token_count": len(toks) if kind in ("seq_file", "session") else None,
                              "tokens": toks if kind in ("seq_file", "session") else None},
            "expected_layout": self._expected(sc, cp, info),
            "api_return": api_return,
            "generator_parse": layout,
        }

    def _ctx_json(self, cp: CtxParams, info: dict[str, Any]) -> dict[str, Any]:
        d = cp.to_json()
        d.update({
            "n_ctx_actual": info.get("n_ctx"),
            "n_ctx_seq_actual": info.get("n_ctx_seq"),
            "flash_attn_type": info.get("flash_attn"),
        })
        return d

    def _expected(self, sc: Scenario, cp: CtxParams, info: dict[str, Any]) -> dict[str, Any]:
        p = plan(self.recipe, self.rot_fields, 0)
        return {
            "arch": self.recipe.architecture,
            "memory": self.recipe.memory,
            "kv_cache_type_k": sc.type_k,
            "kv_cache_type_v": sc.type_v,
            "v_trans": 0 if sc.flash_attn else 1,
            "n_stream": 1 if sc.kv_unified else cp.n_seq_max,
            "rotation_fields_written": self.rot_fields,
            "rotation_env": dict(cp.env),
            "kv_caches_built": info.get("kv_caches"),
            "rotation_built": rotation_from_log(info.get("context_log", [])),
            "kv_cell_ext_bytes": p.cell_ext_bytes,
            "recr_layers": list(p.recr_layers),
            "ple_layers": sorted(p.ple_layers),
            "k_only_roles": sorted(p.no_v_roles),
        }

    def _seqs(self, p: LlamaProcess, which: list[int]) -> dict[str, Any]:
        out = {}
        for s in which:
            out[str(s)] = {"n_tokens": len(self.prompts[s]), "token_ids": self.prompts[s],
                           "pos_min_max": [p.seq_pos_min(s), p.seq_pos_max(s)]}
        return out

    def _open(self, cp: CtxParams, what: str) -> LlamaProcess:
        try:
            return LlamaProcess(self.model_path, cp, build=self.build, timeout_s=300)
        except EngineError as e:
            raise GenError(f"{self.build}/{what}: {e}") from None

    def _decode_all(self, p: LlamaProcess, name: str) -> None:
        for sid, toks in self.prompts.items():
            out = p.decode(sid, toks)
            if not (out.ok and out.rc == 0):
                raise GenError(f"{self.build}/{name}: decode of seq {sid} failed: {out.summary()} rc={out.rc}")

    # -- generation ------------------------------------------------------------------------------
    def scenario(self, sc: Scenario) -> None:
        rec = self.recipe
        n_seq = len(self.prompts)
        cp = ctx_params(rec, sc, n_seq)
        tag = f"{rec.model}-{sc.tag}"
        partial = rec.memory in PARTIAL_CLASSES or sc.name == "A"
        made: list[dict[str, Any]] = []
        nxt = {s: [int(toks[-1]) % 370 + 3] for s, toks in self.prompts.items()}  # the next token per seq
        with self._open(cp, tag) as p:
            info = p.info()
            self._decode_all(p, tag)
            all_seqs = list(self.prompts)
            for s in all_seqs:
                seqs = self._seqs(p, [s])
                name = f"{tag}-seq{s}.seqstate"
                path = self.out / name
                o = p.state_seq_save_file(path, s, self.prompts[s])
                if not o.ok or not o.value:
                    raise GenError(f"{self.build}/{name}: llama_state_seq_save_file failed: {o.summary()}")
                data = path.read_bytes()
                size_api = p.state_seq_get_size(s, 0)
                made.append(self._entry(name, data, api="llama_state_seq_save_file", kind="seq_file", sc=sc, cp=cp,
                                        info=info, flags=0, seq_id=s, seqs=seqs,
                                        api_return={"returned": o.value, "state_seq_get_size": size_api,
                                                    # the blob's 8-byte header is not in the file; its
                                                    # 12-byte header and the tokens are
                                                    "equals_file_size": o.value == len(data)
                                                    and size_api - 8 + 12 + 4 * len(self.prompts[s]) == len(data)}))
                for flags in (0, PARTIAL_ONLY) if partial else (0,):
                    name = f"{tag}-seq{s}{'-partial' if flags else ''}.seqdata.bin"
                    data = p.state_seq_get_data(s, flags)
                    size_api = p.state_seq_get_size(s, flags)
                    made.append(self._entry(name, data, api=f"llama_state_seq_get_data_ext(flags={flags})",
                                            kind="seq_blob", sc=sc, cp=cp, info=info, flags=flags, seq_id=s,
                                            seqs=seqs, api_return={"state_seq_get_size": size_api,
                                                                   "equals_file_size": size_api == len(data)}))
                    if s == 0 and flags == 0:
                        self.scen[sc.name] = {"ctx": cp, "blob0": data, "layout0": made[-1]["generator_parse"],
                                              "file0": (self.out / f"{tag}-seq0.seqstate").read_bytes()}
            seqs = self._seqs(p, all_seqs)
            data = p.state_get_data()
            size_api = p.state_get_size()
            made.append(self._entry(f"{tag}-ctx.state.bin", data, api="llama_state_get_data", kind="ctx_blob", sc=sc,
                                    cp=cp, info=info, flags=0, seq_id=None, seqs=seqs,
                                    api_return={"state_get_size": size_api, "equals_file_size": size_api == len(data)}))
            all_tokens = [t for s in all_seqs for t in self.prompts[s]]
            name = f"{tag}-ctx.session"
            if sc.name == session_scenario(rec):
                o = p.state_save_file(self.out / name, all_tokens)
                if not o.ok or not o.value:
                    raise GenError(f"{self.build}/{name}: llama_state_save_file failed: {o.summary()}")
                data = (self.out / name).read_bytes()
                made.append(self._entry(name, data, api="llama_state_save_file", kind="session", sc=sc, cp=cp,
                                        info=info, flags=0, seq_id=None, seqs=seqs,
                                        api_return={"returned": o.value, "state_get_size": size_api,
                                                    "equals_file_size": size_api + 12 + 4 * len(all_tokens)
                                                    == len(data)}))
            base_logits = {}
            for s in all_seqs:
                o = p.decode(s, nxt[s])
                base_logits[s] = o.value if o.ok and o.rc == 0 else None
            self.scen[sc.name].update(next=nxt, logits=base_logits)
        self._roundtrips(made, cp, info, nxt, base_logits)
        self.entries += made

    def _roundtrips(self, made: list[dict[str, Any]], cp: CtxParams, info: dict[str, Any],
                    nxt: dict[int, list[int]], base_logits: dict[int, Any]) -> None:
        """Load every file into a fresh context of the same parameters (memory cleared between files),
        re-save it the same way and compare the bytes, then decode the next token."""
        n_seq = len(self.prompts)
        with self._open(cp, f"{self.recipe.model} round trips") as p, \
                tempfile.TemporaryDirectory(prefix="kvscope-rt-") as td:
            for e in made:
                data = (self.out / e["file"]).read_bytes()
                kind, s, flags = e["kind"], e["seq_id"], e["flags"]
                resave = b""
                if kind == "seq_file":
                    o = p.state_seq_load_file(self.out / e["file"], s, 4096)
                    api = f"llama_state_seq_load_file(dest_seq_id={s})"
                    ret = o.rc
                    if o.ok and o.rc:
                        tmp = os.path.join(td, "re.seqstate")
                        p.state_seq_save_file(tmp, s, o.value or [])
                        resave = Path(tmp).read_bytes()
                elif kind == "seq_blob":
                    o = p.state_seq_set_data(data, s, flags)
                    api = f"llama_state_seq_set_data_ext(dest_seq_id={s}, flags={flags})"
                    ret = o.value
                    if o.ok and o.value:
                        resave = p.state_seq_get_data(s, flags)
                elif kind == "ctx_blob":
                    o = p.state_set_data(data)
                    api = "llama_state_set_data"
                    ret = o.value
                    if o.ok and o.value:
                        resave = p.state_get_data()
                else:
                    o = p.state_load_file(self.out / e["file"], 4096)
                    api = "llama_state_load_file"
                    ret = o.rc
                    if o.ok and o.rc:
                        tmp = os.path.join(td, "re.session")
                        p.state_save_file(tmp, o.value or [])
                        resave = Path(tmp).read_bytes()
                if o.aborted:
                    raise GenError(f"{self.build}/{e['file']}: the round trip aborted llama.cpp: {o.summary()}")
                rt: dict[str, Any] = {
                    "api": api,
                    "return": ret,
                    "return_equals_size": ret == len(data) if kind in ("seq_file", "seq_blob", "ctx_blob") else None,
                    "resaved_identical": resave == data,
                    "pos_min_max_after": positions(p, n_seq),
                    "log": relevant_log(o.log),
                }
                if kind in ("seq_file", "seq_blob") and not flags:
                    out = p.decode(s, nxt[s])
                    rt["next_token_logits_vs_original_context"] = {str(s): _logits_cmp(base_logits[s], out.value)}
                elif kind in ("ctx_blob", "session"):
                    cmp = {}
                    for sid in self.prompts:
                        out = p.decode(sid, nxt[sid])
                        cmp[str(sid)] = _logits_cmp(base_logits[sid], out.value)
                    rt["next_token_logits_vs_original_context"] = cmp
                e["roundtrip"] = rt
                p.memory_clear()

    def slot(self, sc: Scenario) -> None:
        """A genuine llama-server slot save of sequence 1's prompt."""
        rec = self.recipe
        cp = ctx_params(rec, sc, 1)
        tag = f"{rec.model}-{sc.tag}"
        name = f"{tag}-slot.seqstate"
        toks = self.prompts[1]
        args = ["-fa", "on" if sc.flash_attn else "off", "-ctk", sc.type_k, "-ctv", sc.type_v,
                "-b", str(cp.n_batch), "-ub", str(cp.n_ubatch), "--swa-full", "-kvu", "--no-warmup"]
        env = dict(cp.env)
        try:
            with ServerProcess(self.model_path, build=self.build, n_parallel=1, n_ctx=cp.n_ctx, threads=2,
                               args=args, env=env, timeout_s=120) as srv:
                cl = srv.client()
                done = cl.complete(toks, n_predict=1, id_slot=0, temperature=0.0, top_k=1, seed=1)
                saved = cl.slot_save(0, name)
                data = Path(cl.slot_path(name)).read_bytes()
                slots = cl.slots()
                restored = cl.slot_restore(0, name)
        except ServerError as e:
            raise GenError(f"{self.build}/{name}: llama-server: {e}") from None
        cp1 = CtxParams(**{**cp.to_json(), "env": tuple(env.items()), "kv_unified": True})
        with self._open(cp1, name) as p, tempfile.TemporaryDirectory(prefix="kvscope-rt-") as td:
            info = p.info()
            e = self._entry(name, data, api="llama-server POST /slots/0?action=save", kind="seq_file", sc=sc, cp=cp1,
                            info=info, flags=0, seq_id=0,
                            seqs={"0": {"n_tokens": len(toks), "token_ids": toks}},
                            api_return={"server_response": {k: v for k, v in saved.items() if k != "timings"},
                                        "equals_file_size": saved.get("n_written") == len(data)})
            e["server"] = {
                "args": args,
                "env": env,
                "completion_tokens_cached": done.get("tokens_cached"),
                "n_ctx": slots[0].get("n_ctx") if slots else None,
                "restore_response": {k: v for k, v in restored.items() if k != "timings"},
            }
            path = os.path.join(td, name)
            Path(path).write_bytes(data)
            o = p.state_seq_load_file(path, 0, 4096)
            rt: dict[str, Any] = {"api": "llama_state_seq_load_file(dest_seq_id=0)", "return": o.rc,
                                  "return_equals_size": o.rc == len(data), "log": relevant_log(o.log)}
            if o.ok and o.rc:
                tmp = os.path.join(td, "re.seqstate")
                p.state_seq_save_file(tmp, 0, o.value or [])
                rt["resaved_identical"] = Path(tmp).read_bytes() == data
                rt["pos_min_max_after"] = positions(p, 1)
            e["roundtrip"] = rt
        self.entries.append(e)

    def restores(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        obs, skipped = Restorer(self.model_path, self.build, self.prompts).all_cases(self.scen)
        for o in obs:
            o.update({"model_key": self.recipe.model, "architecture": self.recipe.architecture,
                      "memory_class": self.recipe.memory})
        for s in skipped:
            s["model_key"] = self.recipe.model
        return obs, skipped


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
