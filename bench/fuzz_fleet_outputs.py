"""The long fuzz's ``outputs`` family (#31 items 1-3): where ``-o`` points, for every command that writes.

Each case draws a command (``repair``, ``corrupt``, ``rewrite``, ``report``) and an OUT from: one of the
command's inputs (the state, the model, the ``--tokens @FILE``) by its path, a symlink, a hard link,
``/proc/self/fd/N`` or a ``..`` detour; a FIFO; a character device (``/dev/null``, ``/dev/zero``); a folder
(empty, or holding a file of the user's), or for ``report`` an earlier report with the user's files in it;
a regular file that is no input, by its path or by ``/proc/self/fd/N``; a fresh path. It runs the real
command in this process and checks:

- an input (by any path), a FIFO, a device, a folder where a file goes and a file where a folder goes are
  refused: exit 2, one line starting ``kvscope: ``, nothing written;
- a fresh path, a regular file that is no input (``corrupt``, ``rewrite``), an empty folder and an
  earlier report (``report``; the user's files in it kept) are written: exit 0 (``report``: 0 or 1),
  the output complete; ``repair`` runs with a ``--build`` that does not exist, so an OUT it may write
  gets past the guard and stops at the build, with no engine and nothing written;
- every input's sha256 unchanged; the FIFO still a FIFO (a command that opened it would block: a
  watchdog opens its reading end after ``FIFO_S`` so the case ends and fails), the device still a
  device, the system's ``/dev/null`` still the character device 1,3; nothing left behind (no
  ``.kvscope-tmp-*``, no name in the case's folder but the output); no traceback.

Run as root, the device is a private node of the same device number in the case's folder (the code
before the fix replaced the machine's ``/dev/null``); otherwise the real ``/dev/null`` or ``/dev/zero``.

``case_outputs(rng, work)`` is the family's case.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import stat
import threading
import time
from pathlib import Path
from typing import Any

from fuzz_fleet_common import DATA, MODEL, captured, check, kvscope_main  # noqa: E402  (bench/ is on sys.path)

STATE = DATA / "llamacpp-2026-10-01" / "llama-f16-fa0-unified0-seq0.seqstate"
COMMANDS = ("repair", "corrupt", "rewrite", "report")
FORMS = ("path", "symlink", "hardlink", "procfd", "dotdot")
TARGETS = ("input", "fifo", "device", "folder", "user_folder", "earlier_report", "regular", "proc_other", "fresh")
WEIGHTS = (6, 2, 2, 1, 1, 1, 1, 1, 2)  # earlier_report: for report (item 3); for the others it is user_folder
DEVICES = {"null": (1, 3), "zero": (1, 5)}
FIFO_S = 30.0  # a refusal takes well under this; a command blocked opening the FIFO is freed after it
TEMP_PREFIX = ".kvscope-tmp-"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tokens(state: Path) -> list[int]:
    from kvscope.core.reader.parse import read_state

    return list(read_state(str(state)).tokens or [])


def _text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _listing(root: Path) -> set[str]:
    names = set()
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        names |= {str((here / n).relative_to(root)) for n in dirnames + filenames}
    return names


def _device(rng: random.Random, folder: Path) -> str:
    name = rng.choice(sorted(DEVICES))
    if not os.access("/dev", os.W_OK):
        return f"/dev/{name}"  # this process cannot replace it: the real one is safe to aim at
    path = folder / name
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(*DEVICES[name]))
    return str(path)


def _system_null_intact() -> bool:
    st = os.lstat("/dev/null")
    return stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == DEVICES["null"]


def _argv(cmd: str, state: Path, model: Path, tokens: Path, out: str) -> list[str]:
    if cmd == "repair":  # no such build: past the guard it stops at the build, before any engine
        return ["repair", str(state), "--model", str(model), "--tokens", f"@{tokens}", "-o", out,
                "--build", "no-such-build", "--timeout", "5"]
    if cmd == "corrupt":
        return ["corrupt", str(state), "--corrupt", "truncated_half", "--model", str(model), "-o", out]
    if cmd == "rewrite":
        return ["rewrite", str(state), "--model", str(model), "-o", out]
    return ["report", str(state), "--model", str(model), "-o", out]


def _fifo_watchdog(path: str, done: threading.Event) -> threading.Thread:
    """After FIFO_S, open the FIFO's reading end (and drain it): a command blocked opening it goes on."""
    def watch() -> None:
        if done.wait(FIFO_S):
            return
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            return
        try:
            while not done.wait(0.05):
                with contextlib.suppress(BlockingIOError):
                    os.read(fd, 1 << 16)
        finally:
            os.close(fd)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def case_outputs(rng: random.Random, work: Path) -> dict[str, Any]:
    cmd = rng.choice(COMMANDS)
    target = rng.choices(TARGETS, WEIGHTS)[0]
    if target == "earlier_report" and cmd != "report":
        target = "user_folder"
    elif cmd == "report" and target in ("folder", "user_folder") and rng.random() < 0.5:
        target = "earlier_report"
    inp, place = work / "in", work / "out"
    inp.mkdir()
    place.mkdir()
    state, model, tokens = inp / "slot.seqstate", inp / "model.gguf", inp / "tokens.json"
    shutil.copyfile(STATE, state)
    shutil.copyfile(MODEL, model)
    tokens.write_text(json.dumps(_tokens(STATE)))
    reads = {"state": state, "model": model, **({"tokens": tokens} if cmd == "repair" else {})}
    sums = {p: _sha(p) for p in (state, model, tokens)}
    info: dict[str, Any] = {"command": cmd, "target": target}
    fd = None
    folder_out = cmd == "report"
    if target == "input":
        which = rng.choice(sorted(reads))
        form = rng.choice(FORMS)
        info["input"], info["form"] = which, form
        src = reads[which]
        if form == "path":
            out = str(src)
        elif form == "symlink":
            out = str(place / f"link-{which}")
            os.symlink(src if rng.random() < 0.5 else os.path.relpath(src, place), out)
        elif form == "hardlink":
            out = str(inp / f"hard-{which}")
            os.link(src, out)
        elif form == "procfd":
            fd = os.open(src, os.O_RDONLY)
            out = f"/proc/self/fd/{fd}"
        else:
            (place / "sub").mkdir()
            out = str(place / "sub" / ".." / ".." / "in" / src.name)
        expect = "is the input"
    elif target == "fifo":
        out = str(place / "pipe")
        os.mkfifo(out)
        expect = "a FIFO (named pipe), not a " + ("folder" if folder_out else "regular file")
    elif target == "device":
        out = _device(rng, place)
        info["device"] = out
        expect = "a character device, not a " + ("folder" if folder_out else "regular file")
    elif target in ("folder", "user_folder"):
        out = str(place / "dir")
        os.mkdir(out)
        if target == "user_folder":
            (place / "dir" / "mine.txt").write_text("the user's")
        expect = ("" if target == "folder" else "not a kvscope report") if folder_out else \
            "a folder, not a regular file"
    elif target == "earlier_report":  # a report run before, then files of the user's put into its folder
        out = str(place / "dir")
        with captured() as (_o, e0):
            rc0 = kvscope_main(["report", str(state), "-o", out])
        check(rc0 in (0, 1), f"the earlier report was not written: {e0.getvalue()[-500:]!r}")
        (place / "dir" / "mine.txt").write_text("the user's")
        (place / "dir" / "sub").mkdir()
        (place / "dir" / "sub" / "deep.txt").write_text("deep")
        expect = ""
    elif target == "proc_other":  # /proc/self/fd/N of a file that is no input: no place to write to
        other = place / "other.bin"
        other.write_bytes(b"an earlier output")
        fd = os.open(other, os.O_RDONLY)
        out = f"/proc/self/fd/{fd}"
        expect = "is a /proc name"
    elif target == "regular":
        out = str(tokens if cmd != "repair" and rng.random() < 0.5 else place / "old.bin")
        if out != str(tokens):
            Path(out).write_bytes(b"an earlier output")
        expect = "a regular file, not a folder" if folder_out else ""
    else:
        out = str(place / rng.choice(["new.seqstate", "new file", "new\u202e.bin", "r"]))
        expect = ""
    if cmd == "repair" and expect == "":
        expect = "no-such-build"  # what repair may write gets past the guard and stops at the build
    writes = expect == ""
    info["out"] = out if out.startswith("/dev/") or out.startswith("/proc/") else os.path.relpath(out, work)
    before = _listing(work)
    fifo = out if target == "fifo" else None
    done = threading.Event()
    if fifo is not None:
        _fifo_watchdog(fifo, done)
    t0 = time.monotonic()
    try:
        with captured() as (o, e):
            rc = kvscope_main(_argv(cmd, state, model, tokens, out))
    finally:
        done.set()
        if fd is not None:
            os.close(fd)
    info["seconds"] = round(time.monotonic() - t0, 3)
    err, text = e.getvalue(), o.getvalue()
    why = f"{cmd} -o {out!r} ({target}): exit {rc}: {err[-800:]!r}"
    check("Traceback" not in err, f"traceback: {why}")
    if fifo is not None:
        check(stat.S_ISFIFO(os.lstat(fifo).st_mode), f"the FIFO is no longer a FIFO: {why}")
        check(info["seconds"] < FIFO_S, f"the command blocked on the FIFO: {why}")
    if target == "device":
        check(stat.S_ISCHR(os.lstat(out).st_mode), f"the device is no longer a device: {why}")
    check(_system_null_intact(), f"/dev/null is no longer the character device 1,3: {why}")
    for p, s in sums.items():
        if not (target == "regular" and out == str(p)):
            check(p.is_file() and not p.is_symlink() and _sha(p) == s, f"{p.name} changed: {why}")
    check(not [n for n in _listing(work) if TEMP_PREFIX in n], f"temporaries left: {why}")
    after = _listing(work)
    if writes:
        check(rc in ((0, 1) if cmd == "report" else (0,)), f"not written: {why}")
        if folder_out:
            check((Path(out) / "report.json").is_file(), f"no report.json in OUT: {why}")
            new = {n for n in after - before if not n.startswith(os.path.relpath(out, work) + "/")}
            check(new <= {os.path.relpath(out, work)}, f"left beside the report: {sorted(new)}: {why}")
        else:
            check(Path(out).is_file() and Path(out).read_bytes() != b"an earlier output", f"OUT not written: {why}")
            check(after - before <= {os.path.relpath(out, work)}, f"left behind: {sorted(after - before)}: {why}")
        if target == "earlier_report":
            check(_text(Path(out) / "mine.txt") == "the user's" and _text(Path(out) / "sub" / "deep.txt") == "deep",
                  f"the user's files are gone: {why}")
        info["outcome"] = "written"
        return info
    lines = err.splitlines()
    check(rc == 2 and text == "", f"exit {rc}, expected 2 and nothing on stdout: {why}")
    check(len(lines) == 1 and lines[0].startswith("kvscope: "), f"not one 'kvscope: ' line: {why}")
    check(expect in lines[0], f"expected {expect!r}: {why}")
    check(after == before, f"names changed: +{sorted(after - before)} -{sorted(before - after)}: {why}")
    if target == "user_folder":
        check(os.listdir(out) == ["mine.txt"], f"the user's folder changed: {why}")
    info["outcome"] = "refused" if expect != "no-such-build" else "past the guard"
    return info
