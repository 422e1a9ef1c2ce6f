"""The compiled de-rotation kernel (core/_derotate.c through kvscope.core.derotate_kernel):
built and running where the CPU has AVX2, equal to an exact float64 transform on random blocks,
out of the way for what it does not take, and giving ``--stats`` the numpy path's answers on
real rotated files."""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from hypothesis import given, settings
from hypothesis import strategies as st

from kvscope.core import derotate_kernel as dk
from kvscope.core.analysis import stats
from kvscope.core.analysis.record_values import dequantize_rows
from kvscope.core.reader.parse import read_state
from kvscope.core.reader.rotation import hadamard

Q8, Q4, F32 = GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q4_0, GGMLQuantizationType.F32
GEN = Path(__file__).parent / "data" / "gen-b11434"


def _cpu_has_avx2() -> bool:
    if platform.machine() not in ("x86_64", "AMD64"):
        return False
    flags = next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")), "")
    return {"avx2", "f16c"} <= set(flags.split(":", 1)[-1].split())


def test_the_kernel_is_built_and_runs_where_the_cpu_has_avx2() -> None:
    """An install whose kernel did not compile (it is optional) fails here instead of running slowly."""
    assert dk.kernel() == ("avx2" if _cpu_has_avx2() else None)


def _stats(data: np.ndarray, qt: GGMLQuantizationType, block: int) -> dk.RotatedStats | None:
    """The kernel's answer for data it takes: statistics where it runs, None where it does not
    (on such a CPU the tests below check only that, and numpy does the work)."""
    got = dk.rotated_stats(data, int(qt), block)
    assert (got is None) == (dk.kernel() is None)
    return got


def _blocks(qt: GGMLQuantizationType, n_blocks: int, scales: np.ndarray, seed: int) -> np.ndarray:
    """Raw ggml blocks of ``qt`` with the given f16 scales and random quants."""
    _, ts = GGML_QUANT_SIZES[qt]
    raw = np.random.default_rng(seed).integers(0, 256, (n_blocks, ts), dtype=np.uint8)
    raw[:, :2] = scales.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return raw.reshape(-1)


def _exact(values: np.ndarray, block: int) -> tuple[float, float, float, float]:
    """min, max, sum, sum of squares of the de-rotated values, in float64."""
    d = values.reshape(-1, block).astype(np.float64) @ hadamard(block).astype(np.float64)
    return float(d.min()), float(d.max()), float(d.sum()), float((d * d).sum())


SCALES = st.one_of(st.floats(-2.0, 2.0, width=16), st.sampled_from([0.0, -0.0, 6e-8, -6e-8, 65504.0, -65504.0]))


@settings(max_examples=150, deadline=None)
@given(qt=st.sampled_from([Q8, Q4]), block=st.sampled_from([32, 64, 128, 256, 512]), n_rot=st.integers(0, 40),
       scales=st.data(), seed=st.integers(0, 2**32 - 1))
def test_quantized_blocks_equal_an_exact_transform(qt: GGMLQuantizationType, block: int, n_rot: int,
                                                   scales: st.DataObject, seed: int) -> None:
    """Random q8_0/q4_0 blocks (zero, subnormal and the largest scales among them), any number of
    rotation blocks (past the kernel's float32 flush of 16 blocks too), every block size it takes."""
    n_blocks = n_rot * block // 32
    d = np.array(scales.draw(st.lists(SCALES, min_size=n_blocks, max_size=n_blocks)), np.float32)
    raw = _blocks(qt, n_blocks, d, seed)
    got = _stats(raw, qt, block)
    if got is None:
        return
    assert got.n_values == n_rot * block
    if n_rot == 0:
        return
    values = dequantize_rows(raw, int(qt))
    mn, mx, total, squares = _exact(values, block)
    tol = 1e-6 * max(1.0, float(np.abs(values).max()) * np.sqrt(block))
    assert got.min == pytest.approx(mn, abs=tol) and got.max == pytest.approx(mx, abs=tol)
    assert got.sum == pytest.approx(total, rel=1e-6, abs=tol)
    assert got.sum_squares == pytest.approx(squares, rel=1e-5, abs=1e-30)


@settings(max_examples=60, deadline=None)
@given(block=st.sampled_from([16, 64, 128, 512]), n_rot=st.integers(1, 30), seed=st.integers(0, 2**32 - 1),
       spread=st.floats(1e-6, 1e6))
def test_float32_values_equal_an_exact_transform(block: int, n_rot: int, seed: int, spread: float) -> None:
    values = (np.random.default_rng(seed).standard_normal(n_rot * block) * spread).astype(np.float32)
    got = _stats(values, F32, block)
    if got is None:
        return
    mn, mx, total, squares = _exact(values, block)
    tol = 1e-6 * float(np.abs(values).max()) * np.sqrt(block)
    assert got.min == pytest.approx(mn, abs=tol) and got.max == pytest.approx(mx, abs=tol)
    assert got.sum_squares == pytest.approx(squares, rel=1e-5)


