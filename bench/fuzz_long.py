"""Long fuzz run of the state reader: millions of mutated real fixtures, no hypothesis.

The same mutators as ``tests/test_fuzz_reader.py`` (truncation, byte flips, extreme values over
structural u32/u64 fields or aligned words, inserted/deleted bytes, appended junk), drawn with
plain ``random`` so a run does hundreds of inputs per second per core. Seeds are every real
fixture under ``tests/data`` (the manifest folders and the lab's corrupted inputs), parsed half
the time with the tiny model that wrote them.

A share of the inputs (``--model-share``, default a quarter) mutates the model instead: the key/value
section of the tiny GGUF that wrote the fixture gets the same mutations over its structural fields
(counts, lengths, value and element types); ``load_model_profile`` must return a profile or raise a
one-line, escaped ModelProfileError within 1 s, and a profile it returns then parses the fixture
under the checks below. Every ``--sparse-every`` inputs, the mutated state is extended with a hole
to 1-50 GB (a sparse giant tail); every ``--race-every`` inputs, a thread keeps cutting the file
and growing it back while it is parsed, and ``FileChangedError`` is an accepted answer. One input
in ``NAMES_EVERY`` is written under a hostile file name (control, bidi, HTML and Markdown characters)
and inspect's text, Markdown and JSON of it must escape the name and the file's strings for their
medium.

Every input is checked: ``read_state`` does not raise, ``check_tiling(root) == []``, each
finding lies inside ``[0, size]``, coverage adds up to the size, the parse takes under 2 s (20 s
for a sparse tail), ``scan_stats`` does not raise, and (every ``--mem-every`` inputs) a parse from
bytes (or a model load plus the parse) allocates under size + 64 MiB (tracemalloc; sparse tails:
under 64 MiB). Peak allocations are reported for state, model and sparse-tail inputs
separately. Input ``i`` of a run is a pure function of ``(--seed, i)``: ``--replay i`` rebuilds
and re-checks one input in-process, with the traceback.

``--fleet-inputs N`` then runs N inputs of each process-level family of ``bench/fuzz_fleet.py``
(verify against a misbehaving llama-server, migrate/scan with links in DEST and SOURCE, killed and
stopped workers, signals with leftover checks; outputs naming inputs, FIFOs and devices as outputs,
hostile ``--ctx-param`` and corrupt specs, ``--jobs`` extremes and links leaving SOURCE, hostile option
values and their messages, signals during repair and the engine lab), with the same seed.

Failing inputs are written to ``bench/out/fuzz-failures/`` (``<signature>-<index>.bin`` plus a
``.json`` with the fixture, the mutations and the error; at most ``--keep-per-signature`` files
per distinct failure and worker). The exit status is 1 when anything failed.

Usage::

    .venv/bin/python bench/fuzz_long.py                      # 1,000,000 inputs on 2 cores
    .venv/bin/python bench/fuzz_long.py --inputs 20000 --seed 7
    .venv/bin/python bench/fuzz_long.py --seed 7 --replay 1234
    .venv/bin/python bench/fuzz_long.py --quick              # a smoke run: 200 inputs, one process
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import re
import resource
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import tracemalloc
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from kvscope.core.analysis.stats import scan_stats
from kvscope.core.model.profile import ModelProfile, ModelProfileError, load_model_profile
from kvscope.core.reader.parse import read_state
from kvscope.core.reader.records import ParseResult
from kvscope.core.reader.source import FileChangedError
from kvscope.core.reader.tree import check_tiling, coverage

ROOT = Path(__file__).resolve().parent.parent
from fuzz_inputs import (  # noqa: E402  (the run's inputs: seeds, models, mutations)
    DATA,
    Input,
    Seed,
    load_seed,
    make_input,
    model_file,
    profile_for,
    seed_files,
)

OUT = ROOT / "bench" / "out" / "fuzz-failures"
PARSE_SECONDS = 2.0
SPARSE_SECONDS = 20.0
MODEL_SECONDS = 1.0
MEMORY_SLACK = 64 << 20
HANG_SECONDS = 60


# -- checks --------------------------------------------------------------------------------


class CheckFailed(Exception):
    """An invariant did not hold for a parse."""


class Hang(Exception):
    """A parse ran past HANG_SECONDS."""


def check_result(res: ParseResult, size: int) -> None:
    if res.size != size:
        raise CheckFailed(f"result size {res.size} != input size {size}")
    problems = check_tiling(res.root)
    if problems:
        raise CheckFailed(f"tiling: {problems[0]}")
    cov = coverage(res.root)
    total = cov["parsed_bytes"] + cov["untrusted_bytes"] + cov["unparsed_bytes"] + cov["trailing_bytes"]
    if cov["size"] != size or total != size:
        raise CheckFailed(f"coverage adds up to {total} of {size}")
    for f in res.findings:
        if not (0 <= f.offset <= size):
            raise CheckFailed(f"finding {f.code} at offset {f.offset} outside [0, {size}]")
        if f.length < 0 or f.offset + f.length > size:
            raise CheckFailed(f"finding {f.code} [{f.offset}, +{f.length}) runs past {size}")


def _load_model(path: Path, data: bytes) -> ModelProfile | None:
    """The mutated model's profile, or None after checking its error is one clean line."""
    path.write_bytes(data)
    t0 = time.perf_counter()
    try:
        prof = load_model_profile(path)
    except ModelProfileError as e:
        if not str(e) or not str(e).isprintable():
            raise CheckFailed(f"model error is not one escaped line: {str(e)[:80]!r}") from None
        prof = None
    dt = time.perf_counter() - t0
    if dt > MODEL_SECONDS:
        raise CheckFailed(f"model load took {dt:.2f} s (limit {MODEL_SECONDS} s)")
    return prof


