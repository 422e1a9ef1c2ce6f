"""Proof of the v3 -> v4 migration on real llama.cpp: files written by 0c1e5709, migrated by
kvscope, load in the b11434 build, and the restored state gives the same next-token logits as a
fresh prefill of the same tokens in that build. The unmigrated file is refused, as llama.cpp
refuses a foreign version.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvharness.fixtures import DATA, load_manifest, profile
from kvscope.core.analysis.compat import compatibility
from kvscope.core.convert.to_generation import plan_migration, write_plan
from kvscope.core.engine.llamacpp import PARTIAL_ONLY, CtxParams, LlamaProcess
from kvscope.core.reader.parse import read_state

V3 = DATA / "llamacpp-2026-10-01"
MANIFEST = load_manifest(V3 / "manifest.json")
# one file of every kind and memory class the 0c1e5709 fixtures have (PARTIAL_ONLY blobs included)
CASES = [
    "llama-f16-fa0-unified0-seq1.seqstate",
    "llama-f16-fa1-unified1-seq2.seqdata.bin",
    "llama-q8_0-fa1-unified0-seq0.seqdata.bin",
    "llama-f16-fa0-unified0-ctx.state.bin",
    "llama-f16-fa1-unified1-ctx.session",
    "gemma2-f16-fa0-unified0-swafull1-seq0.seqstate",
    "gemma2-f16-fa0-unified0-swafull1-seq1-partial.seqdata.bin",
    "gemma2-f16-fa0-unified1-swafull0-ctx.session",
    "lfm2-f16-fa0-unified0-seq1.seqdata.bin",
    "lfm2-f16-fa0-unified0-seq0-partial.seqdata.bin",
    "lfm2-f16-fa0-unified0-ctx.state.bin",
    "mamba-f32state-n3-seq2.seqstate",
    "mamba-f32state-n3-ctx.session",
]
NEXT_TOKEN = 42
TOL = 1e-3


def _entry(name: str) -> dict[str, Any]:
    return next(e for e in MANIFEST["files"] if e["file"] == name)


def _ctx(entry: dict[str, Any]) -> CtxParams:
    c = entry["context_params"]
    return CtxParams(n_ctx=c["n_ctx"], n_batch=c["n_batch"], n_ubatch=c["n_ubatch"], n_seq_max=c["n_seq_max"],
                     kv_unified=c["kv_unified"], flash_attn=c["flash_attn"], type_k=c["type_k"], type_v=c["type_v"],
                     swa_full=c["swa_full"])


def _restore(eng: LlamaProcess, entry: dict[str, Any], path: Path) -> None:
    kind, seq = entry["kind"], int(entry.get("seq_id") or 0)
    flags = PARTIAL_ONLY if entry.get("flags") == 1 else 0
    size = path.stat().st_size
    if kind == "seq_blob":
        out = eng.state_seq_set_data(path.read_bytes(), seq, flags)
        assert out.ok and out.rc == size, out.log
    elif kind == "ctx_blob":
        out = eng.state_set_data(path.read_bytes())
        assert out.ok and out.rc == size, out.log
    elif kind == "seq_file":
        out = eng.state_seq_load_file(path, seq, 4096)
        assert out.ok and out.value is not None, out.log
    else:
        out = eng.state_load_file(path, 4096)
        assert out.ok and out.value is not None, out.log


def _seqs(entry: dict[str, Any]) -> dict[int, list[int]]:
    return {int(s): v["token_ids"] for s, v in entry["seqs"].items() if v["n_tokens"]}


@pytest.mark.parametrize("name", CASES)
def test_migrated_file_loads_in_b11434_and_matches_a_fresh_prefill(name: str, tmp_path: Path,
                                                                  builds: dict[str, Any]) -> None:
    entry = _entry(name)
    src = V3 / name
    prof = profile(entry["model_key"])
    res = read_state(src, profile=prof, layout="2026-10")
    assert res.n_errors == 0
    plan = plan_migration(res, "2026-10-v4", prof)
    assert plan.supported and plan.exact, plan.missing
    dst = tmp_path / name
    with open(dst, "wb") as fh:
        write_plan(plan, src, fh)
    model = str(DATA / "llamacpp-2026-10-01" / f"tiny-{entry['model_key']}.gguf")
    ctx = _ctx(entry)
    seqs = _seqs(entry)
    if entry["kind"] in ("seq_file", "seq_blob"):
        seqs = {int(entry.get("seq_id") or 0): seqs[int(entry.get("seq_id") or 0)]} if seqs else {}
    partial = entry.get("flags") == 1
    predicted = {c.generation: c for c in compatibility(res, prof)}["2026-10-v4"]
    with LlamaProcess(model, ctx, build="b11434") as eng:
        # the unmigrated file: llama.cpp answers what kvscope's compatibility says it would
        if entry["kind"] in ("seq_file", "session"):
            refused = (eng.state_seq_load_file(src, 0, 4096) if entry["kind"] == "seq_file"
                       else eng.state_load_file(src, 4096))
            assert refused.value is None
        elif entry["kind"] == "seq_blob":
            refused = eng.state_seq_set_data(src.read_bytes(), int(entry.get("seq_id") or 0),
                                             PARTIAL_ONLY if entry.get("flags") == 1 else 0)
        else:
            refused = eng.state_set_data(src.read_bytes())
        if predicted.loads is False:
            assert not refused.rc
            said = predicted.answer.split(": ", 1)[1]
            assert any(said in line for line in refused.log), (predicted.answer, refused.log)
        else:  # recurrent-only states have no KV data header: the two layouts are the same bytes
            assert predicted.loads and refused.rc
            eng.memory_clear()
        if partial:  # a PARTIAL_ONLY blob restores into a sequence whose full state is there
            for s, toks in seqs.items():
                assert eng.decode(s, toks).ok
        _restore(eng, entry, dst)
        restored = {s: eng.decode(s, [NEXT_TOKEN], len(t)).value for s, t in seqs.items()}
    with LlamaProcess(model, ctx, build="b11434") as fresh:
        for s, toks in seqs.items():
            assert fresh.decode(s, toks).ok
        prefill = {s: fresh.decode(s, [NEXT_TOKEN], len(t)).value for s, t in seqs.items()}
    assert seqs
    for s in seqs:
        a, b = np.asarray(restored[s]), np.asarray(prefill[s])
        assert a.shape == b.shape and np.isfinite(a).all()
        assert float(np.max(np.abs(a - b))) <= TOL * max(1.0, float(np.max(np.abs(b)))), (s, np.max(np.abs(a - b)))
        assert int(np.argmax(a)) == int(np.argmax(b))
