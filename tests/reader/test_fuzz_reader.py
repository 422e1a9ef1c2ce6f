"""Property-based fuzzing of the state reader over mutated real llama.cpp fixtures.

Each example takes one real fixture (a spread of folders, kinds and models), applies one to
four mutations (truncation, byte flips, extreme values written over structural u32/u64 fields
or aligned words, byte insertions and deletions, appended junk) and parses the result with and
without the model profile. The reader must never raise, the structure tree must still tile the
file, findings must point inside the file, coverage must add up, a parse must stay fast, and
``scan_stats`` must cope with whatever the parse produced. A sample of examples also checks that
a parse allocates no more than the file's size plus 64 MiB (Python/numpy allocations, tracemalloc).

The model is fuzzed too: the tiny GGUF that wrote a fixture (its key/value section) gets the
same mutations over its structural fields (counts, lengths, types); ``load_model_profile`` must
give a profile or a one-line escaped ModelProfileError, quickly and in bounded memory, and a
profile it gives must parse the fixture within the same invariants. Fixtures extended with a
hole to 1-50 GB (sparse giant tails) must parse in bounded time and memory, and a parse racing a
thread that keeps cutting the file must give a checked result or FileChangedError, nothing else.

The budget is bounded for CI (about 4,000 examples, some 25-30 s when nothing fails); failing
inputs of hypothesis' final (shrunk) examples are written to ``bench/out/fuzz-failures/``.
``bench/fuzz_long.py`` runs the same mutators for millions of inputs; what either finds goes into
``REGRESSIONS``.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.control import current_build_context

from kvharness.fixtures import DATA, model_path, profile
from kvharness.fuzz_mutations import apply_mutations as apply_byte_mutations
from kvharness.fuzz_mutations import gguf_fields, gguf_kv_end
from kvscope.core.analysis.stats import scan_stats
from kvscope.core.model.profile import ModelProfileError, load_model_profile
from kvscope.core.reader.parse import read_state
from kvscope.core.reader.records import ParseResult
from kvscope.core.reader.source import FileChangedError
from kvscope.core.reader.tree import check_tiling, coverage

pytestmark = pytest.mark.slow  # fuzz: generated corruptions of every real fixture

# (fixture relative to tests/data, model key of the tiny GGUF that wrote it)
FIXTURES: tuple[tuple[str, str], ...] = (
    ("llamacpp-2025-05-08/llama-f16-fa0-seq1.seqstate", "llama"),  # seq_file, pre-n_stream
    ("llamacpp-2025-05-08/mamba-f32state-n3-ctx.state.bin", "mamba"),  # context_blob, recurrent
    ("llamacpp-2025-08-14/gemma2-f16-fa0-unified0-swafull1-ctx.session", "gemma2"),  # session, iSWA, outputs
    ("llamacpp-2025-08-14/lfm2-f16-fa0-unified0-seq1-partial.seqdata.bin", "lfm2"),  # seq_blob, hybrid partial
    ("llamacpp-2026-04-26/qwen2vl-f16-fa0-unified0-seq0.seqdata.bin", "qwen2vl"),  # seq_blob, 8-byte cell ext
    ("llamacpp-2026-04-26/llama-q8_0-fa1-unified1-seq3.seqstate", "llama"),  # seq_file, q8_0
    ("llamacpp-2026-08-16/gemma2-f16-fa0-unified0-swafull1-seq1.seqdata.bin", "gemma2"),  # blob header
    ("llamacpp-2026-08-16/lfm2-f16-fa0-unified0-ctx.state.bin", "lfm2"),  # context_blob, hybrid
    ("llamacpp-2026-10-01/llama-f16-fa0-unified0-seq1.slot-emulated.seqstate", "llama"),  # server slot tokens
    ("llamacpp-2026-10-01/qwen2vl-f16-fa0-unified0-ctx.session", "qwen2vl"),  # session, 12-byte cell ext
    ("llamacpp-2026-10-01/mamba-f32state-n3-seq0.seqstate", "mamba"),  # seq_file, recurrent
    ("llamacpp-2026-10-01/llama-f16-fa1-unified1-frag-ctx.state.bin", "llama"),  # context_blob, fragmented
    # every memory class of today's llama.cpp, both pinned builds (models in tests/data/gen-models)
    ("gen-b11434/llama-q8_0-fa1-unified0-seq0.seqstate", "gen/llama"),  # v4, rotation words
    ("gen-b11434/deepseek32-f16-fa0-unified0-seq0.seqdata.bin", "gen/deepseek32"),  # DSA: K-only MLA + indexer
    ("gen-0c1e5709/dots3note-f16-fa0-unified0-ctx.state.bin", "gen/dots3note"),  # DSA-iSWA, v3
    ("gen-b11434/glm5-next-f16-fa0-unified0-seq1.seqstate", "gen/glm5-next"),  # hybrid_idx, KDA
    ("gen-b11434/qwen4exp-f16-fa0-unified0-ctx.state.bin", "gen/qwen4exp"),  # hybrid_idx, PLE p rows, cell ext
    ("gen-b11434/minimax-m3-f16-fa0-unified0-seq0.seqdata.bin", "gen/minimax-m3"),  # MSA
    ("gen-b11434/deepseek4-f16-fa0-unified0-seq0.seqdata.bin", "gen/deepseek4"),  # DSV4 blocks
    ("gen-0c1e5709/deepseek4-f16-fa0-unified0-seq0-partial.seqdata.bin", "gen/deepseek4"),  # DSV4 partial
    ("gen-b11434/lfm2-swa-f16-fa0-unified0-seq0.seqstate", "gen/lfm2-swa"),  # hybrid-iSWA, empty base
    ("gen-b11434/qwen35-f16-fa0-unified0-seq0.seqstate", "gen/qwen35"),  # hybrid, M-RoPE ext
)

EXTREMES_32 = (0, 1, 2, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xFFFFFFFE)
EXTREMES_64 = (0, 1, 0x7FFFFFFF, 0xFFFFFFFF, 2**32, 2**63 - 1, 2**63, 2**64 - 1)

# a hang guard, not a speed figure (bench/bench_reader.py measures the parse): generous, so that a loaded
# machine does not fail it, and far below what a loop over a file-controlled count would take
PARSE_SECONDS = 15.0
MEMORY_SLACK = 64 << 20
FAILURES = Path(__file__).resolve().parents[2] / "bench" / "out" / "fuzz-failures"


@cache
def fixture_bytes(rel: str) -> bytes:
    return (DATA / rel).read_bytes()


@cache
def field_offsets(rel: str) -> tuple[tuple[int, int], ...]:
    """(offset, width) of the structural scalar fields of a fixture, from its clean parse."""
    key = dict(FIXTURES)[rel]
    res = read_state(DATA / rel, profile=profile(key))
    out: list[tuple[int, int]] = []
    for leaf in res.root.leaves():
        if leaf.kind == "field" and leaf.size in (4, 8):
            out.append((leaf.offset, leaf.size))
        elif leaf.kind == "layer_header":  # i32 type, then u64 row size or u32 el + u32 n_embd
            out += [(leaf.offset, 4), (leaf.offset + 4, 8), (leaf.offset + 4, 4), (leaf.offset + 8, 4)]
        elif leaf.kind in ("cell_meta", "tokens", "outputs") and leaf.size >= 8:
            for k in range(min(leaf.size // 4, 6)):  # the first records: pos, n_seq_id, ids/ext
                out.append((leaf.offset + 4 * k, 4))
    return tuple(sorted(set(out)))


# -- mutations ----------------------------------------------------------------------------
# A mutation is a tuple whose first item names it; positions are taken modulo the current
# length so any drawn integer is valid and shrinks towards the start of the file.

_pos = st.integers(min_value=0, max_value=1 << 20)
_junk = st.binary(min_size=1, max_size=64)
_value32 = st.one_of(st.sampled_from(EXTREMES_32), st.integers(0, 2**32 - 1))
_value64 = st.one_of(st.sampled_from(EXTREMES_64), st.integers(0, 2**64 - 1))

MUTATION = st.one_of(
    st.tuples(st.just("truncate"), _pos),
    st.tuples(st.just("flip"), _pos, st.integers(1, 255)),
    st.tuples(st.just("field"), _pos, st.sampled_from((4, 8)), _value64),
    st.tuples(st.just("word"), _pos, st.sampled_from((4, 8)), _value64),
    st.tuples(st.just("insert"), _pos, st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("delete"), _pos, st.integers(1, 8)),
    st.tuples(st.just("append"), _junk),
)


def apply_mutations(data: bytes, rel: str, muts: list[tuple[Any, ...]]) -> bytes:
    return apply_byte_mutations(data, field_offsets(rel), muts)


# -- checks -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="kvscope-fuzz-") as d:
        yield Path(d)


def check_result(res: ParseResult, size: int) -> None:
    assert res.size == size
    assert check_tiling(res.root) == []
    cov = coverage(res.root)
    assert cov["size"] == size
    assert cov["parsed_bytes"] + cov["untrusted_bytes"] + cov["unparsed_bytes"] + cov["trailing_bytes"] == size
    for f in res.findings:
        assert 0 <= f.offset <= size, f"{f.code} at {f.offset} outside [0, {size}]"
        assert f.length >= 0 and f.offset + f.length <= size, f"{f.code} [{f.offset}, +{f.length}) past {size}"


@contextmanager
def saved_on_failure(data: bytes, **meta: Any) -> Iterator[None]:
    """Write the input of hypothesis' final (shrunk) failing example to bench/out/fuzz-failures/."""
    try:
        yield
    except BaseException as e:
        try:
            final = current_build_context().is_final
        except Exception:
            final = True
        if final:
            FAILURES.mkdir(parents=True, exist_ok=True)
            stem = FAILURES / f"pytest-{hashlib.sha1(data).hexdigest()[:12]}"
            stem.with_suffix(".bin").write_bytes(data)
            info = {**meta, "size": len(data), "error": f"{type(e).__name__}: {e}"}
            stem.with_suffix(".json").write_text(
                json.dumps(info, indent=1, default=lambda o: o.hex() if isinstance(o, bytes) else repr(o)))
            e.add_note(f"failing input saved to {stem.with_suffix('.bin')}")
        raise