def _race(path: Path, size: int, fn: Any) -> Any:
    """``fn()`` while a thread keeps cutting ``path`` to half and growing it back; None if it saw the change."""
    stop = threading.Event()

    def toggle() -> None:
        while not stop.is_set():
            os.truncate(path, size // 2)
            os.truncate(path, size)

    t = threading.Thread(target=toggle)
    t.start()
    try:
        return fn()
    except FileChangedError:
        return None
    finally:
        stop.set()
        t.join()


# what no rendering may pass through raw: C0/C1 controls but the newline, bidi embeddings, overrides,
# isolates and marks; and in Markdown a < or & that is not backslash-escaped (raw HTML, an entity)
_RAW_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_MARKDOWN_RAW = re.compile(r"(?<!\\)[<&]")


def check_renderings(res: ParseResult, prof: ModelProfile | None) -> None:
    """inspect's text, Markdown and JSON of ``res`` (read from a hostile file name) escape it for their medium."""
    import io

    from kvscope.core.analysis.inspection import Inspection
    from kvscope.core.analysis.verdict import verdict
    from kvscope.core.jsonout import write_json

    found = Inspection(res, prof, verdict(res, prof))
    for markdown in (False, True):
        out = found.to_text(markdown=markdown)
        hit = _RAW_CONTROL.search(out) or (_MARKDOWN_RAW.search(out) if markdown else None)
        if hit:
            raise CheckFailed(f"{'Markdown' if markdown else 'text'} output passes {hit.group()!r} raw")
    buf = io.StringIO()
    write_json(found.to_json(lazy=True), buf)
    if json.loads(buf.getvalue()).get("file") != res.path:
        raise CheckFailed("the JSON does not give the file name back as it is")


def run_one(path: Path, inp: Input, measure_memory: bool) -> tuple[ParseResult | None, float, int]:
    """Run and check one input (the state is written at ``path``); (result, seconds, peak bytes or -1)."""
    seed = inp.seed
    prof = profile_for(seed.key) if inp.with_model else None
    state = inp.data
    model_peak = -1
    if inp.target == "model":
        mpeak = -1
        if measure_memory:  # the load and the parse it allows, from bytes
            tracemalloc.start()
            try:
                prof = _load_model(path.with_suffix(".gguf"), inp.data)
                if prof is not None:
                    read_state(data=seed.data, profile=prof)
                _, mpeak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            if mpeak > len(inp.data) + len(seed.data) + MEMORY_SLACK:
                raise CheckFailed(f"model load and parse allocated {mpeak} bytes")
        else:
            prof = _load_model(path.with_suffix(".gguf"), inp.data)
        if prof is None:
            return None, 0.0, mpeak
        state = seed.data
        measure_memory = False  # measured above
        model_peak = mpeak
    if inp.name:
        path = path.with_name(inp.name)
        try:
            path.write_bytes(state)
            res = read_state(path, profile=prof)
            check_result(res, len(state))
            check_renderings(res, prof)
        finally:
            path.unlink(missing_ok=True)
        return res, 0.0, -1
    path.write_bytes(state)
    size = len(state)
    if inp.sparse:
        os.truncate(path, inp.sparse)
        size = inp.sparse
    t0 = time.perf_counter()
    if inp.race:
        res = _race(path, size, lambda: read_state(path, profile=prof))
        if res is not None:
            check_result(res, res.size)
        return res, time.perf_counter() - t0, -1
    if inp.sparse:
        tracemalloc.start()
    try:
        res = read_state(path, profile=prof)
        peak = tracemalloc.get_traced_memory()[1] if inp.sparse else -1
    finally:
        if inp.sparse:
            tracemalloc.stop()
    dt = time.perf_counter() - t0
    check_result(res, size)
    if dt > (SPARSE_SECONDS if inp.sparse else PARSE_SECONDS):
        raise CheckFailed(f"parse took {dt:.2f} s (limit {SPARSE_SECONDS if inp.sparse else PARSE_SECONDS} s)")
    if inp.sparse:
        if peak > MEMORY_SLACK:
            raise CheckFailed(f"parse of a sparse {inp.sparse >> 30} GB file allocated {peak} bytes")
        return res, dt, peak
    if res.kind != "unknown":
        scan_stats(res)  # appends nonfinite_values / zero_rows findings: check them too
        check_result(res, size)
    if measure_memory:
        tracemalloc.start()
        try:
            if inp.target == "model":
                _load_model(path.with_suffix(".gguf"), inp.data)
            read_state(data=state, profile=prof)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        if peak > len(inp.data) + size + MEMORY_SLACK:
            raise CheckFailed(f"parse allocated {peak} bytes for a {size}-byte input")
    return res, dt, model_peak if inp.target == "model" else peak


# -- workers -------------------------------------------------------------------------------


@dataclass
class ChunkReport:
    n: int = 0
    codes: Counter[str] = field(default_factory=Counter)
    kinds: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)  # signature -> count
    saved: list[str] = field(default_factory=list)
    slowest: tuple[float, int, str] = (0.0, -1, "")
    mem_samples: int = 0
    mem_peak: int = 0  # largest tracemalloc peak minus input size (state mutations)
    model_samples: int = 0
    model_peak: int = 0  # largest tracemalloc peak of a model load + parse minus input sizes
    model_inputs: int = 0
    model_loaded: int = 0  # mutated models that still gave a profile
    sparse_inputs: int = 0
    sparse_peak: int = 0  # largest tracemalloc peak of a sparse-tail parse
    race_inputs: int = 0
    race_changed: int = 0  # races that ended in FileChangedError
    maxrss_kib: int = 0


