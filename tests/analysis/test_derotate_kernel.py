"""The compiled kernels (core/_derotate.c through kvscope.core.derotate_kernel): built and running
where the CPU has AVX2; the de-rotation equal to an exact float64 transform on random blocks, the
plain values' statistics, zero rows and decode equal to numpy's on random rows full of special
values; out of the way for what they do not take; and giving ``--stats`` and ``diff`` the numpy
path's answers on real files."""

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
from kvscope.core.analysis.diff import diff_states
from kvscope.core.analysis.record_values import dequantize_rows, numpy_dequantize_rows
from kvscope.core.reader.parse import read_state
from kvscope.core.reader.rotation import hadamard
from tests.support.value_rows import BF16, ELEMENT_TYPES, F16, KERNEL_TYPES, SPECIAL, plain_rows

pytestmark = pytest.mark.slow  # the C kernel against numpy over large random inputs

Q8, Q4, F32 = GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q4_0, GGMLQuantizationType.F32
GEN = Path(__file__).parent.parent / "data" / "gen-b11434"
OLD = Path(__file__).parent.parent / "data" / "llamacpp-2026-10-01"


def _cpu_has_avx2() -> bool:
    if platform.machine() not in ("x86_64", "AMD64"):
        return False
    flags = next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")), "")
    return {"avx2", "f16c"} <= set(flags.split(":", 1)[-1].split())


def test_the_kernel_is_built_and_runs_where_the_cpu_has_avx2() -> None:
    """An install whose kernel did not compile (it is optional) fails here instead of running slowly;
    where it runs it takes every type whose layout gguf-py gives as the kernel decodes it."""
    assert dk.kernel() == ("avx2" if _cpu_has_avx2() else None)
    assert [dk.takes_values(int(t)) for t in KERNEL_TYPES] == [_cpu_has_avx2()] * len(KERNEL_TYPES)


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


# -- plain values: value_stats / decode against numpy's decode -------------------------------------


def _numpy_stats(values: np.ndarray) -> tuple[int, int, int, float, float, float, float]:
    """(NaN, Inf, first non-finite or -1, min, max, sum, sum of squares) of the finite values, in float64."""
    flat = values.reshape(-1)
    fin = np.isfinite(flat)
    good = flat[fin].astype(np.float64)
    nan = int(np.count_nonzero(np.isnan(flat)))
    first = int(np.argmin(fin)) if not fin.all() else -1
    mn, mx = (float(good.min()), float(good.max())) if good.size else (np.inf, -np.inf)
    return nan, flat.size - good.size - nan, first, mn, mx, float(good.sum()), float(np.dot(good, good))


@settings(max_examples=300, deadline=None)
@given(qt=st.sampled_from(KERNEL_TYPES), n_rows=st.integers(1, 12), units=st.integers(1, 700),
       seed=st.integers(0, 2**32 - 1), data=st.data())
def test_plain_values_equal_the_numpy_path(qt: GGMLQuantizationType, n_rows: int, units: int, seed: int,
                                           data: st.DataObject) -> None:
    """Random rows of every type the kernel takes, with subnormals, the largest finite values,
    zeros, NaN/Inf of any payload at any position (over several of the kernel's chunks, the last
    one short) and all-zero rows: exact counts, first position, extremes and zero rows; the sums
    to float32 rounding."""
    n = n_rows * units
    specials = data.draw(st.lists(st.tuples(st.integers(0, n - 1), st.sampled_from(SPECIAL[qt])), max_size=8))
    zero = data.draw(st.lists(st.integers(0, n_rows - 1), max_size=3, unique=True))
    raw = plain_rows(qt, n_rows, units, seed, specials, zero)
    flags = np.full(n_rows + 1, 7, np.uint8)
    got = dk.value_stats(raw, int(qt), raw.shape[1], flags)
    assert (got is None) == (dk.kernel() is None)
    if got is None:
        return
    values = numpy_dequantize_rows(raw, int(qt))
    nan, inf, first, mn, mx, total, squares = _numpy_stats(values)
    assert (got.n_values, got.n_nan, got.n_inf, got.first_nonfinite) == (values.size, nan, inf, first)
    assert (got.min, got.max) == (mn, mx)
    size = float(np.abs(values[np.isfinite(values)].astype(np.float64)).sum())
    assert got.sum == pytest.approx(total, rel=1e-5, abs=1e-5 * size + 1e-300)
    assert got.sum_squares == pytest.approx(squares, rel=1e-5, abs=1e-300)
    want = ~raw.any(axis=1)
    assert got.n_zero == int(want.sum()) and np.array_equal(flags[:n_rows], want) and flags[n_rows] == 7


@settings(max_examples=100, deadline=None)
@given(qt=st.sampled_from(ELEMENT_TYPES), dims=st.integers(1, 9), cells=st.integers(1, 300),
       seed=st.integers(0, 2**32 - 1), data=st.data())
