"""A lab scenario's live context in a real engine: libllama in a child process, or a llama-server.

The engine builds the live context the way the scenario's ``context.json`` says llama.cpp did:
a fresh context with the same parameters, then one decode per sequence of its prompt tokens, in
sequence order. :class:`LlamaLive` keeps that state (``llama_state_get_data``) and puts the
context back to it before every case (``llama_state_set_data``); the next-token logits of each
sequence in it are the baseline the cases' probes compare with. It also writes the clean input
of every kind from the live context (the scenario's input when the build writes another layout
than the scenario's files). :class:`ServerLive` does the same with llama-server slots: the live
sequences are prompt-only completions, saved as slot files and restored before every case. Both drive
the engine through one :class:`~kvscope.core.engine.session.EngineSession` (verify's and repair's too).

:func:`core_scenario` builds the torch :class:`~kvscope.core.lab.scenario.Scenario` that matches
the engine's live context byte for byte (for ``--engine both`` and the differential fuzz).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from kvscope.core.engine.builds import BuildError, by_name
from kvscope.core.engine.janitor import janitor
from kvscope.core.engine.session import (
    CtxParams,
    LlamaSession,
    Outcome,
    Prefill,
    SaveRefused,
    ServerClient,
    ServerError,
    ServerProcess,
    ServerSession,
    server_args,
)
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
    """The live context in a libllama session; restarted (and rebuilt) after a crash."""

    def __init__(self, spec: LiveSpec, *, build: str | None = None, lib_path: str | None = None,
                 timeout_s: float = 120.0, baseline: bool = True) -> None:
        self.spec, self.build, self.lib_path, self.timeout_s = spec, build, lib_path, timeout_s
        self._session: LlamaSession | None = None
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
    def session(self) -> LlamaSession:
        """The engine session, restarted (and the live context rebuilt) when its child died."""
        if self._session is None or not self._session.alive:
            self.restarts += 1
            self._start()
        assert self._session is not None
        return self._session

    def _start(self) -> None:
        if self._session is not None:
            self._session.close()
        s = self._session = LlamaSession(self.spec.model, self.spec.ctx, build=self.build, lib_path=self.lib_path,
                                         timeout_s=self.timeout_s, scratch=self._tmp)
        self.info = s.info()
        for q in sorted(self.spec.seqs):
            o = s.prefill(q, self.spec.seqs[q]).outcome
            if o.rc != 0:
                why = (f"its {len(self.spec.seqs[q])} tokens do not fit the context (llama_decode found no free "
                       f"cells; n_ctx {self.spec.ctx.n_ctx}, n_seq_max {self.spec.ctx.n_seq_max})"
                       if o.ok and o.rc == 1 else f"{o.summary()} (llama_decode returned {o.rc})")
                raise EngineLabError(f"llama.cpp could not decode sequence {q}'s prompt: {why}")
        self.seq_blobs = {q: s.save("seq_blob", q) for q in sorted(self.spec.seqs)}
        blob = s.save("context_blob")
        if self.live_blob and blob != self.live_blob:
            self.notes.append("the rebuilt live context differs from the first one")
        self.live_blob = blob
        if self._want_baseline and not self.baseline:
            for q in sorted(self.spec.seqs):
                self.baseline[q] = _decode_next(s, q, self.spec.next_token)
                self.reset()
                self.variation[q] = self._tail_logits(s, q, self.spec.seqs[q])
                self.reset()
            t, toks = self.spec.target, self.spec.target_tokens
            if toks and t not in self.spec.seqs:  # an empty target: a prefill of its tokens beside the live ones
                if _decoded(s.prefill(t, toks)):
                    self.baseline[t] = _decode_next(s, t, self.spec.next_token)
                    self.reset()
                    self.variation[t] = self._tail_logits(s, t, toks) if _decoded(s.prefill(t, toks)) else None
                self.reset()

    def _tail_logits(self, s: LlamaSession, seq: int, toks: list[int]) -> F32A | None:
        """The engine's own variation: ``seq``'s next-token logits after its last tokens (it holds ``toks``) are
        decoded again one at a time (verify's ``tail`` calibration schedule; a memory that cannot drop a suffix
        re-decodes all)."""
        if not _decoded(s.prefill(seq, toks, TAIL_SCHEDULE.chunks(len(toks)))):
            return None
        return _decode_next(s, seq, self.spec.next_token)

    def reset(self) -> None:
        """Back to the live context (``llama_state_set_data`` of the live state)."""
        o = self.session.restore("context_blob", 0, data=self.live_blob)
        if not o.ok or o.value != len(self.live_blob):
            raise EngineLabError(f"llama.cpp does not restore its own live context: {o.summary()} {o.log[-1:]}")

    def clean_input(self, kind: str, flags: int = 0) -> bytes:
        """The target's clean state as the API of ``kind`` writes it (a blob with ``flags``), from the live
        context."""
        s, t = self.session, self.spec.target
        self.reset()
        if kind == "seq_blob":
            return s.save("seq_blob", t, flags=flags)
        if kind == "context_blob":
            return self.live_blob
        try:
            if kind == "seq_file":
                return s.save("seq_file", t, tokens=self.spec.seqs.get(t, []))
            return s.save("session_file", tokens=self.spec.all_tokens)
        except SaveRefused:
            raise EngineLabError(f"llama.cpp did not write the clean {kind}") from None

    def restore(self, kind: str, data: bytes, capacity: int, flags: int = 0) -> Outcome:
        """Restore ``data`` into the target with the API of ``kind`` (a blob with ``flags``)."""
        return self.session.restore(kind, self.spec.target, data=data, n_token_capacity=capacity,
                                    flags=flags if kind == "seq_blob" else 0)

    def probe(self, seqs: list[int]) -> dict[int, float]:
        """Max |Δ| of each sequence's next-token logits against the live baseline; the state is put back."""
        return {s: logits_diff(v, self.baseline.get(s)) for s, v in self.probe_logits(seqs).items()}

    def probe_logits(self, seqs: list[int]) -> dict[int, F32A | None]:
        """Each sequence's next-token logits over the current state (None: the decode failed or killed the
        engine; the sequences after a crash are not probed); the state is put back after each."""
        e = self.session
        post = e.save("context_blob")
        out: dict[int, F32A | None] = {}
        for s in seqs:
            out[s] = _decode_next(e, s, self.spec.next_token)
            if not e.alive:
                out[s] = None
                break
            e.restore("context_blob", 0, data=post)
        return out

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None
        shutil.rmtree(self._tmp, ignore_errors=True)
        self._scratch.close()
        janitor().forget("dir", self._tmp)


