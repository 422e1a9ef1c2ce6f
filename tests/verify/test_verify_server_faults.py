"""``kvscope verify --engine server`` against a misbehaving llama-server (``kvharness.fake_server``: a
proxy before a real one that answers one chosen request wrongly). Every fault ends in a verdict or in one
line and exit code 2, never a traceback; ``--timeout`` bounds a server that trickles bytes; an answer or a
saved slot is bounded in size and never read through a link, a FIFO or a device; the server's text reaches
the terminal escaped."""

from __future__ import annotations

import errno
import os
import resource
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kvharness.fake_server import FakeServer
from kvharness.fixtures import model_path
from kvharness.states import PROMPT
from kvscope.core.cli.main import main
from kvscope.core.engine.builds import InstalledBuild
from kvscope.core.engine.server import ServerProcess
from kvscope.core.verify import engines
from kvscope.core.verify.result import VERDICTS, VerifyResult
from kvscope.core.verify.run import Verifier, VerifyError

TIMEOUT_S = 3.0  # --timeout of every run here: what a trickling server gets
BOUND_S = 40.0  # a run against a hanging server ends well within this (the timeouts of a few requests)


@pytest.fixture(scope="module")
def real(builds: dict[str, InstalledBuild]) -> Iterator[ServerProcess]:
    with ServerProcess(model_path("llama"), build="0c1e5709", n_ctx=512) as srv:
        yield srv


@pytest.fixture(scope="module")
def slot(real: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> Path:
    c = real.client()
    c.complete(PROMPT, n_predict=0)
    c.slot_save(0, "fixture-slot.bin")
    out = tmp_path_factory.mktemp("slot") / "slot0.bin"
    shutil.copyfile(Path(real.slot_dir) / "fixture-slot.bin", out)
    return out


@pytest.fixture
def fake(real: ServerProcess) -> Iterator[FakeServer]:
    with FakeServer(real.url, real.slot_dir) as f:
        yield f


def _verify(path: Path, fake: FakeServer) -> VerifyResult:
    return Verifier(path, model_path("llama"), engine="server", server_url=fake.url, slot_dir=fake.slot_dir,
                    timeout_s=TIMEOUT_S).run()


def _leftovers(fake: FakeServer) -> list[str]:
    return [n for n in os.listdir(fake.slot_dir) if n.startswith("kvscope-verify-")]


def test_the_proxy_alone_gives_an_ok_verdict(slot: Path, fake: FakeServer) -> None:
    r = _verify(slot, fake)
    assert r.verdict == "ok", r.reasons
    assert fake.seen.get("prefill", 0) >= 1 and not _leftovers(fake)


# --- server errors during the re-prefill, wrong types, a missing slot: one line -------------------------
PREFILL_FAULTS = [("prefill", "status", 500), ("prefill", "status", 404), ("prefill", "silent", None),
                  ("prefill", "invalid", None), ("prefill", "close", None), ("erase", "status", 500),
                  ("erase", "close", None), ("save", "status", 500), ("save", "invalid", None),
                  ("save", "close", None), ("prefill", "json", [1, 2]), ("save", "silent", None)]


@pytest.mark.parametrize(("endpoint", "kind", "arg"), PREFILL_FAULTS)
def test_a_server_failing_the_re_prefill_is_one_line(endpoint: str, kind: str, arg: Any, slot: Path,
                                                     fake: FakeServer) -> None:
    fake.fault(endpoint, kind, arg)
    t0 = time.monotonic()
    with pytest.raises(VerifyError, match="llama-server failed during the re-prefill") as e:
        _verify(slot, fake)
    assert time.monotonic() - t0 < BOUND_S
    assert "\n" not in str(e.value) and fake.hits, fake.hits
    assert not _leftovers(fake)


def _remove(slot_dir: str, name: str) -> None:
    os.unlink(os.path.join(slot_dir, name))


def _directory(slot_dir: str, name: str) -> None:
    _remove(slot_dir, name)
    os.mkdir(os.path.join(slot_dir, name))


def _fifo(slot_dir: str, name: str) -> None:
    _remove(slot_dir, name)
    os.mkfifo(os.path.join(slot_dir, name))


def _link_to(target: str) -> Callable[[str, str], None]:
    def make(slot_dir: str, name: str) -> None:
        _remove(slot_dir, name)
        os.symlink(target, os.path.join(slot_dir, name))
    return make


def _sparse_20gb(slot_dir: str, name: str) -> None:
    with open(os.path.join(slot_dir, name), "r+b") as fh:
        fh.truncate(20 << 30)


@pytest.mark.parametrize(("change", "words"), [
    (_remove, "No such file"), (_directory, "a directory"), (_fifo, "FIFO"), (_link_to("/dev/zero"), "symbolic link"),
    (_link_to("/etc/passwd"), "symbolic link"), (_sparse_20gb, "more than")])
def test_a_saved_slot_that_is_not_a_plain_file_of_its_size_is_refused(change: Callable[[str, str], None], words: str,
                                                                      slot: Path, fake: FakeServer) -> None:
    fake.fault("save", "after", change)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.monotonic()
    with pytest.raises(VerifyError, match=words) as e:
        _verify(slot, fake)
    assert time.monotonic() - t0 < BOUND_S and "\n" not in str(e.value)
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) < 512 * 1024  # KiB: nothing read whole
    for n in _leftovers(fake):  # what the change left (a folder, a FIFO) goes with the run's names
        pytest.fail(f"left in the slot folder: {n}")


