"""Maintainer tool: derive the committed architecture recipes of ``kvscope.core.modelgen`` from a
real llama.cpp build.

For every model key in ``SEEDS`` it starts from a superset of GGUF metadata (the keys and tiny
values llama.cpp's own ``tests/test-llama-archs.cpp`` feeds ``llama_model_init_from_user``, with
this project's dimensions), lets each pinned build create the model from that metadata through
the public API ``llama_model_init_from_user`` (tensors filled deterministically), saves it with
``llama_model_save_to_file`` and decodes a few tokens. It then drops every metadata key whose
removal changes nothing in either build (saved metadata, tensor inventory and next-token
logits all identical), and writes ``core/modelgen/archs/<model>.json``: the minimal metadata and
the tensor inventory (names, shapes) as the build created it. ``kvscope.core.modelgen`` writes
the models from those files alone, without a build.

Usage: ``python tools/modelgen_probe.py [--only MODEL ...] [--build NAME ...] [--no-prune]``.
Needs the llama-cpp-python binding (``LLAMA_BUILD=OFF``) and the pinned builds
(``kvscope llama-build``). The child mode (``--child LIB_DIR``) is internal.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ARCH_DIR = ROOT / "core" / "modelgen" / "archs"

# (key with "{a}" for the architecture, gguf value type, value)
Meta = list[tuple[str, str, Any]]

MOE_MANDATORY = {"deepseek32", "glm-dsa", "dots3note", "glm5-next", "qwen4exp", "minimax-m3", "deepseek4"}
MLA = {"deepseek32", "glm-dsa", "dots3note", "glm5-next"}

# model key -> architecture and the dimensions that differ from test-llama-archs' defaults
_ATTN = {"n_embd": 128, "n_head": 2, "n_ff": 256}  # head size 64: quantized caches are rotated
_MLA = {"kv_lora_rank": 128, "q_lora_rank": 64, "indexer_n_head": 4}
_MROPE = {"rope_sections": [8, 12, 12, 0]}  # rope pairs: 8 + 12 + 12 = 32 = n_rot / 2
SEEDS: dict[str, dict[str, Any]] = {
    "llama": {"memory": "llama_kv_cache", "arch": "llama", **_ATTN, "n_head_kv": 1},
    "gemma2": {"memory": "llama_kv_cache_iswa", "arch": "gemma2", **_ATTN, "n_head_kv": 1, "n_swa": 16},
    "mamba": {"memory": "llama_memory_recurrent", "arch": "mamba", "n_embd": 64, "n_head": 0, "n_ff": 0,
              "ssm_inner": 128, "ssm_state": 16, "dt_rank": 4},
    "lfm2": {"memory": "llama_memory_hybrid", "arch": "lfm2", **_ATTN, "n_swa": 0},
    "lfm2-swa": {"memory": "llama_memory_hybrid_iswa", "arch": "lfm2", **_ATTN, "n_swa": 16},
    "qwen35": {"memory": "llama_memory_hybrid", "arch": "qwen35", **_ATTN, "ssm_inner": 64, "ssm_state": 32, **_MROPE},
    "qwen3vl": {"memory": "llama_kv_cache", "arch": "qwen3vl", **_ATTN, "n_head_kv": 1, **_MROPE},
    "deepseek32": {"memory": "llama_kv_cache_dsa", "arch": "deepseek32", **_MLA},
    "glm-dsa": {"memory": "llama_kv_cache_dsa", "arch": "glm-dsa", **_MLA},
    "dots3note": {"memory": "llama_kv_cache_dsa_iswa", "arch": "dots3note", **_MLA},
    "glm5-next": {"memory": "llama_memory_hybrid_idx", "arch": "glm5-next", **_MLA, "kda_head_dim": 32},
    "qwen4exp": {"memory": "llama_memory_hybrid_idx", "arch": "qwen4exp", "n_embd": 128, "n_ff": 192,
                 "indexer_n_head": 4, "ssm_inner": 64, "ssm_state": 32, "ple_ngram": 2, "ple_conv": 2, **_MROPE},
    "minimax-m3": {"memory": "llama_kv_cache_msa", "arch": "minimax-m3", "n_embd": 128, "n_ff": 192},
    "deepseek4": {"memory": "llama_kv_cache_dsv4", "arch": "deepseek4", "n_embd": 128, "n_head": 4, "n_head_dim": 64,
                  "n_ff": 64, "indexer_n_head": 4, "o_groups": 4},
}


def _defaults(arch: str) -> dict[str, Any]:
    """test-llama-archs' get_gguf_ctx dimensions for ``arch``."""
    d: dict[str, Any] = {"n_vocab": 379, "n_ctx": 256, "n_embd": 256, "n_head": 2, "n_ff": 384, "n_layer": 2}
    if arch == "deepseek4":
        d.update(n_embd=512, n_head=8, n_ff=1024, n_layer=4)
    elif arch in MLA:
        d.update(n_embd=128, n_head=1, n_ff=192)
    d["n_head_kv"] = d["n_head"]
    d["n_swa"] = d["n_ctx"] // 8
    d["kv_lora_rank"] = 512
    d["q_lora_rank"] = 64 if arch == "deepseek4" else 512
    d["ssm_inner"] = None
    d["ssm_state"] = 128
    d["dt_rank"] = None
    d["indexer_head_size"] = None
    d["indexer_n_head"] = 64
    d["n_head_dim"] = None
    d["kda_head_dim"] = 128
    d["o_groups"] = 8
    return d