_W: dict[str, Any] = {}


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    raise Hang(f"no result after {HANG_SECONDS} s")


def worker_init(seed_paths: list[str], run_seed: int, mem_every: int, keep: int, out: str, scratch: str,
                model_share: float = 0.25, sparse_every: int = 0, race_every: int = 0) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C
    signal.signal(signal.SIGALRM, _on_alarm)
    # numpy overflow/invalid warnings from scanning garbage payloads would flood the output
    warnings.filterwarnings("ignore", category=RuntimeWarning)
    _W.update(
        seeds=[load_seed(Path(p)) for p in seed_paths],
        run_seed=run_seed,
        mem_every=mem_every,
        model_share=model_share,
        sparse_every=sparse_every,
        race_every=race_every,
        keep=keep,
        scratch=Path(scratch) / f"input-{os.getpid()}.bin",
        saved=Counter(),
        out=Path(out),
    )


def signature(exc: BaseException) -> str:
    """A short stable name for a failure: exception type, message head and innermost frame."""
    tb = traceback.extract_tb(exc.__traceback__)
    where = next((f"{Path(fr.filename).name}:{fr.lineno}" for fr in reversed(tb) if "kvscope" in fr.filename
                  or "/core/" in fr.filename), "")
    msg = re.sub(r"-?\d+", "N", str(exc))[:60] if isinstance(exc, CheckFailed) else ""
    return f"{type(exc).__name__} {msg} {where}".strip()


