"""Shared helpers of the memory-core tests: manifest scenarios, contexts, small synthetic models."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from fixtures import FOLDER_GENERATION, load_manifest, manifests, profile
from kvscope.core.memory import ContextParams, MemoryContext, MemorySpec
from kvscope.core.memory.spec import SWA_STANDARD, AttnLayer


def params_from_manifest(cp: dict[str, Any]) -> ContextParams:
    """The context parameters a fixture was written with (2025-05 had one unified cache)."""
    unified = True if cp.get("kv_unified") is None else bool(cp["kv_unified"])
    return ContextParams(
        n_ctx=cp["n_ctx"],
        n_seq_max=cp["n_seq_max"],
        kv_unified=unified,
        flash_attn=bool(cp["flash_attn"]),
        type_k=cp["type_k"],
        type_v=cp.get("type_v") or cp["type_k"],
        swa_full=True if cp.get("swa_full") is None else bool(cp["swa_full"]),
        n_batch=cp.get("n_batch") or 2048,
        n_ubatch=cp.get("n_ubatch") or 512,
    )


def scenarios() -> list[tuple[Path, str, str, list[dict[str, Any]]]]:
    """(folder, generation, model key, files) of every scenario that has a whole-context blob."""
    out = []
    for mf in manifests():
        groups: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
        for e in load_manifest(mf)["files"]:
            groups[(e["model_key"], e["scenario"], json.dumps(e["context_params"], sort_keys=True))].append(e)
        for (key, _, _), files in groups.items():
            if any(e["kind"] == "ctx_blob" for e in files):
                out.append((mf.parent, FOLDER_GENERATION[mf.parent.name], key, files))
    return out


def live_context(folder: Path, gen: str, key: str, files: list[dict[str, Any]]) -> MemoryContext:
    """A context of the scenario's parameters holding its whole-context state."""
    ctx_entry = next(e for e in files if e["kind"] == "ctx_blob")
    ctx = MemoryContext.create(profile(key), params_from_manifest(ctx_entry["context_params"]), gen)
    res = ctx.set_data((folder / ctx_entry["file"]).read_bytes())
    assert res.ok, res
    return ctx


# -- small synthetic models, one per memory class ------------------------------------------------


def spec_of(memory_class: str, ext: bool = False) -> MemorySpec:
    """A small model of ``memory_class`` (or ``kv_mla``: a KV cache with K-only layers), tiny layer widths."""
    n_pos = 4 if ext else 1
    if memory_class == "kv":
        return MemorySpec("test", 3, "kv", (AttnLayer(0, 32, 32), AttnLayer(1, 64, 32), AttnLayer(2, 32, 64)),
                          n_pos_per_embd=n_pos)
    if memory_class == "kv_mla":  # layers 1 and 2 keep no V (K-only layers, as an MLA model's)
        return MemorySpec("test", 3, "kv", (AttnLayer(0, 32, 32), AttnLayer(1, 64, 0), AttnLayer(2, 32, 0)),
                          n_pos_per_embd=n_pos)
    if memory_class == "iswa":
        return MemorySpec("test", 4, "iswa", tuple(AttnLayer(i, 32, 32) for i in range(4)),
                          swa_layers=frozenset({0, 2}), n_swa=3, swa_type=SWA_STANDARD, n_pos_per_embd=n_pos)
    if memory_class == "recurrent":
        return MemorySpec("test", 3, "recurrent", recurrent_layers=(0, 1, 2), n_embd_r=16, n_embd_s=24)
    if memory_class == "hybrid":
        return MemorySpec("test", 4, "hybrid", (AttnLayer(1, 32, 32), AttnLayer(3, 32, 32)),
                          recurrent_layers=(0, 2), n_embd_r=16, n_embd_s=0, n_pos_per_embd=n_pos)
    if memory_class == "hybrid_iswa":
        return MemorySpec("test", 4, "hybrid_iswa", (AttnLayer(1, 32, 32), AttnLayer(3, 32, 32)),
                          swa_layers=frozenset({1}), n_swa=2, swa_type=SWA_STANDARD, recurrent_layers=(0, 2),
                          n_embd_r=16, n_embd_s=8, n_pos_per_embd=n_pos)
    raise ValueError(memory_class)
