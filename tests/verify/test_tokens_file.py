"""``--tokens @FILE`` (verify, repair, the app's Tokens for this blob…) goes through the core's one bounded reader.

A FIFO or a device is refused before it is opened (it would block or never end), a file over the cap is refused
from its size, a deeply nested JSON is one refusal (no recursion error), and a big file within the cap is parsed
in pieces with memory near the ids themselves. Real files, FIFOs and processes; no engine is needed: the
commands refuse before they start one.
"""

from __future__ import annotations

import json
import os
import random
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from kvscope.core.errors import UsageError
from kvscope.core.fileio import read_bounded
from kvscope.core.verify.prefill import MAX_TOKENS_FILE, parse_tokens

pytestmark = pytest.mark.slow  # token files in subprocesses

ROOT = Path(__file__).resolve().parents[2]
BLOB = ROOT / "resources/examples/llama-dropped-layer.seqdata.bin"
TINY = ROOT / "resources/examples/tiny-llama.gguf"


def _kvscope(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The real command in a child (a hang is a TimeoutExpired, not a stuck test run)."""
    return subprocess.run([sys.executable, "-m", "kvscope.core.cli.main", *argv], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, check=False)


def _commands(spec: str, tmp: Path) -> list[list[str]]:
    return [["verify", str(BLOB), "--model", str(TINY), "--tokens", spec],
            ["repair", str(BLOB), "--model", str(TINY), "-o", str(tmp / "out.bin"), "--tokens", spec]]


def _one_line_exit_2(r: subprocess.CompletedProcess[str], says: str) -> None:
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("kvscope: ") and says in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_a_fifo_is_refused_before_it_is_opened_by_verify_and_repair(tmp_path: Path) -> None:
    fifo = tmp_path / "tokens.fifo"
    os.mkfifo(fifo)  # no writer ever comes: opening it for reading would wait for ever
    for argv in _commands(f"@{fifo}", tmp_path):
        _one_line_exit_2(_kvscope(*argv), "not a regular file (a FIFO)")
    assert fifo.is_fifo() and sorted(os.listdir(tmp_path)) == ["tokens.fifo"]


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_an_endless_device_is_refused_without_reading_it(device: str, tmp_path: Path) -> None:
    for argv in _commands(f"@{device}", tmp_path):
        _one_line_exit_2(_kvscope(*argv), "not a regular file (a character device)")
    with pytest.raises(UsageError, match="not a regular file"):
        parse_tokens(f"@{device}")


def test_a_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"not a regular file \(a directory\)"):
        parse_tokens(f"@{tmp_path}")


def test_a_file_over_the_cap_is_refused_from_its_size(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    with open(big, "wb") as fh:  # a sparse file: nothing to write, and nothing may be read
        fh.write(b"[1")
        fh.truncate(MAX_TOKENS_FILE + 1)
    with pytest.raises(UsageError) as e:
        parse_tokens(f"@{big}")
    assert f"{MAX_TOKENS_FILE + 1:,} bytes, more than the 64 MiB" in str(e.value)
    r = _kvscope(*_commands(f"@{big}", tmp_path)[0])
    _one_line_exit_2(r, "more than the 64 MiB")
    with pytest.raises(ValueError, match="more than the 10 bytes"):
        read_bounded(big, 10)


def test_deep_nesting_is_one_refusal_not_a_recursion_error(tmp_path: Path) -> None:
    for name, doc in (("deep.json", "[" * 200_000 + "]" * 200_000),
                      ("deep-obj.json", '{"0": ' + "[" * 200_000 + "]" * 200_000 + "}"),
                      ("deep-dict.json", '{"0": {"0": ' * 50_000 + "1" + "}" * 100_000)):
        (tmp_path / name).write_text(doc)
        with pytest.raises(UsageError, match="expected a JSON list of token ids") as e:
            parse_tokens(f"@{tmp_path / name}")
        assert "\n" not in str(e.value)
    _one_line_exit_2(_kvscope(*_commands(f"@{tmp_path / 'deep.json'}", tmp_path)[1]), "a list in a list")


@pytest.mark.parametrize(("doc", "says"), [
    ("[1, 2,", "Expecting value: line 1 column 7 (char 6)"),  # what json says, where it says it
    ("[1, 2", "Expecting ',' delimiter: line 1 column 6 (char 5)"),
    ("[1 2]", "Expecting ',' delimiter"), ("[01]", "Expecting ',' delimiter"), ("[1,,2]", "Expecting value"),
    ("[1] x", "Extra data"), ("", "Expecting value"), ('{"0": [1],}', "Expecting property name"),
    ("[99999999999]", "more than 10 digits"), ("[2147483648]", "does not fit a 32-bit llama_token"),
    ('{"0": 5}', "expected a JSON list"), ("[1e3]", "expected a JSON list"), ("[-1.0]", "expected a JSON list"),
])
def test_malformed_files_are_one_line(doc: str, says: str, tmp_path: Path) -> None:
    (tmp_path / "t.json").write_text(doc)
    with pytest.raises(UsageError, match="^--tokens @") as e:
        parse_tokens(f"@{tmp_path / 't.json'}")
    assert says in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("doc", ["[1, 2, 3]", " [\n 7 ,\t-0 , 2147483647, -2147483648 ]\n", "[]",
                                 '{"1": [4, 5], "0": [6]}', '{"\\u0031": [7], "1": [8]}', "{}"])
def test_the_file_reads_as_json_reads_it(doc: str, tmp_path: Path) -> None:
    (tmp_path / "t.json").write_text(doc)
    want = json.loads(doc)
    got = parse_tokens(f"@{tmp_path / 't.json'}")
    assert got == ({int(k): v for k, v in want.items()} if isinstance(want, dict) else want)


def test_the_inline_form_is_unchanged_and_bounded() -> None:
    assert parse_tokens("1, 2,3,") == [1, 2, 3]
    with pytest.raises(UsageError, match="32-bit"):
        parse_tokens("1," + "9" * 30)


_CHILD = """
import resource, subprocess, sys
code = ("from kvscope.core.verify.prefill import parse_tokens; t = parse_tokens(sys.argv[1]); "
        "print(len(t), t[:3], t[-1])")
r = subprocess.run([sys.executable, "-c", "import sys; " + code, sys.argv[1]], capture_output=True, text=True)
print(r.stdout.strip(), "|", r.stderr.strip()[-300:], "|", resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def test_a_big_file_within_the_cap_costs_memory_near_its_ids(tmp_path: Path) -> None:
    """About 30 MiB of ids (5.4 million of them, as json.dumps writes a list): parsed whole, in a child whose
    peak RSS (RUSAGE_CHILDREN of a parent of its own) stays under the file, 16 bytes an id (the list's pointer,
    twice over) and the interpreter: 176 MiB here; about 136 MiB measured. json.load took about 308 MiB (the
    text, then an int object of 32 bytes and a pointer for each id); the file is now read in pieces and equal
    ids share one int object."""
    rng = random.Random(7)
    ids = [rng.randrange(300, 10_000) for _ in range(5_400_000)]  # 4 digits + ", ": 6 bytes an id
    path = tmp_path / "big.json"
    path.write_text(json.dumps(ids))
    size = path.stat().st_size
    assert 30 << 20 < size < MAX_TOKENS_FILE // 2
    r = subprocess.run([sys.executable, "-c", _CHILD, f"@{path}"], capture_output=True, text=True, timeout=300,
                       check=True)
    out, err, peak_kib = r.stdout.rsplit("|", 2)
    assert out.strip() == f"{len(ids)} {ids[:3]} {ids[-1]}", err
    peak = int(peak_kib) * 1024
    assert peak < size + 16 * len(ids) + (64 << 20), f"peak RSS {peak >> 20} MiB for a {size >> 20} MiB file"
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss > 0
