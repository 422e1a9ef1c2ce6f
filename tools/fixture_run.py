"""One model through one pinned llama.cpp build, for the fixture generator (``tools/gen_fixtures.py``).

:class:`ModelRun` writes the model's scenarios (seq files, seq blobs with and without PARTIAL_ONLY,
context blobs, session files, a llama-server slot save) through the build, walks each file it
wrote, round-trips it through the load API and replays the restore experiments; what the build did
goes into the manifest entries it returns.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fixture_restore import Restorer, positions, relevant_log  # noqa: E402
from fixture_scenarios import (  # noqa: E402
    PARTIAL_CLASSES,
    Scenario,
    ctx_params,
    plan,
    prompts,
    session_scenario,
)
from state_walker import WalkError, tokens_of, walk  # noqa: E402

from kvscope.core.engine.llamacpp import CtxParams, EngineError, LlamaProcess  # noqa: E402
from kvscope.core.engine.server import ServerError, ServerProcess  # noqa: E402
from kvscope.core.modelgen.recipes import Recipe  # noqa: E402

DATA = ROOT / "tests" / "data"
PARTIAL_ONLY = 1
SESSION_VERSIONS = {"0c1e5709": (10, 3), "b11434": (11, 4)}


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
