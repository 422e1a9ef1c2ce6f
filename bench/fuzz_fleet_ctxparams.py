"""The long fuzz's ``ctx_params`` family (#31 items 4, 6, 7, 9): ``kvscope verify`` of a healthy slot file with
hostile engine parameters and setups: ``--ctx-param`` names and values (huge, negative, nan/inf, 100,000
digits, wrong types, a context too large for the memory, more threads than CPUs), ``--next-token`` outside
the vocabulary, ``--timeout`` that is no deadline, the model cut or swapped under the running engine, and
a model the file does not fit.

The checks: exit 0 with the verdict ``ok`` (the file is healthy) only where every parameter is sane,
otherwise exit 2 and one line starting ``kvscope: ``; never ``damaged`` (nor any other verdict) for the
healthy file; no traceback; never an OOM (a child run is capped with ``RLIMIT_AS``, and a refused context
is refused within seconds, before any engine allocates); no process of the run left, nothing left in its
``TMPDIR``.

``case_ctx_params(rng, work)`` is the family's case; refusals run in this process (kvscope's ``main``, as
``run_cli`` does), engine runs in a child process of their own session.
"""

from __future__ import annotations

import functools
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from fuzz_fleet_common import DATA, MODEL, captured, check, kvscope_main  # noqa: E402  (bench/ is on sys.path)

from kvharness.proc_runs import CHILD, kill_session, leftovers  # noqa: E402

SEQ = DATA / "llamacpp-2026-10-01" / "llama-f16-fa0-unified0-seq1.seqstate"
OTHER_MODEL = DATA / "llamacpp-2026-10-01" / "tiny-gemma2.gguf"
AS_LIMIT = 16 << 30  # the child's address space: an engine that tried to allocate 23 GB dies, it does not OOM
REFUSE_S = 20.0  # a refusal before any engine starts takes well under this, even on a loaded machine
RUN_S = 240.0  # a whole verify of the tiny slot, with the engine
KINDS = ("hostile", "sane", "next_token", "timeout", "cut", "swap", "wrong_model")
WEIGHTS = (6, 2, 2, 1, 2, 1, 1)


@functools.cache
def _n_vocab() -> int:
    """tiny-llama's vocabulary (379 tokens)."""
    from kvscope.core.model.profile import load_model_profile

    return int(load_model_profile(MODEL).n_vocab)


def _huge(rng: random.Random) -> str:
    return rng.choice(["9" * 100_000, str(2**64), str(2**32), "2147483648", "1e9", "1" + "0" * 30])


# (key, value drawn, sane?) -- every value a string, as the command line gives it
def _hostile_param(rng: random.Random) -> tuple[str, str]:
    key = rng.choice(["n_ctx", "n_batch", "n_ubatch", "n_seq_max", "n_threads", "kv_unified", "flash_attn",
                      "type_k", "type_v", "swa_full", "env.X", "bogus", "env.", "env.A B", "N_CTX", "n_ctx "])
    pick = rng.randrange(12)
    value = [
        lambda: _huge(rng), lambda: str(-rng.randrange(1, 1 << 40)), lambda: "0",
        lambda: rng.choice(["nan", "inf", "-inf", "NaN"]), lambda: rng.choice(["1.5", "0x", "1_", "", " ", "ten"]),
        lambda: rng.choice(["yes", "maybe", "2", "TRUE", "auto"]), lambda: rng.choice(["q9_9", "f64", "F16", "q8_0"]),
        lambda: str(rng.randrange(100_000, 1 << 31)), lambda: "2147483648", lambda: str(rng.randrange(1, 16)),
        lambda: "x" * rng.choice([5000, 100_000]), lambda: "a\x00b",
    ][pick]()
    if key in ("n_ctx", "n_batch", "n_ubatch") and pick == 9:
        value = str(rng.randrange(1, 16))  # a context smaller than the file (or a batch below n_ubatch)
    return key, value


