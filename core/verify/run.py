"""The steps of ``kvscope verify``, in one object the command line and the app share.

:class:`Verifier` runs: parse the file with the model, plan the re-prefill (``prefill``), derive
the context (``params``), pick the build (the one that writes the file's layout generation, else
the binding's own), re-prefill the file's tokens in an empty context of the same parameters,
generate a short greedy continuation from there (``behaviour``), prefill the same tokens under the
calibration's other schedules and decode the same continuation after each (``calibrate``), restore
the file and decode the continuation after it, compare the file's state with the prefill's record
by record, within the engine's own variation (``compare``), and decide (``result.decide``).
``progress(done, total, label)`` is called as it goes; :meth:`Verifier.cancel` (from any thread)
stops it, killing an engine call in flight.
Setup problems (no engine, a file that is not a state, a bad parameter) raise :class:`VerifyError`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kvscope.core import ggml_types as gt
from kvscope.core.analysis.inspection import Inspection, inspect_source, open_state
from kvscope.core.engine.builds import BuildError, by_name
from kvscope.core.engine.choose import build_for_layout
from kvscope.core.engine.session import EngineError, EngineSetupError
from kvscope.core.errors import InputError, KvscopeError
from kvscope.core.fsutil import SHA256_MAX_BYTES, sha256_file
from kvscope.core.model.profile import ModelProfile, load_model_or
from kvscope.core.reader.parse import read_state
from kvscope.core.reader.records import KvStream, ParseResult, Section
from kvscope.core.reader.seq_owner import restore_seq
from kvscope.core.reader.source import ByteSource, FileChangedError
from kvscope.core.verify.behaviour import STEPS, Behaviour, forced, greedy, judge
from kvscope.core.verify.calibrate import measure, schedules_for
from kvscope.core.verify.compare import compare_states
from kvscope.core.verify.comparison import Cancelled, Tolerance
from kvscope.core.verify.context_plan import ROT_DISABLE, ContextPlan, ContextPlanError, context_for
from kvscope.core.verify.engines import (
    ENGINES,
    EngineDiedEarly,
    EngineUnavailable,
    LlamaCppEngine,
    Logits,
    RestoreReport,
    ServerEngine,
    TorchEngine,
    VerifyEngine,
)
from kvscope.core.verify.file_snapshot import Identity, Snapshot
from kvscope.core.verify.preconditions import model_problem, verify_problem
from kvscope.core.verify.prefill import PrefillPlan, Schedule, plan_prefill
from kvscope.core.verify.result import NextToken, VerifyResult, compare_logits, decide

Progress = Callable[[int, int, str], None]
_WEIGHTS = (("parse", 5), ("start", 10), ("prefill", 25), ("next_fresh", 10), ("calibrate", 20), ("restore", 5),
            ("next_restored", 10), ("compare", 15))
_TOTAL = sum(w for _, w in _WEIGHTS)
_INCOMPATIBLE_WORDS = ("unknown (magic, version)", "incompatible key rotation", "incompatible value rotation")


MAX_TIMEOUT_S = 10_000_000.0  # --timeout at most (cli_options.seconds' bound; nan, inf, 1e300 make no deadline)
INT32_MAX = (1 << 31) - 1  # llama_token


class VerifyError(KvscopeError):
    """verify cannot run (bad input, no engine): one line for the user."""


class Verifier:
    """One verification; build it, then :meth:`run` (in any thread)."""

    def __init__(self, path: str | os.PathLike[str], model: str | os.PathLike[str], *, engine: str = "llama.cpp",
                 build: str | None = None, lib_path: str | None = None, server_url: str | None = None,
                 slot_dir: str | None = None, server_bin: str | None = None,
                 overrides: Mapping[str, str] | None = None,
                 tokens: Sequence[int] | Mapping[int, Sequence[int]] | None = None, next_token: int | None = None,
                 tolerance: Tolerance | None = None, progress: Progress | None = None, timeout_s: float = 600.0,
                 profile: ModelProfile | None = None, steps: int = STEPS, calibrate: bool = True) -> None:
        if engine not in ENGINES:
            raise VerifyError(f"unknown engine {engine!r} ({', '.join(ENGINES)})")
        if engine != "server" and (server_url or slot_dir or server_bin):
            raise VerifyError("--server, --slot-dir and --server-bin go with --engine server")
        if build is not None and lib_path is not None:
            raise VerifyError("give either --build or --lib, not both")
        if server_url is not None and (server_bin is not None or build is not None):
            raise VerifyError("--server talks to a running llama-server: --server-bin / --build do not apply")
        self.path, self.model = os.fspath(path), os.fspath(model)
        self.engine_kind, self.build, self.lib_path = engine, build, lib_path
        self.server_url, self.slot_dir, self.server_bin = server_url, slot_dir, server_bin
        self.overrides = dict(overrides or {})
        self.tokens, self.next_token = tokens, next_token
        self.tolerance = tolerance or Tolerance()
        self.progress, self.timeout_s, self.profile = progress, timeout_s, profile
        if not 1 <= steps <= 256:
            raise VerifyError(f"--steps {steps}: expected 1 to 256 continuation tokens")
        if not (isinstance(timeout_s, int | float) and math.isfinite(timeout_s) and 0 < timeout_s <= MAX_TIMEOUT_S):
            raise VerifyError(f"--timeout {timeout_s}: expected seconds above 0 and at most {MAX_TIMEOUT_S:g}")
        if next_token is not None and not 0 <= next_token <= INT32_MAX:
            raise VerifyError(f"--next-token {next_token}: not a token id (0 or more)")
        self.steps, self.calibrate = steps, calibrate
        self._cancel = threading.Event()
        self._engine: VerifyEngine | None = None
        self._snapshot: Snapshot | None = None  # the private copy every step reads
        self._inspection: Inspection | None = None  # the pipeline's inspection of that copy
        self._done = 0
        self._model_id: Identity | None = None  # the model file as verify found it (it must not change)

    # -- control ----------------------------------------------------------------------------------
    def cancel(self) -> None:
        """Stop as soon as possible (any thread): the engine call in flight is killed."""
        self._cancel.set()
        eng = self._engine
        if eng is not None:
            eng.kill()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def _step(self, name: str, label: str) -> None:
        if self._cancel.is_set():
            raise Cancelled
        self._done = sum(w for n, w in _WEIGHTS[: [n for n, _ in _WEIGHTS].index(name)])
        if self.progress is not None:
            self.progress(self._done, _TOTAL, label)
            if self._cancel.is_set():  # cancelled from the progress callback: the step does not start
                raise Cancelled

    def _sub(self, name: str) -> Progress:
        weight = dict(_WEIGHTS)[name]
        base = self._done

        def report(done: int, total: int, label: str) -> None:
            if self.progress is not None:
                self.progress(base + weight * done // max(1, total), _TOTAL, label)

        return report

    # -- the steps ---------------------------------------------------------------------------------
    def _input(self) -> str:
        """The private copy of the file (taken by :meth:`_parse`)."""
        assert self._snapshot is not None
        return self._snapshot.path

    def _parse(self) -> tuple[ModelProfile, ParseResult]:
        """The model's profile and the parse of the private copy: the inspection pipeline's
        (:func:`~kvscope.core.analysis.inspection.inspect_source`; its compatibility comes in :meth:`_run`)."""
        prof = self.profile
        self._model_id = _identity(self.model)
        if prof is None:
            if not os.path.isfile(self.model):
                from kvscope.core.errors import path_kind

                raise VerifyError(f"{self.model}: {path_kind(self.model)} (--model names the GGUF model file)")
            prof = load_model_or(self.model, VerifyError)
        try:
            self._snapshot = Snapshot(self.path)
        except InputError as e:
            raise VerifyError(str(e)) from None
        try:
            src = open_state(self._snapshot.path)
            try:
                found = self._inspection = inspect_source(src, prof, compat=False)
            finally:
                src.close()
        except (InputError, FileChangedError) as e:
            raise VerifyError(str(e).replace(self._snapshot.path, self.path)) from None
        res = found.result
        if not found.is_state:
            why = found.not_state_reason()  # says "not a llama.cpp state file (...)" itself: not nested again
            raise VerifyError(f"{self.path}: {why}" if "state file" in why else
                              f"{self.path}: not a llama.cpp state file ({why})")
        return prof, res

    def _input_identity(self) -> tuple[int, str | None]:
        """The size and sha256 of the bytes verify read (its private copy; no sha256 above
        :data:`~kvscope.core.fsutil.SHA256_MAX_BYTES`): ``verify --json`` names the file it judged by them, and
        ``kvscope report --verify-json`` checks them against the file it reports on."""
        assert self._snapshot is not None
        size = self._snapshot.identity.size
        if size > SHA256_MAX_BYTES:
            return size, None
        try:
            return size, sha256_file(self._snapshot.path)
        except OSError as e:
            raise VerifyError(f"{self.path}: cannot read its copy: {e.strerror or e}") from None

    def _choose_build(self, res: ParseResult) -> tuple[str | None, str]:
        if self.lib_path is not None:
            return None, f"the library in {self.lib_path} (given with --lib)"
        if self.build is not None:
            try:
                b = by_name(self.build)
            except BuildError as e:
                raise VerifyError(str(e)) from None
            return b.name, f"llama.cpp {b.name} (given with --build)"
        choice = build_for_layout(res.layout.name)
        return choice.build.name, choice.reason

    def _start(self, ctx: ContextPlan, build: str | None, prof: ModelProfile) -> VerifyEngine:
        try:
            if self.engine_kind == "torch":
                return TorchEngine(prof)
            if self.engine_kind == "server":
                return ServerEngine(self.model, ctx.ctx, url=self.server_url, slot_dir=self.slot_dir,
                                    binary=self.server_bin, build=build, timeout_s=self.timeout_s, profile=prof)
            return LlamaCppEngine(self.model, ctx.ctx, build=build, lib_path=self.lib_path, timeout_s=self.timeout_s)
        except (EngineSetupError, EngineUnavailable) as e:
            raise VerifyError(str(e)) from None

    def run(self) -> VerifyResult:
        try:
            out = self._run()
            changed = self._snapshot.changed() if self._snapshot is not None else None
            if changed:
                out.input_changed = changed
                out.notes.append(f"{changed}: the verdict is about its content when verify read it "
                                 f"({self._snapshot.identity.size if self._snapshot else 0} bytes)")
            return out
        finally:
            if self._snapshot is not None:
                self._snapshot.close()
                self._snapshot = None
            self._inspection = None

    def _run(self) -> VerifyResult:
        t_all = time.perf_counter()
        self._step("parse", "reading the file")
        t0 = time.perf_counter()
        prof, res = self._parse()
        out = VerifyResult(self.path, res.kind, res.layout.name, self.model)
        out.size, out.sha256 = self._input_identity()
        out.seconds["parse"] = time.perf_counter() - t0
        out.findings = [{"severity": f.severity, "code": f.code, "offset": f.offset, "message": f.message}
                        for f in res.findings if f.severity in ("error", "warning")][:20]
        reader_errors = res.n_errors
        # before any engine: what the app asks to offer Verify (a model the file does not fit, a --next-token
        # outside the vocabulary, tokens given that cannot be this state's)
        why = verify_problem(res, prof, self.tokens, self.next_token, model=self.model, path=self.path)
        if why is not None:
            raise VerifyError(why)
        dest = restore_seq(res)
        plan = plan_prefill(res, dest, self.tokens, self.next_token)
        try:
            ctx = context_for(res, prof, plan.n_tokens, self.overrides)
        except ContextPlanError as e:
            raise VerifyError(str(e)) from None
        out.context = ctx.to_json()
        out.prefill = {**plan.to_json(), "tokens_given": self.tokens is not None}
        out.notes += ctx.notes + plan.notes
        build, reason = (None, "") if self.engine_kind == "torch" or self.server_url else self._choose_build(res)
        if self.engine_kind == "server" and res.kind != "seq_file":
            raise VerifyError(f"llama-server restores slot files (sequence files); {self.path} is a {res.kind}: "
                              "use --engine llama.cpp")
        assert self._inspection is not None
        compat = self._inspection.add_compat()  # the pipeline's step, on the private copy
        out.compatibility = [c.to_json() for c in compat]
        self._step("start", f"starting {self.engine_kind}")
        t0 = time.perf_counter()
        engine = self._engine = self._start(ctx, build, prof)
        try:
            out.engine = {**engine.describe(), "reason": reason}
            out.notes += list(getattr(engine, "warnings", []))
            if self.server_bin:
                out.engine["reason"] = f"the llama-server binary {self.server_bin} (given with --server-bin)"
            out.seconds["start"] = time.perf_counter() - t0
            gen = self._generation(out.engine, build)
            incompatible = self._incompatible(res, gen, compat)
            self._run_steps(out, res, prof, plan, ctx, engine)
            if self._rotation_unknown(res, out) and self.server_url is None:
                engine = self._retry_rotation(out, res, prof, plan, ctx, build, engine)
            if not incompatible and out.restore is not None and not out.restore.ok and gen is None:
                incompatible = any(w in out.restore.message for w in _INCOMPATIBLE_WORDS)
            if out.restore is not None and not out.restore.ok and out.setup_mismatch:
                incompatible = True  # the server is set up otherwise than the file needs: not the file's damage
            self._check_model()
            if gen is not None and gen != res.layout.name and out.comparison is not None:
                out.notes.append(f"the file's layout is {res.layout.name}, the engine writes {gen}: values are "
                                 "compared within the tolerance")
            decide(out, incompatible, reader_errors)
        except EngineUnavailable as e:  # the engine failed under us (a server that broke off, a full disk)
            if not self._cancel.is_set():
                self._check_model()
                raise VerifyError(str(e)) from None
            out.cancelled = True  # killed by cancel(): the call in flight died of it
            out.verdict = "damaged"
            out.reasons = ["cancelled before the verification finished"]
        except Cancelled:
            out.cancelled = True
            out.verdict = "damaged"
            out.reasons = ["cancelled before the verification finished"]
        finally:
            self._engine = None
            engine.close()
        out.seconds["total"] = time.perf_counter() - t_all
        if self.progress is not None:
            self.progress(_TOTAL, _TOTAL, "done")
        return out

    def _check_model(self) -> None:
        """Raise :class:`VerifyError` when the model file changed since verify read it (cut, rewritten or
        replaced under the engine): the engine's answers are then not about one model, whatever they are."""
        if self._model_id is None:
            return
        now = _identity(self.model)
        if now == self._model_id:
            return
        if now is None:
            what = "it is gone"
        elif (now.dev, now.ino) != (self._model_id.dev, self._model_id.ino):
            what = "another file took its name"
        elif now.size != self._model_id.size:
            what = f"its size went from {self._model_id.size:,} to {now.size:,} bytes"
        else:
            what = "it was rewritten"
        raise VerifyError(f"the model file {self.model} changed while verify ran ({what}): the engine's answers are "
                          f"not about one model, so nothing is said about {self.path}; run verify again")

    @staticmethod
    def _rotation_unknown(res: ParseResult, out: VerifyResult) -> bool:
        """Records differ, and the file's rotation is inferred (a layout without the rotation fields, rows a
        default build rotates): the file may have been saved with ``LLAMA_ATTN_ROT_DISABLE=1``."""
        cmp_ = out.comparison
        if cmp_ is None or not cmp_.bad_records() or res.layout.features.get("kv_rot"):
            return False
        inferred = [(i, st) for i, sec in enumerate(res.sections) if sec.kind == "kv" for st in sec.streams
                    if st.n_rot_inferred and (st.n_rot_k or st.n_rot_v)]
        if not inferred:
            return False
        # a file saved without the rotation differs in every record of a rotated role, not in some of them:
        # damage to a few records is not worth a second verification (it doubled a damaged file's cost)
        rotated = [r for i, st in inferred for r in cmp_.records
                   if r.section_index == i and r.stream in (None, st.index)
                   and r.role in ({"k"} if st.n_rot_k else set()) | ({"v"} if st.n_rot_v else set())]
        return not rotated or all(r.status != "match" for r in rotated)

    def _retry_rotation(self, out: VerifyResult, res: ParseResult, prof: ModelProfile, plan: PrefillPlan,
                        ctx: ContextPlan, build: str | None, engine: VerifyEngine) -> VerifyEngine:
        """Run the steps again with the rotation setting flipped; keep that run when every record matches."""
        env = dict(ctx.ctx.env)
        flipped = "on" if env.pop(ROT_DISABLE, None) else "off"
        if flipped == "off":
            env[ROT_DISABLE] = "1"
        alt = ContextPlan(dataclasses.replace(ctx.ctx, env=tuple(sorted(env.items()))), ctx.per_seq, ctx.dest_seq,
                          ctx.flags, ctx.n_token_capacity, dict(ctx.sources), list(ctx.notes))
        alt.sources["env." + ROT_DISABLE] = "retry"
        engine.close()
        engine = self._engine = self._start(alt, build, prof)
        trial = VerifyResult(out.file, out.kind, out.layout, out.model)
        self._run_steps(trial, res, prof, plan, alt, engine)
        if trial.comparison is not None and not trial.comparison.bad_records():
            out.restore, out.comparison, out.next_token = trial.restore, trial.comparison, trial.next_token
            out.behaviour = trial.behaviour
            out.context = alt.to_json()
            out.notes.append(f"layout {res.layout.name} does not record the rotation: with rotation {flipped} "
                             f"({ROT_DISABLE}={'1' if flipped == 'off' else 'unset'}) every record matches, so the "
                             "file was saved that way")
        else:
            out.notes.append(f"layout {res.layout.name} does not record the rotation; with rotation {flipped} the "
                             "records do not match either")
        return engine

    def _generation(self, eng: dict[str, Any], build: str | None) -> str | None:
        name = eng.get("build") or build
        if not name or self.lib_path is not None or self.server_url is not None:
            return str(eng.get("writes")) if eng.get("writes") else None
        try:
            return by_name(str(name)).writes
        except BuildError:
            return None

    @staticmethod
    def _incompatible(res: ParseResult, gen: str | None, compat: list[Any]) -> bool:
        if gen is None or gen == res.layout.name:
            return False
        if gen in {str(n) for n in res.layout.features.get("byte_identical_layouts", [])}:
            return False
        entry = next((c for c in compat if c.generation == gen), None)
        return entry is not None and entry.loads is False

    def _restore(self, out: VerifyResult, res: ParseResult, ctx: ContextPlan, engine: VerifyEngine) -> RestoreReport:
        self._step("restore", f"restoring in {engine.kind}")
        rep = out.restore = engine.restore(self._input(), res, ctx)
        rep.message = rep.message.replace(self._input(), self.path)
        out.seconds["restore"] = rep.seconds
        return rep

    def _run_steps(self, out: VerifyResult, res: ParseResult, prof: ModelProfile, plan: PrefillPlan,
                   ctx: ContextPlan, engine: VerifyEngine) -> None:
        seq = plan.next_seq
        nt = NextToken(plan.next_token, seq)
        if not plan.possible or not engine.can_prefill:
            restored = self._restore(out, res, ctx, engine)
            if plan.next_token is None:
                nt.skipped = "no token to decode next" if plan.possible else (plan.reason or "nothing to decode")
            elif not restored.ok:
                nt.skipped = "the restore failed"
            else:
                nt.skipped = "the torch engine has no forward pass"
            if not engine.can_prefill:
                out.notes.append("the torch engine restores only: the K/V are not compared with the model")
            out.next_token = nt if plan.next_token is not None or nt.skipped else None
            return
        self._step("prefill", f"re-prefilling {sum(len(t) for t in plan.seqs.values())} tokens")
        t0 = time.perf_counter()
        try:
            fresh = engine.prefill(plan, ctx)
        except EngineError as e:  # the file's tokens broke the engine (a crash, a decode error): an outcome
            out.prefill["failed"] = str(e)
            out.notes.append(f"the re-prefill failed: {e}")
            self._restore(out, res, ctx, engine)
            nt.skipped = "the re-prefill failed"
            out.next_token = nt
            return
        out.seconds["prefill"] = time.perf_counter() - t0
        tokens: list[int] = []
        fresh_logits: list[Logits] = []
        why = "no token to decode next"
        if plan.next_token is not None:
            self._step("next_fresh", f"a {self.steps}-token continuation after the prefill")
            t0 = time.perf_counter()
            tokens, fresh_logits, why = greedy(engine.next_logits, seq, plan.seqs[seq], plan.next_token, self.steps)
            out.seconds["next_fresh"] = time.perf_counter() - t0
        states, sched_logits = self._schedules(out, plan, ctx, engine, tokens[:len(fresh_logits)])
        restored = self._restore(out, res, ctx, engine)
        restored_logits: list[Logits] = []
        why_r = "the restore failed"
        if restored.ok and fresh_logits:
            self._step("next_restored", "the continuation after the restore")
            t0 = time.perf_counter()
            before = list(res.tokens) if engine.kind == "server" else plan.seqs.get(seq, [])
            if engine.kind == "server":
                from kvscope.core.verify.reuse_measure import engine_reuse, log_mark

                mark = log_mark(engine)
            first, why_r = engine.next_logits(seq, before, tokens[0])
            if engine.kind == "server":  # that completion continued the slot: the server's reuse of it
                out.reuse = engine_reuse(engine, len(before), mark)
            if first is not None:
                rest, why_r = forced(engine.next_logits, seq, [*before, tokens[0]], tokens[1:len(fresh_logits)])
                restored_logits = [first, *rest]
            out.seconds["next_restored"] = time.perf_counter() - t0
        self._step("compare", "comparing the records")
        t0 = time.perf_counter()
        fresh_res = read_state(data=fresh, profile=prof)
        if engine.kind == "server":
            out.setup_mismatch = server_mismatch(res, fresh_res, getattr(engine, "props", {}))
        fresh_src = ByteSource(fresh)
        calibration = None
        if states:
            calibration = measure(fresh_res, fresh_src, states, per_seq=ctx.per_seq, limit_pos=plan.limit_pos,
                                  tolerance=self.tolerance, read=lambda d: read_state(data=d, profile=prof),
                                  cancel=self._cancel)
        with ByteSource.open(self._input()) as fsrc:
            out.comparison = compare_states(res, fsrc, fresh_res, fresh_src, per_seq=ctx.per_seq,
                                            limit_pos=plan.limit_pos, tolerance=self.tolerance,
                                            progress=self._sub("compare"), cancel=self._cancel,
                                            calibration=calibration)
        del fresh, states
        out.seconds["compare"] = time.perf_counter() - t0
        if plan.next_token is None:
            nt.skipped = "no token to decode next"
        elif not restored.ok:
            nt.skipped = "the restore failed"
        elif not fresh_logits:
            nt.skipped = f"decoding after the prefill failed: {why}"
        elif not restored_logits:
            nt.skipped = f"decoding after the restore failed: {why_r}"
        else:
            nt = compare_logits(restored_logits[0], fresh_logits[0], plan.next_token, seq)
            out.behaviour = judge(seq, tokens, fresh_logits, restored_logits, sched_logits, wanted=self.steps)
            if len(restored_logits) < len(fresh_logits):
                out.behaviour.notes.append(f"the restored continuation stopped after {len(restored_logits)} "
                                           f"step(s): {why_r}")
        if out.behaviour is None:
            out.behaviour = Behaviour(seq, self.steps, skipped=nt.skipped or "not run")
        out.next_token = nt

    def _schedules(self, out: VerifyResult, plan: PrefillPlan, ctx: ContextPlan, engine: VerifyEngine,
                   tokens: list[int]) -> tuple[list[tuple[Schedule, bytes]], dict[str, list[Logits]]]:
        """The calibration's schedules: each one's state, and the continuation decoded after it."""
        states: list[tuple[Schedule, bytes]] = []
        logits: dict[str, list[Logits]] = {}
        if not self.calibrate:
            out.notes.append("calibration off (--no-calibrate): the fixed tolerances and floors decide")
            return states, logits
        self._step("calibrate", "measuring the engine's own variation")
        t0 = time.perf_counter()
        for sched in schedules_for(plan):
            if self._cancel.is_set():
                raise Cancelled
            try:
                states.append((sched, engine.prefill(plan, ctx, sched)))
            except (EngineError, EngineDiedEarly) as e:
                if self._cancel.is_set():
                    raise Cancelled from None
                out.notes.append(f"the calibration's {sched.name} schedule failed ({e}): it is left out")
                continue
            if tokens:
                got, _why = forced(engine.next_logits, plan.next_seq, plan.seqs[plan.next_seq], tokens)
                if len(got) == len(tokens):
                    logits[sched.name] = got
        out.seconds["calibrate"] = time.perf_counter() - t0
        return states, logits


