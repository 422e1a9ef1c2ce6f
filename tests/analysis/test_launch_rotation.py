"""The load answer includes the launch (issue #28 B): b11434's ``state_read_data`` compares a file's
``n_rot_k``/``n_rot_v`` with the ones its cache computed, and ``LLAMA_ATTN_ROT_DISABLE=1`` (read in
``llama_kv_cache``'s constructor) changes those. Real b11434 files saved with and without it
(tests/data/gen-b11434, scenarios C and D: q8_0 K and V) are answered for both launches.

Measured on b11434's llama-server (Gemma 3 270M, q8_0, a slot saved with LLAMA_ATTN_ROT_DISABLE=1,
2026-12-07): a default server refuses the restore (HTTP 400, log "state_read_data: incompatible key rotation
(0 instead of 256)"); a server started with LLAMA_ATTN_ROT_DISABLE=1 restores it."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvharness.fixtures import DATA
from kvscope.core.analysis.compat import ROT_DISABLE_ENV, compat_text
from kvscope.core.analysis.inspection import inspect_source
from kvscope.core.fleet.scanfile import scan_file
from kvscope.core.fleet.summary import format_line
from kvscope.core.model.profile import load_model_profile
from kvscope.core.reader.source import ByteSource

GEN = DATA / "gen-b11434"
LLAMA = DATA / "gen-models" / "llama.gguf"
NOROT = GEN / "llama-q8_0-fa1-unified0-norot-seq0.seqstate"  # saved with LLAMA_ATTN_ROT_DISABLE=1
ROT = GEN / "llama-q8_0-fa1-unified0-seq0.seqstate"  # the same tokens, a default launch (n_rot_k = n_rot_v = 64)


def _inspect(path: Path, model: Path | None = LLAMA):  # type: ignore[no-untyped-def]
    prof = load_model_profile(model) if model is not None else None
    return inspect_source(ByteSource(path.read_bytes()), prof)


def _v4(ins):  # type: ignore[no-untyped-def]
    return next(c for c in ins.compatibility if c.generation == "2026-10-v4")


def test_rotation_disabled_file_refuses_on_a_default_launch() -> None:
    ins = _inspect(NOROT)
    v4 = _v4(ins)
    assert v4.loads is False and v4.stage == "memory"
    assert v4.answer == ("refuses on a default launch (state_read_data: incompatible key rotation (0 instead of 64)); "
                         f"loads with {ROT_DISABLE_ENV}")
    assert (v4.launch_env, v4.launch_answer) == (ROT_DISABLE_ENV, "loads")
    assert any(line.endswith(v4.answer) for line in compat_text(ins.compatibility))
    lib, srv = (a for a in ins.consumers() if a.build == "b11434")
    assert lib.answer == "refuses" and lib.message == v4.answer
    assert srv.answer == "refuses" and srv.message.endswith(f"started with {ROT_DISABLE_ENV} it restores the slot)")
    reuse = [e for e in ins.reuse_prediction() if e.build == "b11434"]
    assert all(e.restores is False and e.fix == f"start llama-server with {ROT_DISABLE_ENV}" for e in reuse)
    assert ROT_DISABLE_ENV in reuse[0].line()


def test_rotated_file_refuses_on_a_launch_with_rotation_disabled() -> None:
    ins = _inspect(ROT)
    v4 = _v4(ins)
    assert v4.loads is True and v4.answer == "loads"
    assert v4.launch_env == ROT_DISABLE_ENV
    assert v4.launch_answer == "state_read_data: incompatible key rotation (64 instead of 0)"
    line = next(line for line in compat_text(ins.compatibility) if "2026-10-v4" in line)
    assert line.endswith(f"loads on a default launch; refuses with {ROT_DISABLE_ENV}: {v4.launch_answer}")
    lib, srv = (a for a in ins.consumers() if a.build == "b11434")
    assert lib.answer == srv.answer == "loads" and ROT_DISABLE_ENV in lib.message and ROT_DISABLE_ENV in srv.message


def test_without_the_model_a_file_without_rotation_is_unknown_on_a_default_launch() -> None:
    """Whether a default launch rotates q8_0 K rows depends on the head size (a multiple of 64), which the
    bytes do not hold: the answer says what is known (it loads with rotation disabled)."""
    v4 = _v4(_inspect(NOROT, None))
    assert v4.loads is None and v4.answer.startswith(f"loads with {ROT_DISABLE_ENV}") and "--model" in v4.answer
    rot = _v4(_inspect(ROT, None))  # a rotated file's fields are a default launch's
    assert rot.loads is True and rot.launch_answer == "state_read_data: incompatible key rotation (64 instead of 0)"


def test_indexer_rotation_is_forced_on_both_launches() -> None:
    """DeepSeek32's lightning-indexer cache rotates its K rows whatever the environment (128 in the file
    saved with LLAMA_ATTN_ROT_DISABLE=1): only the main cache's fields decide."""
    ins = _inspect(GEN / "deepseek32-q8_0-fa1-unified0-norot-seq0.seqstate", DATA / "gen-models" / "deepseek32.gguf")
    v4 = _v4(ins)
    assert v4.loads is False and v4.launch_answer == "loads" and "(0 instead of 64)" in v4.answer


def test_scan_target_says_the_launch() -> None:
    r = scan_file(str(NOROT), str(LLAMA), "2026-10-v4")
    assert r["target"]["status"] == "unknown"
    assert r["target"]["reason"].startswith("refuses on a default launch") and ROT_DISABLE_ENV in r["target"]["reason"]
    assert f"loads with {ROT_DISABLE_ENV}" in format_line(r, NOROT.name)


@pytest.mark.slow  # every real b11434 fixture
@pytest.mark.parametrize("folder", ["gen-b11434", "variants-b11434"])
def test_every_real_b11434_file_is_answered_for_the_launch_that_wrote_it(folder: str) -> None:
    """Over every b11434 fixture with its model (per-sequence files and blobs, context blobs, sessions): a file
    written by a default launch loads on one; a file written with LLAMA_ATTN_ROT_DISABLE=1 loads with it (on a
    default launch too where that launch computes no rotation either, e.g. f16 V or a head size not 64·k)."""
    import json

    man = json.loads((DATA / folder / "manifest.json").read_text())
    checked = refused_default = 0
    profiles: dict[str, object] = {}
    for f in man["files"]:
        path = DATA / folder / f["file"]
        if not path.exists():
            continue
        model = str((DATA / folder / f["model_file"]).resolve())
        if model not in profiles:
            profiles[model] = load_model_profile(model)
        disabled = ((f.get("context_params") or {}).get("env") or {}).get("LLAMA_ATTN_ROT_DISABLE") == "1"
        v4 = _v4(inspect_source(ByteSource(path.read_bytes()), profiles[model]))  # type: ignore[arg-type]
        checked += 1
        if disabled:
            assert v4.loads or (v4.loads is False and v4.launch_answer == "loads"), (f["file"], v4.answer)
            refused_default += v4.loads is False
        else:
            assert v4.loads is True, (f["file"], v4.answer)
    assert checked > 50 and refused_default > 10