def parse_and_check(path: Path, data: bytes, key: str, with_model: bool, **meta: Any) -> ParseResult:
    model = str(model_path(key)) if with_model else None
    with saved_on_failure(data, model=model, **meta):
        path.write_bytes(data)
        t0 = time.perf_counter()
        res = read_state(path, profile=profile(key) if with_model else None)
        dt = time.perf_counter() - t0
        assert dt < PARSE_SECONDS, f"parse took {dt:.2f} s"
        check_result(res, len(data))
        if res.kind != "unknown":
            scan_stats(res)  # appends nonfinite_values / zero_rows findings: check them too
            check_result(res, len(data))
    return res


FUZZ = settings(
    max_examples=1500,
    deadline=timedelta(seconds=3),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def test_fixtures_present() -> None:
    missing = [rel for rel, _ in FIXTURES if not (DATA / rel).is_file()]
    assert not missing
    assert all(field_offsets(rel) for rel, _ in FIXTURES)


@FUZZ
@given(
    fixture=st.sampled_from(FIXTURES),
    with_model=st.booleans(),
    muts=st.lists(MUTATION, min_size=1, max_size=4),
)
def test_mutated_fixture(scratch: Path, fixture: tuple[str, str], with_model: bool,
                         muts: list[tuple[Any, ...]]) -> None:
    rel, key = fixture
    data = apply_mutations(fixture_bytes(rel), rel, muts)
    parse_and_check(scratch / "mutated.bin", data, key, with_model, fixture=rel, mutations=muts)


@FUZZ
@given(
    fixture=st.sampled_from(FIXTURES),
    with_model=st.booleans(),
    slot=_pos,
    width=st.sampled_from((4, 8)),
    value=_value64,
)
def test_extreme_field(scratch: Path, fixture: tuple[str, str], with_model: bool, slot: int, width: int,
                       value: int) -> None:
    """One structural field overwritten: the densest way to reach every count and size check."""
    rel, key = fixture
    muts = [("field", slot, width, value)]
    data = apply_mutations(fixture_bytes(rel), rel, muts)
    parse_and_check(scratch / "mutated.bin", data, key, with_model, fixture=rel, mutations=muts)


# Inputs the fuzzers found, kept as plain regressions: (fixture, mutations, with model). Besides
# the generated mutations, ("put", offset, width, value) writes at an absolute offset.
REGRESSIONS: tuple[tuple[str, list[tuple[Any, ...]], bool], ...] = (
    # n_layer 2 -> 1 in stream 1 of a seq blob: the parse stopped at 6368 and left no leaf for the rest
    ("llamacpp-2026-08-16/gemma2-f16-fa0-unified0-swafull1-seq1.seqdata.bin", [("put", 168, 4, 1)], False),
    # one byte deleted inside the K0 rows (one appended): a resync, leaves end at 12627 of 12628
    ("llamacpp-2026-10-01/llama-f16-fa0-unified0-seq1.slot-emulated.seqstate",
     [("delete", 252, 1), ("append", b"\x00")], False),
    # n_embd_v_gqa of a transposed V header set to 1 in a session: leaves end at 23666 of 45062
    ("llamacpp-2025-08-14/gemma2-f16-fa0-unified0-swafull1-ctx.session", [("put", 21586, 4, 1)], False),
)


@pytest.mark.parametrize(("rel", "muts", "with_model"), REGRESSIONS)
def test_regression(scratch: Path, rel: str, muts: list[tuple[Any, ...]], with_model: bool) -> None:
    data = apply_mutations(fixture_bytes(rel), rel, muts)
    parse_and_check(scratch / "regression.bin", data, dict(FIXTURES)[rel], with_model, fixture=rel,
                    mutations=muts)


@settings(max_examples=300, deadline=timedelta(seconds=3),
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=512), with_model=st.booleans())
def test_random_bytes(scratch: Path, data: bytes, with_model: bool) -> None:
    parse_and_check(scratch / "random.bin", data, "llama", with_model)


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    fixture=st.sampled_from(FIXTURES),
    with_model=st.booleans(),
    muts=st.lists(MUTATION, min_size=1, max_size=4),
)
def test_parse_memory_bounded(fixture: tuple[str, str], with_model: bool, muts: list[tuple[Any, ...]]) -> None:
    """Peak Python/numpy allocation of a parse (from bytes) stays below file size + 64 MiB."""
    rel, key = fixture
    data = apply_mutations(fixture_bytes(rel), rel, muts)
    prof = profile(key) if with_model else None
    with saved_on_failure(data, fixture=rel, mutations=muts, with_model=with_model):
        tracemalloc.start()
        try:
            res = read_state(data=data, profile=prof)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        check_result(res, len(data))
        assert peak < len(data) + MEMORY_SLACK, f"peak {peak} bytes for a {len(data)}-byte input"


