"""The long fuzz's ``server`` family (``bench/fuzz_fleet.py``): ``kvscope verify --engine server``
against a llama-server that misbehaves in a drawn way (kvharness/fake_server.py), and slot-folder
changes (links, FIFOs, sparse and cut files); the checks: a verdict or one printable line, a bounded time
and memory, nothing left in the slot folder, no file a link led to changed."""

from __future__ import annotations

import contextlib
import os
import random
import resource
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fuzz_fleet_common import (  # noqa: E402  (bench/ is on sys.path when a bench script runs)
    HOSTILE,
    KEEP,
    check,
)

# -- server --------------------------------------------------------------------------------------
ENDPOINTS = ("health", "props", "restore", "erase", "save", "prefill", "next")
KINDS = ("status", "message", "silent", "close", "invalid", "json", "trickle_head", "trickle_body", "huge", "after")
SLOT_CHANGES = ("remove", "directory", "fifo", "link_zero", "link_passwd", "link_elsewhere", "sparse", "cut", "flip")
VERIFY_TIMEOUT_S = 3.0
BOUND_S = 90.0


def _random_json(rng: random.Random, depth: int = 0) -> Any:
    pick = rng.randrange(9 if depth < 3 else 6)
    if pick == 0:
        return None
    if pick == 1:
        return rng.choice([True, False])
    if pick == 2:
        return rng.choice([0, -1, 2**31, 2**63, -(2**64), 7])
    if pick == 3:
        return rng.choice([0.5, 1e308, -0.0])
    if pick in (4, 5):
        return rng.choice(HOSTILE + ("", "ok", "7"))
    if pick in (6, 7):
        keys = ["completion_probabilities", "top_logprobs", "id", "logprob", "tokens", "n_saved", "n_restored",
                "total_slots", "default_generation_settings", "n_ctx", "build_info", "status", "error", "content"]
        return {rng.choice(keys): _random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))}
    return [_random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))]


def _slot_change(kind: str, arg: int, elsewhere: str) -> Callable[[str, str | None], None]:
    def change(slot_dir: str, name: str | None) -> None:
        if not name:
            return
        p = os.path.join(slot_dir, name)
        if not os.path.lexists(p):
            return
        if kind in ("cut", "flip", "sparse"):
            with open(p, "r+b") as fh:
                size = os.fstat(fh.fileno()).st_size
                if kind == "cut":
                    fh.truncate(arg % max(size, 1))
                elif kind == "sparse":
                    fh.truncate(size + (arg << 30))
                else:
                    fh.seek(arg % max(size, 1))
                    b = fh.read(1)
                    fh.seek(arg % max(size, 1))
                    fh.write(bytes([(b[0] if b else 0) ^ 0xFF]))
            return
        os.unlink(p)
        if kind == "directory":
            os.mkdir(p)
        elif kind == "fifo":
            os.mkfifo(p)
        elif kind != "remove":
            os.symlink({"link_zero": "/dev/zero", "link_passwd": "/etc/passwd", "link_elsewhere": elsewhere}[kind], p)
    return change


def draw_faults(rng: random.Random) -> list[tuple[str, str, Any, int, str]]:
    """(endpoint, kind, arg, nth, description) for one to three faults."""
    out = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        ep, kind, nth = rng.choice(ENDPOINTS), rng.choice(KINDS), rng.choice([1, 1, 1, 2])
        arg: Any = None
        desc = ""
        if kind == "status":
            arg = rng.choice([400, 401, 404, 500, 501, 503])
        elif kind == "message":
            arg = "".join(rng.choice(HOSTILE) for _ in range(rng.randint(1, 4)))
        elif kind == "json":
            arg = _random_json(rng)
        elif kind == "huge":
            arg = rng.choice([2 << 20, 64 << 20, 1536 << 20])
        elif kind == "after":
            ep = rng.choice(["save", "restore"])
            change = rng.choice(SLOT_CHANGES)
            n = rng.randrange(1 << 20) if change != "sparse" else rng.randint(1, 50)
            desc = f"{change}({n})"
            arg = (change, n)
        out.append((ep, kind, arg, nth, desc or repr(arg)[:60]))
    return out


