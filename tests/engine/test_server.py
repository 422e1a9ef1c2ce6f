"""A real llama-server from the pinned builds: start on loopback, complete, slot save / restore /
erase, the server's own errors, a crash while restoring, the request and time bounds, and stop."""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from pathlib import Path

import pytest

from kvharness.fixtures import model_path
from kvscope.core.engine.builds import InstalledBuild
from kvscope.core.engine.server import (
    ServerClient,
    ServerDied,
    ServerError,
    ServerHTTPError,
    ServerLimitError,
    ServerProcess,
    ServerSetupError,
    server_flags,
)

SEQ_VERSION = {"0c1e5709": 3, "b11434": 4}
PROMPT = "hello world hello world"


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize("build", ["b11434", "0c1e5709"])
def test_slot_save_restore_round_trip(build: str, builds: dict[str, InstalledBuild]) -> None:
    with ServerProcess(model_path("llama"), build=build, n_ctx=512, n_parallel=1) as srv:
        assert srv.url.startswith("http://127.0.0.1:")
        assert "--no-webui" in srv.command and "--offline" in srv.command
        c = srv.client()
        assert c.health() == {"status": "ok"}
        props = c.props()
        assert props["total_slots"] == 1 and props["model_path"] == str(model_path("llama"))
        first = c.complete(PROMPT, n_predict=4, temperature=0, return_tokens=True)
        assert first["id_slot"] == 0 and first["tokens_predicted"] == 4 and len(first["tokens"]) == 4

        saved = c.slot_save(0, "slot0.bin")
        path = Path(c.slot_path("slot0.bin"))
        assert path.is_file() and saved["n_written"] == path.stat().st_size
        magic, version = struct.unpack("<II", path.read_bytes()[:8])
        assert (magic, version) == (0x67677371, SEQ_VERSION[build])  # 'ggsq'

        assert c.slot_erase(0)["n_erased"] == saved["n_saved"]
        restored = c.slot_restore(0, "slot0.bin")
        assert restored["n_restored"] == saved["n_saved"] and restored["n_read"] == saved["n_written"]
        again = c.complete(PROMPT, n_predict=4, temperature=0, return_tokens=True)
        assert again["tokens"] == first["tokens"] and again["content"] == first["content"]
        assert again["tokens_evaluated"] == first["tokens_evaluated"]

        slots = c.slots()
        assert [s["id"] for s in slots] == [0] and slots[0]["n_ctx"] == 512
        assert c.requests == 8
        pid, tmp = srv.pid, srv._tmp
    assert _gone(pid) and not os.path.exists(tmp)
    assert srv.exit_reason == "stopped"


def test_server_errors_carry_the_servers_message(builds: dict[str, InstalledBuild]) -> None:
    with ServerProcess(model_path("llama"), build="b11434", n_ctx=256) as srv:
        c = srv.client(max_requests=6)
        with pytest.raises(ServerHTTPError, match="Invalid filename") as e:
            c.slot_save(0, "../escape.bin")
        assert e.value.status == 400 and e.value.error_type == "invalid_request_error"
        with pytest.raises(ServerHTTPError, match="Unable to restore slot"):
            c.slot_restore(0, "missing.bin")
        c.complete(PROMPT, n_predict=1)
        wrapped = c.slot_erase(7)  # llama-server takes slot ids modulo the slot count: this is slot 0
        assert wrapped["id_slot"] == 7 and wrapped["n_erased"] > 0
        with pytest.raises(ServerHTTPError) as nf:
            c.request("GET", "/")  # no web UI
        assert nf.value.status == 404
        assert c.tokenize("hello")[0] == 1  # BOS first
        with pytest.raises(ServerLimitError, match="request limit reached: 6 requests"):
            c.health()
        assert srv.alive


def test_a_crash_while_restoring_is_reported_with_the_assert(builds: dict[str, InstalledBuild]) -> None:
    """A slot file cut 100 bytes short makes the server abort in llama_state_seq_load_file."""
    srv = ServerProcess(model_path("llama"), build="b11434", n_ctx=256)
    try:
        c = srv.client()
        c.complete(PROMPT * 3, n_predict=2, temperature=0)
        c.slot_save(0, "full.bin")
        data = Path(c.slot_path("full.bin")).read_bytes()
        Path(c.slot_path("cut.bin")).write_bytes(data[:-100])
        with pytest.raises(ServerDied) as died:
            c.slot_restore(0, "cut.bin")
        assert died.value.aborted == "SIGABRT"
        assert "GGML_ASSERT(nread <= state_size) failed" in str(died.value)
        assert not srv.alive and srv.exit_reason == "SIGABRT"
        with pytest.raises(ServerDied):
            c.health()
    finally:
        srv.close()


def test_a_given_slot_dir_is_used_and_kept(builds: dict[str, InstalledBuild], tmp_path: Path) -> None:
    slots = tmp_path / "slots"
    with ServerProcess(model_path("mamba"), build="0c1e5709", slot_dir=slots, n_ctx=128) as srv:
        assert srv.slot_dir == str(slots)
        user = ServerClient(srv.url, slots, max_requests=3, timeout_s=10)  # as for a server the user runs
        user.complete([1, 5, 9, 14], n_predict=1, temperature=0)
        user.slot_save(0, "m.bin")
    assert (slots / "m.bin").is_file()


def test_startup_failures_are_one_line(builds: dict[str, InstalledBuild], tmp_path: Path) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\xff" * 64)
    t0 = time.monotonic()
    with pytest.raises(ServerSetupError, match=r"llama-server exited \(exit 1\) while starting: ") as e:
        ServerProcess(junk, build="b11434", timeout_s=30)
    assert time.monotonic() - t0 < 30 and "\n" not in str(e.value)
    with pytest.raises(ServerSetupError, match="no such model file"):
        ServerProcess(tmp_path / "none.gguf", build="b11434")
    with pytest.raises(ServerSetupError, match="not an executable llama-server"):
        ServerProcess(model_path("llama"), binary=junk)
    with pytest.raises(ServerSetupError, match="unknown llama.cpp build"):
        ServerProcess(model_path("llama"), build="nope")


def test_a_server_binary_path_and_its_flags(builds: dict[str, InstalledBuild]) -> None:
    binary = builds["b11434"].server
    assert server_flags(binary) == {"--no-webui", "--offline"}
    with ServerProcess(model_path("llama"), binary=binary, n_ctx=256, args=["--no-slots"]) as srv:
        assert srv.build is None and srv.binary == str(binary)
        with pytest.raises(ServerHTTPError) as e:
            srv.client().slots()
        assert e.value.status == 501


def test_requests_are_bounded_in_time() -> None:
    """A server that accepts the connection and never answers: the client gives up at its timeout."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.append(lsock.accept()[0]), daemon=True).start()
    c = ServerClient(f"127.0.0.1:{lsock.getsockname()[1]}", timeout_s=0.5)
    t0 = time.monotonic()
    with pytest.raises(ServerError, match="no answer within 0.5 s"):
        c.health()
    assert time.monotonic() - t0 < 3
    for s in held:
        s.close()
    lsock.close()
    with pytest.raises(ServerError, match="slot folder is not known"):
        c.slot_path("x.bin")
    with pytest.raises(ServerError, match="not an http:// server address"):
        ServerClient("ftp://example.invalid/")
