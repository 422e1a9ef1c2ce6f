"""Shared helpers of the memory-core tests: manifest scenarios, contexts, small synthetic models."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from kvharness.fixtures import FOLDER_GENERATION, entry_profile, load_manifest, manifests
from kvscope.core.memory import ContextParams, MemoryContext, MemorySpec
from kvscope.core.memory.spec import SWA_STANDARD, AttnLayer, CacheSpec, Dsv4Block, Dsv4Spec


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
        rot_disabled=(cp.get("env") or {}).get("LLAMA_ATTN_ROT_DISABLE") == "1",
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
    ctx = MemoryContext.create(entry_profile(folder / ctx_entry["file"], ctx_entry),
                               params_from_manifest(ctx_entry["context_params"]), gen)
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


# -- small synthetic models of the composite classes of the 2026-10 builds --------------------------


def _k_only(role: str, ils: tuple[int, ...], width: int, **kw: object) -> CacheSpec:
    return CacheSpec(role, tuple(AttnLayer(il, width, 0) for il in ils), head_k=(width,) * len(ils),
                     **kw)  # type: ignore[arg-type]


def _kv(role: str, ils: tuple[int, ...], k: int, v: int, **kw: object) -> CacheSpec:
    return CacheSpec(role, tuple(AttnLayer(il, k, v) for il in ils), head_k=(k,) * len(ils), head_v=(v,) * len(ils),
                     **kw)  # type: ignore[arg-type]


def class_spec(memory_class: str) -> MemorySpec:
    """A small model of one of the newer memory classes (head sizes 64: quantized caches rotate).

    ``hybrid_iswa0`` is a hybrid-iSWA memory whose base cache holds no layer (LFM2 with SWA).
    """
    if memory_class == "dsa":
        caches = (_k_only("kv_mla", (0, 1, 2), 64, ext=False),
                  _k_only("kv_lid", (0, 1), 64, ext=False, rot_forced=True, n_pos_per_embd=1))
        return MemorySpec("test", 3, "dsa", caches[0].layers, caches=caches)
    if memory_class == "dsa_iswa":
        caches = (_k_only("kv_mla", (0,), 64, ext=False, partial_keep=False),
                  _k_only("kv_lid", (0,), 64, ext=False, partial_keep=False, rot_forced=True),
                  _k_only("kv_swa", (1, 2), 64, ext=False, swa=True, size="swa"))
        return MemorySpec("test", 3, "dsa_iswa", caches[0].layers, swa_layers=frozenset({1, 2}), n_swa=3,
                          swa_type=SWA_STANDARD, caches=caches)
    if memory_class == "hybrid_idx":
        caches = (_kv("kv_attn", (1, 3), 64, 64, partial_keep=False),
                  _k_only("kv_idx", (1, 3), 128, partial_keep=False, ext=True, n_pos_per_embd=1))
        return MemorySpec("test", 4, "hybrid_idx", caches[0].layers, recurrent_layers=(0, 2), n_embd_r=16,
                          n_embd_s=8, n_pos_per_embd=4, has_ple=True, caches=caches, ple_layers=(0,), n_embd_p=96)
    if memory_class == "msa":
        caches = (_kv("kv_base", (0, 1, 2), 64, 64), _kv("kv_idx", (1, 2), 128, 64, ext=False))
        return MemorySpec("test", 3, "msa", caches[0].layers, caches=caches)
    if memory_class == "dsv4":
        caches = (_k_only("kv_raw_base", (), 64, unified=False, ext=False, partial_keep=False),
                  _k_only("kv_raw_swa", (0, 1, 2, 3), 64, unified=False, ext=False, swa=True, size="swa"))
        blocks = Dsv4Spec(
            (Dsv4Block("kcache_csa", "kcache", (2,), 4, 64), Dsv4Block("kcache_hca", "kcache", (3,), 128, 64),
             Dsv4Block("kcache_lid", "kcache", (2,), 4, 128)),
            (Dsv4Block("comp_csa", "comp", (2,), 4, 0, 8, 128), Dsv4Block("comp_hca", "comp", (3,), 128, 0, 128, 64),
             Dsv4Block("comp_lid", "comp", (2,), 4, 0, 8, 256)))
        return MemorySpec("test", 4, "dsv4", (), swa_layers=frozenset(range(4)), n_swa=3, swa_type=SWA_STANDARD,
                          caches=caches, dsv4=blocks)
    if memory_class == "hybrid_iswa0":
        caches = (_kv("kv_base", (), 64, 64, partial_keep=False), _kv("kv_swa", (1, 3), 64, 64, swa=True, size="swa"))
        return MemorySpec("test", 4, "hybrid_iswa", caches[1].layers, swa_layers=frozenset({1, 3}), n_swa=2,
                          swa_type=SWA_STANDARD, recurrent_layers=(0, 2), n_embd_r=16, n_embd_s=8, caches=caches)
    raise ValueError(memory_class)
