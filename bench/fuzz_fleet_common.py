"""What the long fuzz's process-level families (``bench/fuzz_fleet.py``) share: the run's paths and
fixtures, the hostile strings, ``check``, the seeded draws, kvscope's CLI run in this process, and the
look for processes and files a case left behind."""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

from kvharness.fixtures import DATA  # noqa: E402
from kvharness.fleet_tree import TREE_FILES  # noqa: E402
from kvscope.core.cli.main import main as kvscope_main  # noqa: E402

OUT = ROOT / "bench" / "out" / "fuzz-failures" / "fleet"
FAMILIES = ("server", "trees", "workers", "signals", "outputs", "ctx_params", "corrupt_specs", "jobs_links",
            "messages", "signals_repair_lab")
NEEDS_BUILD = frozenset({"server", "ctx_params", "signals_repair_lab"})  # they drive the pinned build 0c1e5709
FIXTURES = [src for src, _ in TREE_FILES if not src.endswith(".gguf")]
MODEL = DATA / "llamacpp-2026-10-01" / "tiny-llama.gguf"
HOSTILE = ("\x1b[31mred\x1b[0m", "a\u202eb\u2066c", "<script>alert(1)</script>", "&amp;\r\nx", "\x00\x07\x7f\x9b",
           "line\nbreak", "\ud7ff\ufffd", "%s%n{0}")


class CheckFailed(Exception):
    """An invariant of the family did not hold."""


def check(cond: bool, what: str) -> None:
    if not cond:
        raise CheckFailed(what)


def case_rng(seed: int, family: str, index: int) -> random.Random:
    return random.Random(f"fuzz_fleet-{seed}-{family}-{index}")


@contextlib.contextmanager
def captured() -> Iterator[tuple[io.StringIO, io.StringIO]]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        yield out, err


def run_cli(args: list[str]) -> tuple[int, list[dict[str, Any]], str]:
    """``kvscope ARGS --json`` in this process: (status, JSON documents, stderr)."""
    with captured() as (out, err):
        rc = kvscope_main([*args, "--json"])
    text = err.getvalue()
    check("Traceback" not in text, f"traceback on stderr: {text[-1500:]}")
    docs = [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]
    return rc, docs, text


def stray_processes() -> list[str]:
    """Descendants of this process other than multiprocessing's fork server and resource tracker
    (and llama-servers the family started itself), given a few seconds to go."""
    import multiprocessing.forkserver as fs

    import psutil

    end = time.monotonic() + 15
    while True:
        left = []
        server = getattr(fs._forkserver, "_forkserver_pid", None)  # the server, not the workers it forked
        for c in psutil.Process().children(recursive=True):
            try:
                cmd = " ".join(c.cmdline())
                if c.status() == psutil.STATUS_ZOMBIE or c.pid == server or "resource_tracker" in cmd \
                        or c.pid in KEEP:
                    continue
                left.append(f"{c.pid} {c.status()} {cmd[:80]}")
            except psutil.Error:
                continue
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.2)


KEEP: set[int] = set()  # pids the run keeps on purpose (the server family's llama-server and its janitor)


def copy_fixtures(rng: random.Random, root: Path, n: int, folders: list[str]) -> list[str]:
    rels = []
    for i in range(n):
        rel = f"{rng.choice(folders)}/f{i}-{rng.randrange(1000)}.bin"
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(DATA / rng.choice(FIXTURES), root / rel)
        rels.append(rel)
    return rels


def outside_names(work: Path, inside: tuple[Path, ...]) -> set[str]:
    """Everything under ``work`` but the folders ``inside`` (not following links)."""
    names = set()
    for dirpath, dirnames, filenames in os.walk(work):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if here / d not in inside]
        names |= {str((here / n).relative_to(work)) for n in dirnames + filenames}
    return names