def _sane_param(rng: random.Random) -> tuple[str, str]:
    cpus = os.cpu_count() or 1
    return rng.choice([("n_threads", str(rng.randint(1, cpus))), ("n_ctx", rng.choice(["512", "1024", "4096"])),
                       ("n_batch", rng.choice(["64", "512", "2048"])), ("n_ubatch", rng.choice(["4", "32", "64"])),
                       ("flash_attn", "false"), ("swa_full", rng.choice(["true", "false"])),
                       ("env.KVSCOPE_FUZZ", rng.choice(["1", "x" * 100]))])


def _child(args: list[str], tmp: Path, wait: float, during: Any = None) -> tuple[int, str, str, int, float]:
    """``kvscope ARGS`` in a child process of its own session with ``RLIMIT_AS`` capped and ``TMPDIR`` its own;
    ``during(proc)`` runs in a thread while it runs. (status, stdout, stderr, session id, seconds)."""
    tmp.mkdir(parents=True, exist_ok=True)

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))

    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, "-c", CHILD, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=dict(os.environ, TMPDIR=str(tmp)), start_new_session=True, text=True, preexec_fn=cap)
    t = threading.Thread(target=during, args=(p,), daemon=True) if during is not None else None
    if t is not None:
        t.start()
    try:
        out, err = p.communicate(timeout=wait)
    except subprocess.TimeoutExpired:
        kill_session(p.pid)
        out, err = p.communicate()
        raise AssertionError(f"verify ran past {wait:g} s: {' '.join(args)[:300]}") from None
    if t is not None:
        t.join(30)
    return p.returncode, out, err, p.pid, time.monotonic() - t0


def _refused(rc: int, out: str, err: str, why: str) -> None:
    check(rc == 2, f"exit {rc}, expected 2: {why}: {err[-600:]}")
    check(not out.strip(), f"output on a refusal: {why}: {out[:300]}")
    lines = err.splitlines()
    check(len(lines) == 1 and lines[0].startswith("kvscope: "), f"not one line: {why}: {err[-600:]}")
    check("Traceback" not in err and len(err) < 3000, f"traceback or a huge line: {why}: {err[-600:]}")


def _verdict_ok(rc: int, out: str, err: str, why: str) -> str:
    check(rc in (0, 1), f"exit {rc} for sane parameters: {why}: {err[-800:]}")
    doc = json.loads(out)
    check(doc["verdict"] == "ok", f"verdict {doc['verdict']} for a healthy file: {why}: {doc['reasons'][:3]}")
    check(rc == 0, f"exit {rc} with verdict ok: {why}")
    return str(doc["verdict"])


def _clean(sid: int, tmp: Path, why: str) -> None:
    procs, names = leftovers(sid, tmp)
    if procs:
        kill_session(sid)
    check(not procs and not names, f"left behind: processes {procs}, files {names[:5]}: {why}")