def test_zero_cells_of_a_transposed_v(qt: GGMLQuantizationType, dims: int, cells: int, seed: int,
                                      data: st.DataObject) -> None:
    """Rows that are columns of ``el``-byte cells: a cell is flagged when it is zero bytes in every
    row (one nonzero byte in any row, -0.0 included, unflags it)."""
    el = GGML_QUANT_SIZES[qt][1]
    raw = plain_rows(qt, cells, dims, seed).reshape(cells, dims, el).transpose(1, 0, 2).copy()
    raw[:, data.draw(st.lists(st.integers(0, cells - 1), max_size=5, unique=True))] = 0
    for d, c, b in data.draw(st.lists(st.tuples(st.integers(0, dims - 1), st.integers(0, cells - 1),
                                                st.integers(0, el - 1)), max_size=3)):
        raw[d, c, b] = 0x80  # the top byte: -0.0 in f16 / bf16 / f32; a subnormal elsewhere
    flags = np.full(cells, 7, np.uint8)
    got = dk.value_stats(raw.reshape(dims, cells * el), int(qt), cells * el, flags, el=el)
    if got is None:
        assert dk.kernel() is None
        return
    want = ~raw.any(axis=(0, 2))
    assert got.n_zero == int(want.sum()) and np.array_equal(flags, want) and got.n_values == dims * cells


@settings(max_examples=150, deadline=None)
@given(qt=st.sampled_from(KERNEL_TYPES), rows=st.integers(0, 4), units=st.integers(1, 300),
       seed=st.integers(0, 2**32 - 1), data=st.data())
def test_decode_is_numpy_bit_for_bit(qt: GGMLQuantizationType, rows: int, units: int, seed: int,
                                     data: st.DataObject) -> None:
    """The kernel's float32 values are numpy's (a NaN is a NaN: its payload is the CPU's conversion's)."""
    specials = data.draw(st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(SPECIAL[qt])), max_size=8))
    raw = plain_rows(qt, rows, units, seed, specials)
    got = dk.decode(raw, int(qt))
    assert (got is None) == (dk.kernel() is None)
    if got is None:
        return
    want = numpy_dequantize_rows(raw, int(qt))
    assert got.shape == want.shape and got.dtype == np.float32
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
    assert np.array_equal(dequantize_rows(raw, int(qt)), got, equal_nan=True)  # what the other views decode with


@settings(max_examples=60, deadline=None)
@given(shift=st.integers(0, 3), n_rows=st.integers(1, 6), units=st.integers(1, 9000), seed=st.integers(0, 2**32 - 1),
       data=st.data())
def test_float32_values_at_any_byte_alignment(shift: int, n_rows: int, units: int, seed: int,
                                              data: st.DataObject) -> None:
    """f32 values on a float's alignment are reduced where they lie, others through the kernel's
    buffer (a file's payload can start at any byte): the same answers either way, over several of
    the kernel's chunks and with NaN/Inf among them."""
    n = n_rows * units
    specials = data.draw(st.lists(st.tuples(st.integers(0, n - 1), st.sampled_from(SPECIAL[F32])), max_size=4))
    raw = plain_rows(F32, n_rows, units, seed, specials)
    buf = np.zeros(raw.size + 4, np.uint8)
    moved = buf[shift : shift + raw.size]
    moved[:] = raw.reshape(-1)
    flags_a, flags_b = np.zeros(n_rows, np.uint8), np.zeros(n_rows, np.uint8)
    a = dk.value_stats(raw, int(F32), raw.shape[1], flags_a)
    b = dk.value_stats(moved, int(F32), raw.shape[1], flags_b)
    if a is None or b is None:
        assert dk.kernel() is None
        return
    assert np.array_equal(flags_a, flags_b)
    for x, y in zip(vars(a).values(), vars(b).values(), strict=True):
        assert x == y or (isinstance(x, float) and np.isnan(x) and np.isnan(y)), (a, b)
    nan, inf, first, mn, mx, _, _ = _numpy_stats(numpy_dequantize_rows(raw, int(F32)))
    assert (b.n_nan, b.n_inf, b.first_nonfinite, b.min, b.max) == (nan, inf, first, mn, mx)


@pytest.mark.parametrize("qt", [F16, BF16])
def test_every_16_bit_pattern(qt: GGMLQuantizationType) -> None:
    """All 65,536 patterns in one buffer: numpy's values, counts, first NaN/Inf and extremes."""
    bits = np.arange(65536, dtype=np.uint16).view(np.uint8)
    got, s = dk.decode(bits, int(qt)), dk.value_stats(bits, int(qt), bits.size, np.zeros(1, np.uint8))
    if got is None or s is None:
        assert dk.kernel() is None
        return
    want = numpy_dequantize_rows(bits, int(qt))
    fin = np.isfinite(want)
    assert np.array_equal(got[fin].view(np.uint32), want[fin].view(np.uint32))
    assert np.array_equal(np.isnan(got), np.isnan(want))
    nan, inf, first, mn, mx, _, _ = _numpy_stats(want)
    assert (s.n_nan, s.n_inf, s.first_nonfinite, s.min, s.max, s.n_zero) == (nan, inf, first, mn, mx, 0)


