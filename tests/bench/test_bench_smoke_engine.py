"""The benches and fuzzers that drive real llama.cpp (the pinned builds, the trained model), in
``--quick`` mode (see conftest: built first when missing, not collected without the engine extra)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from kvscope.core.verify.result import VERDICTS
from tests.bench.conftest import assert_rows, run_bench

pytestmark = pytest.mark.slow


def _json_objects(text: str) -> list[dict[str, Any]]:
    """Every top-level JSON object printed in ``text`` (the benches print them indented)."""
    dec, out, i = json.JSONDecoder(), [], 0
    while (i := text.find("{", i)) >= 0:
        try:
            obj, end = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            i += 1
            continue
        if isinstance(obj, dict):
            out.append(obj)
        i = end
    return out


def test_bench_engine_quick(tmp_path: Path) -> None:
    docs = _json_objects(run_bench("bench_engine.py", cwd=tmp_path))
    assert [d["build"] for d in docs] == ["0c1e5709", "b11434"]
    for d in docs:
        assert {"startup_s", "round_trip_ms", "echo", "decode_s", "state_MiB"} <= d.keys(), d
        assert set(d["echo"]) == {"0.5 MiB", "16 MiB", "128 MiB"}
        for key in ("state_get_data_s", "state_set_data_s", "state_seq_get_data_s"):
            assert {"engine", "in_process", "ratio", "engine_MiB_per_s"} <= d[key].keys(), (key, d)


def test_bench_verify_quick(tmp_path: Path) -> None:
    (doc,) = _json_objects(run_bench("bench_verify.py", "--out", str(tmp_path), cwd=tmp_path))
    assert doc["verdicts"] == ["ok"] and doc["tokens"] == 256, doc
    assert {"ratio_best", "ratio_median", "ratio_with_start_best", "cpu_ratio_median", "goal_ratio",
            "rss"} <= doc.keys()
    assert {"kvscope_peak_mb", "llama_child_peak_mb", "limit_mb"} <= doc["rss"].keys()


@pytest.mark.timeout(900)  # 2 fresh trained-model slots, each written by a llama-server and verified twice with
# the full calibration: 200-250 s a case on the 2-core machine under a load of 4 (300 s was too short there)
def test_fuzz_verify_trained_quick(tmp_path: Path) -> None:
    docs = _json_objects(run_bench("fuzz_verify_trained.py", cwd=tmp_path, ok=(0, 1)))
    summary = docs[-1]
    assert summary["cases"] == 2 and len(docs) == 3, docs
    assert all(d["healthy"] in VERDICTS and d["damaged"] in VERDICTS for d in docs[:-1]), docs


def test_bench_verify_trained_quick(tmp_path: Path) -> None:
    docs = _json_objects(run_bench("bench_verify_trained.py", cwd=tmp_path))
    summary = docs[-1]
    assert [r["cache_type"] for r in summary["runs"]] == ["f16"] and "ratio_max" in summary, summary
    doc = summary["runs"][0]
    assert doc["verify"]["verdict"] == "ok" and doc["tokens"] >= 256, doc
    assert {"baseline", "ratio", "goal_ratio", "within_goal", "baseline_child_peak_mb"} <= doc.keys()
    assert "restore_prefill" in doc["baseline"]


@pytest.mark.parametrize("build", ["0c1e5709", "b11434"])
def test_fuzz_engine_quick(tmp_path: Path, build: str) -> None:
    docs = _json_objects(run_bench("fuzz_engine.py", "--build", build, "--out", str(tmp_path), cwd=tmp_path))
    summary = docs[-1]
    assert summary["cases"] == 12 and summary["disagreeing_cases"] == 0, summary
    assert sum(summary["counts"]["outcome"].values()) == 12
    assert (tmp_path / f"summary-{build}.json").is_file()


def test_fuzz_fleet_quick(tmp_path: Path) -> None:
    from fuzz_fleet_common import FAMILIES

    text = run_bench("fuzz_fleet.py", "--out", str(tmp_path / "failures"), cwd=tmp_path, timeout=900)
    for family in FAMILIES:  # every family ran its one input (the server family needs the pinned build: built)
        assert re.search(rf"^{family}: 1 inputs in \d+ s .* 0 failures", text, re.M), (family, text[-4000:])
    assert_rows(text, ("SUMMARY: 0 failures",))
