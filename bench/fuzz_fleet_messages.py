"""The long fuzz's ``messages`` family: every command with hostile option values, and what it says back.

A case draws one kvscope command and one hostile thing to give it: a number that is ``nan``, ``inf``,
negative or 100,000 digits long, a name with control and bidi characters, a folder, a FIFO or a device
(``/dev/zero``, ``/dev/null``) where a file is expected, a random file where a state file or a model is
expected, or (in a child process, since it is the process's own stdout) the output sent to ``/dev/full``.
It runs the command in this process (``kvscope_main``; a child for ``/dev/full``) and checks what a user
reads: the exit code is 0, 1 or 2 (never 3, an internal error, nor a crash); a failure is one line on
stderr starting ``kvscope: ``, printable (no raw control or bidi character), at most 2,000 characters,
with no Python exception class name (``OverflowError``, ``UnicodeEncodeError``...) and no traceback; a
value echoed back is cut (no 100,000-digit number comes back whole). ``python fuzz_fleet_messages.py N``
runs N cases and prints the failures (the long fuzz calls :func:`case_messages`).

The engine commands (``verify``, ``repair``, ``lab --engine``, ``lab --prompt``) are drawn with inputs
they must refuse before an engine starts, so a case takes a second or two.
"""

from __future__ import annotations

import builtins
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from fuzz_fleet_common import MODEL, CheckFailed, captured, check, kvscope_main

from kvharness.fixtures import DATA
from kvscope.core.textsafe import safe_text

STATE = DATA / "llamacpp-2026-10-01" / "llama-f16-fa0-unified0-seq0.seqstate"
LAB = DATA / "lab" / "llamacpp-2026-10-01" / "llama" / "fa0-unified1"
MESSAGE_LIMIT = 2000
# every built-in exception class name, and the ones a library of ours could let through
EXCEPTION_NAMES = sorted({n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)
                          and n not in ("Exception", "BaseException")}
                         | {"JSONDecodeError", "UnpicklingError", "ArgumentTypeError", "ArgumentError",
                            "CalledProcessError", "TimeoutExpired", "ParserError"})
_NAME_RE = re.compile(r"\b(" + "|".join(map(re.escape, EXCEPTION_NAMES)) + r")\b")
NUMBERS = ("nan", "inf", "-inf", "-1", "-0", "1e309", "0x" + "f" * 5000, "0x" + "f" * 100_000,
           "9" * 5000, "9" * 100_000, "1_000",
           "\u0661\u0662", "0", "4294967297", "-9223372036854775809", "", " ", "1.5")
NAMES = ("a\x1b[31mred\x1b[0m", "b\u202eevil\u2066", "c|pipe|", "d\nnew\rline", "e\x00nul", "f\udcff", "![x](http://a)")


def _special(work: Path, rng: random.Random) -> tuple[str, str]:
    """A path that is not a regular file: (path, what it is)."""
    kind = rng.choice(["folder", "fifo", "dev_zero", "dev_null", "missing", "random", "empty", "hostile_name",
                       "symlink_loop", "unreadable_dir", "nested_json"])
    if kind == "nested_json":  # a tokens file (or anything else) 100,000 lists deep
        p = work / "nested.json"
        depth = rng.choice([1000, 100_000])
        p.write_text("[" * depth + "1" + "]" * depth)
        return str(p), kind
    if kind == "folder":
        p = work / "a-folder"
        p.mkdir(exist_ok=True)
        return str(p), kind
    if kind == "fifo":
        p = work / "a-fifo"
        if not p.exists():
            os.mkfifo(p)
        return str(p), kind
    if kind == "dev_zero":
        return "/dev/zero", kind
    if kind == "dev_null":
        return "/dev/null", kind
    if kind == "missing":
        return str(work / "no-such-thing"), kind
    if kind == "random":
        p = work / "random.bin"
        p.write_bytes(rng.randbytes(rng.choice([1, 37, 4096, 70_000])))
        return str(p), kind
    if kind == "empty":
        p = work / "empty.bin"
        p.write_bytes(b"")
        return str(p), kind
    if kind == "symlink_loop":
        p = work / "loop"
        if not os.path.lexists(p):
            os.symlink(p, p)
        return str(p), kind
    if kind == "unreadable_dir":
        p = work / "closed" / "x.bin"
        p.parent.mkdir(exist_ok=True)
        return str(p), kind
    name = rng.choice(NAMES).replace("\x00", "0").replace("/", "_")
    p = work / (name + ".bin")
    try:
        shutil.copyfile(STATE, p)
    except (OSError, UnicodeEncodeError):
        p = work / "plain.bin"
        shutil.copyfile(STATE, p)
    return str(p), "hostile_name"


def _nested_folder(work: Path, name: str) -> str:
    """A folder holding ``name``: JSON lists 100,000 deep (a report folder's report.json, a migrate journal)."""
    folder = work / f"nested-{name.strip('.')}"
    folder.mkdir(exist_ok=True)
    (folder / name).write_text("[" * 100_000 + "]" * 100_000 + "\n")
    return str(folder)


