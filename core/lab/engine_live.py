"""A lab scenario's live context in a real engine: libllama in a child process, or a llama-server.

The engine builds the live context the way the scenario's ``context.json`` says llama.cpp did:
a fresh context with the same parameters, then one decode per sequence of its prompt tokens, in
sequence order. :class:`LlamaLive` keeps that state (``llama_state_get_data``) and puts the
context back to it before every case (``llama_state_set_data``); the next-token logits of each
sequence in it are the baseline the cases' probes compare with. It also writes the clean input
of every kind from the live context (the scenario's input when the build writes another layout
than the scenario's files). :class:`ServerLive` does the same with llama-server slots: the live
sequences are prompt-only completions, saved as slot files and restored before every case.

:func:`core_scenario` builds the torch :class:`~kvscope.core.lab.scenario.Scenario` that matches
the engine's live context byte for byte (for ``--engine both`` and the differential fuzz).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from kvscope.core.engine.builds import BuildError, by_name
from kvscope.core.engine.janitor import janitor
from kvscope.core.engine.llamacpp import CtxParams, LlamaProcess, Outcome
from kvscope.core.engine.server import ServerClient, ServerError, ServerProcess
from kvscope.core.errors import SetupError
from kvscope.core.fsutil import temporary_folder
from kvscope.core.lab.scenario import RestoreInput, Scenario, ScenarioError, create_scenario
from kvscope.core.memory import ContextParams
from kvscope.core.model.profile import ModelProfile
from kvscope.core.verify.calibrate import SCHEDULES

F32A = npt.NDArray[np.float32]
TAIL_SCHEDULE = next(s for s in SCHEDULES if s.name == "tail")


class EngineLabError(SetupError, ValueError):
    """The lab cannot run this scenario in the engine (one line)."""


@dataclass(frozen=True)
class LiveSpec:
    """How an engine builds the live context: model, parameters, the tokens of each sequence."""

    model: str
    ctx: CtxParams
    seqs: dict[int, list[int]]
    target: int
    kind: str  # the kind of the input restored into the target
    next_token: int
    name: str = ""
    n_token_capacity: int | None = None
    flags: int = 0  # the state flags of a per-sequence blob input (PARTIAL_ONLY)
    target_tokens: list[int] | None = None  # an empty target's tokens: its baseline is a prefill of them

    @property
    def all_tokens(self) -> list[int]:
        """The session file's tokens: every sequence's prompt, in sequence order (as the lab's files hold)."""
        return [t for s in sorted(self.seqs) for t in self.seqs[s]]


def ctx_params_from(p: ContextParams, n_threads: int = 2, env: tuple[tuple[str, str], ...] = ()) -> CtxParams:
    """The engine's context parameters for the core's :class:`ContextParams`."""
    return CtxParams(n_ctx=p.n_ctx, n_batch=p.n_batch, n_ubatch=p.n_ubatch, n_seq_max=p.n_seq_max,
                     kv_unified=p.kv_unified, flash_attn=p.flash_attn, type_k=p.type_k, type_v=p.type_v,
                     swa_full=p.swa_full, n_threads=n_threads, env=env)


def spec_from_scenario(sc: Scenario, model: str | None = None) -> LiveSpec:
    """The live context of a lab scenario folder, from its ``context.json`` (prompts, next token, threads)."""
    if sc.folder is None or not (sc.folder / "context.json").is_file():
        raise EngineLabError("the engine builds the live context from a scenario's context.json (its prompt "
                             "tokens): give a lab scenario folder")
    cj = json.loads((sc.folder / "context.json").read_text())
    entries = cj.get("sequences") or {}
    seqs = {int(s): [int(t) for t in v["tokens"]] for s, v in entries.items() if v.get("live", True)}
    empty = entries.get(str(sc.target)) if str(sc.target) not in {str(s) for s in seqs} else None
    target_tokens = [int(t) for t in empty["tokens"]] if isinstance(empty, dict) and empty.get("tokens") else None
    if not seqs:
        raise EngineLabError(f"{sc.folder / 'context.json'} lists no sequence tokens")
    nt = (cj.get("next_token") or {}).get("token")
    threads = int((cj.get("context_params") or {}).get("n_threads") or 2)
    path = model or sc.profile.path
    return LiveSpec(str(path), ctx_params_from(sc.params, threads), seqs, sc.target, sc.restore.kind,
                    int(nt) if nt is not None else seqs[min(seqs)][-1], sc.name, sc.n_token_capacity,
                    sc.restore.flags, target_tokens)


def logits_diff(a: F32A | None, b: F32A | None) -> float:
    """Max |a - b| of two logit vectors (``inf`` when one is missing or ``a`` holds a non-finite value)."""
    if a is None or b is None:
        return float("inf")
    with np.errstate(all="ignore"):
        if not np.isfinite(a).all():
            return float("inf")
        return float(np.max(np.abs(a.astype(np.float64) - b)))


# ---------------------------------------------------------------------------------------------
# libllama


class LlamaLive:
    """The live context in a libllama child; restarted (and rebuilt) after a crash."""

    def __init__(self, spec: LiveSpec, *, build: str | None = None, lib_path: str | None = None,
                 timeout_s: float = 120.0, baseline: bool = True) -> None:
        self.spec, self.build, self.lib_path, self.timeout_s = spec, build, lib_path, timeout_s
        self._proc: LlamaProcess | None = None
        self.info: dict[str, Any] = {}
        self.notes: list[str] = []
        self.restarts = 0
        self.live_blob = b""
        self.seq_blobs: dict[int, bytes] = {}  # each live sequence's llama_state_seq_get_data
        self.baseline: dict[int, F32A | None] = {}  # each sequence's next-token logits after the live prefill
        self.variation: dict[int, F32A | None] = {}  # ... after the same tokens fed under verify's tail schedule
        # removed on SIGTERM/SIGINT/SIGHUP too (fsutil), and by the janitor should kvscope be killed outright
        self._scratch = contextlib.ExitStack()
        self._tmp = self._scratch.enter_context(temporary_folder(tempfile.gettempdir(), "lab"))
        os.chmod(self._tmp, 0o700)  # copies of the states: the user's alone
        janitor().watch_dir(self._tmp)
        self._want_baseline = baseline
        try:
            self._start()
        except BaseException:  # the engine did not start: nothing would close this
            self.close()
            raise

    @property
    def writes(self) -> str | None:
        """The layout generation the engine's build writes (None for an unidentified library)."""
        name = self.info.get("writes")
        if name:
            return str(name)
        if self.build:
            try:
                return by_name(self.build).writes
            except BuildError:
                return None
        return None

    @property
    def proc(self) -> LlamaProcess:
        if self._proc is None or not self._proc.alive:
            self.restarts += 1
            self._start()
        assert self._proc is not None
        return self._proc

    def _start(self) -> None:
        if self._proc is not None:
            self._proc.close()
        p = self._proc = LlamaProcess(self.spec.model, self.spec.ctx, build=self.build, lib_path=self.lib_path,
                                      timeout_s=self.timeout_s)
        self.info = p.info()
        for s in sorted(self.spec.seqs):
            o = p.decode(s, self.spec.seqs[s], pos0=0)
            if o.rc != 0:
                why = (f"its {len(self.spec.seqs[s])} tokens do not fit the context (llama_decode found no free "
                       f"cells; n_ctx {self.spec.ctx.n_ctx}, n_seq_max {self.spec.ctx.n_seq_max})"
                       if o.ok and o.rc == 1 else f"{o.summary()} (llama_decode returned {o.rc})")
                raise EngineLabError(f"llama.cpp could not decode sequence {s}'s prompt: {why}")
        self.seq_blobs = {s: p.state_seq_get_data(s) for s in sorted(self.spec.seqs)}
        blob = p.state_get_data()
        if self.live_blob and blob != self.live_blob:
            self.notes.append("the rebuilt live context differs from the first one")
        self.live_blob = blob
        if self._want_baseline and not self.baseline:
            for s in sorted(self.spec.seqs):
                self.baseline[s] = _decode_next(p, s, self.spec.next_token)
                self.reset()
                self.variation[s] = self._tail_logits(p, s, self.spec.seqs[s])
                self.reset()
            t, toks = self.spec.target, self.spec.target_tokens
            if toks and t not in self.spec.seqs:  # an empty target: a prefill of its tokens beside the live ones
                o = p.decode(t, toks, pos0=0)
                if o.ok and o.rc == 0:
                    self.baseline[t] = _decode_next(p, t, self.spec.next_token)
                    self.reset()
                    o = p.decode(t, toks, pos0=0)
                    self.variation[t] = self._tail_logits(p, t, toks) if o.ok and o.rc == 0 else None
                self.reset()

    def _tail_logits(self, p: LlamaProcess, seq: int, toks: list[int]) -> F32A | None:
        """The engine's own variation: ``seq``'s next-token logits after its last tokens (it holds ``toks``) are
        decoded again one at a time (verify's ``tail`` calibration schedule; a memory that cannot drop a suffix
        re-decodes all)."""
        pieces = TAIL_SCHEDULE.chunks(len(toks))
        if pieces[0][0] and not p.seq_rm(seq, pieces[0][0], -1):
            p.seq_rm(seq, -1, -1)
            pieces = [(0, pieces[0][0]), *pieces]
        for a, b in pieces:
            o = p.decode(seq, toks[a:b], pos0=a)
            if not o.ok or o.rc != 0:
                return None
        return _decode_next(p, seq, self.spec.next_token)

    def reset(self) -> None:
        """Back to the live context (``llama_state_set_data`` of the live state)."""
        o = self.proc.state_set_data(self.live_blob)
        if not o.ok or o.value != len(self.live_blob):
            raise EngineLabError(f"llama.cpp does not restore its own live context: {o.summary()} {o.log[-1:]}")

    def clean_input(self, kind: str, flags: int = 0) -> bytes:
        """The target's clean state as the API of ``kind`` writes it (a blob with ``flags``), from the live
        context."""
        p, t = self.proc, self.spec.target
        self.reset()
        if kind == "seq_blob":
            return p.state_seq_get_data(t, flags)
        if kind == "context_blob":
            return self.live_blob
        path = os.path.join(self._tmp, f"clean-{uuid.uuid4().hex[:8]}")
        try:
            if kind == "seq_file":
                ok = p.state_seq_save_file(path, t, self.spec.seqs.get(t, [])).value
            else:
                ok = p.state_save_file(path, self.spec.all_tokens).value
            if not ok:
                raise EngineLabError(f"llama.cpp did not write the clean {kind}")
            return Path(path).read_bytes()
        finally:
            if os.path.exists(path):
                os.unlink(path)

    def restore(self, kind: str, data: bytes, capacity: int, flags: int = 0) -> Outcome:
        """Restore ``data`` into the target with the API of ``kind`` (a blob with ``flags``)."""
        p, t = self.proc, self.spec.target
        if kind == "seq_blob":
            return p.state_seq_set_data(data, t, flags)
        if kind == "context_blob":
            return p.state_set_data(data)
        path = os.path.join(self._tmp, f"case-{uuid.uuid4().hex[:8]}")
        Path(path).write_bytes(data)
        try:
            if kind == "seq_file":
                return p.state_seq_load_file(path, t, capacity)
            return p.state_load_file(path, capacity)
        finally:
            os.unlink(path)

    def probe(self, seqs: list[int]) -> dict[int, float]:
        """Max |Δ| of each sequence's next-token logits against the live baseline; the state is put back."""
        return {s: logits_diff(v, self.baseline.get(s)) for s, v in self.probe_logits(seqs).items()}

    def probe_logits(self, seqs: list[int]) -> dict[int, F32A | None]:
        """Each sequence's next-token logits over the current state (None: the decode failed or killed the
        engine; the sequences after a crash are not probed); the state is put back after each."""
        p = self.proc
        post = p.state_get_data()
        out: dict[int, F32A | None] = {}
        for s in seqs:
            out[s] = _decode_next(p, s, self.spec.next_token)
            if not p.alive:
                out[s] = None
                break
            p.state_set_data(post)
        return out

    def close(self) -> None:
        if self._proc is not None:
            self._proc.close()
            self._proc = None
        shutil.rmtree(self._tmp, ignore_errors=True)
        self._scratch.close()
        janitor().forget("dir", self._tmp)


def _decode_next(p: LlamaProcess, seq: int, token: int) -> F32A | None:
    if not p.alive:
        return None
    o = p.decode(seq, [token])
    return o.value if o.ok and o.rc == 0 else None


# ---------------------------------------------------------------------------------------------
# llama-server


def server_ctx_args(ctx: CtxParams) -> list[str]:
    from kvscope.core.verify.engines import server_args

    return server_args(ctx)


@dataclass
class ServerLive:
    """The live sequences in llama-server slots (one slot per sequence), restored before every case."""

    spec: LiveSpec
    build: str | None = None
    binary: str | None = None
    url: str | None = None
    slot_dir: str | None = None
    timeout_s: float = 60.0
    max_requests: int = 100_000
    notes: list[str] = field(default_factory=list)
    restarts: int = 0

    def __post_init__(self) -> None:
        self._process: ServerProcess | None = None
        self._names: list[str] = []
        self._watched: list[str] = []  # slot folders whose kvscope-lab-PID-* files the janitor deletes if we die
        self.clean_slots: dict[int, bytes] = {}
        try:
            self._start()
        except BaseException:  # what it saved in the slot folder goes (nothing else would close this)
            self.close()
            raise

    def _start(self) -> None:
        ctx = self.spec.ctx
        if self.url is None:
            if self._process is not None:
                self._process.close()
            try:
                self._process = ServerProcess(self.spec.model, build=None if self.binary else self.build,
                                              binary=self.binary, n_parallel=ctx.n_seq_max, n_ctx=ctx.n_ctx,
                                              threads=ctx.n_threads, args=server_ctx_args(ctx), env=dict(ctx.env),
                                              timeout_s=120.0, help_timeout_s=self.timeout_s)
            except ServerError as e:
                raise EngineLabError(str(e)) from None
            self.client = self._process.client(max_requests=self.max_requests, timeout_s=self.timeout_s)
        else:
            if self.slot_dir is None:
                raise EngineLabError("--server needs the server's --slot-save-path folder as --slot-dir")
            self.client = ServerClient(self.url, self.slot_dir, max_requests=self.max_requests,
                                       timeout_s=self.timeout_s)
        self.dir = str(self.client.slot_dir)
        if self.dir not in self._watched:  # a user's server's slot folder: our copies go even on SIGTERM or SIGKILL
            janitor().watch_files(self.dir, self._pattern)
            self._watched.append(self.dir)
        for s in sorted(self.spec.seqs):
            self.client.slot_erase(s)
            self.client.complete(self.spec.seqs[s], n_predict=0, id_slot=s)
            self.clean_slots[s] = self.save(s)

    @property
    def alive(self) -> bool:
        return self._process is None or self._process.alive

    def restart(self) -> None:
        if self.url is not None:
            raise EngineLabError(f"the llama-server at {self.url} died; kvscope cannot restart a server it did not "
                                 "start")
        self.restarts += 1
        self._start()

    @property
    def _pattern(self) -> str:
        return f"kvscope-lab-{os.getpid()}-*.bin"

    def _name(self) -> str:
        name = f"kvscope-lab-{os.getpid()}-{uuid.uuid4().hex[:8]}.bin"
        self._names.append(name)
        return name

    def put(self, data: bytes) -> str:
        name = self._name()
        Path(self.dir, name).write_bytes(data)
        return name

    def save(self, slot: int) -> bytes:
        name = self._name()
        self.client.slot_save(slot, name)
        return Path(self.dir, name).read_bytes()

    def reset(self) -> None:
        """Every live slot back to its clean state (its own slot file)."""
        if not self.alive:
            self.restart()
            return
        for s, data in self.clean_slots.items():
            self.client.slot_restore(s, self.put(data))

    def close(self) -> None:
        for name in self._names:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.dir, name))
        self._names.clear()
        if self._process is not None:
            self._process.close()
            self._process = None
        for folder in self._watched:
            janitor().forget("files", f"{os.path.abspath(folder)}/{self._pattern}")
        self._watched.clear()


# ---------------------------------------------------------------------------------------------
# the matching core scenario


def core_scenario(profile: ModelProfile, params: ContextParams, live_blob: bytes, clean: RestoreInput, target: int,
                  layout: str, name: str = "", n_token_capacity: int | None = None) -> Scenario:
    """The torch scenario whose live context is the engine's (``live_blob``, restored whole) in ``layout``."""
    try:
        sc = create_scenario(profile, params, clean, target, live_state=RestoreInput(live_blob, "context_blob",
                                                                                     "engine live context"),
                             layout=layout, name=name)
    except (ScenarioError, ValueError) as e:
        raise EngineLabError(f"the memory core cannot hold this context in layout {layout}: {e}") from None
    if n_token_capacity is not None:
        sc = replace(sc, n_token_capacity=n_token_capacity)
    return sc
