"""verify --engine server measures llama-server's reuse of the restored slot (#18 item 1): the JSON
key ``reuse`` with the server's own accounting, the text line, on a server kvscope starts (whose log
gives the reason) and on the user's --server; the measurement agrees with inspect's prediction."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kvharness.fixtures import DATA
from kvscope.core.analysis.inspection import inspect_file
from kvscope.core.analysis.reuse import ServerSettings, predict_one
from kvscope.core.cli.main import main
from kvscope.core.engine.builds import InstalledBuild
from kvscope.core.engine.server import ServerProcess
from kvscope.core.model.profile import load_model_profile
from kvscope.core.verify.run import verify

GEN = DATA / "gen-b11434"
MODELS = DATA / "gen-models"


@pytest.mark.parametrize("model", ["llama", "gemma2", "mamba", "lfm2-swa"])
def test_started_server_reuse_is_measured_and_predicted(model: str, builds: dict[str, InstalledBuild],
                                                        tmp_path: Path) -> None:
    slot = tmp_path / "slot.bin"
    shutil.copyfile(GEN / f"{model}-f16-fa0-unified0-slot.seqstate", slot)
    r = verify(slot, MODELS / f"{model}.gguf", engine="server", build="b11434")
    assert r.restore is not None and r.restore.ok and r.reuse is not None
    n = len(inspect_file(slot).result.tokens)
    assert r.reuse["restored_tokens"] == n and r.reuse["prompt_tokens"] == n + 1
    assert r.reuse["swa_full"] is True  # verify's own server keeps the whole SWA cache
    profile = load_model_profile(MODELS / f"{model}.gguf")
    want = predict_one(inspect_file(slot, profile).result, profile, ServerSettings(swa_full=True))
    assert (r.reuse["reused_tokens"], r.reuse["reprocessed_tokens"]) == (want.reused_tokens, want.reprocessed_tokens)
    assert r.to_json()["reuse"] == r.reuse


def test_a_slot_the_users_server_re_processes(builds: dict[str, InstalledBuild], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """gemma2 (iSWA, window 16) at the server's defaults but flash attention (the file's V is transposed):
    the restore succeeds and all 9 tokens are re-processed; the user's server gives kvscope no log, so
    the reason is the numbers'."""
    model = MODELS / "gemma2.gguf"
    with ServerProcess(model, build="b11434", n_ctx=256, slot_dir=tmp_path, args=["-fa", "off"]) as srv:
        shutil.copyfile(GEN / "gemma2-f16-fa0-unified0-slot.seqstate", tmp_path / "g.bin")
        code = main(["verify", str(tmp_path / "g.bin"), "--model", str(model), "--engine", "server",
                     "--server", srv.url, "--slot-dir", str(tmp_path), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code in (0, 1), doc
    reuse = doc["reuse"]
    assert (reuse["restored_tokens"], reuse["reused_tokens"], reuse["reprocessed_tokens"]) == (9, 0, 9), reuse
    assert reuse["processed_tokens"] == 10 and reuse["swa_full"] is None and not reuse["reason_from_log"]
    assert reuse["line"].startswith("restores, but llama-server re-processes all 9 tokens")


def test_the_text_output_says_it(builds: dict[str, InstalledBuild], tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    slot = tmp_path / "slot.bin"
    shutil.copyfile(GEN / "llama-f16-fa0-unified0-slot.seqstate", slot)
    main(["verify", str(slot), "--model", str(MODELS / "llama.gguf"), "--engine", "server", "--build", "b11434"])
    out = capsys.readouterr().out
    assert "reuse: llama-server reuses 12 of 12 restored tokens" in out, out


def test_swa_full_off_in_kvscopes_server_names_the_servers_reason(builds: dict[str, InstalledBuild],
                                                                  tmp_path: Path) -> None:
    slot = tmp_path / "slot.bin"
    shutil.copyfile(GEN / "gemma2-f16-fa0-unified0-slot.seqstate", slot)
    r = verify(slot, MODELS / "gemma2.gguf", engine="server", build="b11434", overrides={"swa_full": "false"})
    assert r.reuse is not None and r.reuse["swa_full"] is False
    assert (r.reuse["reused_tokens"], r.reuse["reprocessed_tokens"]) == (0, 9)
    assert r.reuse["reason_from_log"] and r.reuse["reason"].startswith(
        "forcing full prompt re-processing due to lack of cache data"), r.reuse


def test_the_overview_predicts_and_a_verify_replaces_what_it_measured(builds: dict[str, InstalledBuild],
                                                                       tmp_path: Path) -> None:
    from kvscope.core.analysis.compat import compatibility
    from kvscope.core.analysis.overview import build_overview

    slot = tmp_path / "slot.bin"
    shutil.copyfile(GEN / "gemma2-f16-fa0-unified0-slot.seqstate", slot)
    profile = load_model_profile(MODELS / "gemma2.gguf")
    res = inspect_file(slot, profile).result
    compat = compatibility(res, profile)
    ov = build_overview(res, profile, compat)
    lines = ov.reuse_lines()
    assert len(lines) == 4 and ov.to_json()["reuse_text"] == lines
    assert lines[0].startswith("llama-server 0c1e5709: refuses the slot: Unable to restore slot")
    assert lines[2].startswith("llama-server b11434: restores, but re-processes all 9 tokens: forcing full prompt")
    assert lines[3].startswith("llama-server b11434 --swa-full: reuses 9 of 9 tokens")
    assert ("llama-server reuse", "; ".join(lines)) in ov.rows()
    r = verify(slot, MODELS / "gemma2.gguf", engine="server", build="b11434", overrides={"swa_full": "false"})
    after = build_overview(res, profile, compat, r.to_json()).reuse_lines()
    assert after[2].startswith("llama-server b11434: measured by Verify (replaces the prediction): restores, but "
                               "llama-server re-processes all 9 tokens"), after
    assert after[:2] == lines[:2] and after[3] == lines[3]
    # per consumer: the prediction, then the restore Verify measured in its place
    assert ov.consumer_lines()[3] == "b11434 llama-server: loads"
    assert ov.consumer_lines()[1] == ("0c1e5709 llama-server: refuses: Unable to restore slot: No available space "
                                      "in KV cache or invalid slot save file")
    measured = build_overview(res, profile, compat, r.to_json()).consumer_lines()
    assert measured[3] == "b11434 llama-server: measured by Verify (replaces the prediction): loads", measured
    assert measured[2] == "b11434 libllama: loads"