def test_what_the_value_kernel_does_not_take_is_refused() -> None:
    raw = plain_rows(Q8, 2, 3, 4)
    flags = np.zeros(2, np.uint8)
    assert dk.value_stats(raw.reshape(-1)[:-1], int(Q8), 102, flags) is None  # not whole blocks
    assert dk.value_stats(raw, int(Q8), 100, flags) is None  # not whole rows
    assert dk.value_stats(raw, int(Q8), 102, flags[:1]) is None  # too few flags
    assert dk.value_stats(raw, int(Q8), 102, flags, el=5) is None  # a row is not whole cells
    assert dk.value_stats(raw, int(GGMLQuantizationType.Q5_0), 102, flags) is None  # another layout: numpy
    assert dk.decode(raw[:, :-1], int(Q8)) is None and dk.decode(raw, int(GGMLQuantizationType.Q4_1)) is None
    assert [dk.takes_values(int(t)) for t in KERNEL_TYPES] == [dk.kernel() is not None] * len(KERNEL_TYPES)
    empty = dk.value_stats(np.zeros(0, np.uint8), int(F16), 2, flags)
    assert empty is None or (empty.n_values, empty.first_nonfinite, empty.min, empty.max, empty.n_zero) == \
        (0, -1, np.inf, -np.inf, 0)


# real files the pinned builds wrote with unrotated f16 (plain and transposed V), f32, q8_0 and q4_0 K/V
PLAIN_FILES = [*sorted(GEN.glob("llama-f16-fa[01]-unified*-seq0.seqstate")),
               *sorted(GEN.glob("*-q[48]_0-*-norot-ctx.state.bin"))[::3],
               *sorted(OLD.glob("*-f32-*-ctx.state.bin"))]


@pytest.mark.parametrize("path", PLAIN_FILES, ids=lambda p: p.name)
def test_stats_of_real_plain_files_equal_the_numpy_path(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--stats through the kernel (every record's every step) and with numpy alone."""
    calls: list[int] = []

    def spy(*args: object, **kw: object) -> dk.ValueStats | None:
        got = dk.value_stats(*args, **kw)  # type: ignore[arg-type]
        calls.append(got is not None)
        return got

    monkeypatch.setattr(stats, "value_stats", spy)
    fast = stats.scan_stats(read_state(path))
    assert calls and all(calls) == (dk.kernel() is not None)
    monkeypatch.setattr(dk, "_MOD", None)
    slow = stats.scan_stats(read_state(path))
    assert [ls.type for ls in fast.layers] == [ls.type for ls in slow.layers]
    assert any(not ls.derotated and ls.n_values for ls in fast.layers)
    for a, b in zip(fast.layers, slow.layers, strict=True):
        assert (a.n_values, a.n_nan, a.n_inf, a.first_nonfinite, a.zero_rows, a.first_zero_row, a.derotated) == \
            (b.n_values, b.n_nan, b.n_inf, b.first_nonfinite, b.zero_rows, b.first_zero_row, b.derotated)
        if not b.derotated:  # (a lightning indexer's K is rotated in every file: de-rotated to float32 rounding)
            assert (a.min, a.max) == (b.min, b.max) or np.isnan([a.min, a.max, b.min, b.max]).all(), (a, b)
        assert np.allclose([a.min, a.max, a.mean, a.rms], [b.min, b.max, b.mean, b.rms], rtol=1e-5, atol=1e-6,
                           equal_nan=True), (a, b)


def test_diff_decodes_through_the_kernel_as_numpy_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``kvscope diff`` of two f16 states, one with NaN, Inf, -0.0 and a subnormal written in: the
    same report with the kernel's decode and with numpy's."""
    a = GEN / "llama-f16-fa0-unified0-seq0.seqstate"
    rec = next(r for _, r in read_state(a).layer_records() if r.role == "v" and r.transposed)
    data = bytearray(a.read_bytes())
    for i, pat in enumerate((0x7E00, 0xFC00, 0x8000, 0x0001)):
        off = rec.data_offset + (7 * i + 3) * 2
        data[off : off + 2] = pat.to_bytes(2, "little")
    b = tmp_path / a.name
    b.write_bytes(bytes(data))
    fast = diff_states(read_state(a), read_state(b)).to_json()
    monkeypatch.setattr(dk, "_MOD", None)
    assert diff_states(read_state(a), read_state(b)).to_json() == fast
    assert any(ld["nan_b"] == 1 and ld["cells_differ"] == 4 for s in fast["sections"] for ld in s["layers"])
