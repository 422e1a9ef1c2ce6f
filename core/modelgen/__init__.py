"""Tiny random-weight GGUF models for every memory class llama.cpp has (fixtures and benchmarks).

Each model key (``model_keys()``: llama, gemma2, mamba, lfm2, lfm2-swa, qwen35, qwen3vl,
deepseek32, glm-dsa, dots3note, glm5-next, qwen4exp, minimax-m3, deepseek4) has a committed recipe
(``archs/<key>.json``: minimal metadata and the tensor inventory llama.cpp creates for it, derived
from the pinned builds by ``tools/modelgen_probe.py``). ``write_model`` turns a recipe into a GGUF
with seeded random weights, byte-identical on every run; no llama.cpp build is needed.
``realistic_llama`` scales the llama recipe to benchmark size. Command line:
``python -m kvscope.core.modelgen --out DIR [--only KEY ...] [--realistic]``.
"""

from kvscope.core.modelgen.realistic import realistic_llama
from kvscope.core.modelgen.recipes import Recipe, load_recipe, model_keys
from kvscope.core.modelgen.write import SEED, write_model

__all__ = ["SEED", "Recipe", "load_recipe", "model_keys", "realistic_llama", "write_model"]