def test_huge_counts_do_not_allocate() -> None:
    """The first fields of some fixtures set to huge values in turn: no parse allocates by count."""
    for rel, key in FIXTURES[::3]:
        base = fixture_bytes(rel)
        for slot, (_, width) in enumerate(field_offsets(rel)[:24]):
            for value in (0xFFFFFFFF, 0x7FFFFFFF, 2**63):
                data = apply_mutations(base, rel, [("field", slot, width, value)])
                tracemalloc.start()
                try:
                    res = read_state(data=data, profile=profile(key))
                    _, peak = tracemalloc.get_traced_memory()
                finally:
                    tracemalloc.stop()
                check_result(res, len(data))
                assert peak < len(data) + MEMORY_SLACK, (rel, slot, width, value, peak)


# -- the model as untrusted input ----------------------------------------------------------


@cache
def model_prefix(key: str) -> bytes:
    """The tiny model's header and key/value section (what the profile loader reads)."""
    data = model_path(key).read_bytes()
    return data[: gguf_kv_end(data) + 64]


@cache
def model_field_offsets(key: str) -> tuple[tuple[int, int], ...]:
    return tuple(gguf_fields(model_prefix(key)))


MODEL_SECONDS = 10.0  # a hang guard, as PARSE_SECONDS


def load_mutated_model(path: Path, data: bytes) -> Any:
    """The profile of the mutated model at ``path``, or None after checking its error message."""
    path.write_bytes(data)
    t0 = time.perf_counter()
    try:
        prof = load_model_profile(path)
    except ModelProfileError as e:
        msg = str(e)
        assert msg and msg.isprintable(), repr(msg)  # one line, nothing raw from the file
        prof = None
    dt = time.perf_counter() - t0
    assert dt < MODEL_SECONDS, f"model load took {dt:.2f} s"
    return prof


