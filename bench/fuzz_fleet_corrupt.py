"""The long fuzz's ``corrupt_specs`` family (#31 items 8, 10, 16, 18): hostile specs and hostile ``--tokens @FILE``.

Each case is one of two kinds:

- ``spec``: ``kvscope corrupt`` (run in this process) on a copy of a real fixture, with one to three specs drawn
  from the catalog, from each kind's own keys with good values, and from hostile ones: unknown and misspelt keys,
  a key twice, empty values, huge, negative, hex, 100,000-digit and non-ASCII-digit values, selectors past the
  file (``index=99``, ``kv_layer=99``, ``cells=0-99999``, ``stream=9``), ``byte=0x1ff``, a swap with ``kv_layer=``,
  chained trailers past the total cap, terminal control strings. The expectation is worked out beside it with the
  catalog's own in-memory mutations (``parse_spec(...).apply``, the trailer cap): the command writes exactly that
  copy (exit 0, one line per spec and the ``written:`` line) or, where the catalog refuses, refuses in one line
  starting ``kvscope: `` (exit 2) and writes nothing. Never a traceback, exit 1 or 3; the input is unchanged,
  nothing is left beside it, the case takes seconds.
- ``tokens``: ``kvscope verify`` or ``kvscope repair`` (a real child process, with a timeout) of a blob with
  ``--tokens @FILE`` where FILE is a FIFO nobody writes, ``/dev/zero``, ``/dev/urandom``, a folder, a sparse file
  over the 64 MiB cap, JSON nested up to a million deep, a 100,000-digit id, an id past 32 bits, malformed JSON:
  each is refused before any engine starts (exit 2, one line naming ``--tokens``), in well under the timeout (a
  FIFO opened for reading would block for ever), the FIFO still a FIFO, nothing written.

``case_corrupt_specs(rng, work)`` is the family's case.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fuzz_fleet_common import DATA, FIXTURES, HOSTILE, MODEL, captured, check, kvscope_main  # noqa: E402

from kvscope.core.lab.corruptions import CATALOG, KEYS, MAX_TRAILER, CorruptionError, parse_spec
from kvscope.core.model.profile import load_model_profile

ROOT = Path(__file__).resolve().parent.parent
BLOB = ROOT / "resources" / "examples" / "llama-dropped-layer.seqdata.bin"
TINY = ROOT / "resources" / "examples" / "tiny-llama.gguf"
SPEC_S = 30.0  # a corrupt case on a fixture of at most 20 KB takes well under this
TOKENS_S = 60.0  # a refused --tokens takes a child's start-up; a blocked one is killed at this
BIG = ("9" * 20, "9" * 5000, "9" * 100_000, "0x" + "f" * 100_000, "-" + "9" * 4400, "+" + "9" * 30)
ODD = ("", "-1", "-0", "0x1ff", "256", "0o777", "0b101", "1_0", "١", "²", "1e3", "1.5", "nan", "k,v", " 7 ", "x",
       "0x", "--1", "010", "kv_swa", "/memory", "first-nonempty", "other", "q8_0", "+1", "half", "99", "99999999")
VALUES: dict[str, tuple[str, ...]] = {
    "at": ("half", "middle", "start", "end", "1", "-1", "100", "-100"), "node": ("/memory", "/tokens", "/nope"),
    "section": ("0", "1", "-1", "kv", "kv_swa", "recurrent", "9"), "stream": ("0", "1", "2", "9", "first-nonempty"),
    "role": ("k", "v", "r", "s", "kv", "q"), "index": ("0", "1", "-1", "2", "99", "-99"), "il": ("0", "1", "3", "99"),
    "kv_layer": ("0", "1", "3", "99"), "field": ("cell_count", "pos", "n_seq_id", "seq_id", "type", "magic",
                                               "n_layer", "v_trans", "row_size", "n_stream", "cell_cuont"),
    "value": ("nan", "inf", "zeros", "0xff", "+1", "-1", "0", "other", "q8_0", "0x7fffffff", "purple"),
    "cell": ("0", "1", "5", "11", "99999"), "into": ("0", "1", "2", "99999"), "cells": ("0", "1-3", "0-99999", "3-1"),
    "then_fail": ("k", "v", "r", "s", "x"), "a": ("0", "1", "-1", "9"), "b": ("1", "0", "2", "9"),
    "bytes": ("1", "16", "4096", "0", "1048576"), "byte": ("0", "255", "0x41", "0x1ff", "-1"),
}
TOKEN_FORMS = ("fifo", "dev_zero", "dev_urandom", "folder", "over_cap", "nested", "nested_obj", "huge_digits",
               "past_32_bits", "malformed", "float", "string_key")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _misspell(rng: random.Random, key: str) -> str:
    i = rng.randrange(len(key))
    how = rng.choice(("drop", "double", "swap", "case"))
    if how == "drop" and len(key) > 1:
        return key[:i] + key[i + 1:]
    if how == "double":
        return key[:i] + key[i] + key[i:]
    if how == "swap" and i + 1 < len(key):
        return key[:i] + key[i + 1] + key[i] + key[i + 2:]
    return key.upper()


def _draw_spec(rng: random.Random) -> str:
    """One spec: a catalog name, a well-formed one of a kind's own keys, or a hostile one."""
    roll = rng.random()
    if roll < 0.2:
        return rng.choice(list(CATALOG))
    kind = rng.choice(list(KEYS))
    keys = rng.sample(KEYS[kind], rng.randint(0, min(3, len(KEYS[kind]))))
    if kind == "set" and "field" not in keys:
        keys.append("field")
    params = [(k, rng.choice(VALUES.get(k, ("0",)))) for k in keys]
    if kind == "trailer":  # on its own a trailer stays small (the chain cap is drawn below)
        params = [(k, v if k != "bytes" else rng.choice(("1", "16", "4096", "0"))) for k, v in params]
    if roll > 0.6:  # hostile: change one thing
        what = rng.choice(("unknown", "misspelt", "twice", "odd", "big", "hostile", "swap_kv_layer", "empty_kind"))
        if what == "unknown":
            params.append((rng.choice(("cels", "layer", "count", "x", "index2", "kvlayer")), "3"))
        elif what == "misspelt":
            k = rng.choice(KEYS[kind])
            params.append((_misspell(rng, k), rng.choice(VALUES.get(k, ("1",)))))
        elif what == "twice" and params:
            params.append(rng.choice(params))
        elif what in ("odd", "big") and params:
            i = rng.randrange(len(params))
            params[i] = (params[i][0], rng.choice(ODD if what == "odd" else BIG))
        elif what == "hostile":
            i = rng.randrange(len(params) + 1)
            text = rng.choice(HOSTILE).replace(",", ";")
            params.insert(i, (text, "1") if rng.random() < 0.5 else ("index", text))
        elif what == "swap_kv_layer":
            kind, params = "swap", [("role", "k"), ("a", "0"), ("b", "1"), ("kv_layer", rng.choice(("0", "1")))]
        elif what == "empty_kind":
            kind = ""
    body = ",".join(f"{k}={v}" for k, v in params)
    return f"{kind}:{body}" if body or rng.random() < 0.5 else kind


