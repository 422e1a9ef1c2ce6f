"""Every input the process-level fuzz (``bench/fuzz_fleet.py``) once failed, kept in
``tests/data/fuzz-regressions/fleet/`` once fixed, is replayed and must pass (``--replay FAMILY:INDEX``
with its seed: the same drawn case, as a user runs it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvharness.fixtures import DATA
from tests.support.llama_builds import HAVE_BINDING

BENCH = Path(__file__).resolve().parents[2] / "bench"
ENGINE_FAMILIES = {"server", "ctx_params", "signals_repair_lab"}  # not replayed in the core-only suite (no engine)


def _case(path: Path) -> tuple[str, int, int]:
    d = json.loads(path.read_text())
    return d["family"], int(d["seed"]), int(d["index"])


KEPT = [p for p in sorted((DATA / "fuzz-regressions" / "fleet").glob("*.json"))
        if HAVE_BINDING or _case(p)[0] not in ENGINE_FAMILIES]


def test_the_kept_inputs_are_found() -> None:
    assert any(_case(p)[0] == "jobs_links" for p in KEPT)


@pytest.mark.slow
@pytest.mark.parametrize("path", KEPT, ids=[p.stem for p in KEPT])
def test_a_kept_fleet_fuzz_input_passes(path: Path, tmp_path: Path) -> None:
    family, seed, index = _case(path)
    p = subprocess.run([sys.executable, str(BENCH / "fuzz_fleet.py"), "--seed", str(seed), "--replay",
                        f"{family}:{index}"], capture_output=True, text=True, timeout=900, cwd=tmp_path, check=False)
    assert p.returncode == 0 and p.stdout.rstrip().endswith("ok"), (p.stdout + p.stderr)[-4000:]
