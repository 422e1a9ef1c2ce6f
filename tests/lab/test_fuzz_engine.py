"""Differential fuzz: random corruptions of real inputs of every memory class the core supports, restored
in the memory core (policy ``contained``) and in real llama.cpp, must agree on the return value, the
per-component outcome, the other sequences and the whole state afterwards byte for byte. A bounded
number of cases per build here; ``bench/fuzz_engine.py`` runs >= 10,000 per build. Every disagreement
ever found is a regression case in tests/data/engine-regressions/."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kvharness.engine_fuzz import (
    GEN_MODELS,
    KNOWN,
    Arena,
    CorruptionError,
    arena,
    close_arenas,
    draw_case,
    parse_corruption,
    regression_cases,
    sources,
    write_gen_models,
)
from kvscope.core.engine.builds import InstalledBuild
from kvscope.core.model.profile import ModelProfileError, load_model_profile
from tests.support.llama_builds import BUILD_NAMES

CASES_PER_BUILD = 100
CORE_CLASSES = {"kv", "iswa", "recurrent", "hybrid"}  # the tiny fixtures' classes: never skipped


@pytest.fixture(scope="module", autouse=True)
def _arenas_closed() -> Iterator[None]:
    """The arenas' engine children live for this module only (a later test counts a process's children)."""
    yield
    close_arenas()


@pytest.fixture(scope="session")
def gen_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """kvscope.core.modelgen's model of every memory class llama.cpp has: tests/data/gen-models (the
    generated fixtures' models), else written here."""
    if any(GEN_MODELS.glob("*.gguf")):
        return GEN_MODELS
    return write_gen_models(tmp_path_factory.mktemp("gen-models"))


def _arenas(build: str, record: Any, gen: Path) -> list[Arena]:
    """One source per memory class (the tiny fixtures first, then the generated models), plus the unified
    flash-attention llama context."""
    out, skipped = [], {}
    classes: set[str] = set()
    for src in sources(gen):
        try:
            mc = load_model_profile(src.model).memory_class
        except ModelProfileError as e:
            skipped[src.key] = f"kvscope cannot read the model: {e}"
            continue
        if mc in classes and src.key != "llama-unified-fa":
            continue
        classes.add(mc)
        a = arena(src.key, build, gen)
        if isinstance(a, str):
            skipped[src.key] = a
            continue
        out.append(a)
        for kind, why in a.skipped.items():
            skipped[f"{src.key}/{kind}"] = why
    record("skipped", json.dumps(skipped))
    for key, why in skipped.items():
        assert why.strip(), f"{key} skipped without a reason"
        print(f"fuzz {build}: {key} skipped: {why}")
    have = {a.profile.memory_class for a in out if len(a.runners) == 4}
    assert have >= CORE_CLASSES, (have, skipped)
    record("memory_classes", json.dumps(sorted(have)))
    return out


@pytest.mark.parametrize("build", BUILD_NAMES)
def test_core_and_llama_cpp_agree_on_random_corruptions(build: str, builds: dict[str, InstalledBuild],
                                                        record_property: Any, gen_models: Path) -> None:
    arenas = _arenas(build, record_property, gen_models)
    seen: dict[str, int] = {}

    @settings(max_examples=CASES_PER_BUILD, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
    @given(st.data())
    def one(data: st.DataObject) -> None:
        def pick(lo: int, hi: int) -> int:
            return data.draw(st.integers(lo, hi))

        ar = arenas[pick(0, len(arenas) - 1)]
        kind, c = draw_case(pick, ar)
        try:
            ar.mutate(kind, c)
        except CorruptionError:
            assume(False)
        r = ar.case(kind, c)
        outcome = "aborted" if r.engine.aborted else ("restored" if r.core.restore.ok else "refused")
        seen[outcome] = seen.get(outcome, 0) + 1
        assert not r.unexplained(), json.dumps(r.to_json(), indent=1)

    one()
    record_property("outcomes", json.dumps(seen))
    assert seen.get("restored") and seen.get("refused"), seen  # the draws reach both sides of the checks


@pytest.mark.parametrize("path", [p for p, _ in regression_cases()], ids=lambda p: p.stem)
def test_engine_regressions(path: Path, builds: dict[str, InstalledBuild], gen_models: Path) -> None:
    """Each kept case still gives exactly its recorded disagreements (none, once fixed or explained)."""
    case = json.loads(path.read_text())
    for build in case["builds"]:
        a = arena(case["source"], build, gen_models)
        assert isinstance(a, Arena), a
        data = path.with_suffix(".bin").read_bytes() if path.with_suffix(".bin").is_file() else None
        c = parse_corruption(case["spec"]) if data is None else None
        r = a.case(case["kind"], c, data, case.get("description", ""))
        got = sorted(d.field for d in r.disagreements)
        assert got == sorted(case["expect_disagreements"]), json.dumps(r.to_json(), indent=1)
        for f in got:
            assert f in KNOWN, f"{f} is not an explained difference"
        if case.get("expect_note"):
            assert any(case["expect_note"] in n for n in r.engine.notes), r.engine.notes
