"""Reuse after a restore on the trained model (Gemma 3 270M, iSWA, window 512), with real llama-server
slot saves (tests/support/trained.py): the issue's numbers first, then the prediction
(core.analysis.reuse) against the measurement (core.verify.reuse_measure) for f16/q8_0/q4_0 caches, flash
attention on and off, a prompt longer than the window, two slots and both pinned builds, each file
restored with --swa-full off and on."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kvscope.core.analysis.inspection import inspect_file
from kvscope.core.analysis.reuse import ServerSettings, predict_one
from kvscope.core.engine.builds import InstalledBuild
from kvscope.core.engine.server import ServerProcess
from kvscope.core.model.profile import load_model_profile
from kvscope.core.verify.reuse_measure import measure_reuse
from tests.support.trained import N_CTX, SPECS, SlotSpec, prompt_tokens, trained_model, trained_slot


@pytest.mark.parametrize("swa_full", [False, True], ids=["default", "swa-full"])
def test_the_issues_numbers(swa_full: bool, builds: dict[str, InstalledBuild]) -> None:
    """b11434 at default settings: a 265-token prompt and 8 greedy tokens (the slot holds 272), saved,
    erased, restored; the same prompt plus three words is re-processed in full (cache_n 0 of 268),
    and with --swa-full 265 tokens are reused."""
    args = ["--swa-full", "-lv", "4"] if swa_full else ["-lv", "4"]
    with ServerProcess(trained_model(), build="b11434", n_ctx=N_CTX, args=args, timeout_s=180.0) as srv:
        c = srv.client(timeout_s=300.0)
        toks = prompt_tokens(srv, 265)
        c.complete(toks, n_predict=8, temperature=0.0)
        saved = c.slot_save(0, "issue.bin")
        assert saved["n_saved"] == 272
        assert c.slot_erase(0)["n_erased"] == 272
        assert c.slot_restore(0, "issue.bin")["n_restored"] == 272
        again = c.complete([*toks, *c.tokenize(" three more words", add_special=False)], n_predict=1,
                           temperature=0.0)
        log = "\n".join(srv.log_tail(200))
    t = again["timings"]
    if swa_full:
        assert (t["cache_n"], t["prompt_n"]) == (265, 3)
    else:
        assert (t["cache_n"], t["prompt_n"]) == (0, 268)
        assert "forcing full prompt re-processing due to lack of cache data" in log


# both builds, every cache type and flash-attention setting, the long prompt with --swa-full on and off
# when written, two slots; each restored into a server with --swa-full off and on
# (0c1e5709: the long prompt only, the case the window decides; its server is the slower of the two here)
CASES = [s for s in SPECS if s.build == "b11434"] + [
    s for s in SPECS if s.build == "0c1e5709" and s.long and not s.swa_full]


@pytest.mark.parametrize("spec", CASES, ids=[s.name for s in CASES])
def test_prediction_matches_the_server(spec: SlotSpec, builds: dict[str, InstalledBuild], tmp_path: Path) -> None:
    slots = trained_slot(spec)
    profile = load_model_profile(trained_model())
    assert profile.memory_class == "iswa" and profile.n_swa == 512
    for swa_full in (False, True):
        restore_spec = SlotSpec(spec.build, spec.cache_type, spec.flash_attn, swa_full, spec.long, spec.n_parallel)
        for s in slots:
            shutil.copyfile(s.path, tmp_path / s.path.name)
        with ServerProcess(trained_model(), build=spec.build, n_ctx=N_CTX * spec.n_parallel,
                           n_parallel=spec.n_parallel, slot_dir=tmp_path,
                           args=[*restore_spec.server_args(), "--kv-unified" if spec.n_parallel > 1
                                 else "--no-kv-unified"], timeout_s=180.0) as srv:
            c = srv.client(timeout_s=300.0)
            for s in slots:
                insp = inspect_file(s.path, profile)
                assert list(insp.result.tokens) == list(s.tokens)
                predicted = predict_one(insp.result, profile, ServerSettings(swa_full=swa_full))
                assert c.slot_restore(s.id_slot, s.path.name)["n_restored"] == s.n_saved
                measured = measure_reuse(c, s.id_slot, list(s.tokens), log=srv.log_tail)
                where = (spec.name, s.id_slot, swa_full, predicted.line(), measured.line())
                assert (measured.reused_tokens, measured.reprocessed_tokens) == \
                    (predicted.reused_tokens, predicted.reprocessed_tokens), where
                if swa_full:  # the whole SWA cache is kept: every restored token is reused
                    assert predicted.reused_tokens == s.n_saved, where
                else:
                    # the saved SWA cells start within the window of the end (the writer saves only those,
                    # --swa-full or not): nothing is reused, and the server says why
                    assert predicted.reused_tokens == 0 and predicted.fix and "--swa-full" in predicted.fix, where
                    assert measured.reason_from_log and "lack of cache data" in measured.reason, where
