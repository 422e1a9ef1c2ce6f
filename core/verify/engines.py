"""The engines ``kvscope verify`` runs a state file in, behind one small interface.

* :class:`LlamaCppEngine`: libllama in a child process (:class:`~kvscope.core.engine.session.LlamaSession`);
  a crash during the restore is an outcome, and the prefill then runs in a new child.
* :class:`ServerEngine`: a llama-server over HTTP, one kvscope starts (from a build or a binary) or
  one the user runs (its URL and ``--slot-save-path`` folder): the file is restored as a slot,
  the prefill is a prompt-only completion in an erased slot saved to the slot folder, and the
  next token's distribution is the server's top-K log-probabilities.
* :class:`TorchEngine`: the embedded memory core; it restores (llama.cpp's checks, the
  ``contained`` policy) but has no forward pass, so nothing is re-prefilled.

Every engine answers :meth:`restore` with a :class:`RestoreReport`, :meth:`next_logits` with a
:class:`Logits` (or None), and :meth:`prefill` with the bytes of the fresh state.
"""

from __future__ import annotations

import errno
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from kvscope.core.engine.choices import VERIFY_ENGINES
from kvscope.core.engine.session import (
    CtxParams,
    EngineDied,
    EngineError,
    EngineSetupError,
    LlamaSession,
    Outcome,
    ServerClient,
    ServerDied,
    ServerError,
    ServerHTTPError,
    ServerProcess,
    ServerSession,
    restored,
    short_line,
)
from kvscope.core.errors import InputError, SetupError
from kvscope.core.model.profile import ModelProfile
from kvscope.core.reader.records import ParseResult
from kvscope.core.reader.state_kinds import PER_SEQUENCE_KINDS
from kvscope.core.verify.context_plan import ContextPlan
from kvscope.core.verify.faults import abort_fault, half_restored_fault
from kvscope.core.verify.file_snapshot import copy_sparse, kind_of, open_regular
from kvscope.core.verify.prefill import WHOLE, PrefillPlan, Schedule

ENGINES = VERIFY_ENGINES
MIN_SLOT_LIMIT = 256 << 20  # bytes a saved slot may have, at least (a fresh state of the file's tokens)
SLOT_SIZE_FACTOR = 4  # ... and at most this many times the file's size
SERVER_TOP_K = 40  # log-probabilities a server reports for the next token
_ERROR_WORDS = ("error", "failed", "unknown", "mismatch", "incompatible", "invalid", "unable", "assert", "cannot",
                "wrong", "expected", "exceed", "mirrored slot", "not supported")


@dataclass
class RestoreReport:
    """What the engine did with the file: ``ok`` (restored), its own message, the raw return value."""

    ok: bool
    message: str
    returned: Any = None
    aborted: str | None = None  # "SIGABRT" ... when the engine died restoring it
    log: list[str] = field(default_factory=list)
    seconds: float = 0.0
    engine_fault: str | None = None  # what llama.cpp itself did wrong with the file (with the evidence)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "message": self.message, "returned": self.returned, "aborted": self.aborted,
                "log": list(self.log[-20:]), "seconds": round(self.seconds, 4), "engine_fault": self.engine_fault}


@dataclass
class Logits:
    """The next token's scores: every logit (``full``), or a server's top-K log-probabilities."""

    values: npt.NDArray[np.float32] | None = None  # logits[n_vocab]
    top: dict[int, float] | None = None  # token -> log-probability
    basis: str = "logits"


def partial_utf8_tokens(profile: ModelProfile) -> list[int]:
    """Tokens whose text is not whole UTF-8 on its own (a byte of a multi-byte character). llama-server
    withholds the text and the probabilities of a sampled token that ends inside a character, so its
    requests that need them ban these from being sampled (``logit_bias``; the probabilities it reports are
    the raw logits')."""
    return [i for i in range(profile.n_vocab) if "\ufffd" in profile.detokenize([i])]


class EngineUnavailable(SetupError):
    """The engine cannot be started or reached: one line saying how to get it."""