def _one_state(work: Path) -> str:
    folder = work / "one-state"
    folder.mkdir(exist_ok=True)
    shutil.copyfile(STATE, folder / "a.seqstate")
    return str(folder)


def _draw(rng: random.Random, work: Path) -> tuple[list[str], str]:
    """One command line and what is hostile in it."""
    out = str(work / f"out-{rng.randrange(10**6)}")
    special, what = _special(work, rng)
    num = rng.choice(NUMBERS)
    name = rng.choice(NAMES)
    state, model, lab = str(STATE), str(MODEL), str(LAB)
    choices: list[tuple[list[str], str]] = [
        (["inspect", special], f"inspect {what}"),
        (["inspect", state, "--model", special], f"inspect --model {what}"),
        (["inspect", state, "--layout", name], "inspect --layout name"),
        (["inspect", state, "--markdown", "--layout", num], "inspect --layout number"),
        (["diff", state, special], f"diff {what}"),
        (["rewrite", special, "-o", out], f"rewrite {what}"),
        (["rewrite", state, "-o", out, "--seq-id", num], "rewrite --seq-id number"),
        (["rewrite", state, "-o", out, "--layout", name], "rewrite --layout name"),
        (["rewrite", state, "-o", special], f"rewrite -o {what}"),
        (["scan", special], f"scan {what}"),
        (["scan", str(work), "--file-timeout", num], "scan --file-timeout number"),
        (["scan", str(work), "--jobs", num], "scan --jobs number"),
        (["scan", str(work), "--batch", num], "scan --batch number"),
        (["scan", str(work), "--target", name], "scan --target name"),
        (["migrate", special, "--layout", "2026-10", "--out", out], f"migrate {what}"),
        (["migrate", str(work), "--layout", name, "--out", out], "migrate --layout name"),
        (["corrupt", special, "--corrupt", "truncated_half", "-o", out], f"corrupt {what}"),
        (["corrupt", state, "--corrupt", f"truncate:at={num}", "-o", out], "corrupt spec number"),
        (["corrupt", state, "--corrupt", name, "-o", out], "corrupt spec name"),
        (["corrupt", state, "--corrupt", "truncated_half", "-o", special], f"corrupt -o {what}"),
        (["lab", "--context", special], f"lab --context {what}"),
        (["lab", "--context", special, "--model", model], f"lab --context {what} --model"),
        (["lab", "--context", lab, "--restore", special], f"lab --restore {what}"),
        (["lab", "--context", lab, "--model", special], f"lab --model {what}"),
        (["lab", "--context", lab, "--into", num], "lab --into number"),
        (["lab", "--context", lab, "--ctx-param", f"n_ctx={num}"], "lab --ctx-param number"),
        (["lab", "--context", lab, "--corrupt", name], "lab --corrupt name"),
        (["lab", "--context", lab, "--live-seq", f"{num}={special}"], f"lab --live-seq {what}"),
        (["lab", "--context", str(work / ("new" + name.replace("/", "_").replace("\x00", ""))), "--prompt", "hi",
          "--model", special], f"lab --prompt --model {what}"),
        (["verify", special, "--model", model], f"verify {what}"),
        (["verify", state, "--model", special], f"verify --model {what}"),
        (["verify", state, "--model", model, "--timeout", num], "verify --timeout number"),
        (["verify", state, "--model", model, "--tokens", num], "verify --tokens number"),
        (["verify", state, "--model", model, "--tokens", "@" + special], f"verify --tokens @{what}"),
        (["verify", state, "--model", model, "--next-token", num], "verify --next-token number"),
        (["verify", state, "--model", model, "--steps", num], "verify --steps number"),
        (["repair", special, "--model", model, "-o", out], f"repair {what}"),
        (["repair", state, "--model", model, "-o", out, "--timeout", num], "repair --timeout number"),
        (["repair", state, "--model", model, "-o", out, "--tokens", "@" + special], f"repair --tokens @{what}"),
        (["llama-build", "--jobs", num, "--list"], "llama-build --jobs number"),
        (["llama-build", "--build", name, "--list"], "llama-build --build name"),
        (["gui", special, "--screenshot", out + ".png"], f"gui --screenshot {what}"),
        (["gui", state, "--screenshot", out + ".png", "--size", rng.choice(["100000x100000", f"{num}x{num}",
                                                                             "0x0", "-5x-5", "axb", "1x"])],
         "gui --screenshot --size"),
        (["report", special, "-o", out], f"report {what}"),
        (["report", state, "-o", out, "--model", special], f"report --model {what}"),
        (["report", state, "-o", out, "--lab-into", num], "report --lab-into number"),
        (["report", state, "-o", _nested_folder(work, "report.json")], "report -o DIR with a nested report.json"),
        (["migrate", _one_state(work), "--layout", "2026-10", "--out", _nested_folder(work, ".kvscope-migrate.jsonl")],
         "migrate with a nested journal line"),
    ]
    return rng.choice(choices)


