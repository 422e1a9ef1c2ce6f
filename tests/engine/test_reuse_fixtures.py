"""Reuse after a restore, predicted (core.analysis.reuse) against measured (core.verify.reuse_measure) on every
memory class the fixture generator writes: each real llama-server slot save under tests/data/gen-*/ is
restored into its own build's llama-server, with and without --swa-full, and continued by three tokens;
the server's timings.cache_n must be what the prediction says, token for token."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from kvharness.fixtures import DATA
from kvscope.core.analysis.inspection import inspect_file
from kvscope.core.analysis.reuse import ServerSettings, predict_one
from kvscope.core.engine.builds import InstalledBuild
from kvscope.core.engine.server import ServerProcess
from kvscope.core.model.profile import load_model_profile
from kvscope.core.verify.reuse_measure import measure_reuse

BUILD_FOLDERS = {"b11434": DATA / "gen-b11434", "0c1e5709": DATA / "gen-0c1e5709"}


def _slots(build: str) -> list[dict[str, Any]]:
    manifest = json.loads((BUILD_FOLDERS[build] / "manifest.json").read_text())
    return [f for f in manifest["files"] if f["file"].endswith("-slot.seqstate")]


CASES = [(b, f["file"]) for b in BUILD_FOLDERS for f in _slots(b)]


@pytest.mark.parametrize("swa_full", [False, True], ids=["default", "swa-full"])
@pytest.mark.parametrize(("build", "name"), CASES, ids=[f"{b}-{n.split('-f16')[0]}" for b, n in CASES])
def test_prediction_matches_the_server(build: str, name: str, swa_full: bool, builds: dict[str, InstalledBuild],
                                       tmp_path: Path) -> None:
    entry = next(f for f in _slots(build) if f["file"] == name)
    folder = BUILD_FOLDERS[build]
    model = (folder / entry["model_file"]).resolve()
    args = [a for a in entry["server"]["args"] if a != "--swa-full"] + (["--swa-full"] if swa_full else [])
    shutil.copyfile(folder / name, tmp_path / "slot.bin")
    profile = load_model_profile(model)
    insp = inspect_file(folder / name, profile)
    predicted = predict_one(insp.result, profile, ServerSettings(swa_full=swa_full))
    with ServerProcess(model, build=build, n_ctx=entry["server"]["n_ctx"], slot_dir=tmp_path,
                       args=[*args, "-lv", "4"]) as srv:
        c = srv.client()
        restored = c.slot_restore(0, "slot.bin")
        assert restored["n_restored"] == len(insp.result.tokens)
        measured = measure_reuse(c, 0, list(insp.result.tokens), log=srv.log_tail)
    assert predicted.restores is True, predicted
    got = (measured.reused_tokens, measured.reprocessed_tokens)
    assert got == (predicted.reused_tokens, predicted.reprocessed_tokens), (predicted.line(), measured.line())
    if predicted.reused_tokens == 0:  # the server says why in its own words
        assert measured.reason_from_log and "forcing full prompt re-processing" in measured.reason, measured