def save_failure(sig: str, index: int, inp: Input, exc: BaseException) -> str:
    out: Path = _W.get("out", OUT)
    out.mkdir(parents=True, exist_ok=True)
    tag = hashlib.sha1(sig.encode()).hexdigest()[:10]
    stem = out / f"{tag}-{index}"
    stem.with_suffix(".gguf" if inp.target == "model" else ".bin").write_bytes(inp.data)
    seed = inp.seed
    meta = {
        "signature": sig,
        "index": index,
        "run_seed": _W.get("run_seed"),
        "fixture": str(seed.path.relative_to(ROOT)),
        "model": str(model_file(seed.key).relative_to(ROOT)) if inp.with_model and seed.key else None,
        "target": inp.target,
        "sparse": inp.sparse,
        "race": inp.race,
        "mutations": [[x.hex() if isinstance(x, bytes) else x for x in m] for m in inp.muts],
        "size": len(inp.data),
        "error": f"{type(exc).__name__}: {exc}",
        "traceback": traceback.format_exception(exc),
    }
    stem.with_suffix(".json").write_text(json.dumps(meta, indent=1))
    saved = stem.with_suffix(".gguf" if inp.target == "model" else ".bin")
    return str(saved.relative_to(ROOT)) if saved.is_relative_to(ROOT) else str(saved)