class EngineDiedEarly(EngineUnavailable):
    """The engine died (a signal, a timeout) before it read the state file: in the re-prefill of the tokens,
    which is the setup's business (the model, the parameters, the machine), never the file's."""

    def __init__(self, what: str) -> None:
        super().__init__(f"the engine died before reading the file: {what}")


def engine_message(log: list[str], fallback: str) -> str:
    """The engine's own failure from its log: the first line naming an error (the check that failed) and,
    when others follow, the last one (what the API call concluded); else ``fallback``."""
    picked = [short_line(ln) for ln in log if any(w in ln.lower() for w in _ERROR_WORDS)] or [
        short_line(ln) for ln in log[-1:]]
    if not picked:
        return fallback
    return picked[0] if len(picked) == 1 else f"{picked[0]}; {picked[-1]}"


class VerifyEngine:
    """The interface; see the module docstring."""

    kind = ""

    def describe(self) -> dict[str, Any]:
        raise NotImplementedError

    def restore(self, path: str, res: ParseResult, plan: ContextPlan) -> RestoreReport:
        raise NotImplementedError

    def next_logits(self, seq: int, tokens_before: list[int], token: int) -> tuple[Logits | None, str]:
        """Decode ``token`` after what the sequence holds now: (scores, or None and why)."""
        raise NotImplementedError

    def prefill(self, plan: PrefillPlan, ctx: ContextPlan, schedule: Schedule = WHOLE) -> bytes:
        """Decode the plan's tokens in an empty context (``schedule``: in which chunks; one that keeps
        positions of the previous prefill decodes only the rest); the fresh state (per-sequence or whole,
        as the file)."""
        raise NotImplementedError

    @property
    def can_prefill(self) -> bool:
        return True

    def kill(self) -> None:
        """Stop a call in flight (cancel); the engine is unusable afterwards."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> VerifyEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------
# libllama


class LlamaCppEngine(VerifyEngine):
    kind = "llama.cpp"

    def __init__(self, model: str, ctx: CtxParams, *, build: str | None = None, lib_path: str | None = None,
                 timeout_s: float = 600.0) -> None:
        self.model, self.ctx, self.build, self.lib_path, self.timeout_s = model, ctx, build, lib_path, timeout_s
        self._session: LlamaSession | None = self._start()

    def _start(self) -> LlamaSession:
        return LlamaSession(self.model, self.ctx, build=self.build, lib_path=self.lib_path, timeout_s=self.timeout_s,
                            record_abi_warnings=True)

    @property
    def warnings(self) -> list[str]:
        return self._session.warnings if self._session is not None else []

    @property
    def _info(self) -> dict[str, Any]:
        return self._session.info() if self._session is not None else {}

    def _live(self) -> LlamaSession:
        s = self._session
        if s is None or not s.alive:
            try:
                if s is None:
                    self._session = s = self._start()
                else:
                    s.restart()
            except EngineSetupError as e:  # the engine that ran before cannot start again (the model went away)
                raise EngineUnavailable(str(e)) from None
        return s

    def describe(self) -> dict[str, Any]:
        i = self._info
        return {"kind": self.kind, "build": i.get("build"), "commit": i.get("commit"), "writes": i.get("writes"),
                "lib_dir": i.get("lib_dir"), "binding": i.get("binding"), "abi": i.get("abi"),
                "n_ctx": i.get("n_ctx"), "kv_caches": i.get("kv_caches"), "flash_attn": i.get("flash_attn"),
                "rotation": i.get("rotation")}

    def restore(self, path: str, res: ParseResult, plan: ContextPlan) -> RestoreReport:
        s = self._live()
        s.clear()  # a restore after a prefill (the behaviour's continuation) starts from empty too
        dest = max(plan.dest_seq, 0)
        per_seq = res.kind in PER_SEQUENCE_KINDS
        empty = s.save("seq_blob", dest) if per_seq else None  # what an empty sequence's state is
        t0 = time.perf_counter()
        o = s.restore(res.kind, dest, path=path, n_token_capacity=plan.n_token_capacity,
                      flags=plan.flags if res.kind == "seq_blob" else 0)
        report = _report(o, restored(res.kind, o), time.perf_counter() - t0)
        report.engine_fault = self._fault(report, res, dest, empty)
        return report

    def _fault(self, report: RestoreReport, res: ParseResult, dest: int, empty: bytes | None = None) -> str | None:
        """llama.cpp's own failure on this file: an assert where a refusal belongs, or a refused file that left
        cells behind (a failed load must leave the sequence as it was: empty here, a fresh context)."""
        if report.aborted is not None:
            return abort_fault(report.aborted, report.log)
        s = self._session
        if report.ok or s is None or not s.alive:
            return None
        seqs = [dest] if res.kind in PER_SEQUENCE_KINDS else list(range(int(self._info.get("n_seq_max") or 1)))
        held: dict[int, tuple[int, int]] = {}
        for q in seqs:
            try:
                held[q] = s.positions(q)
            except EngineError:
                return None
        fault = half_restored_fault(held)
        if fault is None and empty is not None:  # seq_pos_* of an iSWA memory look at kv_swa alone
            try:
                now = s.save("seq_blob", dest)
            except EngineError:
                return None
            if now != empty:
                fault = half_restored_fault({}, extra=[
                    f"llama.cpp's seq_pos_max reports sequence {dest} empty, yet its state (llama_state_seq_get_data, "
                    f"{len(now)} bytes, against {len(empty)} for an empty sequence) holds what the load wrote in a "
                    "part of the memory seq_pos_max does not look at (an iSWA memory's kv_base)"])
        return fault

    def next_logits(self, seq: int, tokens_before: list[int], token: int) -> tuple[Logits | None, str]:
        s = self._session
        if s is None or not s.alive:
            return None, "the engine died"
        o = s.logits(seq, token)
        if o.aborted is not None:
            return None, o.summary()
        if o.rc != 0 or o.value is None:
            return None, f"llama_decode returned {o.rc}: {engine_message(o.log, 'no message')}"
        return Logits(values=o.value), ""

    def prefill(self, plan: PrefillPlan, ctx: ContextPlan, schedule: Schedule = WHOLE) -> bytes:
        try:
            return self._prefill(plan, ctx, schedule)
        except EngineDied as e:  # any call of the prefill (a clear, a decode, the state read back) found it dead
            raise EngineDiedEarly(f"the re-prefill: {e}") from None

    def _prefill(self, plan: PrefillPlan, ctx: ContextPlan, schedule: Schedule) -> bytes:
        s = self._live()
        if not any(schedule.start(len(t)) for t in plan.seqs.values()):
            s.clear()
        for seq, toks in plan.seqs.items():
            done = s.prefill(seq, toks, schedule.chunks(len(toks)))
            o, (a, b) = done.outcome, done.piece
            if o.aborted is not None:  # the tokens are the model's own ids: the setup killed it, not the file
                why = (f"no answer within --timeout {self.timeout_s:g} s" if o.aborted == "timeout"
                       else o.summary())
                raise EngineDiedEarly(f"the re-prefill of sequence {seq}'s tokens {a}..{b - 1}: {why}")
            if o.rc != 0:
                raise EngineError(f"llama_decode of sequence {seq}'s tokens {a}..{b - 1} returned {o.rc}: "
                                  f"{engine_message(o.log, 'no message')}")
        if ctx.per_seq:
            return s.save("seq_blob", ctx.dest_seq, flags=ctx.flags)
        return s.save("context_blob")

    def kill(self) -> None:
        if self._session is not None:
            self._session.kill()

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None


def _report(o: Outcome, ok: bool, seconds: float) -> RestoreReport:
    if o.aborted is not None:
        return RestoreReport(False, o.summary(), None, o.aborted, list(o.log) + list(o.stderr[-5:]), seconds)
    returned = o.rc if o.rc is not None else o.value
    if isinstance(returned, list):
        returned = len(returned)
    if ok:
        return RestoreReport(True, f"restored ({returned} bytes read)" if isinstance(returned, int) and not
                             isinstance(returned, bool) else "restored", returned, None, list(o.log), seconds)
    return RestoreReport(False, engine_message(o.log, "the restore returned failure with no log line"), returned,
                         None, list(o.log), seconds)


# ---------------------------------------------------------------------------------------------
# llama-server


# requests one verify sends a llama-server at most (a guard against a loop): the prefill and each schedule's
# pieces (the tail up to 64 one-token requests, the micro schedule up to 32), 8 continuation steps after each
# state, the restores, saves and erases
MAX_REQUESTS = 256


class ServerEngine(VerifyEngine):
    kind = "server"

    def __init__(self, model: str, ctx: CtxParams, *, url: str | None = None, slot_dir: str | None = None,
                 binary: str | None = None, build: str | None = None, timeout_s: float = 600.0,
                 max_requests: int = MAX_REQUESTS, profile: ModelProfile | None = None) -> None:
        self.ctx, self.model, self.profile = ctx, model, profile
        self._banned: list[list[Any]] | None = None
        self.build = build
        self.last_completion: dict[str, Any] | None = None  # the answer of the last next_logits (reuse reads it)
        prefix = f"kvscope-verify-{os.getpid()}-{uuid.uuid4().hex[:6]}-"  # our files in the slot folder
        if url is not None:
            if slot_dir is None:
                raise EngineUnavailable("--server needs the server's --slot-save-path folder as --slot-dir")
            self.session = ServerSession(model, ctx, url=url, slot_dir=slot_dir, timeout_s=timeout_s,
                                         max_requests=max_requests, prefix=prefix)
            try:
                self.client.health()
            except ServerError as e:
                self.session.close()
                raise EngineUnavailable(f"the llama-server at {url} does not answer: {e}") from None
        else:
            try:
                self.session = ServerSession(model, ctx, binary=binary, build=build, timeout_s=timeout_s,
                                             max_requests=max_requests, prefix=prefix)
            except ServerError as e:
                raise EngineUnavailable(str(e)) from None
        self.started = self.session.started
        self.slot_dir = self.session.slot_dir
        self._slot_limit = MIN_SLOT_LIMIT
        try:
            self._props = _props(self.session.info())
        except ServerError:
            self._props = {}

    @property
    def client(self) -> ServerClient:
        return self.session.client

    @property
    def _process(self) -> ServerProcess | None:
        return self.session.process

    @property
    def props(self) -> dict[str, Any]:
        """What the server's ``/props`` said when it was reached (the fields :func:`_props` keeps)."""
        return dict(self._props)

    def describe(self) -> dict[str, Any]:
        p = self._process
        gen = self._props.get("default_generation_settings") or {}
        gen = gen if isinstance(gen, dict) else {}
        return {"kind": self.kind, "build": p.build.name if p is not None and p.build is not None else self.build,
                "url": self.client.url, "slot_dir": self.slot_dir, "started_by_kvscope": self.started,
                "binary": p.binary if p is not None else None, "n_ctx": gen.get("n_ctx"),
                "build_info": self._props.get("build_info"), "total_slots": self._props.get("total_slots")}

    def _slot(self, seq: int) -> int:
        total = self._props.get("total_slots")
        total = total if isinstance(total, int) and total > 0 else self.ctx.n_seq_max
        return seq if 0 <= seq < total else 0

    def _copy_in(self, path: str) -> str:
        """Copy the file into the slot folder under a new name of ours (holes kept, no link followed)."""
        try:
            fd, st = open_regular(path)
        except InputError as e:
            raise EngineUnavailable(str(e)) from None
        try:
            name = self.session.new_name()
            copy_sparse(fd, os.path.join(self.slot_dir, name), st.st_size)
        except OSError as e:
            raise EngineUnavailable(f"cannot copy the file into the slot folder {self.slot_dir}: "
                                    f"{e.strerror or e}") from None
        finally:
            os.close(fd)
        self._slot_limit = max(MIN_SLOT_LIMIT, SLOT_SIZE_FACTOR * st.st_size)
        return name

    def _read_slot(self, path: str) -> bytes:
        """The slot file the server saved: a regular file (not a link, FIFO or device) of a plausible size."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
        except OSError as e:
            why = "a symbolic link" if e.errno == errno.ELOOP else e.strerror
            raise EngineUnavailable(f"llama-server saved the slot but {path} cannot be read: {why}") from None
        try:
            st = os.fstat(fd)
            kind = kind_of(st.st_mode)
            if kind is not None:
                raise EngineUnavailable(f"llama-server saved the slot but {path} is {kind}")
            if st.st_size > self._slot_limit:
                raise EngineUnavailable(f"the saved slot {path} is {st.st_size} bytes, more than the "
                                        f"{self._slot_limit} a fresh state of this file can take")
            os.set_blocking(fd, True)
            with os.fdopen(os.dup(fd), "rb") as fh:
                data = fh.read(self._slot_limit + 1)
            if len(data) > self._slot_limit:
                raise EngineUnavailable(f"the saved slot {path} grew beyond {self._slot_limit} bytes")
            return data
        except OSError as e:
            raise EngineUnavailable(f"cannot read the saved slot {path}: {e.strerror or e}") from None
        finally:
            os.close(fd)

    def restore(self, path: str, res: ParseResult, plan: ContextPlan) -> RestoreReport:
        t0 = time.perf_counter()
        if res.kind != "seq_file":
            return RestoreReport(False, f"llama-server restores slot files (sequence files), not a {res.kind}",
                                 seconds=time.perf_counter() - t0)
        name = self._copy_in(path)
        slot = self._slot(plan.dest_seq)
        try:
            o = self.session.restore(res.kind, slot, path=os.path.join(self.slot_dir, name))
        except ServerDied as e:
            return RestoreReport(False, str(e), None, e.aborted, list(e.log), time.perf_counter() - t0)
        except ServerHTTPError as e:
            return RestoreReport(False, e.message, e.status, None, [], time.perf_counter() - t0)
        except ServerError as e:
            return RestoreReport(False, str(e), None, None, [], time.perf_counter() - t0)
        n = o.rc
        return RestoreReport(True, f"slot {slot} restored ({n} bytes read, {o.value.get('n_restored')} tokens)", n,
                             None, [], time.perf_counter() - t0)

    def _logit_bias(self) -> list[list[Any]]:
        """Tokens that are not whole UTF-8 on their own, banned from being *sampled*: a server withholds the
        probabilities of a token that ends inside a character (the reported ones are the raw logits')."""
        if self._banned is None:
            self._banned = [[i, False] for i in partial_utf8_tokens(self.profile)] if self.profile else []
        return self._banned

    def next_logits(self, seq: int, tokens_before: list[int], token: int) -> tuple[Logits | None, str]:
        if not self.session.alive:
            return None, "llama-server is not running"
        try:
            doc = self.session.logits(self._slot(seq), token, tokens_before, n_probs=SERVER_TOP_K, temperature=0.0,
                                      logit_bias=self._logit_bias()).value
        except ServerError as e:
            return None, str(e)
        self.last_completion = doc if isinstance(doc, dict) else None
        top = _top_logprobs(doc.get("completion_probabilities"))
        if top is None:
            return None, "the server's completion_probabilities are not a list of {id, logprob} entries"
        if not top:
            return None, "the server returned no probabilities"
        return Logits(top=top, basis=f"top-{SERVER_TOP_K} log-probabilities from llama-server"), ""

    def prefill(self, plan: PrefillPlan, ctx: ContextPlan, schedule: Schedule = WHOLE) -> bytes:
        if len(plan.seqs) != 1:
            raise EngineError("llama-server re-prefills one slot: this file holds several sequences")
        (seq, toks), = plan.seqs.items()
        slot = self._slot(seq)
        try:
            pieces = schedule.chunks(len(toks))
            if not pieces[0][0]:
                self.session.clear(slot)
            self.session.prefill(slot, toks, pieces)
            return self.session.save("seq_file", slot, reader=self._read_slot)
        except ServerDied as e:  # before the file was restored: the setup's failure (a model cut under it ...)
            raise EngineDiedEarly(f"llama-server died in the re-prefill: {e}") from None
        except ServerHTTPError as e:
            if e.status == 400:  # "Prompt contains invalid tokens": the server refuses the file's tokens, an outcome
                raise EngineError(f"llama-server refused the file's tokens: {e}") from None
            raise EngineUnavailable(f"llama-server failed during the re-prefill: {e}") from None
        except ServerError as e:
            raise EngineUnavailable(f"llama-server failed during the re-prefill: {e}") from None

    def server_log(self, n: int = 400) -> list[str]:
        """The last ``n`` lines of the log of a server kvscope started (none for the user's ``--server``)."""
        return self.session.log_tail(n)

    def kill(self) -> None:
        self.session.kill()

    def close(self) -> None:
        self.session.close()


def _props(doc: dict[str, Any]) -> dict[str, Any]:
    """The ``/props`` fields kvscope reads, each kept only when it has the type llama-server gives it."""
    out: dict[str, Any] = {}
    gen = doc.get("default_generation_settings")
    if isinstance(gen, dict):
        out["default_generation_settings"] = {k: v for k, v in gen.items() if k == "n_ctx" and isinstance(v, int)}
    if isinstance(doc.get("build_info"), str):
        out["build_info"] = doc["build_info"][:200]
    total = doc.get("total_slots")
    if isinstance(total, int) and not isinstance(total, bool):
        out["total_slots"] = total
    return out


def _top_logprobs(probs: Any) -> dict[int, float] | None:
    """token -> log-probability from a completion's ``completion_probabilities`` (None: not that shape)."""
    if probs is None or probs == []:
        return {}
    if not isinstance(probs, list) or not isinstance(probs[0], dict):
        return None
    tops = probs[0].get("top_logprobs") or []
    if not isinstance(tops, list):
        return None
    out: dict[int, float] = {}
    for t in tops:
        if not isinstance(t, dict):
            return None
        tid, lp = t.get("id"), t.get("logprob")
        if not isinstance(tid, int) or isinstance(tid, bool) or not isinstance(lp, int | float) or isinstance(lp, bool):
            return None
        out[tid] = float(lp)
    return out


# ---------------------------------------------------------------------------------------------
# torch


class TorchEngine(VerifyEngine):
    """The memory core: the restore with llama.cpp's checks under the ``contained`` policy."""

    kind = "torch"

    def __init__(self, profile: ModelProfile | None) -> None:
        self.profile = profile

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "build": None, "policy": "contained",
                "scope": "restore only: the memory core has no forward pass to re-prefill with"}

    @property
    def can_prefill(self) -> bool:
        return False

    def restore(self, path: str, res: ParseResult, plan: ContextPlan) -> RestoreReport:
        t0 = time.perf_counter()
        try:
            from kvscope.core.memory.infer import InferError, infer_context, load
        except ImportError as e:
            raise EngineUnavailable(f"the torch engine needs the memory extra ({e}): pip install 'kvscope[memory]'") \
                from None
        try:
            inf = infer_context(res, self.profile)
        except (InferError, ValueError) as e:
            return RestoreReport(False, str(e), None, None, [], time.perf_counter() - t0)
        with open(path, "rb") as fh:
            r = load(inf, fh.read())
        msg = f"restored ({r.n_read} bytes read)" if r.ok else str(r)
        return RestoreReport(bool(r.ok), msg, r.returned, None, list(r.actions), time.perf_counter() - t0)

    def next_logits(self, seq: int, tokens_before: list[int], token: int) -> tuple[Logits | None, str]:
        return None, "the torch engine has no forward pass"

    def prefill(self, plan: PrefillPlan, ctx: ContextPlan, schedule: Schedule = WHOLE) -> bytes:
        raise EngineError("the torch engine has no forward pass")

    def close(self) -> None:
        return None
