"""What ``tools/gen_fixtures.py`` generates: the models, the covering design of context parameters,
the prompts, the file names, and the walker plan of every model (which optional fields llama.cpp
writes for it).

The covering design (per model with an attention cache; recurrent-only models get A and B,
DeepSeek-V4, whose every sequence and stream carries ~100 KB of compressor state, A, C and D, the
latter two unified):

====  ======  ======  ==  =======  ========  ============================================
name  type_k  type_v  fa  unified  rotation  why
====  ======  ======  ==  =======  ========  ============================================
A     f16     f16     0   0        -         transposed V, one stream per sequence
B     f16     f16     1   1        -         row V, one shared stream
C     q8_0    q8_0    1   0        on        rotated quantized K and V
D     q8_0    q8_0    1   0        off       the same tokens as C with LLAMA_ATTN_ROT_DISABLE=1
E     q4_0    f16     0   1        on (K)    quantized K beside a transposed f16 V (MLA models and
                                             DeepSeek-V4 need one type: q4_0/q4_0 with fa 1)
F     q4_0    q4_0    1   1        off       q4_0 on both sides, rotation disabled
====  ======  ======  ==  =======  ========  ============================================

Every pair of (type, fa), (type, unified) and (quantized type, rotation) occurs; the full product
(3 x 3 x 2 x 2 x 2 = 72 contexts per model) would add nothing a reader could tell apart. Every
scenario writes the per-sequence files and blobs and the context blob; the session file (the
context blob behind a token header) is written in scenario B (DeepSeek-V4: A), the llama-server
slot in A.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from state_walker import Plan

from kvscope.core.engine.llamacpp import CtxParams
from kvscope.core.modelgen.recipes import Recipe

# memory classes whose state_write honours LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
PARTIAL_CLASSES = {
    "llama_kv_cache_iswa",
    "llama_memory_hybrid",
    "llama_memory_hybrid_iswa",
    "llama_memory_hybrid_idx",
    "llama_kv_cache_dsa_iswa",
    "llama_kv_cache_dsv4",
}
RECURRENT_ONLY = {"llama_memory_recurrent"}
# architectures whose rope type is M-RoPE/IMROPE (hparams.n_pos_per_embd() > 1): 12-byte cell ext
MROPE_ARCHS = {"qwen2vl", "qwen3vl", "qwen3vlmoe", "qwen35", "qwen35moe", "qwen4exp", "paddleocr"}
# architectures whose KV caches hold K only (hparams.is_mla(): key_length_mla set)
MLA_KEY = ".attention.key_length_mla"

MODELS = (
    "llama",
    "gemma2",
    "mamba",
    "lfm2",
    "lfm2-swa",
    "qwen35",
    "qwen3vl",
    "deepseek32",
    "glm-dsa",
    "dots3note",
    "glm5-next",
    "qwen4exp",
    "minimax-m3",
    "deepseek4",
)


@dataclass(frozen=True)
class Scenario:
    """One context configuration of the covering design."""

    name: str
    type_k: str
    type_v: str
    flash_attn: bool
    kv_unified: bool
    rotation: bool  # False = LLAMA_ATTN_ROT_DISABLE=1

    @property
    def tag(self) -> str:
        """The file-name part: ``<ktype>[-v<vtype>]-fa<0|1>-unified<0|1>[-norot]``."""
        t = self.type_k if self.type_v == self.type_k else f"{self.type_k}-v{self.type_v}"
        return f"{t}-fa{int(self.flash_attn)}-unified{int(self.kv_unified)}" + ("" if self.rotation else "-norot")


SCENARIOS = (
    Scenario("A", "f16", "f16", False, False, True),
    Scenario("B", "f16", "f16", True, True, True),
    Scenario("C", "q8_0", "q8_0", True, False, True),
    Scenario("D", "q8_0", "q8_0", True, False, False),
    Scenario("E", "q4_0", "f16", False, True, True),
    Scenario("F", "q4_0", "q4_0", True, True, False),
)


# MLA models and DeepSeek-V4 take one cache type for K and V (llama_init_from_model: "model does not
# support different K and V cache types"): their E quantizes both sides, with flash attention
SAME_TYPE_E = Scenario("E", "q4_0", "q4_0", True, True, True)


def is_mla(recipe: Recipe) -> bool:
    return any(k.endswith(MLA_KEY) for k, _t, _v in recipe.metadata)


def scenarios_for(recipe: Recipe) -> tuple[Scenario, ...]:
    if recipe.memory in RECURRENT_ONLY:
        return SCENARIOS[:2]
    if recipe.memory == "llama_kv_cache_dsv4":
        # ~100 KB of compressor state per sequence and stream whatever its length: A, and the
        # rotation pair C/D in one stream
        return (SCENARIOS[0],) + tuple(replace(sc, kv_unified=True) for sc in SCENARIOS[2:4])
    if is_mla(recipe) or recipe.architecture == "deepseek4":
        return tuple(SAME_TYPE_E if sc.name == "E" else sc for sc in SCENARIOS)
    return SCENARIOS


def seq_lengths(recipe: Recipe) -> tuple[int, ...]:
    """Prompt lengths of sequences 0, 1, 2: longer than the sliding window (16/32) where there is
    one, longer than DeepSeek-V4's 128-token compression block for deepseek4."""
    if recipe.memory == "llama_kv_cache_dsv4":
        return (131, 9)
    if any(k.endswith(".attention.sliding_window") for k, _t, _v in recipe.metadata):
        return (23, 9, 3)
    return (5, 12, 2)