def check_message(rc: int, err: str, argv: list[str]) -> None:
    """The invariants of what a user reads after ``argv`` exited ``rc`` with ``err`` on stderr."""
    check(rc in (0, 1, 2), f"exit {rc} (0, 1 or 2 expected; 3 is an internal error): {err[-600:]}")
    check("Traceback" not in err, f"traceback: {err[-1500:]}")
    failures = [line for line in err.splitlines() if line.startswith("kvscope: ")]
    if rc == 2:
        check(len(failures) >= 1, f"exit 2 without a 'kvscope: ' line: {err[-600:]!r}")
        check(err.count("\n") == 1 and err.endswith("\n"), f"exit 2 with {err.count(chr(10))} lines on stderr: "
              f"{err[-800:]!r}")
    for line in failures:
        check(line.isprintable(), f"unprintable character in {line[:300]!r}")
        check(len(line) <= MESSAGE_LIMIT + 100, f"a {len(line)}-character line: {line[:200]!r}...")
        m = _NAME_RE.search(line)
        check(m is None, f"a Python exception name ({m.group(1) if m else ''}) in {line[:400]!r}")
        check(not re.search(r"\d{200}", line), f"a long number echoed back whole: {line[:200]!r}...")
        nested = re.search(r"not a llama\.cpp state file \(not a llama\.cpp state file", line)
        check(nested is None, f"a nested reason: {line[:300]!r}")
    check(all(line.isprintable() or line == "" for line in err.splitlines()), f"raw control on stderr: {err[:300]!r}")


def _full_disk(rng: random.Random, work: Path) -> dict[str, Any]:
    """stdout on /dev/full, in a child process (its own stdout): one line, exit 2."""
    argv = rng.choice([["corrupt", "--list"], ["--help"], ["inspect", str(STATE)], ["inspect", str(STATE), "--json"],
                       ["diff", str(STATE), str(STATE)], ["llama-build", "--list"], ["corrupt", "--help"],
                       ["inspect", str(STATE), "--markdown"]])
    code = "import sys\nfrom kvscope.core.cli.main import main\nsys.exit(main())\n"
    fd = os.open("/dev/full", os.O_WRONLY)
    try:
        r = subprocess.run([sys.executable, "-c", code, *argv], stdout=fd, stderr=subprocess.PIPE, text=True,
                           timeout=120, cwd=work)
    finally:
        os.close(fd)
    check(r.returncode == 2, f"> /dev/full: exit {r.returncode}: {r.stderr[-600:]}")
    check(r.stderr == "kvscope: cannot write the output: no space left on device\n", f"> /dev/full: {r.stderr!r}")
    return {"command": "kvscope " + " ".join(argv) + " > /dev/full", "outcome": f"exit {r.returncode}"}


def case_messages(rng: random.Random, work: Path) -> dict[str, Any]:
    """One hostile command line run in this process (one in eight: stdout on /dev/full in a child)."""
    work.mkdir(parents=True, exist_ok=True)
    if rng.random() < 0.125 and os.path.exists("/dev/full"):
        return _full_disk(rng, work)
    argv, what = _draw(rng, work)
    closed = work / "closed"
    if closed.exists():
        closed.chmod(0o000)
    env_before = os.environ.get("QT_QPA_PLATFORM")
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    try:
        with captured() as (_, err):
            try:
                rc = kvscope_main(argv)
            except SystemExit as e:  # a command must return its code, not exit
                rc = e.code if isinstance(e.code, int) else 99
        text = err.getvalue()
    finally:
        if closed.exists():
            closed.chmod(0o755)
        if env_before is None:
            os.environ.pop("QT_QPA_PLATFORM", None)
    shown = [safe_text(a if len(a) < 60 else a[:40] + f"...({len(a)} chars)") for a in argv]  # printable summary
    try:
        check_message(rc, text, argv)
    except CheckFailed as e:
        raise CheckFailed(f"kvscope {' '.join(map(repr, shown))} [{what}]: {e}") from None
    return {"command": "kvscope " + " ".join(shown), "hostile": what, "outcome": f"exit {rc}",
            "message": text.strip()[:200]}


def main(argv: list[str]) -> int:
    n = int(argv[0]) if argv else 20
    seed = argv[1] if len(argv) > 1 else "0"
    failed = 0
    import time

    t0 = time.monotonic()
    for i in range(n):
        rng = random.Random(f"fuzz_fleet-{seed}-messages-{i}")
        with tempfile.TemporaryDirectory(prefix="kvscope-msgs-") as tmp:
            try:
                got = case_messages(rng, Path(tmp))
                print(f"ok   {i}: {got['command'][:150]} -> {got['outcome']}: {got.get('message', '')[:150]!r}")
            except CheckFailed as e:
                failed += 1
                print(f"FAIL {i}: {str(e)[:700]}")
    dt = time.monotonic() - t0
    print(f"{n} cases, {failed} failed, {dt:.1f} s ({60 * n / dt:.0f} per minute)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