def _expected(data: bytes, specs: list[str], profile: Any) -> bytes | None:
    """What the copy must be (the catalog's own mutations, in order), or None where it must be refused."""
    try:
        parsed = [parse_spec(s) for s in specs]
    except CorruptionError:
        return None
    if sum(c.appends for c in parsed) > MAX_TRAILER:
        return None
    try:
        for c in parsed:
            data = c.apply(data, profile).data
    except CorruptionError:
        return None
    return data


def _spec_case(rng: random.Random, work: Path) -> dict[str, Any]:
    name = rng.choice(FIXTURES)
    folder = work / "in"
    folder.mkdir(parents=True)
    src = folder / Path(name).name
    shutil.copyfile(DATA / name, src)
    model = str(MODEL) if "/llama-" in name and rng.random() < 0.7 else None
    specs = [_draw_spec(rng) for _ in range(rng.choice((1, 1, 2, 3)))]
    if rng.random() < 0.1:  # chained trailers past the total cap: refused before anything is read or written
        specs = [f"trailer:bytes={rng.choice((MAX_TRAILER, MAX_TRAILER // 2 + 1, 0x30000000))}"
                 for _ in range(rng.randint(2, 3))]
    info: dict[str, Any] = {"command": "corrupt", "kind": "spec", "fixture": name, "model": bool(model),
                            "specs": [s if len(s) <= 120 else s[:100] + f"…({len(s)} chars)" for s in specs]}
    before = _sha(src)
    want = _expected(src.read_bytes(), specs, load_model_profile(model) if model else None)
    out = work / "out" / "copy.bin"
    out.parent.mkdir()
    argv = ["corrupt", str(src), "-o", str(out), *[a for s in specs for a in ("--corrupt", s)]]
    if model:
        argv += ["--model", model]
    t0 = time.monotonic()
    with captured() as (so, se):
        rc = kvscope_main(argv)
    secs = time.monotonic() - t0
    text, err = so.getvalue(), se.getvalue()
    why = f"corrupt {info['specs']} on {name}: exit {rc}: {err[-600:]}"
    check("Traceback" not in err and rc in (0, 2), f"not 0 or 2, or a traceback: {why}")
    check(secs < SPEC_S, f"took {secs:.1f} s: {why}")
    check(_sha(src) == before and os.listdir(folder) == [src.name], f"the input changed or something beside it: {why}")
    if want is None:
        check(rc == 2, f"the catalog refuses it, the command wrote it: {why}")
        check(text == "" and err.count("\n") == 1 and err.startswith("kvscope: "), f"not one line: {why}")
        check(os.listdir(out.parent) == [], f"written or left behind though refused: {os.listdir(out.parent)}")
        info["outcome"] = "refused"
        info["reason"] = err.strip()[:160]
    else:
        check(rc == 0, f"the catalog makes it, the command refused it: {why}")
        check(out.read_bytes() == want, f"the copy is not the catalog's mutation: {why}")
        lines = text.splitlines()
        check(len(lines) == len(specs) + 1 and lines[-1].startswith("written: "), f"lines {lines}: {why}")
        check(os.listdir(out.parent) == ["copy.bin"], f"left behind: {os.listdir(out.parent)}")
        info["outcome"] = "written"
    info["seconds"] = round(secs, 3)
    return info