def superset(model: str) -> Meta:
    """The metadata test-llama-archs gives ``SEEDS[model]['arch']``, with this project's sizes."""
    seed = SEEDS[model]
    arch = seed["arch"]
    d = _defaults(arch)
    d.update({k: v for k, v in seed.items() if k != "arch"})
    moe = arch in MOE_MANDATORY
    n_vocab, n_embd, n_head, n_ff, n_layer = d["n_vocab"], d["n_embd"], d["n_head"], d["n_ff"], d["n_layer"]
    n_embd_head = d["n_head_dim"] or (n_embd // n_head if n_head else 0)
    m: Meta = []

    def add(key: str, vtype: str, value: Any) -> None:
        m.append((key, vtype, value))

    add("{a}.vocab_size", "u32", n_vocab)
    add("{a}.context_length", "u32", d["n_ctx"])
    add("{a}.embedding_length", "u32", n_embd)
    add("{a}.features_length", "u32", n_embd)
    add("{a}.block_count", "u32", n_layer)
    add("{a}.leading_dense_block_count", "u32", 1)
    add("{a}.feed_forward_length", "u32", n_ff)
    add("{a}.use_parallel_residual", "bool", False)
    add("{a}.logit_scale", "f32", 1.0)
    add("{a}.full_attention_interval", "u32", 2)
    if arch in ("lfm2", "glm5-next"):
        per_layer = [0 if il == 1 else n_head for il in range(n_layer)]
        if arch == "glm5-next":
            add("{a}.attention.head_count", "u32", n_head)
        else:
            add("{a}.attention.head_count", "arr_u32", per_layer)
        add("{a}.attention.head_count_kv", "arr_u32", per_layer)
    else:
        add("{a}.attention.head_count", "u32", n_head)
        add("{a}.attention.head_count_kv", "u32", 1 if arch == "deepseek4" else d["n_head_kv"])
    if arch == "deepseek4":
        add("{a}.attention.key_length", "u32", n_embd_head)
        add("{a}.attention.value_length", "u32", n_embd_head)
        add("{a}.rope.dimension_count", "u32", n_embd_head // 2)
    elif arch in MLA:
        add("{a}.attention.key_length", "u32", d["kv_lora_rank"] + (0 if arch == "glm5-next" else 64))
        add("{a}.attention.value_length", "u32", d["kv_lora_rank"])
        add("{a}.rope.dimension_count", "u32", 0 if arch == "glm5-next" else 64)
        add("{a}.attention.key_length_mla", "u32", 192)
        add("{a}.attention.value_length_mla", "u32", 128)
        if arch == "dots3note":
            add("{a}.attention.kv_lora_rank_swa", "u32", d["kv_lora_rank"])
            add("{a}.attention.key_length_swa", "u32", d["kv_lora_rank"] + 64)
            add("{a}.attention.value_length_swa", "u32", d["kv_lora_rank"])
            add("{a}.attention.key_length_mla_swa", "u32", 192)
            add("{a}.attention.value_length_mla_swa", "u32", 128)
            add("{a}.rope.freq_base_swa", "f32", 10000.0)
            add("{a}.attention.indexer.types", "arr_u32", [0 if il % 2 else 1 for il in range(n_layer)])
    elif arch == "minimax-m3":
        add("{a}.rope.dimension_count", "u32", 64)
    add("{a}.attention.clamp_kqv", "f32", 1.0)
    add("{a}.attention.layer_norm_epsilon", "f32", 1e-5)
    add("{a}.attention.layer_norm_rms_epsilon", "f32", 1e-5)
    add("{a}.attention.group_norm_epsilon", "f32", 1e-5)
    add("{a}.attention.group_norm_groups", "u32", 8)
    add("{a}.attention.q_lora_rank", "u32", d["q_lora_rank"])
    add("{a}.attention.kv_lora_rank", "u32", d["kv_lora_rank"])
    if d["n_swa"]:
        add("{a}.attention.sliding_window", "u32", d["n_swa"])
    if arch == "dots3note":
        add("{a}.attention.sliding_window_pattern", "arr_u32", [il % 2 for il in range(n_layer)])
    else:
        add("{a}.attention.sliding_window_pattern", "u32", 2)
    if arch in ("qwen4exp", "glm5-next"):
        add("{a}.hyper_connection.count", "u32", 4)
        add("{a}.hyper_connection.sinkhorn_iterations", "u32", 2)
        add("{a}.hyper_connection.epsilon", "f32", 1.0e-6)
        add("{a}.hyper_connection.low_rank", "u32", 8)
        add("{a}.attention.compress_ratios", "arr_u32", [4] * n_layer)
        ple_ngram, ple_hpn = d.get("ple_ngram", 3), 2
        ple_n_heads = (ple_ngram - 1) * ple_hpn
        add("{a}.ple.layers", "arr_u32", [0])
        add("{a}.ple.ngram_size", "u32", ple_ngram)
        add("{a}.ple.heads_per_ngram", "u32", ple_hpn)
        add("{a}.ple.conv_kernel", "u32", d.get("ple_conv", 4))
        add("{a}.ple.eos_token_id", "u32", 0)
        add("{a}.embedding_length_per_layer_input", "u32", n_embd // ple_n_heads)
        add("{a}.ple.layer_multipliers", "arr_u64", [1, 3, 5][:ple_ngram])
        add("{a}.ple.head_offsets", "arr_u64", [h * n_vocab for h in range(ple_n_heads)])
        add("{a}.ple.head_vocab_sizes", "arr_u64", [n_vocab] * ple_n_heads)
    add("{a}.attention.indexer.head_count", "u32", n_head if arch == "minimax-m3" else d["indexer_n_head"])
    idx_len = d["indexer_head_size"] or (n_embd_head if arch == "qwen4exp" else 128)
    add("{a}.attention.indexer.key_length", "u32", idx_len)
    add("{a}.attention.indexer.top_k", "u32", 131072)
    add("{a}.attention.indexer.block_size", "u32", 4)
    add("{a}.attention.indexer.kpool", "u32", 4)
    add("{a}.attention.indexer.kpool_select_tail", "bool", True)
    add("{a}.attention.indexer.local_blocks", "u32", 1)
    add("{a}.rope.dimension_sections", "arr_u32", d.get("rope_sections") or [n_embd_head // 4] * 4)
    if arch == "deepseek4":
        add("{a}.attention.output_group_count", "u32", d["o_groups"])
        add("{a}.attention.output_lora_rank", "u32", 32)
        add("{a}.attention.compress_ratios", "arr_u32", [0, 0, 4, 128])
        add("{a}.attention.compress_rope_freq_base", "f32", 160000.0)
        add("{a}.hyper_connection.count", "u32", 4)
        add("{a}.hyper_connection.sinkhorn_iterations", "u32", 2)
        add("{a}.hyper_connection.epsilon", "f32", 1.0e-6)
        add("{a}.hash_layer_count", "u32", 0)
        add("{a}.swiglu_clamp_exp", "f32", 10.0)
        add("{a}.expert_weights_scale", "f32", 1.0)
        add("{a}.expert_weights_norm", "bool", True)
    if moe:
        add("{a}.expert_feed_forward_length", "u32", n_ff)
        add("{a}.expert_shared_feed_forward_length", "u32", n_ff // 2)
        add("{a}.expert_latent_length", "u32", n_ff)
        add("{a}.interleave_moe_layer_step", "u32", 2)
        add("{a}.expert_count", "u32", 2)
        add("{a}.expert_used_count", "u32", 2)
        add("{a}.expert_shared_count", "u32", 1)
        add("{a}.expert_gating_func", "u32", 4 if arch == "deepseek4" else 2)
        add("{a}.expert_group_scale", "f32", 1.0)
        add("{a}.experts_per_group", "u32", 1)
    qwen_ssm = arch in ("qwen3next", "qwen35", "qwen35moe", "qwen4exp")
    add("{a}.ssm.inner_size", "u32", d["ssm_inner"] or (256 if qwen_ssm else 2 * n_embd))
    add("{a}.ssm.conv_kernel", "u32", 4)
    add("{a}.ssm.state_size", "u32", d["ssm_state"])
    add("{a}.ssm.time_step_rank", "u32", d["dt_rank"] or n_head)
    add("{a}.ssm.group_count", "u32", 2)
    add("{a}.kda.head_dim", "u32", d["kda_head_dim"])
    add("{a}.kda.safe_gate", "bool", True)
    add("{a}.kda.gate_lower_bound", "f32", -5.0)
    add("{a}.wkv.head_size", "u32", n_embd_head)
    add("{a}.shortconv.l_cache", "u32", 3)
    add("{a}.residual_scale", "f32", 3.5565588200778455)
    add("{a}.attn_res.block_size", "u32", 12)
    add("{a}.activation.situ_beta", "f32", 4.0)
    add("{a}.activation.situ_linear_beta", "f32", 25.0)
    return m


# ---------------------------------------------------------------------------------------------
# child: one process per build, one model per request line


def _child(lib_dir: str) -> None:  # pragma: no cover - runs in the subprocess
    # results go to the original stdout; whatever C code prints goes to stderr
    results = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    os.environ["LLAMA_CPP_LIB_PATH"] = lib_dir
    import llama_cpp as L  # noqa: N812
    import numpy as np

    from kvscope.core.modelgen.gguf_write import write_metadata_only
    from kvscope.core.modelgen.tensor_data import tensor_values

    ggml = ctypes.CDLL(os.path.join(lib_dir, "libggml-base.so"))

    class GgufInitParams(ctypes.Structure):
        _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.c_void_p)]

    ggml.gguf_init_from_file.restype = ctypes.c_void_p
    ggml.gguf_init_from_file.argtypes = [ctypes.c_char_p, GgufInitParams]
    ggml.gguf_free.argtypes = [ctypes.c_void_p]
    ggml.ggml_nbytes.restype = ctypes.c_size_t
    ggml.ggml_nbytes.argtypes = [ctypes.c_void_p]
    ggml.ggml_get_name.restype = ctypes.c_char_p
    ggml.ggml_get_name.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_tensor_set.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]

    log: list[str] = []

    @ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
    def on_log(level: int, text: bytes, _ud: Any) -> None:
        log.append(text.decode("utf-8", "replace"))

    L.llama_log_set(on_log, None)
    L.llama_backend_init()

    @L.llama_model_set_tensor_data_t
    def set_data(tensor: int, _ud: Any) -> None:
        name = ggml.ggml_get_name(tensor).decode()
        nbytes = ggml.ggml_nbytes(tensor)
        ttype = ctypes.cast(tensor, ctypes.POINTER(ctypes.c_int32))[0]
        if ttype != 0:
            raise RuntimeError(f"unexpected type {ttype} for {name}")
        vals = tensor_values(name, (nbytes // 4,), seed=1).astype(np.float32)
        ggml.ggml_backend_tensor_set(tensor, vals.ctypes.data, 0, nbytes)

    def decode_and_measure(model: Any, out: dict[str, Any]) -> None:
        cparams = L.llama_context_default_params()
        cparams.n_ctx = 128
        cparams.n_batch = 64
        cparams.n_ubatch = 64
        cparams.n_seq_max = 1
        cparams.n_threads = 2
        cparams.n_threads_batch = 2
        mark = len(log)
        ctx = L.llama_init_from_model(model, cparams)
        if not ctx:
            out["error"] = "context creation failed"
            return
        out["mem_log"] = [
            ln.strip() for ln in log[mark:] if re.match(r"(llama_kv_cache|llama_memory)\w*:", ln) and "dev =" not in ln
        ]
        toks = [1] + [(7 * i + 3) % 370 + 3 for i in range(39)]
        arr = (L.llama_token * len(toks))(*toks)
        rc = L.llama_decode(ctx, L.llama_batch_get_one(arr, len(toks)))
        if rc != 0:
            out["error"] = f"decode returned {rc}"
        else:
            n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
            lp = L.llama_get_logits_ith(ctx, -1)
            logits = np.ctypeslib.as_array(lp, shape=(n_vocab,)).copy()
            out["logits_sha"] = hashlib.sha256(logits.tobytes()).hexdigest()
            out["finite"] = bool(np.isfinite(logits).all())
            out["sizes"] = [
                int(L.llama_state_get_size(ctx)),
                int(L.llama_state_seq_get_size(ctx, 0)),
                int(L.llama_state_seq_get_size_ext(ctx, 0, 1)),
            ]
            out["ok"] = True
        L.llama_free(ctx)

    for line in sys.stdin:
        req = json.loads(line)
        log.clear()
        out: dict[str, Any] = {"ok": False}
        with tempfile.TemporaryDirectory() as td:
            mparams = L.llama_model_default_params()
            if req["kind"] == "init":
                meta_path = os.path.join(td, "meta.gguf")
                write_metadata_only(meta_path, req["arch"], [tuple(x) for x in req["meta"]])
                gctx = ggml.gguf_init_from_file(meta_path.encode(), GgufInitParams(True, None))
                model = L.llama_model_init_from_user(gctx, set_data, None, mparams)
                ggml.gguf_free(gctx)
            else:
                model = L.llama_model_load_from_file(req["path"].encode(), mparams)
            if not model:
                out["error"] = "model creation failed"
            else:
                if req["kind"] == "init":
                    saved = os.path.join(td, "saved.gguf")
                    L.llama_model_save_to_file(model, saved.encode())
                    out["saved"] = _describe(saved)
                decode_and_measure(model, out)
                L.llama_model_free(model)
        out["log_tail"] = [ln for ln in log if "error" in ln.lower() or "failed" in ln.lower()][-8:]
        results.write(json.dumps(out) + "\n")
        results.flush()


def _describe(path: str) -> dict[str, Any]:
    import gguf

    r = gguf.GGUFReader(path)
    kv: dict[str, Any] = {}
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name == "general.name":
            continue
        val = field.contents()
        if isinstance(val, float):
            val = round(val, 6)
        kv[name] = val
    tensors = [[t.name, [int(x) for x in t.shape], t.tensor_type.name] for t in r.tensors]
    return {"kv": kv, "tensors": tensors}


# ---------------------------------------------------------------------------------------------
# parent


class Child:
    def __init__(self, lib_dir: str) -> None:
        self.lib_dir = lib_dir
        self.proc: subprocess.Popen[str] | None = None

    def _start(self) -> subprocess.Popen[str]:
        env = dict(os.environ, LLAMA_CPP_LIB_PATH=self.lib_dir)
        return subprocess.Popen(
            [sys.executable, __file__, "--child", self.lib_dir],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None if os.environ.get("KVSCOPE_PROBE_DEBUG") else subprocess.DEVNULL,
            text=True,
            env=env,
        )

    def check(self, arch: str, meta: Meta) -> dict[str, Any]:
        return self.request({"kind": "init", "arch": arch, "meta": meta})

    def load(self, path: str) -> dict[str, Any]:
        return self.request({"kind": "load", "path": path})

    def request(self, req: dict[str, Any]) -> dict[str, Any]:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            rc = self.proc.returncode
            self.proc = None
            return {"ok": False, "error": f"child died (rc {rc})"}
        return json.loads(line)  # type: ignore[no-any-return]

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


def _same(a: dict[str, Any], b: dict[str, Any], removed: set[str]) -> bool:
    """``b`` (built without the keys ``removed``) is the same model as ``a``: same tensors, memory and
    logits, and the same saved metadata apart from the removed keys themselves."""
    if not (a.get("ok") and b.get("ok")):
        return False
    kv_a = {k: v for k, v in a["saved"]["kv"].items() if k not in removed}
    kv_b = {k: v for k, v in b["saved"]["kv"].items() if k not in removed}
    return bool(
        kv_a == kv_b
        and a["saved"]["tensors"] == b["saved"]["tensors"]
        and a["logits_sha"] == b["logits_sha"]
        and a["mem_log"] == b["mem_log"]
        and a["sizes"] == b["sizes"]
    )


# kept even where llama.cpp derives the same value without them: converted models carry them
_KEEP = (".attention.head_count_kv", ".attention.key_length", ".attention.value_length")


def _unprunable(key: str) -> bool:
    return key.startswith(("general.", "tokenizer.")) or key.endswith(_KEEP)


def _group(name: str) -> str:
    return re.sub(r"^blk\.\d+\.", "blk.{i}.", name)


def _measure(rec: dict[str, Any], children: dict[str, Child], td: str) -> dict[str, dict[str, Any]]:
    from kvscope.core.modelgen.recipes import recipe_from_dict
    from kvscope.core.modelgen.write import write_model

    path = os.path.join(td, f"{rec['model']}.gguf")
    write_model(recipe_from_dict(rec), path)
    return {n: ch.load(path) for n, ch in children.items()}


def _signature(res: dict[str, dict[str, Any]]) -> Any:
    if not all(r.get("ok") and r.get("finite") for r in res.values()):
        return None
    return {n: (r["mem_log"], r["sizes"]) for n, r in res.items()}


def probe(model: str, children: dict[str, Child], prune: bool) -> dict[str, Any]:
    from kvscope.core.modelgen.tokenizer import TOKENIZER_META

    arch = SEEDS[model]["arch"]
    meta: Meta = [(k.replace("{a}", arch), t, v) for k, t, v in superset(model)] + list(TOKENIZER_META)
    base = {name: ch.check(arch, meta) for name, ch in children.items()}
    for name, res in base.items():
        if not res.get("ok") or not res.get("finite"):
            raise SystemExit(f"{model}: build {name}: {res.get('error')} {res.get('log_tail')}")
    if prune:
        removed: set[str] = set()
        for key, _vtype, _value in list(meta):
            if _unprunable(key):
                continue
            trial = [x for x in meta if x[0] != key]
            if all(_same(base[n], ch.check(arch, trial), removed | {key}) for n, ch in children.items()):
                meta = trial
                removed.add(key)
    # tensors both builds create (a build may create optional tensors the other does not know)
    invs = [r["saved"]["tensors"] for r in base.values()]
    common = [t for t in invs[0] if all(t in other for other in invs[1:])]
    rec: dict[str, Any] = {
        "model": model,
        "architecture": arch,
        "memory": SEEDS[model]["memory"],
        "source": (
            "tools/modelgen_probe.py: metadata from tests/test-llama-archs.cpp's get_gguf_ctx, reduced to the keys "
            "that change what llama.cpp builds; tensors as llama_model_init_from_user creates them, less the "
            "optional ones whose absence leaves the memory layout unchanged"
        ),
        "builds": sorted(children),
        "metadata": [[k, t, v] for k, t, v in meta if not k.startswith("tokenizer.")],
        "tensors": [[n, s] for n, s, _ in common],
    }
    with tempfile.TemporaryDirectory() as td:
        full = _measure(rec, children, td)
        sig = _signature(full)
        if sig is None:
            raise SystemExit(f"{model}: the written model does not load/decode: {json.dumps(full)[:2000]}")
        if prune:
            groups = list(dict.fromkeys(_group(n) for n, _ in rec["tensors"]))
            for g in groups:
                if g == "token_embd.weight":
                    continue
                trial = dict(rec, tensors=[t for t in rec["tensors"] if _group(t[0]) != g])
                if _signature(_measure(trial, children, td)) == sig:
                    rec = trial
        final = _measure(rec, children, td)
        if _signature(final) != sig:
            raise SystemExit(f"{model}: the pruned model differs: {json.dumps(final)[:2000]}")
    rec["memory_log"] = {n: r["mem_log"] for n, r in final.items()}
    return rec


def _iter_models(only: list[str] | None) -> Iterator[str]:
    for m in SEEDS:
        if not only or m in only:
            yield m


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--build", nargs="*")
    ap.add_argument("--no-prune", action="store_true")
    ap.add_argument("--print", action="store_true", help="print the recipe instead of writing it")
    args = ap.parse_args(argv)
    if args.child:
        _child(args.child)
        return 0
    from kvscope.core.engine import builds

    names = args.build or [b.name for b in builds.BUILDS]
    children: dict[str, Child] = {}
    for n in names:
        inst = builds.installed(builds.by_name(n))
        if inst is None:
            raise SystemExit(f"build {n} is not built (kvscope llama-build --build {n})")
        children[n] = Child(str(inst.lib_dir))
    try:
        for model in _iter_models(args.only):
            rec = probe(model, children, prune=not args.no_prune)
            text = json.dumps(rec, indent=1) + "\n"
            if args.print:
                print(text)
            else:
                ARCH_DIR.mkdir(parents=True, exist_ok=True)
                (ARCH_DIR / f"{model}.json").write_text(text)
                print(f"{model}: {len(rec['metadata'])} keys, {len(rec['tensors'])} tensors", flush=True)
    finally:
        for ch in children.values():
            ch.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