@settings(max_examples=250, deadline=timedelta(seconds=5),
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(fixture=st.sampled_from(FIXTURES), muts=st.lists(MUTATION, min_size=1, max_size=3))
def test_mutated_model(scratch: Path, fixture: tuple[str, str], muts: list[tuple[Any, ...]]) -> None:
    """A mutated model loads (or fails with one clean line); its profile parses the state safely."""
    rel, key = fixture
    data = apply_byte_mutations(model_prefix(key), model_field_offsets(key), muts)
    with saved_on_failure(data, fixture=rel, model_mutations=muts):
        tracemalloc.start()
        try:
            prof = load_mutated_model(scratch / "model.gguf", data)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < len(data) + MEMORY_SLACK, f"model load peak {peak} bytes"
        if prof is None:
            return
        state = fixture_bytes(rel)
        t0 = time.perf_counter()
        res = read_state(data=state, profile=prof)
        assert time.perf_counter() - t0 < PARSE_SECONDS
        check_result(res, len(state))


SPARSE_SIZES = (1 << 30, 50 << 30)


@pytest.mark.parametrize("size", SPARSE_SIZES)
@pytest.mark.parametrize(("rel", "key"), FIXTURES[::2])
def test_sparse_giant_tail(scratch: Path, rel: str, key: str, size: int) -> None:
    """A fixture extended with a hole: bounded parse time and allocation, whatever the tail's size."""
    path = scratch / "sparse.bin"
    path.write_bytes(fixture_bytes(rel))
    os.truncate(path, size)
    try:
        for prof in (None, profile(key)):
            tracemalloc.start()
            try:
                t0 = time.perf_counter()
                res = read_state(path, profile=prof)
                dt = time.perf_counter() - t0
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            check_result(res, size)
            assert dt < 10 * PARSE_SECONDS, f"parse of a {size >> 30} GB sparse tail took {dt:.1f} s"
            assert peak < MEMORY_SLACK, f"parse of a {size >> 30} GB sparse tail allocated {peak >> 20} MiB"
    finally:
        path.unlink()


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(fixture=st.sampled_from(FIXTURES), with_model=st.booleans(), cut=st.floats(0.0, 1.0))
def test_concurrent_truncation(scratch: Path, fixture: tuple[str, str], with_model: bool, cut: float) -> None:
    """A thread keeps cutting the file and growing it back while it is parsed and scanned: the
    result is checked against the size it was read at, or the read says the file changed."""
    rel, key = fixture
    data = fixture_bytes(rel)
    path = scratch / "racing.bin"
    path.write_bytes(data)
    stop = threading.Event()

    def toggle() -> None:
        while not stop.is_set():
            os.truncate(path, int(len(data) * cut))
            os.truncate(path, len(data))

    t = threading.Thread(target=toggle)
    t.start()
    try:
        for _ in range(5):
            try:
                res = read_state(path, profile=profile(key) if with_model else None)
                check_result(res, res.size)
                if res.kind != "unknown":
                    scan_stats(res)
                    check_result(res, res.size)
            except FileChangedError as e:
                assert str(e) == "the file changed while it was read"
    finally:
        stop.set()
        t.join()