def prompts(recipe: Recipe, seed: int = 7) -> dict[int, list[int]]:
    """Token ids per sequence: BOS, then ids drawn from the vocabulary (deterministic)."""
    rs = np.random.RandomState(seed)
    out = {}
    for sid, n in enumerate(seq_lengths(recipe)):
        out[sid] = [1] + [int(t) for t in rs.randint(3, 379, size=n - 1)]
    return out


SLOT_SCENARIO = "A"


def session_scenario(recipe: Recipe) -> str:
    """The scenario whose context is also saved as a session file."""
    return "B" if any(sc.name == "B" for sc in scenarios_for(recipe)) else "A"


def ctx_params(recipe: Recipe, sc: Scenario, n_seq: int) -> CtxParams:
    n_ctx = 512 if recipe.memory == "llama_kv_cache_dsv4" else 256
    env = () if sc.rotation else (("LLAMA_ATTN_ROT_DISABLE", "1"),)
    return CtxParams(
        n_ctx=n_ctx, n_batch=256, n_ubatch=256, n_seq_max=n_seq, kv_unified=sc.kv_unified,
        flash_attn=sc.flash_attn, type_k=sc.type_k, type_v=sc.type_v, swa_full=True, n_threads=2, env=env,
    )


def _meta(recipe: Recipe, suffix: str) -> Any:
    for k, _t, v in recipe.metadata:
        if k == recipe.architecture + suffix:
            return v
    return None


def recurrent_layers(recipe: Recipe) -> tuple[int, ...]:
    """Model layers that hold recurrent state, by each architecture's load_arch_hparams rule."""
    n_layer = int(_meta(recipe, ".block_count"))
    arch = recipe.architecture
    if recipe.memory in RECURRENT_ONLY:
        return tuple(range(n_layer))
    if arch == "lfm2":
        heads = _meta(recipe, ".attention.head_count")
        return tuple(i for i in range(n_layer) if heads[i] == 0)
    if arch == "glm5-next":
        kv = _meta(recipe, ".attention.head_count_kv")
        return tuple(i for i in range(n_layer) if kv[i] == 0)
    if arch in ("qwen35", "qwen4exp"):
        interval = _meta(recipe, ".full_attention_interval") or 4
        return tuple(i for i in range(n_layer) if (i + 1) % interval != 0)
    return ()


def plan(recipe: Recipe, rot_fields: bool, flags: int) -> Plan:
    """The walker plan of a state of ``recipe``'s model written with ``flags``."""
    mla = is_mla(recipe)
    ple = _meta(recipe, ".ple.layers") if recipe.architecture == "qwen4exp" else None
    no_v: frozenset[str] = frozenset()
    if mla:
        # hparams.is_mla(): every cache of the model (the indexer caches copy the hparams) holds K only
        no_v = frozenset({"kv", "kv_mla", "kv_lid", "kv_swa", "kv_attn", "kv_idx", "kv_base"})
    elif recipe.memory == "llama_kv_cache_dsv4":
        no_v = frozenset({"kv_base", "kv_swa"})  # the raw iSWA cache holds K only (V is K)
    elif recipe.architecture == "qwen4exp":
        no_v = frozenset({"kv_idx"})  # the QSA indexer cache holds keys only
    ext = 12 if recipe.architecture in MROPE_ARCHS or ple else 0
    return Plan(
        memory=recipe.memory,
        flags=flags,
        rot_fields=rot_fields,
        cell_ext_bytes=ext,
        no_v_roles=no_v,
        recr_layers=recurrent_layers(recipe),
        ple_layers=frozenset(ple or ()),
    )


def with_flags(p: Plan, flags: int) -> Plan:
    return replace(p, flags=flags)
