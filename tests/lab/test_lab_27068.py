"""llama.cpp issue #27068 in the lab: a late-failing restore leaves NaN rows in free cells that poison
the other sequence of a single-stream cache on the attention path without flash attention.

Scenario ``llama/fa0-unified1`` (one stream, flash attention off): ``nan_rows_late_fail`` restored into
seq 0 beside live seq 1, under each policy and reader kind.
"""

from __future__ import annotations

import math
from functools import cache

import pytest
import torch

from kvharness.fixtures import DATA
from kvscope.core.lab.probe import probe_sequences
from kvscope.core.lab.runner import LabRunner, parse_case
from kvscope.core.lab.scenario import Scenario, load_scenario

FA0_UNIFIED = DATA / "lab/llamacpp-2026-10-01/llama/fa0-unified1"
READERS = ("buffer", "file")


@cache
def _scenario(folder: str = str(FA0_UNIFIED)) -> Scenario:
    return load_scenario(folder)


@cache
def _runner(folder: str = str(FA0_UNIFIED)) -> LabRunner:
    return LabRunner(_scenario(folder), [parse_case("nan_rows_late_fail"), parse_case("nan_rows_valid_then_seq_rm")])


@pytest.mark.parametrize("reader", READERS)
def test_legacy_leaves_nan_in_free_cells_and_poisons_seq1(reader: str) -> None:
    r = _runner().run_cell(parse_case("nan_rows_late_fail"), "legacy", reader)
    assert r.error is None and r.restore.returned == 0 and r.restore.failed_check == "v_type"
    assert r.target.state == "removed" and (r.target.pos_min, r.target.pos_max) == (-1, -1)
    assert r.stale_cells is not None and r.stale_cells > 0
    assert r.stale_nonfinite == 7  # the 7 cells seq 0's rows were read into
    seq1 = r.others[1]
    assert seq1.intact  # its own cells and bytes are untouched...
    assert math.isinf(seq1.probe_diff["dense"])  # ...yet the dense read-out over the stream is NaN
    assert seq1.probe_diff["skip-masked"] == 0.0  # the flash-attention kernel never reads a masked cell


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("policy", ["contained", "transactional"])
def test_contained_and_transactional_keep_seq1_at_baseline(policy: str, reader: str) -> None:
    r = _runner().run_cell(parse_case("nan_rows_late_fail"), policy, reader)
    assert r.error is None and r.restore.returned == 0
    assert r.others[1].intact
    assert r.others[1].probe_diff == {"dense": 0.0, "skip-masked": 0.0}
    assert r.stale_nonfinite == 0
    if policy == "transactional":
        assert r.target.state == "unchanged" and (r.target.pos_min, r.target.pos_max) == (0, 6)
        assert r.target.probe_diff == {"dense": 0.0, "skip-masked": 0.0}
        assert r.stale_cells == 0
    else:
        assert r.target.state == "removed" and r.stale_cells == 0  # the chosen cells were zeroed
    assert r.recovered


def test_contained_probe_is_bit_identical_to_the_baseline() -> None:
    """Not just a zero difference: the read-out vectors of seq 1 are the same bits."""
    runner = _runner()
    ctx = runner.working_context()
    res = ctx.seq_set_data((FA0_UNIFIED / "nan_rows_late_fail.seqdata.bin").read_bytes(), 0, policy="contained")
    assert res.returned == 0
    probe = probe_sequences(ctx, _scenario().profile, [1])[1]
    for kernel, vec in probe.vectors.items():
        assert torch.equal(vec, runner.baseline[1].vectors[kernel]), kernel


@pytest.mark.parametrize("policy", ["contained", "legacy", "transactional"])
def test_nan_rows_valid_then_seq_rm_poisons_dense_only(policy: str) -> None:
    r = _runner().run_cell(parse_case("nan_rows_valid_then_seq_rm"), policy, "buffer")
    assert r.error is None and r.restore.ok and r.restore.returned == 7372
    assert r.target.state == "restored"  # measured right after the restore, before the seq_rm
    assert r.stale_nonfinite == 7  # after seq_rm(0) the NaN rows sit in free cells
    assert r.others[1].intact
    assert math.isinf(r.others[1].probe_diff["dense"])
    assert r.others[1].probe_diff["skip-masked"] == 0.0


def test_two_streams_isolate_the_other_sequence() -> None:
    """With kv_unified=false (one stream per sequence) the stale NaN rows are in seq 0's stream only."""
    folder = str(DATA / "lab/llamacpp-2026-10-01/llama")
    r = _runner(folder).run_cell(parse_case("nan_rows_late_fail"), "legacy", "buffer")
    assert r.stale_nonfinite == 7
    assert r.others[1].probe_diff == {"dense": 0.0, "skip-masked": 0.0}
