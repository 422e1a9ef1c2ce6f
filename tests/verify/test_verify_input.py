"""What ``kvscope verify`` reads: the header's token count does not size the engine's buffer, the file is
read once (a replacement or an in-place overwrite during the run changes neither the parse, the restore
nor the comparison, and is reported), and only a regular file is read (a FIFO, a directory, a device or
a piped /dev/stdin is refused by what it is, with exit code 2)."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from kvharness.fixtures import MODELS, model_path
from kvharness.states import OTHER, kv_records, write_states
from kvscope.core.engine.builds import InstalledBuild
from kvscope.core.verify.run import Verifier, VerifyError, verify

SEQ = MODELS / "llama-f16-fa0-unified0-seq1.seqstate"
SESSION = MODELS / "llama-f16-fa1-unified1-ctx.session"
TOKEN_COUNT_AT = 8  # magic u32, version u32, n_token_count u32: the same in sequence and session files


def _with_token_count(src: Path, dst: Path, n: int) -> Path:
    data = bytearray(src.read_bytes())
    data[TOKEN_COUNT_AT:TOKEN_COUNT_AT + 4] = struct.pack("<I", n)
    dst.write_bytes(bytes(data))
    return dst


# --- the header's n_token_count -------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["seq", "seq_v4", "session"])
def test_a_huge_token_count_is_refused_by_llama_cpp_not_allocated(kind: str, builds: dict[str, InstalledBuild],
                                                                  tmp_path: Path) -> None:
    src = {"seq": SEQ, "session": SESSION}.get(kind) or write_states("b11434", tmp_path)["seq_file"]
    bad = _with_token_count(src, tmp_path / f"count.{kind}", 1 << 28)  # 1 GiB of int32 tokens before the fix
    r = verify(bad, model_path("llama"))
    assert r.verdict == "damaged" and r.restore is not None and not r.restore.ok
    assert "exceeded capacity" in r.restore.message, r.restore.message
    assert r.context["n_token_capacity"] <= r.context["ctx"]["n_ctx"]


def test_a_zero_token_count_gets_a_verdict(builds: dict[str, InstalledBuild], tmp_path: Path) -> None:
    bad = _with_token_count(SEQ, tmp_path / "zero.seqstate", 0)  # the tokens are read as the state: garbage ids
    r = verify(bad, model_path("llama"))
    assert r.verdict == "damaged" and r.restore is not None and not r.restore.ok
    assert r.context["ctx"]["n_seq_max"] <= 256


# --- read once ------------------------------------------------------------------------------------
def _swap_at(step: str, path: Path, change: Callable[[], None]) -> Callable[[int, int, str], None]:
    done: list[str] = []

    def progress(_d: int, _t: int, label: str) -> None:
        if label.startswith(step) and not done:
            done.append(label)
            change()

    return progress


@pytest.mark.parametrize("step", ["restoring", "re-prefilling", "comparing"])
def test_a_file_replaced_during_the_run_is_verified_as_read_and_reported(
        step: str, builds: dict[str, InstalledBuild], tmp_path: Path) -> None:
    target = tmp_path / "state.seqstate"
    shutil.copyfile(SEQ, target)
    other = write_states("0c1e5709", tmp_path / "other", tokens=OTHER)["seq_file"]  # stale for SEQ's tokens

    def replace() -> None:
        tmp = tmp_path / "incoming"
        shutil.copyfile(other, tmp)
        os.replace(tmp, target)

    r = Verifier(target, model_path("llama"), progress=_swap_at(step, target, replace)).run()
    assert r.verdict == "ok", r.reasons
    assert r.input_changed is not None and "replaced" in r.input_changed
    assert any("replaced" in n for n in r.notes)
    assert r.to_json()["input_changed"] == r.input_changed


@pytest.mark.parametrize("step", ["restoring", "comparing"])
def test_an_in_place_overwrite_during_the_run_is_detected(step: str, builds: dict[str, InstalledBuild],
                                                         tmp_path: Path) -> None:
    target = tmp_path / "state.seqstate"
    shutil.copyfile(SEQ, target)
    k, _ = kv_records(target)

    def overwrite() -> None:
        with open(target, "r+b") as fh:  # same inode: a writer that rewrites the file where it is
            fh.seek(k[1].data_offset)
            fh.write(b"\x7f" * k[1].data_size)

    r = Verifier(target, model_path("llama"), progress=_swap_at(step, target, overwrite)).run()
    assert r.verdict == "ok", r.reasons
    assert r.input_changed is not None and "rewritten in place" in r.input_changed
    assert verify(target, model_path("llama")).verdict == "damaged"  # the overwrite was real


def test_an_unchanged_file_is_not_reported(builds: dict[str, InstalledBuild]) -> None:
    r = verify(SEQ, model_path("llama"))
    assert r.verdict == "ok" and r.input_changed is None and r.to_json()["input_changed"] is None


# --- not a regular file ---------------------------------------------------------------------------
def test_a_fifo_a_directory_and_a_device_are_refused_by_what_they_are(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)  # no writer: an open without O_NONBLOCK would hang
    for path, what in ((fifo, "FIFO"), (tmp_path, "directory"), (Path("/dev/null"), "character device")):
        with pytest.raises(VerifyError, match=what):
            verify(path, model_path("llama"))
    with pytest.raises(VerifyError, match="no such file"):
        verify(tmp_path / "absent", model_path("llama"))


def test_dev_stdin_is_read_when_it_is_a_file_and_refused_when_a_pipe(builds: dict[str, InstalledBuild]) -> None:
    cmd = [sys.executable, "-m", "kvscope.core.cli.main", "verify", "/dev/stdin", "--model", str(model_path("llama"))]
    with open(SEQ, "rb") as fh:
        r = subprocess.run(cmd, stdin=fh, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "verdict: ok" in r.stdout, r.stderr
    piped = subprocess.run(cmd, input=SEQ.read_bytes(), capture_output=True, timeout=300)
    err = piped.stderr.decode()
    assert piped.returncode == 2 and err.strip().endswith("a FIFO (named pipe), not a state file"), err
    assert len(err.strip().splitlines()) == 1