@pytest.mark.parametrize(("endpoint", "answer"), [
    ("props", {"total_slots": "two", "default_generation_settings": [512], "build_info": 7}),
    ("props", ["not", "an", "object"]),
    ("next", {"completion_probabilities": "none"}),
    ("next", {"completion_probabilities": [{"top_logprobs": [{"id": "7", "logprob": None}]}]}),
    ("next", {"completion_probabilities": [["id", 1]]})])
def test_answers_of_the_wrong_types_still_give_a_verdict(endpoint: str, answer: Any, slot: Path,
                                                        fake: FakeServer) -> None:
    fake.fault(endpoint, "json", answer)
    r = _verify(slot, fake)
    assert r.verdict in VERDICTS and fake.hits
    if endpoint == "next":
        assert r.next_token is not None and "completion_probabilities" in r.next_token.skipped


def test_a_full_disk_while_copying_into_the_slot_folder_is_one_line(slot: Path, fake: FakeServer,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def full(src_fd: int, dst_path: str, size: int) -> None:
        with open(dst_path, "wb") as fh:  # part of the copy is written, then the disk is full
            fh.write(b"\0" * 100)
        os.unlink(dst_path)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(engines, "copy_sparse", full)
    with pytest.raises(VerifyError, match="cannot copy the file into the slot folder .*No space left on device"):
        _verify(slot, fake)
    assert not _leftovers(fake)


# --- time and size bounds -------------------------------------------------------------------------------
@pytest.mark.parametrize(("endpoint", "kind"), [
    ("health", "trickle_head"), ("health", "trickle_body"), ("restore", "trickle_head"),
    ("restore", "trickle_body"), ("prefill", "trickle_head"), ("prefill", "trickle_body"),
    ("next", "trickle_body")])
def test_a_trickling_server_is_cut_off_at_the_timeout(endpoint: str, kind: str, slot: Path,
                                                      fake: FakeServer) -> None:
    fake.fault(endpoint, kind)
    t0 = time.monotonic()
    try:
        r = _verify(slot, fake)
        assert r.verdict in VERDICTS
        if endpoint == "restore":
            assert r.restore is not None and not r.restore.ok and "within 3 s" in r.restore.message
        if endpoint == "next":
            assert r.next_token is not None and "within 3 s" in r.next_token.skipped
    except VerifyError as e:
        assert endpoint in ("health", "prefill") and "within 3 s" in str(e)
    assert time.monotonic() - t0 < BOUND_S and fake.hits


def test_a_huge_health_answer_is_refused_without_reading_it(slot: Path, fake: FakeServer) -> None:
    fake.fault("health", "huge", 1536 << 20)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(VerifyError, match="MiB"):
        _verify(slot, fake)
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) < 512 * 1024


def test_a_file_with_a_large_hole_is_copied_with_its_hole(slot: Path, fake: FakeServer, tmp_path: Path) -> None:
    holed = tmp_path / "holed.bin"
    shutil.copyfile(slot, holed)
    with open(holed, "r+b") as fh:
        fh.truncate(holed.stat().st_size + (2 << 30))  # 2 GiB of hole after the state
    used: list[int] = []
    fake.fault("restore", "after", lambda d, n: used.append(os.stat(os.path.join(d, n)).st_blocks * 512))
    r = _verify(holed, fake)
    assert r.verdict in VERDICTS and used and used[0] < 16 << 20, used


# --- the server's text ----------------------------------------------------------------------------------
def test_the_servers_error_text_reaches_the_terminal_escaped(slot: Path, fake: FakeServer,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    fake.fault("restore", "message", "bad\x1b[31m red\nsecond line\x07")
    rc = main(["verify", str(slot), "--model", str(model_path("llama")), "--engine", "server", "--server", fake.url,
               "--slot-dir", fake.slot_dir, "--timeout", str(TIMEOUT_S)])
    out = capsys.readouterr().out
    assert rc == 1 and "\x1b" not in out and "\x07" not in out
    line = next(ln for ln in out.splitlines() if ln.startswith("restore:"))
    assert "bad\\x1b[31m red\\nsecond line\\x07" in line


def test_every_line_of_the_text_report_is_escaped() -> None:
    from kvscope.core.verify.engines import RestoreReport
    from kvscope.core.verify.result import result_text

    r = VerifyResult("a\x1b]0;title\x07.bin", "seq_file", "2026-10", "m.gguf", engine={"kind": "llama.cpp"},
                     restore=RestoreReport(False, "llama.cpp: bad\rline\x1b[2J"), reasons=["why\u202eeno"],
                     notes=["note\nsecond"])
    text = result_text(r)
    assert not any(c in text for c in "\x1b\x07\r\u202e")
    assert len(text.splitlines()) == 6 and "note\\nsecond" in text and "bad\\rline\\x1b[2J" in text