def _identity(path: str) -> Identity | None:
    try:
        return Identity.of(os.stat(path))
    except OSError:
        return None


def model_misfit(path: str, model: str, res: ParseResult, prof: ModelProfile) -> str | None:
    """The line that refuses ``model`` for the file ``path`` when the file does not fit it, as ``kvscope inspect``
    judges it (its verdict's model mismatch: every error is about the model, and one says the model is
    another); None when it fits or the file is damaged. verify and repair ask it before any engine starts."""
    return model_problem(res, prof, model, path)


def _data_stream(sec: Section) -> KvStream | None:
    return next((st for st in sec.streams if st.k_layers), None)


def server_mismatch(res: ParseResult, fresh: ParseResult, props: dict[str, Any]) -> list[str]:
    """How the llama-server is set up otherwise than ``res`` needs, one line per setting: what its ``/props``
    reports (the cells of a slot) and what its own slot save (``fresh``, the re-prefill) shows (the KV streams,
    V transposition, cache types), each against the file's."""
    out: list[str] = []
    slots = props.get("total_slots")
    gen = props.get("default_generation_settings") or {}
    n_ctx = gen.get("n_ctx") if isinstance(gen, dict) else None
    cells = max([st.cell_count for s in res.sections if s.kind == "kv" for st in s.streams], default=0)
    if isinstance(n_ctx, int) and 0 < n_ctx < cells:
        out.append(f"n_ctx: a slot of the server holds {n_ctx:,} cells (its -c over its slots), the file "
                   f"{cells:,}")
    mine = {s.role: s for s in res.sections if s.kind == "kv"}
    theirs = {s.role: s for s in fresh.sections if s.kind == "kv"}
    for role, sec in mine.items():
        other = theirs.get(role)
        if other is None:
            continue
        a, b = sec.n_stream or 1, other.n_stream or 1
        if a != b:
            np_ = f"-np {slots}" if isinstance(slots, int) else "its -np"
            out.append(f"n_stream ({role}): the server keeps {b} KV stream(s) ("
                       + (f"one per slot: {np_} without --kv-unified" if b > 1 else "--kv-unified, or -np 1")
                       + f"), the file {a} ("
                       + (f"-np {a} without --kv-unified" if a > 1 else "--kv-unified, or -np 1") + ")")
        fa, fb = _data_stream(sec), _data_stream(other)
        if fa is None or fb is None:
            continue
        if fa.v_trans is not None and fb.v_trans is not None and bool(fa.v_trans) != bool(fb.v_trans):
            out.append(f"v_trans ({role}): the server stores V " + ("transposed (-fa off)" if fb.v_trans else
                       "untransposed (flash attention: -fa on, or -fa auto choosing it)") + ", the file "
                       + ("transposed (saved with -fa off)" if fa.v_trans else "untransposed (saved with -fa on)"))
        for side, ra, rb in (("type_k", fa.k_layers, fb.k_layers), ("type_v", fa.v_layers, fb.v_layers)):
            if ra and rb and ra[0].type_id != rb[0].type_id:
                flag = "-ctk" if side == "type_k" else "-ctv"
                out.append(f"{side} ({role}): the server's cache is {gt.type_name(rb[0].type_id)} ({flag}), the "
                           f"file's {gt.type_name(ra[0].type_id)}")
    return out


def verify(path: str | os.PathLike[str], model: str | os.PathLike[str], **kw: Any) -> VerifyResult:
    """Run a :class:`Verifier` with these arguments."""
    return Verifier(path, model, **kw).run()
