"""What kvscope knows about llama.cpp architectures: memory class, SWA layout, recurrent state.

llama.cpp decides per architecture which memory a model gets (``create_memory`` in
``src/llama-model.cpp``), which layers use a sliding window and how big recurrent state rows are
(``load_hparams``, ``src/llama-hparams.cpp``), and which models use M-RoPE (``llama_model_rope_type``).
This module keeps that knowledge as a small table of families, every entry naming the llama.cpp
code it mirrors, plus the functions that apply the SWA and recurrent-size rules to GGUF metadata.
Architectures not listed get a plain KV cache over all layers, exactly as llama.cpp's
create_memory() default branch does, unless the GGUF itself says otherwise
(sliding_window_pattern, per-layer head_count_kv, ...).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvscope.core.model.gguf_metadata import GGUFMetadata, GGUFMetadataError

__all__ = [
    "HYBRID_RULES",
    "MROPE_ARCHES",
    "MROPE_IF_SECTIONS_ARCHES",
    "NO_MEMORY_ARCHES",
    "RECURRENT_ARCHES",
    "SPECIAL_CACHE_ARCHES",
    "SWA_DISABLED_ARCHES",
    "SWA_RULES",
    "SwaRule",
    "pattern_layers",
    "recurrent_sizes",
    "swa_setup",
]

# llm_arch_is_recurrent(): llama_memory_recurrent over every layer.
RECURRENT_ARCHES = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})

# llm_arch_is_hybrid(): llama_memory_hybrid (or _iswa), a KV cache for the attention layers then a
# llama_memory_recurrent for the recurrent layers. The value says how llama.cpp marks a layer
# recurrent (hparams.recurrent_layer_arr in load_hparams) and which layers the KV cache holds
# (the filter_attn / filter_recr callbacks in create_memory):
#   "kv0"      recurrent <=> head_count_kv[il] == 0; KV cache = the other layers (default filters)
#   "kv0_ff0"  recurrent <=> head_count_kv[il] == 0 and feed_forward_length[il] == 0; the KV cache
#              holds the non-recurrent layers with feed_forward_length 0 (MLP-only layers hold
#              neither) -- nemotron_h
#   "all"      every layer is recurrent AND has a KV cache entry (parallel attention + SSM) -- falcon-h1
#   "interval" recurrent <=> (il + 1) % full_attention_interval != 0 (default 4) -- qwen3next, qwen35
HYBRID_RULES: dict[str, str] = {
    "jamba": "kv0",
    "plamo2": "kv0",
    "granitehybrid": "kv0",
    "lfm2": "kv0",
    "lfm2moe": "kv0",
    "kimi-linear": "kv0",
    "nemotron_h": "kv0_ff0",
    "nemotron_h_moe": "kv0_ff0",
    "falcon-h1": "all",
    "qwen3next": "interval",
    "qwen35": "interval",
    "qwen35moe": "interval",
    "qwen4exp": "interval",
    "minimax-01": "interval",
    "glm5-next": "kv0",
    "bailingmoe3": "kv0",
    "kimi-k3": "kv0",
}
# full_attention_interval when the GGUF has none (and no attention.recurrent_layers array)
DEFAULT_ATTENTION_INTERVAL: dict[str, int] = {"minimax-01": 8}

# create_memory() returns no memory at all for these (embedding / diffusion models).
NO_MEMORY_ARCHES = frozenset(
    {
        "bert",
        "jina-bert-v2",
        "jina-bert-v3",
        "nomic-bert",
        "nomic-bert-moe",
        "neo-bert",
        "eurobert",
        "modern-bert",
        "wavtokenizer-dec",
        "gemma-embedding",
        "dream",
        "llada",
        "llada-moe",
        "rnd1",
    }
)

# Architectures whose cache is a dedicated class (their plans: kvscope.core.model.memory_plan).
SPECIAL_CACHE_ARCHES: dict[str, str] = {
    "deepseek32": "llama_kv_cache_dsa",
    "glm-dsa": "llama_kv_cache_dsa",
    "hy_v4": "llama_kv_cache_dsa (with indexer.top_k > 0)",
    "dots3note": "llama_kv_cache_dsa_iswa",
    "glm5-next": "llama_memory_hybrid_idx",
    "qwen4exp": "llama_memory_hybrid_idx (llama_memory_hybrid_iswa with SWA)",
    "minimax-m3": "llama_kv_cache_msa",
    "deepseek4": "llama_kv_cache_dsv4",
}


@dataclass(frozen=True)
class SwaRule:
    """How load_hparams() sets up sliding-window attention for one architecture."""

    pattern: int  # hparams.set_swa_pattern(pattern): period of SWA / full layers
    dense_first: bool = False  # set_swa_pattern(pattern, dense_first=true)
    default_n_swa: int = 0  # window when the GGUF has no sliding_window key (0: none)
    forced_n_swa: int = 0  # window llama.cpp uses whatever the GGUF says (0: the GGUF's)
    needs_window_key: bool = False  # SWA only when the GGUF has sliding_window > 0


# llama_hparams::set_swa_pattern(n, dense_first):
#   dense_first=false: layer il is SWA <=> n == 0 or il % n < n - 1   (gemma2, n=2: 0, 2, 4, ... SWA)
#   dense_first=true:  layer il is SWA <=> n == 0 or il % n != 0
# A GGUF {arch}.attention.sliding_window_pattern key (a period, or one bool per layer with true =
# SWA) overrides the table, as newer converters write it.
SWA_RULES: dict[str, SwaRule] = {
    "gemma2": SwaRule(2, default_n_swa=4096),
    "gemma3": SwaRule(6),
    "gemma3n": SwaRule(5),
    "gemma-embedding": SwaRule(6),
    "cohere2": SwaRule(4),
    "gpt-oss": SwaRule(2),
    "olmo2": SwaRule(4, needs_window_key=True),
    "smallthinker": SwaRule(4, dense_first=True, forced_n_swa=4096, needs_window_key=True),
    # exaone4: only the 64-layer (32B) model uses SWA, see swa_setup()
    "exaone4": SwaRule(4, default_n_swa=4096),
    # llama4: chunked attention, 3 chunked : 1 full, window 8192 -- unless sliding_window == 0
    "llama4": SwaRule(4, forced_n_swa=8192),
    # deepseek4: set_swa_pattern(0) -- every layer uses the window (attention.sliding_window)
    "deepseek4": SwaRule(0),
}
# SWA on every attention layer when the GGUF sets attention.sliding_window > 0 (lfm2 load_hparams)
SWA_IF_WINDOW_ON_ATTENTION = frozenset({"lfm2", "lfm2moe"})
# load_hparams() turns SWA off for these even when the GGUF has a sliding window.
SWA_DISABLED_ARCHES = frozenset({"phi3"})

# llama_model_rope_type(): LLAMA_ROPE_TYPE_MROPE / _IMROPE -> hparams.n_pos_per_embd() == 4, and
# every KV cell carries a llama_kv_cell_ext record in the state file.
MROPE_ARCHES = frozenset(
    {"qwen2vl", "paddleocr", "qwen3vl", "qwen3vlmoe", "qwen35", "qwen35moe", "qwen3tts", "qwen4exp", "clef"}
)
# M-RoPE only when rope.dimension_sections is set (hparams.use_mrope()).
MROPE_IF_SECTIONS_ARCHES = frozenset({"glm4", "glm4moe", "hunyuan_vl", "bailingmoe3", "dflash"})


def pattern_layers(n_layer: int, pattern: int, dense_first: bool) -> tuple[int, ...]:
    """Layers llama_hparams::set_swa_pattern(pattern, dense_first) marks as SWA."""
    if dense_first:
        return tuple(il for il in range(n_layer) if pattern == 0 or il % pattern != 0)
    return tuple(il for il in range(n_layer) if pattern == 0 or il % pattern < pattern - 1)


def swa_setup(meta: GGUFMetadata, arch: str, n_layer: int) -> tuple[int, tuple[int, ...]]:
    """(n_swa, swa_layers) as load_hparams() sets them; (0, ()) when the model has no SWA."""
    if arch in SWA_DISABLED_ARCHES:
        return 0, ()
    window = meta.int_(f"{arch}.attention.sliding_window")
    pattern_key = f"{arch}.attention.sliding_window_pattern"
    rule = SWA_RULES.get(arch)
    if arch == "exaone4" and n_layer != 64 and not meta.has(pattern_key):
        rule = None
    if arch == "llama4" and window == 0:
        return 0, ()
    if rule is not None and rule.needs_window_key and not window:
        return 0, ()

    layers: tuple[int, ...] | None = None
    if meta.has(pattern_key):
        value = meta.values[pattern_key]
        if isinstance(value, np.ndarray):
            flags = meta.int_array(pattern_key)
            assert flags is not None
            if len(flags) != n_layer:
                raise GGUFMetadataError(
                    f"{meta.name}: GGUF key '{pattern_key}' has {len(flags)} entries, "
                    f"the model has {n_layer} layers"
                )
            layers = tuple(il for il, f in enumerate(flags) if f)
        else:
            period = meta.require_int(pattern_key)
            layers = pattern_layers(n_layer, period, rule.dense_first if rule else False)
    elif rule is not None:
        layers = pattern_layers(n_layer, rule.pattern, rule.dense_first)
    if not layers:
        return 0, ()

    if rule is not None and rule.forced_n_swa:
        n_swa = rule.forced_n_swa
    elif window is not None:
        n_swa = window
    else:
        n_swa = rule.default_n_swa if rule is not None else 0
    if n_swa <= 0:
        return 0, ()
    return n_swa, layers


def recurrent_sizes(
    meta: GGUFMetadata, arch: str, n_embd: int, n_head: int = 0, head_dim_k: int = 0
) -> tuple[int, int]:
    """(n_embd_r, n_embd_s): llama_hparams::n_embd_r() / n_embd_s() (``n_head``: layer 0's head count).

    The branches are tried in llama.cpp's order (src/llama-hparams.cpp): RWKV, LFM2 short
    convolution (r only), KDA (Kimi, GLM5-Next, BailingMoE3), MiniMax-01 linear attention (s
    only), then the Mamba / gated delta-net sizes.
    """
    wkv_head_size = meta.int_(f"{arch}.wkv.head_size") or 0
    if wkv_head_size:  # RWKV: token shift rows, wkv state
        token_shift_count = meta.int_(f"{arch}.token_shift_count")
        return (2 if token_shift_count is None else token_shift_count) * n_embd, n_embd * wkv_head_size
    d_conv = meta.int_(f"{arch}.ssm.conv_kernel") or 0
    d_inner = meta.int_(f"{arch}.ssm.inner_size") or 0
    d_state = meta.int_(f"{arch}.ssm.state_size") or 0
    n_group = meta.int_(f"{arch}.ssm.group_count") or 0
    l_cache = meta.int_(f"{arch}.shortconv.l_cache") or 0
    kda = meta.int_(f"{arch}.kda.head_dim") or 0
    head_la = head_dim_k if arch == "minimax-01" else 0  # n_embd_head_la = n_embd_head_k_full
    if l_cache:  # LFM2 short convolution
        n_embd_r = n_embd * (l_cache - 1)
    elif kda:  # conv state of Q, K, V
        n_embd_r = 3 * (d_conv - 1 if d_conv > 0 else 3) * n_head * kda
    else:  # Mamba: the first conv column is shifted out, so d_conv - 1 columns are kept
        n_embd_r = (d_conv - 1 if d_conv > 0 else 0) * (d_inner + 2 * n_group * d_state)
    if kda:
        n_embd_s = kda * kda * n_head
    elif head_la:
        n_embd_s = head_la * head_la * n_head
    else:
        n_embd_s = d_state * d_inner
    return n_embd_r, n_embd_s