def run_chunk(task: tuple[int, int]) -> ChunkReport:
    start, count = task
    seeds: list[Seed] = _W["seeds"]
    rep = ChunkReport()
    for index in range(start, start + count):
        inp = make_input(seeds, _W["run_seed"], index, _W["model_share"], _W["sparse_every"], _W["race_every"])
        every = _W["mem_every"] if inp.target == "state" else max(1, _W["mem_every"] // 5)  # fewer model inputs
        measure = _W["mem_every"] > 0 and index % every == 0
        rep.model_inputs += inp.target == "model"
        rep.sparse_inputs += inp.sparse > 0
        rep.race_inputs += inp.race
        signal.alarm(HANG_SECONDS)
        try:
            res, dt, peak = run_one(_W["scratch"], inp, measure)
        except (Exception, RecursionError) as e:  # anything at all is a finding of the fuzzer
            signal.alarm(0)
            sig = signature(e)
            rep.failures[sig] += 1
            if _W["saved"][sig] < _W["keep"]:
                _W["saved"][sig] += 1
                rep.saved.append(save_failure(sig, index, inp, e))
            rep.n += 1
            continue
        signal.alarm(0)
        rep.n += 1
        if inp.target == "model" and peak >= 0:
            rep.model_samples += 1
            rep.model_peak = max(rep.model_peak, peak - len(inp.data) - len(inp.seed.data))
        if res is None:
            rep.race_changed += inp.race
            continue
        rep.model_loaded += inp.target == "model"
        rep.kinds[res.kind] += 1
        rep.codes.update({f.code for f in res.findings})
        if dt > rep.slowest[0]:
            what = "model" if inp.target == "model" else f"sparse {inp.sparse >> 30} GB" if inp.sparse else "state"
            rep.slowest = (dt, index, f"{inp.seed.path.relative_to(DATA)} model={inp.with_model} {what} "
                           f"{len(inp.data)} B")
        if peak < 0:
            continue
        if inp.sparse:
            rep.sparse_peak = max(rep.sparse_peak, peak)
        elif inp.target == "state":
            rep.mem_samples += 1
            rep.mem_peak = max(rep.mem_peak, peak - len(inp.data))
    rep.maxrss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rep


# -- driver --------------------------------------------------------------------------------


def replay(seed_paths: list[str], run_seed: int, index: int, model_share: float, sparse_every: int,
           race_every: int) -> int:
    seeds = [load_seed(Path(p)) for p in seed_paths]
    inp = make_input(seeds, run_seed, index, model_share, sparse_every, race_every)
    print(f"input {index} of seed {run_seed}: {inp.seed.path.relative_to(ROOT)} model={inp.with_model} "
          f"target {inp.target}{f', sparse {inp.sparse >> 30} GB' if inp.sparse else ''}"
          f"{', racing a truncation' if inp.race else ''}, {len(inp.data)} bytes, mutations {inp.muts}")
    with tempfile.TemporaryDirectory() as d:
        res, dt, peak = run_one(Path(d) / "input.bin", inp, True)
    if res is None:
        print("ok: " + ("the read saw the file change" if inp.race else "the model was refused with a clean error"))
        return 0
    print(f"ok: kind {res.kind}, layout {res.layout.name}, {len(res.findings)} findings "
          f"({', '.join(sorted({f.code for f in res.findings})) or 'none'}), {dt * 1e3:.1f} ms, "
          f"peak alloc {peak / 2**20:.1f} MiB")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--inputs", type=int, default=1_000_000, help="number of mutated inputs (default 1,000,000)")
    ap.add_argument("--seed", type=int, default=0, help="run seed: input i is a function of (seed, i)")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--chunk", type=int, default=500, help="inputs per work unit")
    ap.add_argument("--mem-every", type=int, default=250, help="tracemalloc every N-th input (0: never)")
    ap.add_argument("--keep-per-signature", type=int, default=5, help="failing inputs saved per distinct failure")
    ap.add_argument("--progress", type=float, default=10.0, help="seconds between progress lines")
    ap.add_argument("--out", type=Path, default=OUT, help="where failing inputs go (default bench/out/fuzz-failures)")
    ap.add_argument("--model-share", type=float, default=0.25, help="share of inputs that mutate the model (0.25)")
    ap.add_argument("--sparse-every", type=int, default=2000, help="every N-th input gets a 1-50 GB hole (0: never)")
    ap.add_argument("--race-every", type=int, default=1000,
                    help="every N-th input is parsed while a thread cuts the file (0: never)")
    ap.add_argument("--replay", type=int, metavar="INDEX", help="rebuild and check one input, with traceback")
    ap.add_argument("--fleet-inputs", type=int, default=0, metavar="N",
                    help="then N inputs of each process-level family of bench/fuzz_fleet.py (server, trees, "
                    "workers, signals, outputs, ctx_params, corrupt_specs, jobs_links, messages, "
                    "signals_repair_lab; seconds each, one at a time) with the same seed (default 0: none)")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: 200 inputs on one process, with memory samples, sparse tails and races "
                    "among them (every 50th, 50th and 40th)")
    args = ap.parse_args(argv)
    if args.quick:
        args.inputs, args.jobs, args.chunk = 200, 1, 100
        args.mem_every, args.sparse_every, args.race_every = 50, 50, 40

    seed_paths = [str(p) for p in seed_files()]
    if args.replay is not None:
        return replay(seed_paths, args.seed, args.replay, args.model_share, args.sparse_every, args.race_every)

    print(f"fuzz_long: {args.inputs:,} inputs, seed {args.seed}, {args.jobs} jobs, {len(seed_paths)} seed files")
    tasks = [(s, min(args.chunk, args.inputs - s)) for s in range(0, args.inputs, args.chunk)]
    total = ChunkReport()
    t0 = last = time.perf_counter()
    scratch = tempfile.mkdtemp(prefix="kvscope-fuzz-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    init_args = (seed_paths, args.seed, args.mem_every, args.keep_per_signature, str(args.out), scratch,
                 args.model_share, args.sparse_every, args.race_every)
    interrupted = False

    def merge(rep: ChunkReport) -> None:
        nonlocal last
        total.n += rep.n
        total.codes.update(rep.codes)
        total.kinds.update(rep.kinds)
        total.failures.update(rep.failures)
        total.saved += rep.saved
        total.slowest = max(total.slowest, rep.slowest)
        total.mem_samples += rep.mem_samples
        total.mem_peak = max(total.mem_peak, rep.mem_peak)
        total.model_samples += rep.model_samples
        total.model_peak = max(total.model_peak, rep.model_peak)
        total.model_inputs += rep.model_inputs
        total.model_loaded += rep.model_loaded
        total.sparse_inputs += rep.sparse_inputs
        total.sparse_peak = max(total.sparse_peak, rep.sparse_peak)
        total.race_inputs += rep.race_inputs
        total.race_changed += rep.race_changed
        total.maxrss_kib = max(total.maxrss_kib, rep.maxrss_kib)
        now = time.perf_counter()
        if now - last >= args.progress:
            last = now
            rate = total.n / (now - t0)
            eta = (args.inputs - total.n) / rate if rate else 0.0
            print(f"  {total.n:>10,} / {args.inputs:,}  {rate:8.0f} inputs/s  failures {sum(total.failures.values())}"
                  f"  slowest {total.slowest[0] * 1e3:.0f} ms  ETA {eta / 60:.1f} min", flush=True)

    try:
        if args.jobs <= 1:
            worker_init(*init_args)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            for task in tasks:
                merge(run_chunk(task))
        else:
            with mp.get_context("fork").Pool(args.jobs, worker_init, init_args) as pool:
                for rep in pool.imap_unordered(run_chunk, tasks):
                    merge(rep)
    except KeyboardInterrupt:
        interrupted = True
        print("interrupted", file=sys.stderr)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    elapsed = time.perf_counter() - t0

    rss_children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    rss_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print("\nfinding codes (inputs with at least one):")
    for code, n in total.codes.most_common():
        print(f"  {code:<22} {n:>10,}  {100 * n / max(total.n, 1):5.1f}%")
    print("kinds: " + ", ".join(f"{k} {n:,}" for k, n in total.kinds.most_common()))
    dt, idx, what = total.slowest
    print(f"slowest parse: {dt * 1e3:.1f} ms (input {idx}: {what}; replay with --seed {args.seed} --replay {idx})")
    print(f"state mutations: peak allocation over input size (tracemalloc, {total.mem_samples} samples): "
          f"{total.mem_peak / 2**20:.2f} MiB")
    print(f"model mutations: {total.model_inputs:,} inputs, {total.model_loaded:,} still loaded and parsed the state; "
          f"peak allocation of load + parse over input sizes ({total.model_samples} samples): "
          f"{total.model_peak / 2**20:.2f} MiB")
    print(f"sparse giant tails (1-50 GB holes): {total.sparse_inputs:,} inputs, peak parse allocation "
          f"{total.sparse_peak / 2**20:.2f} MiB")
    print(f"concurrent truncation: {total.race_inputs:,} inputs, {total.race_changed:,} ended in FileChangedError, "
          "the rest in a checked result")
    print(f"peak RSS: workers {max(total.maxrss_kib, rss_children) / 1024:.0f} MiB, "
          f"driver {rss_self / 1024:.0f} MiB")
    if total.failures:
        print("FAILURES:")
        for sig, n in total.failures.most_common():
            print(f"  {n:>8,}  {sig}")
        for p in total.saved:
            print(f"  saved {p}")
    n_fail = sum(total.failures.values())
    rate = total.n / elapsed if elapsed else 0.0
    print(f"SUMMARY: {total.n:,} inputs ({total.model_inputs:,} model mutations) in {elapsed:.1f} s "
          f"({rate:.0f} inputs/s, {args.jobs} jobs), "
          f"{n_fail} failures in {len(total.failures)} distinct signatures, slowest {dt * 1e3:.1f} ms, "
          f"seed {args.seed}{' (interrupted)' if interrupted else ''}")
    fleet_rc = 0
    if args.fleet_inputs > 0 and not interrupted:
        import fuzz_fleet

        print(f"\nprocess-level families (bench/fuzz_fleet.py), {args.fleet_inputs} inputs each:", flush=True)
        fleet_rc = fuzz_fleet.main(["--inputs", str(args.fleet_inputs), "--seed", str(args.seed)])
    return 1 if n_fail or interrupted or fleet_rc else 0


if __name__ == "__main__":
    sys.exit(main())
