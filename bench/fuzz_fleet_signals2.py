"""The long fuzz's ``signals_repair_lab`` family (#31 item 12): signals during ``repair`` and the engine lab.

Each case draws a command: ``repair`` of a real 2026-10 slot file (the pinned 0c1e5709 rebuilds and
verifies it), ``lab --engine llama.cpp`` (libllama in a child) or ``lab --engine server`` against a
llama-server the case starts itself as the user's (``--server URL --slot-dir DIR``); a signal (SIGINT,
SIGTERM, SIGHUP, SIGKILL) and a delay over the command's usual run. The command is a real child in its own
session and ``TMPDIR`` (``kvharness.proc_runs.run_until``). Checks:

- after INT/TERM/HUP: exit 130, 128 + signal or death by the signal (or the command was done first, or
  not yet begun), no traceback;
- after any signal (SIGKILL included: the janitor's part): no process of the session and nothing in its
  TMPDIR within 30 s (no ``.kvscope-tmp-repair-*`` with ``rebuilt.*``, no ``.kvscope-tmp-lab-*``), no
  ``kvscope-lab-*.bin`` left in the user's server's slot folder, the user's server still running;
- ``repair``: its output is absent or a complete state (never a temporary beside it).

Needs the pinned build 0c1e5709 (``kvscope llama-build``). ``case_signals_repair_lab(rng, work)`` is the
family's case.
"""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path
from typing import Any

from fuzz_fleet_common import DATA, MODEL, check

from kvharness.proc_runs import kill_session, leftovers, run_until, temporaries
from kvscope.core.engine.server import ServerProcess

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGKILL)
COMMANDS = ("repair", "lab-llama.cpp", "lab-server")
DURATION = {"repair": 20.0, "lab-llama.cpp": 12.0, "lab-server": 12.0}  # about how long each runs here
SLOT = DATA / "llamacpp-2026-10-01" / "llama-f16-fa0-unified0-seq1.seqstate"
LAB = DATA / "lab" / "llamacpp-2026-10-01" / "llama"
CASES = ("cell_count_plus1", "cell_count_minus1", "cell_count_zero", "truncated_half", "nan_rows_valid")


def _lab_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("kvscope-lab-*"))


def case_signals_repair_lab(rng: random.Random, work: Path) -> dict[str, Any]:
    cmd = rng.choice(COMMANDS)
    sig = rng.choice(SIGNALS)
    delay = round(rng.uniform(0.05, DURATION[cmd]), 3)
    tmp, out, slots = work / "tmp", work / "out" / "fixed.seqstate", work / "slots"
    info: dict[str, Any] = {"command": cmd, "signal": signal.Signals(sig).name, "delay": delay}
    cases = [x for c in rng.sample(CASES, rng.randint(1, 3)) for x in ("--corrupt", c)]
    server: ServerProcess | None = None
    if cmd == "repair":
        out.parent.mkdir(parents=True)
        args = ["repair", str(SLOT), "--model", str(MODEL), "-o", str(out)]
    elif cmd == "lab-llama.cpp":
        args = ["lab", "--context", str(LAB), "--engine", "llama.cpp", *cases]
    else:
        server = ServerProcess(MODEL, build="0c1e5709", n_parallel=2, n_ctx=512, slot_dir=slots,
                               args=["--no-kv-unified", "-fa", "off", "-b", "256", "-ub", "256"])
        args = ["lab", "--context", str(LAB), "--engine", "server", "--server", server.url, "--slot-dir",
                str(slots), *cases]
    try:
        rc, _, err, sid = run_until(args, tmp, delay=delay, sig=sig, wait=180.0)
        try:
            name = signal.Signals(sig).name
            why = f"{cmd} {name} after {delay} s: exit {rc}: {err[-1000:]}"
            if sig == signal.SIGKILL:
                info["outcome"] = "killed" if rc == -sig else f"done first ({rc})"
            else:
                # death by the signal too: a SIGINT as Python finalizes (its handlers reset) kills it outright
                stopped = (130, -sig) if sig == signal.SIGINT else (128 + sig, -sig)
                check(rc in (*stopped, 0, 1, 2), why)  # 0/1/2: done (or refused) before the signal
                check("Traceback" not in err, why)
                info["outcome"] = "stopped" if rc in stopped else f"done first ({rc})"
            procs, names = leftovers(sid, tmp)
            check(not procs and not names, f"{why}: left processes {procs}, TMPDIR {names[:8]}")
            if server is not None:
                end = time.monotonic() + 30  # the janitor deletes them as kvscope dies
                while _lab_files(slots) and time.monotonic() < end:
                    time.sleep(0.1)
                check(_lab_files(slots) == [], f"{why}: left in the user's slot folder: {_lab_files(slots)[:5]}")
                check(server.alive, f"{why}: the user's llama-server died")
            if cmd == "repair":
                check(not temporaries(out.parent), f"{why}: a temporary beside the output")
                if out.exists():
                    from kvscope.core.reader.parse import read_state

                    check(read_state(out).n_errors == 0, f"{why}: the output is not a complete state")
                    info["output"] = "written"
        finally:
            kill_session(sid)
    finally:
        if server is not None:
            server.close()
    return info
