"""The whole-context state of a fixture scenario, loaded into the core, reproduces every
per-sequence blob and file written from the same context (full and PARTIAL_ONLY), the session
file and the context blob, byte for byte, in all five build folders and both generated folders
(every memory class of the pinned builds).

This checks what the per-sequence writers select (stream, SWA masking, per-seq meta, flags, the
DeepSeek-V4 rows of a sequence) and llama.cpp's cache sizing (the manifests record the sizes the
real build used).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvscope.core.memory import KvCache
from kvscope.core.memory.dsv4 import Dsv4Blocks
from kvscope.core.memory.params import ggml_pad
from tests.support.mem_helpers import live_context, params_from_manifest, scenarios

SCENARIOS = scenarios()


def _id(s: tuple[Path, str, str, list[dict[str, Any]]]) -> str:
    return f"{s[0].name[9:]}:{s[2]}-{s[3][0]['scenario']}"


def test_all_folders_have_scenarios() -> None:
    assert {s[1] for s in SCENARIOS} == {"2025-05", "2025-08", "2026-04", "2026-08", "2026-10", "2026-10-v4"}
    assert {s[0].name for s in SCENARIOS} >= {"gen-0c1e5709", "gen-b11434"}
    assert len(SCENARIOS) >= 100


@pytest.mark.parametrize("scenario", SCENARIOS, ids=_id)
def test_per_sequence_files_from_whole_context(scenario: tuple[Path, str, str, list[dict[str, Any]]]) -> None:
    folder, gen, key, files = scenario
    ctx = live_context(folder, gen, key, files)
    checked = 0
    for e in files:
        data = (folder / e["file"]).read_bytes()
        if e["kind"] == "seq_blob":
            out = ctx.seq_get_data(e["seq_id"], e.get("flags") or 0)
        elif e["kind"] == "seq_file":
            out = ctx.seq_file_bytes(e["seq_id"], e["token_payload"]["tokens"])
        elif e["kind"] == "session":
            out = ctx.session_bytes(e["token_payload"]["tokens"])
        else:
            out = ctx.get_data()
        assert bytes(out) == data, f"{folder.name}/{e['file']}"
        checked += 1
    assert checked == len(files)


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s[1] == "2026-10" and s[0].name.startswith("llamacpp")],
                         ids=_id)
def test_cache_sizes_follow_llama_cpp(scenario: tuple[Path, str, str, list[dict[str, Any]]]) -> None:
    _, _, key, files = scenario
    cp = files[0]["context_params"]
    params = params_from_manifest(cp)
    assert params.n_ctx_actual == cp["n_ctx_actual"]
    assert params.n_ctx_seq == cp["n_ctx_seq_actual"]
    ctx = live_context(*scenario)
    for part in ctx.memory.parts:
        if not isinstance(part.mem, KvCache):
            assert isinstance(part.mem, Dsv4Blocks) or part.mem.size == params.n_seq_max
        elif part.role == "kv_swa" and not cp["swa_full"]:
            n_swa = ctx.memory.spec.n_swa
            want = ggml_pad(min(cp["n_ctx_seq_actual"], n_swa * params.n_seq_max + cp["n_ubatch"]), 256)
            assert part.mem.size == want
        else:
            assert part.mem.size == cp["n_ctx_seq_actual"]
            assert part.mem.n_stream == (1 if cp["kv_unified"] else cp["n_seq_max"])


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s[0].name.startswith("gen-")], ids=_id)
def test_every_cache_as_the_build_made_it(scenario: tuple[Path, str, str, list[dict[str, Any]]]) -> None:
    """Cells, layers and streams of every llama_kv_cache the build logged, in its order (DeepSeek-V4: the
    raw pair, then its compressed caches)."""
    _, _, _, files = scenario
    built = files[0]["expected_layout"]["kv_caches_built"]
    ctx = live_context(*scenario)
    mine = [(c.size, len(c.layers), c.n_stream) for c in ctx.memory.kv_caches()]
    if ctx.memory.memory_class == "dsv4":
        blocks = ctx.memory.dsv4()
        mine += [(size, len(b.layers), blocks.n_stream) for size, b in zip(blocks.sizes, blocks.spec.kcaches,
                                                                             strict=True)]
    assert mine == [(c["cells"], c["layers"], c["n_stream"]) for c in built]