@pytest.mark.parametrize("qt", [Q8, Q4])
@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_a_non_finite_scale_leaves_it_to_numpy(qt: GGMLQuantizationType, bad: float) -> None:
    d = np.full(40, 0.5, np.float32)
    d[37] = bad  # in the last of 10 rotation blocks of 128: after the first float32 flush
    assert dk.rotated_stats(_blocks(qt, 40, d, 1), int(qt), 128) is None
    d[37] = 0.5
    _stats(_blocks(qt, 40, d, 1), qt, 128)  # not None where the kernel runs


@pytest.mark.parametrize("bad", [np.inf, np.nan, 3e19])  # 3e19 is finite, its square is not in float32
def test_non_finite_float32_values_or_squares_leave_it_to_numpy(bad: float) -> None:
    v = np.ones(64 * 20, np.float32)
    v[64 * 19 + 5] = bad
    assert dk.rotated_stats(v, int(F32), 64) is None


def test_what_the_kernel_does_not_take_is_refused() -> None:
    raw = _blocks(Q8, 8, np.ones(8, np.float32), 2)
    assert dk.rotated_stats(raw[:-1], int(Q8), 128) is None  # not whole rotation blocks
    assert dk.rotated_stats(raw, int(Q8), 96) is None  # not a power of two
    assert dk.rotated_stats(raw, int(Q8), 1024) is None  # larger than the kernel's buffer
    assert not dk.supports(int(Q8), 16)  # smaller than one q8_0 block
    assert not dk.supports(int(GGMLQuantizationType.Q5_1), 128)  # another layout: numpy decodes it
    assert dk.supports(int(F32), 16) == dk.supports(int(Q4), 512) == (dk.kernel() is not None)
    assert dk.rotated_stats(np.ones(64, np.float32)[1:].view(np.uint8)[3:-1].view(np.float32), int(F32), 16) \
        is None  # 63 values: not whole blocks (and the kernel never reads past them)


def _rotated(path: Path) -> bool:
    return any(r.rotated for _, r in read_state(path).layer_records())


# real files b11434 wrote with quantized K/V, one in 6 of those whose rows are rotated
ROTATED = [p for p in sorted(GEN.glob("*-q[48]_0-*"))[::6] if p.suffix in (".bin", ".seqstate") and _rotated(p)]


@pytest.mark.parametrize("path", ROTATED, ids=lambda p: p.name)
def test_stats_of_real_rotated_files_equal_the_numpy_path(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--stats with the kernel and with numpy alone, on files b11434 wrote with rotated q8_0/q4_0 K/V."""
    res = read_state(path)
    fast = stats.scan_stats(res)
    assert any(ls.derotated for ls in fast.layers)
    monkeypatch.setattr(dk, "_MOD", None)
    slow = stats.scan_stats(read_state(path))
    assert len(fast.layers) == len(slow.layers)
    for a, b in zip(fast.layers, slow.layers, strict=True):
        assert (a.n_values, a.n_nan, a.n_inf, a.zero_rows, a.derotated) == \
            (b.n_values, b.n_nan, b.n_inf, b.zero_rows, b.derotated)
        scale = max(1.0, abs(b.min), abs(b.max)) if b.n_values else 1.0
        for x, y, tol in ((a.min, b.min, 1e-6 * scale), (a.max, b.max, 1e-6 * scale), (a.mean, b.mean, 1e-6 * scale),
                          (a.rms, b.rms, 0.0)):
            assert np.isclose(x, y, rtol=1e-5, atol=tol, equal_nan=True), (a, b)


def test_a_nan_scale_in_a_real_rotated_file_is_counted_as_numpy_counts_it(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    src = next(p for p in ROTATED if "q8_0" in p.name and p.suffix == ".seqstate")
    res = read_state(src)
    rec = next(r for _, r in res.layer_records() if r.rotated and r.type == "q8_0")
    data = bytearray(src.read_bytes())
    data[rec.data_offset + 34 * 3 : rec.data_offset + 34 * 3 + 2] = np.float16(np.nan).tobytes()
    bad = tmp_path / src.name
    bad.write_bytes(bytes(data))
    fast = stats.scan_stats(read_state(bad))
    monkeypatch.setattr(dk, "_MOD", None)
    slow = stats.scan_stats(read_state(bad))
    hit = [(a, b) for a, b in zip(fast.layers, slow.layers, strict=True) if b.n_nan]
    assert len(hit) == 1 and hit[0][0].n_nan == hit[0][1].n_nan == 32
    a, b = hit[0]
    assert (a.min, a.max, a.first_nonfinite) == (b.min, b.max, b.first_nonfinite)


def test_without_the_kernel_nothing_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where it did not compile or the CPU lacks AVX2 (--stats then is the numpy path the tests above
    compare against)."""
    monkeypatch.setattr(dk, "_MOD", None)
    assert dk.kernel() is None and not dk.supports(int(Q8), 128) and not dk.supports(int(F32), 64)
    assert dk.rotated_stats(_blocks(Q8, 4, np.ones(4, np.float32), 3), int(Q8), 128) is None