def _decoded(done: Prefill) -> bool:
    return done.outcome.ok and done.ok


def _decode_next(s: LlamaSession, seq: int, token: int) -> F32A | None:
    if not s.alive:
        return None
    o = s.logits(seq, token)
    return o.value if o.ok and o.rc == 0 else None


# ---------------------------------------------------------------------------------------------
# llama-server


def server_ctx_args(ctx: CtxParams) -> list[str]:
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
        self.session: ServerSession | None = None
        self.clean_slots: dict[int, bytes] = {}
        try:
            self._start()
        except BaseException:  # what it saved in the slot folder goes (nothing else would close this)
            self.close()
            raise

    def _start(self) -> None:
        if self.session is None:
            if self.url is not None and self.slot_dir is None:
                raise EngineLabError("--server needs the server's --slot-save-path folder as --slot-dir")
            try:
                self.session = ServerSession(self.spec.model, self.spec.ctx, url=self.url, slot_dir=self.slot_dir,
                                             binary=self.binary, build=self.build, timeout_s=self.timeout_s,
                                             max_requests=self.max_requests, prefix=f"kvscope-lab-{os.getpid()}-")
            except ServerError as e:
                if self.url is not None:  # the user's address: the client's own error
                    raise
                raise EngineLabError(str(e)) from None
        else:
            try:
                self.session.restart()
            except ServerError as e:
                raise EngineLabError(str(e)) from None
        s = self.session
        for q in sorted(self.spec.seqs):
            s.clear(q)
            s.prefill(q, self.spec.seqs[q])
            self.clean_slots[q] = s.save("seq_file", q)

    @property
    def _live(self) -> ServerSession:
        assert self.session is not None
        return self.session

    @property
    def _process(self) -> ServerProcess | None:
        return self._live.process

    @property
    def client(self) -> ServerClient:
        return self._live.client

    @property
    def dir(self) -> str:
        return self._live.slot_dir

    @property
    def alive(self) -> bool:
        return self._live.alive

    def restart(self) -> None:
        if self.url is not None:
            raise EngineLabError(f"the llama-server at {self.url} died; kvscope cannot restart a server it did not "
                                 "start")
        self.restarts += 1
        self._start()

    def restore(self, slot: int, data: bytes) -> dict[str, Any]:
        """``data`` put in the slot folder and restored into ``slot``: the server's answer."""
        doc: dict[str, Any] = self._live.restore("seq_file", slot, data=data).value
        return doc

    def clear(self, slot: int) -> None:
        self._live.clear(slot)

    def complete(self, prompt: list[int], n_predict: int, slot: int, **request: Any) -> dict[str, Any]:
        """A completion of ``n_predict`` tokens in ``slot`` (the poisoned-slot check: only a server generates)."""
        return self._live.client.complete(prompt, n_predict, slot, **request)

    def save(self, slot: int) -> bytes:
        return self._live.save("seq_file", slot)

    def reset(self) -> None:
        """Every live slot back to its clean state (its own slot file)."""
        if not self.alive:
            self.restart()
            return
        for s, data in self.clean_slots.items():
            self._live.restore("seq_file", s, data=data)

    def close(self) -> None:
        if self.session is not None:
            self.session.close()


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