class ServerBench:
    """One real llama-server and its slot for the family (started on first use)."""

    def __init__(self) -> None:
        self.srv: Any = None
        self.slot: Path | None = None
        self.elsewhere = tempfile.mkdtemp(prefix="kvscope-fuzz-elsewhere-")
        Path(self.elsewhere, "secret.bin").write_bytes(b"x" * 4096)

    def start(self) -> None:
        if self.srv is not None:
            return
        import psutil

        from kvharness.fixtures import model_path
        from kvharness.states import PROMPT
        from kvscope.core.engine.server import ServerProcess

        self.srv = ServerProcess(model_path("llama"), build="0c1e5709", n_ctx=512)
        self.srv.__enter__()
        KEEP.update(c.pid for c in psutil.Process().children(recursive=True))
        c = self.srv.client()
        c.complete(PROMPT, n_predict=0)
        c.slot_save(0, "fuzz-slot.bin")
        self.slot = Path(tempfile.mkdtemp(prefix="kvscope-fuzz-slot-")) / "slot0.bin"
        shutil.copyfile(Path(self.srv.slot_dir) / "fuzz-slot.bin", self.slot)

    def close(self) -> None:
        if self.srv is not None:
            self.srv.__exit__(None, None, None)
            shutil.rmtree(self.slot.parent if self.slot else "", ignore_errors=True)
        shutil.rmtree(self.elsewhere, ignore_errors=True)


BENCH: ServerBench | None = None


def case_server(rng: random.Random, work: Path) -> dict[str, Any]:
    from kvharness.fake_server import FakeServer
    from kvharness.fixtures import model_path
    from kvscope.core.verify.result import VERDICTS
    from kvscope.core.verify.run import Verifier, VerifyError

    global BENCH
    if BENCH is None:
        BENCH = ServerBench()
    BENCH.start()
    assert BENCH.slot is not None
    faults = draw_faults(rng)
    info: dict[str, Any] = {"faults": [f"{ep}#{nth} {kind} {desc}" for ep, kind, _, nth, desc in faults]}
    with FakeServer(BENCH.srv.url, BENCH.srv.slot_dir) as fake:
        for ep, kind, arg, nth, _ in faults:
            if kind == "after":
                arg = _slot_change(arg[0], arg[1], os.path.join(BENCH.elsewhere, "secret.bin"))
            fake.fault(ep, kind, arg, nth=nth)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.monotonic()
        try:
            r = Verifier(BENCH.slot, model_path("llama"), engine="server", server_url=fake.url,
                         slot_dir=fake.slot_dir, timeout_s=VERIFY_TIMEOUT_S).run()
            check(r.verdict in VERDICTS, f"verdict {r.verdict!r}")
            info["outcome"] = r.verdict
        except VerifyError as e:
            msg = str(e)
            check(bool(msg) and "\n" not in msg and msg.isprintable(), f"not one printable line: {msg[:300]!r}")
            info["outcome"] = "error: " + msg[:50]
        dt = time.monotonic() - t0
        info["seconds"] = round(dt, 1)
        info["hits"] = list(fake.hits)
        check(dt < BOUND_S, f"took {dt:.1f} s")
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak
        check(grown < 512 * 1024, f"RSS grew {grown} KiB")
        left = [n for n in os.listdir(fake.slot_dir) if n.startswith("kvscope-verify-")]
        check(not left, f"left in the slot folder: {left}")
        check(Path(BENCH.elsewhere, "secret.bin").read_bytes() == b"x" * 4096, "the file a link led to changed")
    for n in os.listdir(BENCH.srv.slot_dir):  # what a change made of the server's own save, for the next case
        p = os.path.join(BENCH.srv.slot_dir, n)
        if n != "fuzz-slot.bin":
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(p)
    return info


def close() -> None:
    """Stop the llama-server the family kept for the run (if it started one)."""
    global BENCH
    if BENCH is not None:
        BENCH.close()
        BENCH = None