def _tokens_file(rng: random.Random, work: Path, form: str) -> str:
    path = work / "tokens.json"
    if form == "fifo":
        os.mkfifo(path)
    elif form in ("dev_zero", "dev_urandom"):
        return "/dev/zero" if form == "dev_zero" else "/dev/urandom"
    elif form == "folder":
        path.mkdir()
    elif form == "over_cap":
        with open(path, "wb") as fh:
            fh.write(b"[" + b"1," * 1000)
            fh.truncate((64 << 20) + rng.randint(1, 1 << 24))
    elif form in ("nested", "nested_obj"):
        depth = rng.choice((100, 10_000, 1_000_000))
        doc = "[" * depth + "1" + "]" * depth
        path.write_text(doc if form == "nested" else '{"0": ' + doc + "}")
    elif form == "huge_digits":
        path.write_text("[1, " + "9" * rng.choice((11, 5000, 100_000)) + "]")
    elif form == "past_32_bits":
        path.write_text(f"[1, {rng.choice((2 ** 31, -(2 ** 31) - 1, 2 ** 63))}]")
    elif form == "malformed":
        path.write_text(rng.choice(("[1, 2,", "[1 2]", "[01]", "[1]]", "", "{\"0\": [1],}", "[,]", "\x00", "[-]")))
    elif form == "float":
        path.write_text(rng.choice(("[1.5]", "[1e3]", "[true]", "[null]", '["1"]', '{"0": [2.0]}')))
    else:
        path.write_text(rng.choice(('{"x": [1]}', '{"' + "1" * 100 + '": [1]}', '{"0": 5}', '{"0": {"0": [1]}}')))
    return str(path)


def _tokens_case(rng: random.Random, work: Path) -> dict[str, Any]:
    form = rng.choice(TOKEN_FORMS)
    cmd = rng.choice(("verify", "repair"))
    work.mkdir(parents=True, exist_ok=True)
    spec = "@" + _tokens_file(rng, work, form)
    out = work / "repaired.bin"
    argv = [cmd, str(BLOB), "--model", str(TINY), "--tokens", spec] + (["-o", str(out)] if cmd == "repair" else [])
    info: dict[str, Any] = {"command": cmd, "kind": "tokens", "form": form}
    before = _sha(BLOB)
    t0 = time.monotonic()
    try:
        r = subprocess.run([sys.executable, "-m", "kvscope.core.cli.main", *argv], capture_output=True, text=True,
                           timeout=TOKENS_S, stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        check(False, f"{cmd} --tokens {form}: still running after {TOKENS_S:.0f} s (blocked reading it?)")
        raise  # not reached
    secs = time.monotonic() - t0
    why = f"{cmd} --tokens {form}: exit {r.returncode}: {r.stderr[-600:]}"
    check("Traceback" not in r.stderr and r.returncode == 2, f"not a refusal: {why}")
    check(r.stdout == "" and r.stderr.count("\n") == 1 and r.stderr.startswith("kvscope: --tokens "),
          f"not one line naming --tokens: {why}")
    check(not out.exists(), f"{out.name} written: {why}")
    check(_sha(BLOB) == before, f"the blob changed: {why}")
    if form == "fifo":
        check(Path(spec[1:]).is_fifo(), "the FIFO is no longer a FIFO")
    info["outcome"] = "refused"
    info["reason"] = r.stderr.strip()[:160]
    info["seconds"] = round(secs, 3)
    return info


def case_corrupt_specs(rng: random.Random, work: Path) -> dict[str, Any]:
    """One case of the family: hostile specs to ``kvscope corrupt`` (most cases) or hostile ``--tokens @FILE``."""
    return _tokens_case(rng, work / "tokens") if rng.random() < 0.25 else _spec_case(rng, work / "spec")