def case_ctx_params(rng: random.Random, work: Path) -> dict[str, Any]:
    kind = rng.choices(KINDS, WEIGHTS)[0]
    base = ["verify", str(SEQ), "--model", str(MODEL), "--no-calibrate", "--steps", "2"]
    info: dict[str, Any] = {"kind": kind}
    if kind == "hostile":  # refused in this process, before any engine: fast, exit 2, one line
        pairs = [_hostile_param(rng) for _ in range(rng.randint(1, 3))]
        pairs += [_sane_param(rng) for _ in range(rng.randint(0, 2))]
        rng.shuffle(pairs)
        args = [*base, *[a for k, v in pairs for a in ("--ctx-param", f"{k}={v}")]]
        info["command"] = f"verify {' '.join(f'{k}={v[:20]}' for k, v in pairs)}"
        t0 = time.monotonic()
        with captured() as (stdout, stderr):
            rc = kvscope_main([*args, "--json"])
        out, err = stdout.getvalue(), stderr.getvalue()
        took = time.monotonic() - t0
        why = info["command"]
        if rc == 2:
            _refused(rc, out, err, why)
            check(took < REFUSE_S, f"a refusal took {took:.1f} s (an engine started?): {why}")
            info["outcome"] = "refused: " + err.strip()[9:70]
        else:  # a hostile draw can be a sane value by chance (swa_full=false, env.X=1...): then the verdict ok
            info["outcome"] = "ok (the draw was sane): " + _verdict_ok(rc, out, err, why)
        info["seconds"] = round(took, 2)
        return info
    tmp = work / "tmp"
    if kind == "sane":
        pairs = [_sane_param(rng) for _ in range(rng.randint(1, 3))]
        keys = {k: v for k, v in pairs}
        if "n_ubatch" in keys and "n_batch" in keys and int(keys["n_ubatch"]) > int(keys["n_batch"]):
            keys["n_batch"] = keys["n_ubatch"]
        args = [*base, *[a for k, v in keys.items() for a in ("--ctx-param", f"{k}={v}")], "--json"]
        info["command"] = f"verify {' '.join(f'{k}={v[:20]}' for k, v in keys.items())}"
        rc, out, err, sid, took = _child(args, tmp, RUN_S)
        info["outcome"] = _verdict_ok(rc, out, err, info["command"])
    elif kind in ("next_token", "timeout"):
        if kind == "next_token":
            n_vocab = _n_vocab()
            tok = rng.choice([-1, n_vocab, n_vocab + rng.randrange(1 << 20), 2**31 - 1, 2**31, 2**40,
                              rng.randrange(n_vocab), n_vocab - 1])
            args, sane = [*base, "--next-token", str(tok), "--json"], 0 <= tok < n_vocab
        else:
            val = rng.choice(["nan", "inf", "-1", "0", "1e300", "1e-9", "abc", "600"])
            args, sane = [*base, "--timeout", val, "--json"], val == "600"
        info["command"] = " ".join(args[-3:-1])
        rc, out, err, sid, took = _child(args, tmp, RUN_S if sane else REFUSE_S * 3)
        if sane:
            info["outcome"] = _verdict_ok(rc, out, err, info["command"])
        else:
            _refused(rc, out, err, info["command"])
            info["outcome"] = "refused: " + err.strip()[9:70]
    else:  # the model cut or swapped under the run at a drawn moment, or the wrong model from the start
        model = work / "model.gguf"
        shutil.copyfile(MODEL, model)
        delay = round(rng.uniform(0.0, 4.0), 2)
        info["delay"] = delay

        def change(p: subprocess.Popen[str]) -> None:
            end = time.monotonic() + delay
            while time.monotonic() < end and p.poll() is None:
                time.sleep(0.01)
            if p.poll() is not None:
                return
            if kind == "cut":
                os.truncate(model, rng.choice([0, 100, model.stat().st_size // 2, model.stat().st_size - 1]))
            else:
                shutil.copyfile(OTHER_MODEL, work / "other.gguf")
                os.replace(work / "other.gguf", model)

        if kind == "wrong_model":
            args = ["verify", str(SEQ), "--model", str(OTHER_MODEL), "--json"]
            info["command"] = "verify --model tiny-gemma2 (a tiny-llama slot)"
            rc, out, err, sid, took = _child(args, tmp, REFUSE_S * 3)
            _refused(rc, out, err, info["command"])
            check("does not fit" in err, f"the refusal does not say the model does not fit: {err[-300:]}")
            info["outcome"] = "refused"
        else:
            args = [*base[:3], str(model), *base[4:], "--json"]
            info["command"] = f"verify, the model {kind} after {delay} s"
            rc, out, err, sid, took = _child(args, tmp, RUN_S, change)
            why = info["command"]
            if rc == 2:
                _refused(rc, out, err, why)
                info["outcome"] = "refused: " + err.strip()[9:70]
            else:  # the run finished before the change (or read everything it needed before it)
                info["outcome"] = _verdict_ok(rc, out, err, why)
    info["seconds"] = round(took, 2)
    _clean(sid, tmp, info["command"])
    return info


case_ctxparams = case_ctx_params  # the family's name as the brief spells it (fuzz_fleet_<name>: ctxparams)
