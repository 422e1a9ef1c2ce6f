"""What belongs to the setup is never charged to the file (#31 items 4, 5, 6, 7, 9): a model cut under a
running engine, a llama-server set up otherwise than the file needs, parameters no engine should start
with, a model the file does not fit and a ``--next-token`` outside the vocabulary end in one line and
exit 2 (or, for the server's settings, the verdict ``incompatible`` naming them), never ``damaged``.
Every engine here is real: the pinned builds' libllama child and llama-server."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvharness.fixtures import MODELS, model_path
from kvharness.states import PROMPT
from kvscope.core.cli.main import main
from kvscope.core.engine.builds import InstalledBuild
from kvscope.core.engine.server import ServerProcess
from kvscope.core.verify.context_plan import cpu_limit
from kvscope.core.verify.repair import RepairError, repair
from kvscope.core.verify.run import Verifier, VerifyError

SEQ = MODELS / "llama-f16-fa0-unified0-seq1.seqstate"
FAST_S = 5.0  # a refusal before any engine starts takes well under this (an engine start alone takes ~1 s)


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(["verify", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _one_line(err: str) -> str:
    assert err.count("\n") == 1 and err.startswith("kvscope: ") and "Traceback" not in err, err
    return err


def _no_engine_left() -> None:
    """No llama-server or libllama child this test started is left (the janitor is no engine)."""
    assert not _engine_pids(), [_cmdline(pid) for pid in _engine_pids()]


def _cmdline(pid: int) -> str:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as fh:
        return fh.read().replace(b"\0", b" ").decode("utf-8", "replace")
    return f"pid {pid} (gone)"


@pytest.fixture(autouse=True)
def _engines_before() -> Iterator[None]:
    """The engines this process already had when the test began (another module's, kept for its tests) are
    neither counted as left by this test nor signalled by it."""
    _BEFORE.clear()
    _BEFORE.update(_all_engine_pids())
    yield
    _BEFORE.clear()


_BEFORE: set[int] = set()


# --- item 6: parameters validated and bounded before any engine starts --------------------------------
def test_a_context_too_large_for_the_memory_is_refused_before_it_allocates(
        builds: dict[str, InstalledBuild], capsys: pytest.CaptureFixture[str]) -> None:
    t0 = time.monotonic()
    rc, out, err = _run(capsys, str(SEQ), "--model", str(model_path("llama")), "--ctx-param", "n_ctx=2147483648")
    took = time.monotonic() - t0
    assert rc == 2 and not out and took < FAST_S, (rc, err, took)
    assert "n_ctx=2147483648" in _one_line(err) and "memory available" in err and "loading" not in err
    _no_engine_left()


@pytest.mark.parametrize(("pair", "words"), [
    ("n_threads=100000", "CPU"),
    ("n_threads=0", "positive integer"),
    ("n_threads=-4", "positive integer"),
    ("n_ctx=" + "9" * 100_000, "expected an integer"),
    ("n_ctx=4294967296", "below 2**32"),
    ("n_ctx=nan", "expected an integer"),
    ("n_batch=inf", "expected an integer"),
    ("n_ubatch=1.5", "expected an integer"),
    ("n_seq_max=100000", "LLAMA_MAX_SEQ"),
    ("kv_unified=maybe", "true or false"),
    ("flash_attn=2", "true, false or auto"),
    ("type_k=q9_9", "not a KV cache type"),
    ("n_ctx=16", "too small for the file"),
    ("env.BAD NAME=1", "environment variable name"),
    ("env.X=" + "y" * 5000, "at most"),
])
def test_a_bad_ctx_param_is_one_line_and_exit_2_before_any_engine(
        pair: str, words: str, builds: dict[str, InstalledBuild], capsys: pytest.CaptureFixture[str]) -> None:
    t0 = time.monotonic()
    rc, out, err = _run(capsys, str(SEQ), "--model", str(model_path("llama")), "--ctx-param", pair)
    assert rc == 2 and not out and time.monotonic() - t0 < FAST_S, (pair, rc, err)
    assert words in _one_line(err) and len(err) < 600, (pair, err)
    _no_engine_left()


def test_the_cpu_bound_is_this_machines() -> None:
    assert cpu_limit() == min(512, os.cpu_count() or 1)


def test_n_threads_within_the_cpus_still_runs(builds: dict[str, InstalledBuild],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _run(capsys, str(SEQ), "--model", str(model_path("llama")), "--ctx-param",
                        f"n_threads={cpu_limit()}", "--no-calibrate", "--json")
    assert rc == 0, err
    assert json.loads(out)["context"]["ctx"]["n_threads"] == cpu_limit()


def test_a_batch_below_the_default_micro_batch_takes_the_micro_batch_down(
        builds: dict[str, InstalledBuild], capsys: pytest.CaptureFixture[str]) -> None:
    """llama.cpp's own rule (n_ubatch at most n_batch): n_batch=64 alone is sane, not 'n_ubatch exceeds n_batch'
    (found by the ctx_params fuzz family)."""
    rc, out, err = _run(capsys, str(SEQ), "--model", str(model_path("llama")), "--ctx-param", "n_batch=64",
                        "--no-calibrate", "--json")
    assert rc == 0, err
    ctx = json.loads(out)["context"]["ctx"]
    assert (ctx["n_batch"], ctx["n_ubatch"]) == (64, 64)


def test_a_timeout_that_is_no_deadline_is_refused(builds: dict[str, InstalledBuild]) -> None:
    for bad in (float("nan"), float("inf"), -1.0, 0.0, 1e300):
        with pytest.raises(VerifyError, match="--timeout"):
            Verifier(SEQ, model_path("llama"), timeout_s=bad)


def test_an_engine_stopped_by_the_timeout_while_starting_says_so(builds: dict[str, InstalledBuild]) -> None:
    with pytest.raises(VerifyError, match=r"did not finish loading the model .* within the timeout of 1e-06 s"):
        Verifier(SEQ, model_path("llama"), timeout_s=1e-6).run()
    _no_engine_left()


# --- item 9: --next-token outside the vocabulary -----------------------------------------------------
@pytest.mark.parametrize("token", ["1000000", "-1", "2147483648"])
def test_a_next_token_outside_the_vocabulary_is_refused(token: str, builds: dict[str, InstalledBuild],
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    t0 = time.monotonic()
    rc, out, err = _run(capsys, str(SEQ), "--model", str(model_path("llama")), "--next-token", token)
    assert rc == 2 and not out and time.monotonic() - t0 < FAST_S, (rc, out, err)
    assert "--next-token" in _one_line(err)


def test_the_last_id_of_the_vocabulary_is_a_next_token(builds: dict[str, InstalledBuild]) -> None:
    from kvharness.fixtures import profile

    last = profile("llama").n_vocab - 1
    r = Verifier(SEQ, model_path("llama"), next_token=last, calibrate=False, steps=1).run()
    assert r.verdict == "ok", r.reasons
    assert r.next_token is not None and r.next_token.token == last and not r.next_token.skipped


# --- item 7: a model the file does not fit --------------------------------------------------------------
def test_verify_refuses_a_model_the_file_does_not_fit(builds: dict[str, InstalledBuild],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    wrong = str(model_path("gemma2"))
    rc, out, err = _run(capsys, str(SEQ), "--model", wrong)
    assert rc == 2 and not out, (rc, out, err)
    assert "does not fit" in _one_line(err) and "model mismatch" in err
    assert main(["inspect", str(SEQ), "--model", wrong]) != 0  # inspect says the same of it
    assert "model mismatch" in capsys.readouterr().out.lower()


def test_repair_refuses_a_model_the_file_does_not_fit(builds: dict[str, InstalledBuild], tmp_path: Path) -> None:
    out = tmp_path / "repaired.seqstate"
    t0 = time.monotonic()
    with pytest.raises(RepairError, match="does not fit"):
        repair(SEQ, model_path("gemma2"), out)
    assert not out.exists() and time.monotonic() - t0 < FAST_S


# --- item 4: the model file cut under a running engine ----------------------------------------------
def _cut_at_prefill(model: Path) -> Callable[[int, int, str], None]:
    """A progress callback that cuts the model to half its size when the re-prefill starts (the engine holds
    it mapped: the next weight it reads is past the end, SIGBUS)."""
    def progress(_done: int, _total: int, label: str) -> None:
        if label.startswith("re-prefilling") and model.stat().st_size > 4096:
            os.truncate(model, model.stat().st_size // 2)
    return progress


@pytest.mark.parametrize("engine", ["llama.cpp", "server"])
def test_a_model_cut_under_the_engine_is_a_setup_error(engine: str, builds: dict[str, InstalledBuild],
                                                       tmp_path: Path) -> None:
    model = tmp_path / "tiny-llama.gguf"
    shutil.copyfile(model_path("llama"), model)
    v = Verifier(SEQ if engine == "llama.cpp" else _server_slot(tmp_path), model, engine=engine,
                 progress=_cut_at_prefill(model), timeout_s=60)
    with pytest.raises(VerifyError) as e:
        v.run()
    msg = e.value.message
    assert "changed while verify ran" in msg and "its size went from" in msg, msg
    assert "\n" not in msg
    _no_engine_left()


def _engine_pids() -> list[int]:
    """The libllama children and llama-servers this process started since the test began."""
    return [pid for pid in _all_engine_pids() if pid not in _BEFORE]


def _all_engine_pids() -> list[int]:
    """This process's libllama children and llama-servers."""
    me, out = os.getpid(), []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read()
        except (OSError, ValueError):
            continue
        if ppid == me and (b"llama-server" in cmd or b"kvscope.core.engine.worker" in cmd):
            out.append(int(pid))
    return out


def _segfault_at_prefill(_done: int, _total: int, label: str) -> None:
    """A progress callback that makes the engine die of SIGSEGV inside the re-prefill's first call (before any
    restore). The engine is stopped at once (alive: verify sends it the call instead of starting another), and
    SIGSEGV is delivered when it is let go half a second later, while that call waits for its answer; a SIGSEGV
    sent straight away raced verify's is-it-alive check, which restarts an engine that is already dead."""
    if label.startswith("re-prefilling"):
        pids = _engine_pids()
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
            os.kill(pid, signal.SIGSEGV)  # pending while stopped

        def let_go() -> None:
            time.sleep(0.5)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

        threading.Thread(target=let_go, daemon=True).start()


@pytest.mark.parametrize("engine", ["llama.cpp", "server"])
def test_an_engine_that_dies_before_reading_the_file_is_a_setup_error(
        engine: str, builds: dict[str, InstalledBuild], tmp_path: Path) -> None:
    path = SEQ if engine == "llama.cpp" else _server_slot(tmp_path)
    v = Verifier(path, model_path("llama"), engine=engine, progress=_segfault_at_prefill, timeout_s=60)
    with pytest.raises(VerifyError) as e:
        v.run()
    msg = e.value.message
    assert msg.startswith("the engine died before reading the file: ") and "SIGSEGV" in msg, msg
    assert "\n" not in msg
    _no_engine_left()


def _server_slot(tmp_path: Path) -> Path:
    """A slot file llama-server (the pinned 0c1e5709, one slot) saved of PROMPT."""
    out = tmp_path / "slot0.bin"
    if not out.exists():
        with ServerProcess(model_path("llama"), build="0c1e5709", n_ctx=512,
                           args=["-fa", "off", "--no-kv-unified"]) as srv:
            c = srv.client()
            c.complete(PROMPT, n_predict=0)
            c.slot_save(0, "slot.bin")
            shutil.copyfile(Path(srv.slot_dir) / "slot.bin", out)
    return out


# --- item 5: a user's llama-server set up otherwise than the file needs -----------------------------
@pytest.fixture(scope="module")
def slot(builds: dict[str, InstalledBuild], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _server_slot(tmp_path_factory.mktemp("slot"))


@pytest.fixture(scope="module")
def two_streams(builds: dict[str, InstalledBuild]) -> Iterator[ServerProcess]:
    """-np 2 without --kv-unified: a KV stream per slot, where the slot file holds one."""
    with ServerProcess(model_path("llama"), build="0c1e5709", n_ctx=1024, n_parallel=2,
                       args=["-fa", "off", "--no-kv-unified"]) as srv:
        yield srv


@pytest.fixture(scope="module")
def flash(builds: dict[str, InstalledBuild]) -> Iterator[ServerProcess]:
    """-fa on: V untransposed, where the slot file (saved with -fa off) holds it transposed."""
    with ServerProcess(model_path("llama"), build="0c1e5709", n_ctx=512, args=["-fa", "on", "--no-kv-unified"]) as srv:
        yield srv


def test_the_slot_restores_in_a_server_set_up_like_it(slot: Path, builds: dict[str, InstalledBuild]) -> None:
    with ServerProcess(model_path("llama"), build="0c1e5709", n_ctx=512, args=["-fa", "off", "--no-kv-unified"]) as s:
        r = Verifier(slot, model_path("llama"), engine="server", server_url=s.url, slot_dir=s.slot_dir).run()
    assert r.verdict == "ok", r.reasons
    assert not r.setup_mismatch


@pytest.mark.parametrize(("server", "setting"), [("two_streams", "n_stream"), ("flash", "v_trans")])
def test_a_server_set_up_otherwise_is_incompatible_naming_the_setting(
        server: str, setting: str, slot: Path, request: pytest.FixtureRequest,
        capsys: pytest.CaptureFixture[str]) -> None:
    srv: ServerProcess = request.getfixturevalue(server)
    rc, out, err = _run(capsys, str(slot), "--model", str(model_path("llama")), "--engine", "server", "--server",
                        srv.url, "--slot-dir", srv.slot_dir, "--json")
    d = json.loads(out)
    assert rc == 1 and d["verdict"] == "incompatible", (d["verdict"], d["reasons"], err)
    assert d["restore"]["ok"] is False
    assert any(m.startswith(setting) for m in d["setup_mismatch"]), d["setup_mismatch"]
    assert any(x.startswith(setting) for x in d["reasons"]), d["reasons"]
    assert not [n for n in os.listdir(srv.slot_dir) if n.startswith("kvscope-verify-")]
