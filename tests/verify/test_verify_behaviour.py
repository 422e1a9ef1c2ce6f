"""The behaviour part of verify's verdict (#17 item 2) and the calibration's schedules.

The qwen4exp (``llama_memory_hybrid_idx``) partial per-sequence states written by b11434 restore
without an error and their records match, but the next tokens' logits after the restore differ
from a fresh prefill's by up to 2.1 (KL up to 0.2): verify says ``diverges`` (exit 1), naming the
step. The unit tests pin the step rule (floors, the schedules' own figures, a margin) and the
schedules' token ranges.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvharness.fixtures import DATA
from kvscope.core.analysis.verdict import VERIFY_VERDICT_LEVEL
from kvscope.core.cli.main import main
from kvscope.core.engine.builds import InstalledBuild
from kvscope.core.verify.behaviour import KL_FLOOR, MARGIN, Behaviour, StepCheck, judge
from kvscope.core.verify.calibrate import SCHEDULES
from kvscope.core.verify.engines import Logits
from kvscope.core.verify.prefill import WHOLE, Schedule
from kvscope.core.verify.result import VERDICTS
from kvscope.core.verify.run import verify

GEN = DATA / "gen-b11434"
QWEN4EXP = DATA / "gen-models/qwen4exp.gguf"


def _tokens(name: str) -> list[int]:
    man = {e["file"]: e for e in json.loads((GEN / "manifest.json").read_text())["files"]}[name]
    return [int(t) for t in next(iter(man["seqs"].values()))["token_ids"]]


@pytest.mark.parametrize("seq", [0, 1, 2])
def test_a_partial_hybrid_idx_state_diverges(seq: int, builds: dict[str, InstalledBuild],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    name = f"qwen4exp-f16-fa0-unified0-seq{seq}-partial.seqdata.bin"
    toks = _tokens(name)
    r = verify(GEN / name, QWEN4EXP, tokens=toks)
    assert r.restore is not None and r.restore.ok
    assert r.comparison is not None and r.comparison.all_match  # the records it holds are right
    assert r.behaviour is not None and r.behaviour.diverges
    first = r.behaviour.first_beyond
    assert first is not None and first.step == 0 and first.kl is not None and first.kl > 0.05
    assert r.verdict == "diverges", r.reasons
    assert "step 0" in r.reasons[0] and "KL" in r.reasons[0]
    rc = main(["verify", str(GEN / name), "--model", str(QWEN4EXP), "--tokens", ",".join(map(str, toks)), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1 and doc["verdict"] == "diverges" and doc["behaviour"]["first_step_beyond"] == 0
    full = verify(GEN / f"qwen4exp-f16-fa0-unified0-seq{seq}.seqstate", QWEN4EXP)  # the whole sequence: ok
    assert full.verdict == "ok" and full.behaviour is not None and not full.behaviour.diverges


def _lg(values: list[float]) -> Logits:
    return Logits(values=np.array(values, dtype=np.float32))


def test_a_step_diverges_only_beyond_the_schedules_own_figures_and_the_floors() -> None:
    base = [4.0, 2.0, 1.0, 0.5, 0.0]
    fresh = [_lg(base)] * 3
    same = judge(0, [1, 2, 3], fresh, list(fresh), {})
    assert not same.diverges and same.limit_kl == KL_FLOOR
    tiny = [_lg([b + 1e-4 * i for i, b in enumerate(base)])] * 3  # below the floors: never a divergence
    assert not judge(0, [1, 2, 3], fresh, tiny, {}).diverges
    off = [_lg(base), _lg([0.0, 2.0, 4.0, 0.5, 0.0]), _lg(base)]  # step 1 swaps the favourite
    b = judge(0, [1, 2, 3], fresh, off, {})
    assert b.diverges and b.first_beyond is not None and b.first_beyond.step == 1
    assert b.first_beyond.same_argmax is False and "step 1" in b.summary()
    noisy = {"tail": [_lg(base), _lg([0.0, 2.0, 4.0, 0.5, 0.0]), _lg(base)]}  # the engine itself varies as much
    c = judge(0, [1, 2, 3], fresh, off, noisy)
    assert not c.diverges and c.limit_kl == pytest.approx(MARGIN * c.spread_kl)
    nan = [_lg(base), _lg([float("nan")] * 5), _lg(base)]
    d = judge(0, [1, 2, 3], fresh, nan, noisy)
    assert d.diverges and d.to_json()["steps"][1]["kl_is_infinite"]


def test_a_figure_above_its_limit_is_never_called_within_it() -> None:
    """#28: "8 continuation steps within the engine's own variation (largest KL 0.0654, limit 0.0279)": a step
    is beyond only when its KL and its max |dlogit| both are, so a KL above its limit with the logits within
    theirs is not a divergence, and the words must say which figure is above and which within."""
    import random
    import re

    step = StepCheck(3, 17, 0.0654, 0.41, 1.0, True, 17, 17, 0.009, 0.2)
    b = Behaviour(0, steps=[step], limit_kl=0.0279, limit_max_abs=1.0)
    assert not b.diverges
    text = b.summary()
    assert "within the engine's own variation (largest KL 0.0654" not in text
    assert "KL 0.0654 is above its limit 0.0279" in text and "max |dlogit| 0.41 is within its limit 1" in text
    rng = random.Random(28)
    for _ in range(2000):  # every summary: a figure called within its limit is within it
        steps = [StepCheck(i, i, rng.uniform(0, 0.1), rng.choice([None, rng.uniform(0, 3)]), 1.0, True, 1, 1, None,
                           None) for i in range(rng.randint(1, 8))]
        lim_kl, lim_dl = rng.uniform(0.001, 0.1), rng.uniform(0.1, 3)
        for st in steps:
            st.beyond = st.max_abs_logit_diff is not None and st.kl > lim_kl and st.max_abs_logit_diff > lim_dl
        text = Behaviour(0, steps=steps, limit_kl=lim_kl, limit_max_abs=lim_dl).summary()
        for a, lim in re.findall(r"largest KL ([0-9.e+-]+), limit ([0-9.e+-]+)\)", text):
            assert float(a) <= float(lim), text
        for a, lim in re.findall(r"([0-9.e+-]+) is within its limit ([0-9.e+-]+)", text):
            assert float(a) <= float(lim), text
        for a, lim in re.findall(r"([0-9.e+-]+) is above its limit ([0-9.e+-]+)", text):
            assert float(a) > float(lim), text
        for a, lim in re.findall(r"(?:KL|max \|dlogit\|) ([0-9.e+-]+) \(limit ([0-9.e+-]+)\)", text):  # beyond
            assert float(a) > float(lim), text


def test_a_different_argmax_comes_with_the_engines_own_variation() -> None:
    """#28: "a DIFFERENT argmax" under an ok verdict, without the spread that explains it: verify's terminal
    lines now carry the engine's own variation at that step (the app's Overview: tests/app/test_gui_verify.py)."""
    from kvscope.core.verify.behaviour import spread_note
    from kvscope.core.verify.result import NextToken, VerifyResult, result_text

    beh = Behaviour(0, steps=[StepCheck(0, 5, 0.05, 0.8, 1.0, False, 7, 9, 0.04, 0.5)], limit_kl=0.12,
                    limit_max_abs=1.5)
    note = spread_note(beh.to_json())
    assert note == "the engine's own variation at that step: KL up to 0.04 under other batch schedules, limit 0.12"
    assert spread_note(None) == "" and spread_note({"steps": []}) == ""
    res = VerifyResult(file="f", kind="seq_file", layout="2026-10", model="m")
    res.next_token, res.behaviour = NextToken(5, 0, 0.8, False, 0.05, 7, 9), beh
    assert f"same argmax False, KL 0.05 ({note})" in result_text(res)
    res.next_token = NextToken(5, 0, 0.1, True, 0.001, 7, 7)
    assert "variation at that step" not in result_text(res)


def test_server_top_k_scores_are_judged_too() -> None:
    fresh = [Logits(top={5: -0.1, 7: -2.5, 9: -4.0})]
    moved = [Logits(top={7: -0.1, 5: -2.5, 9: -4.0})]
    b = judge(0, [3], fresh, moved, {})
    assert b.diverges and b.steps[0].top_k_overlap == 1.0 and b.steps[0].same_argmax is False
    assert not judge(0, [3], fresh, list(fresh), {}).diverges


@pytest.mark.parametrize("n", [1, 2, 3, 7, 96, 607, 2048])
def test_schedules_feed_every_token_once_in_order(n: int) -> None:
    for sched in (WHOLE, *SCHEDULES, Schedule("odd", keep=0.3, pieces=3, tail=5)):
        pieces = sched.chunks(n)
        assert pieces[-1][1] == n and all(a < b for a, b in pieces)
        assert all(x[1] == y[0] for x, y in zip(pieces, pieces[1:], strict=False))
        assert sched.start(n) == pieces[0][0] < n
    tail = SCHEDULES[0].chunks(n)
    assert all(b - a == 1 for a, b in tail) and len(tail) == min(8, max(1, n - 1))


def test_every_verdict_has_a_level() -> None:
    assert set(VERIFY_VERDICT_LEVEL) == set(VERDICTS) and VERIFY_VERDICT_LEVEL["diverges"] == "damaged"
