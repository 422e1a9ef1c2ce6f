"""The llama.cpp engine's own cost: call round trips, payload transport, and the state APIs on a
big state through :class:`LlamaProcess`, against the same llama.cpp calls made in-process.

It writes a random-weight llama GGUF (tiny-llama's tokenizer, ``--embd``/``--layers`` wide), starts
a child per build, and reports: start-up time; the round trip of a small call (``seq_pos_max``,
median and p99 over 1,000); ``echo`` throughput (the transport alone: inline below 1 MiB, a scratch
file above); and for a state of ``--tokens`` tokens with f32 K/V, ``state_get_data`` /
``state_set_data`` / ``state_seq_get_data`` through the engine and, in a second process that calls
llama.cpp directly through the binding (``bytes`` out, ``bytearray`` in), the same calls, with the
ratio of the two. Goal: small calls well under 5 ms; big payloads near the in-process cost.

Usage::

    .venv/bin/python bench/bench_engine.py                     # 8 layers x 512, 4,096 tokens (128 MiB)
    .venv/bin/python bench/bench_engine.py --tokens 8192 --build b11434
    .venv/bin/python bench/bench_engine.py --quick             # a smoke run: 1,024 tokens, 2 x 128
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "tests/data/llamacpp-2026-10-01/tiny-llama.gguf"


def write_model(path: Path, n_embd: int, n_layer: int, n_head: int, n_ff: int) -> Path:
    """A random-weight llama GGUF with tiny-llama's tokenizer."""
    import gguf

    src = gguf.GGUFReader(TINY)
    w = gguf.GGUFWriter(path, arch="llama")
    for field in src.fields.values():
        if field.name.startswith("tokenizer."):
            vtype = field.types[0]
            sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            w.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    n_vocab = len(src.fields["tokenizer.ggml.tokens"].data)
    w.add_context_length(16384)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    rng = np.random.default_rng(0)

    def t(name: str, *shape: int) -> None:
        data = (rng.standard_normal(shape[::-1], dtype=np.float32) * 0.02).astype(np.float16)
        w.add_tensor(name, data)

    def norm(name: str) -> None:
        w.add_tensor(name, np.ones(n_embd, dtype=np.float32))

    t("token_embd.weight", n_embd, n_vocab)
    norm("output_norm.weight")
    t("output.weight", n_embd, n_vocab)
    for i in range(n_layer):
        norm(f"blk.{i}.attn_norm.weight")
        norm(f"blk.{i}.ffn_norm.weight")
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            t(f"blk.{i}.{name}.weight", n_embd, n_embd)
        t(f"blk.{i}.ffn_gate.weight", n_embd, n_ff)
        t(f"blk.{i}.ffn_up.weight", n_embd, n_ff)
        t(f"blk.{i}.ffn_down.weight", n_ff, n_embd)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def timed(fn: Any, repeat: int = 3) -> tuple[float, Any]:
    """Best of ``repeat`` wall times, and the last result."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def tokens_for(n: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(3).integers(3, 379, n)]


def baseline(model: str, n_ctx: int, n_tokens: int) -> dict[str, float]:
    """In this process (a child started with LLAMA_CPP_LIB_PATH): the same calls, directly."""
    import ctypes

    from kvscope.core.engine.worker import Channel, Engine

    chan = Channel(os.open(os.devnull, os.O_WRONLY))
    ctx = {"n_ctx": n_ctx, "n_batch": 512, "n_ubatch": 512, "n_seq_max": 1, "kv_unified": True, "flash_attn": None,
           "type_k": "f32", "type_v": "f32", "swa_full": True, "n_threads": 2}
    eng = Engine({"model": model, "ctx": ctx, "scratch": []}, chan)
    eng.op_decode({"seq_id": 0, "tokens": tokens_for(n_tokens)}, None)
    L, c = eng.L, eng.ctx

    def get() -> bytes:
        size = L.llama_state_get_size(c)
        buf = (ctypes.c_uint8 * size)()
        n = L.llama_state_get_data(c, buf, size)
        return bytes(memoryview(buf)[:n])

    def seq_get() -> bytes:
        size = L.llama_state_seq_get_size_ext(c, 0, 0)
        buf = (ctypes.c_uint8 * size)()
        n = L.llama_state_seq_get_data_ext(c, buf, size, 0, 0)
        return bytes(memoryview(buf)[:n])

    t_get, blob = timed(get)

    def put() -> int:
        arr = bytearray(blob)
        return int(L.llama_state_set_data(c, (ctypes.c_uint8 * len(arr)).from_buffer(arr), len(arr)))

    t_set, n = timed(put)
    assert n == len(blob)
    t_seq, _ = timed(seq_get)
    return {"state_get_data_s": t_get, "state_set_data_s": t_set, "state_seq_get_data_s": t_seq, "bytes": len(blob)}


def bench_build(build: str, model: Path, n_ctx: int, n_tokens: int) -> dict[str, Any]:
    from kvscope.core.engine.llamacpp import CtxParams, LlamaProcess

    out: dict[str, Any] = {"build": build}
    t0 = time.perf_counter()
    ctx = CtxParams(n_ctx=n_ctx, n_batch=512, n_ubatch=512, type_k="f32", type_v="f32")
    with LlamaProcess(model, ctx, build=build) as p:
        out["startup_s"] = round(time.perf_counter() - t0, 3)
        rt = []
        for _ in range(1000):
            t1 = time.perf_counter()
            p.seq_pos_max(0)
            rt.append(time.perf_counter() - t1)
        rt.sort()
        out["round_trip_ms"] = {"median": round(statistics.median(rt) * 1e3, 3), "p99": round(rt[989] * 1e3, 3)}
        echo = {}
        for mib in (0.5, 16, 128):
            data = os.urandom(int(mib * (1 << 20)))
            t, back = timed(lambda d=data: p.echo(d))
            assert back == data
            echo[f"{mib:g} MiB"] = {"s": round(t, 4), "MiB_per_s_each_way": round(2 * mib / t)}
        out["echo"] = echo
        toks = tokens_for(n_tokens)
        t1 = time.perf_counter()
        assert p.decode(0, toks).rc == 0
        out["decode_s"] = round(time.perf_counter() - t1, 2)
        t_get, blob = timed(p.state_get_data)
        t_set, o = timed(lambda: p.state_set_data(blob))
        assert o.value == len(blob)
        t_seq, _ = timed(lambda: p.state_seq_get_data(0))
    mib = len(blob) / (1 << 20)
    env = dict(os.environ, LLAMA_CPP_LIB_PATH=str(_lib_dir(build)))
    r = subprocess.run([sys.executable, __file__, "--baseline", str(model), str(n_ctx), str(n_tokens)],
                       capture_output=True, text=True, env=env, check=True)
    base = json.loads(r.stdout.strip().splitlines()[-1])
    assert base["bytes"] == len(blob)
    out["state_MiB"] = round(mib, 1)
    for key, t in (("state_get_data_s", t_get), ("state_set_data_s", t_set), ("state_seq_get_data_s", t_seq)):
        out[key] = {"engine": round(t, 3), "in_process": round(base[key], 3), "ratio": round(t / base[key], 2),
                    "engine_MiB_per_s": round(mib / t)}
    return out


def _lib_dir(build: str) -> Path:
    from kvscope.core.engine.builds import by_name, installed

    have = installed(by_name(build))
    if have is None:
        raise SystemExit(f"llama.cpp {build} is not built: kvscope llama-build --build {build}")
    return have.lib_dir


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--baseline"]:
        print(json.dumps(baseline(argv[1], int(argv[2]), int(argv[3]))))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", action="append", help="build(s) to measure (default: both)")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--embd", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: 1,024 tokens, 2 layers of 128 (a 2 MiB state: past the 1 MiB inline "
                    "limit, as in the full run)")
    args = ap.parse_args(argv)
    if args.quick:
        args.tokens, args.embd, args.layers = 1024, 128, 2
    with tempfile.TemporaryDirectory() as tmp:
        model = write_model(Path(tmp) / "bench-llama.gguf", args.embd, args.layers, 8, 2 * args.embd)
        n_ctx = max(512, -(-(args.tokens + 1) // 256) * 256)
        for build in args.build or ["0c1e5709", "b11434"]:
            print(json.dumps(bench_build(build, model, n_ctx, args.tokens), indent=1), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
