"""``kvscope repair``: rebuild a healthy state of the same kind from the file's own tokens.

:func:`repair` inspects FILE with the model through the one pipeline
(:func:`kvscope.core.analysis.inspection.inspect_file`), plans the re-prefill of its tokens (``prefill``: a blob
needs ``tokens``; media chunks cannot be re-prefilled), derives the context (``context_plan``) and picks
the pinned build that writes the file's layout generation. The engine then prefills the tokens
into the file's sequence and saves the state the way the file was saved:

* a llama-server slot (its ``server_tokens`` payload): a llama-server of that build on the same
  cache settings, one prompt-only completion in the slot and its own slot save, so the result is a
  slot file llama-server restores;
* a sequence file: ``llama_state_seq_save_file`` of the sequence; a session file:
  ``llama_state_save_file``; a blob: ``llama_state_seq_get_data_ext`` (with the file's flags) or
  ``llama_state_get_data``.

Before anything runs, :func:`kvscope.core.verify.preconditions.repair_problem` (the check the app's Repair…
asks too) refuses what cannot be rebuilt. The rebuilt state is verified (``run.Verifier``: the same kind,
layout and sequence, verdict ``ok``) in a private temporary folder, and only then written to OUT
atomically. OUT never names the input.
Anything that prevents a faithful rebuild raises :class:`RepairError` (one line).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvscope.core.analysis.inspection import inspect_file
from kvscope.core.engine.builds import BuildError, by_name
from kvscope.core.engine.choose import build_for_layout
from kvscope.core.engine.janitor import janitor
from kvscope.core.engine.session import EngineError, LlamaSession, SaveRefused
from kvscope.core.errors import InputError
from kvscope.core.fsutil import check_output, temporary_folder, write_atomic
from kvscope.core.model.profile import ModelProfile, load_model_or
from kvscope.core.reader.records import ParseResult
from kvscope.core.reader.seq_owner import restore_seq
from kvscope.core.reader.state_kinds import BLOB_KINDS, PER_SEQUENCE_KINDS
from kvscope.core.textsafe import safe_text
from kvscope.core.verify.context_plan import ContextPlan, ContextPlanError, context_for
from kvscope.core.verify.engines import EngineUnavailable, LlamaCppEngine, ServerEngine
from kvscope.core.verify.preconditions import repair_problem
from kvscope.core.verify.prefill import PrefillPlan, plan_prefill
from kvscope.core.verify.result import VerifyResult
from kvscope.core.verify.run import Verifier, VerifyError

SERVER_TOKENS = "server_tokens"  # the token payload format of a llama-server slot save


class RepairError(InputError):
    """The file cannot be rebuilt faithfully: one line for the user."""


@dataclass
class RepairResult:
    """What was rebuilt, how, and the verification of the rebuilt state."""

    file: str
    output: str
    kind: str
    layout: str
    build: str
    writer: str
    seqs: dict[int, int] = field(default_factory=dict)  # sequence -> tokens re-prefilled
    size: int = 0
    verify: VerifyResult | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "output": self.output, "kind": self.kind, "layout": self.layout,
                "build": self.build, "writer": self.writer, "seqs": {str(k): v for k, v in self.seqs.items()},
                "size": self.size, "verify": self.verify.to_json() if self.verify is not None else None,
                "seconds": {k: round(v, 3) for k, v in self.seconds.items()}, "notes": list(self.notes)}

    def text(self) -> str:
        v = self.verify
        lines = [f"{self.file}: {self.kind}, layout {self.layout}",
                 f"rebuilt with llama.cpp {self.build} ({self.writer}) from "
                 + ", ".join(f"sequence {s}'s {n} tokens" for s, n in self.seqs.items()),
                 f"verified: {v.verdict if v is not None else 'not run'}"
                 + (f" ({v.reasons[0]})" if v is not None and v.reasons else ""),
                 f"written: {self.output} ({self.size:,} bytes)"]
        return "\n".join(lines + [f"note: {n}" for n in self.notes]) + "\n"


def _profile(model: str) -> ModelProfile:
    if not os.path.isfile(model):
        raise RepairError(f"{model}: no such model file")
    return load_model_or(model, RepairError)


def _parsed(path: str, prof: ModelProfile) -> ParseResult:
    """``path`` through the one inspection pipeline (no statistics, no compatibility table: repair needs the
    parse); :class:`RepairError` when it cannot be read or changed while read."""
    try:
        return inspect_file(path, prof, compat=False).result
    except RepairError:
        raise
    except InputError as e:
        raise RepairError(str(e)) from None


def _swa_full(res: ParseResult, plan: PrefillPlan) -> bool:
    """Whether the file's SWA cache held every cell (``--swa-full``): it holds as many cells as tokens."""
    n = plan.n_tokens
    for sec in res.sections:
        if sec.kind == "kv" and sec.role == "kv_swa":
            return max((st.cell_count for st in sec.streams), default=0) >= n
    return True


def _plan(res: ParseResult, path: str, tokens: Sequence[int] | Mapping[int, Sequence[int]] | None) -> PrefillPlan:
    dest = restore_seq(res)
    plan = plan_prefill(res, dest, tokens)
    if plan.limit_pos is not None:
        raise RepairError(f"{path}: the prompt holds {plan.n_media} media chunk(s) from position {plan.limit_pos}: "
                          "they cannot be re-prefilled from the file")
    if not plan.possible:
        raise RepairError(f"{path}: cannot be re-prefilled: {plan.reason}")
    return plan


def _build(res: ParseResult, build: str | None) -> str:
    try:
        name = by_name(build).name if build is not None else build_for_layout(res.layout.name).build.name
        writes = by_name(name).writes
    except BuildError as e:
        raise RepairError(str(e)) from None
    if writes != res.layout.name:
        raise RepairError(f"no pinned llama.cpp build writes layout {res.layout.name} ({name} writes {writes}): "
                          "the rebuilt state would be of another layout generation")
    return name


def _rebuild(res: ParseResult, model: str, plan: PrefillPlan, ctx: ContextPlan, build: str, dest: str,
             timeout_s: float, prof: ModelProfile) -> str:
    """Prefill the tokens and save the state as the file was saved, into ``dest``; the writer's name."""
    slot = res.kind == "seq_file" and (res.token_payload or {}).get("format") == SERVER_TOKENS
    if slot:
        srv = ServerEngine(model, ctx.ctx, build=build, timeout_s=timeout_s, profile=prof)
        try:
            data = srv.prefill(plan, ctx)
        finally:
            srv.close()
        with open(dest, "wb") as fh:
            fh.write(data)
        return "llama-server's slot save"
    if res.kind in BLOB_KINDS:
        eng = LlamaCppEngine(model, ctx.ctx, build=build, timeout_s=timeout_s)
        try:
            data = eng.prefill(plan, ctx)
        finally:
            eng.close()
        with open(dest, "wb") as fh:
            fh.write(data)
        return "llama_state_seq_get_data_ext" if res.kind == "seq_blob" else "llama_state_get_data"
    with LlamaSession(model, ctx.ctx, build=build, timeout_s=timeout_s, scratch=os.path.dirname(dest)) as session:
        for seq, toks in plan.seqs.items():
            o = session.prefill(seq, toks).outcome
            if o.rc != 0 or o.aborted is not None:
                raise RepairError(f"the engine cannot prefill sequence {seq}'s {len(toks)} tokens: {o.summary()}")
        try:
            if res.kind == "seq_file":
                seq = ctx.dest_seq
                writer = "llama_state_seq_save_file"
                data = session.save("seq_file", seq, tokens=plan.seqs[seq])
            else:
                writer = "llama_state_save_file"
                data = session.save("session_file", tokens=[t for s in sorted(plan.seqs) for t in plan.seqs[s]])
        except SaveRefused as e:
            raise RepairError(f"{e.writer} failed: {e.outcome.summary()}") from None
    with open(dest, "wb") as fh:
        fh.write(data)
    return writer


def repair(path: str | os.PathLike[str], model: str | os.PathLike[str], out: str | os.PathLike[str], *,
           tokens: Sequence[int] | Mapping[int, Sequence[int]] | None = None, build: str | None = None,
           timeout_s: float = 600.0, inputs: Sequence[str | os.PathLike[str]] = ()) -> RepairResult:
    """Rebuild FILE's state from its tokens into OUT (verified first); raises :class:`RepairError`.

    ``inputs``: the other files the caller read for it (``--tokens @FILE``); OUT names none of them, nor FILE
    or the model, and is refused before anything is read when it exists and is not a regular file."""
    path, model, out = os.fspath(path), os.fspath(model), os.fspath(out)
    check_output(out, [path, model, *inputs], error=RepairError)
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):  # found now, not after minutes of engine work
        raise RepairError(f"{safe_text(out)}: no folder {safe_text(folder)} to write it in")
    prof = _profile(model)
    t0 = time.perf_counter()
    res = _parsed(path, prof)
    # before any engine: what the app asks to offer Repair (an empty or random file, a model the file does not
    # fit, a blob without tokens, a token outside the vocabulary, media chunks, no build writing its layout)
    why = repair_problem(res, prof, tokens, model=model)
    if why is not None:
        raise RepairError(f"{path}: {why}")
    plan = _plan(res, path, tokens)
    name = _build(res, build)
    try:
        ctx = context_for(res, prof, plan.n_tokens)
    except ContextPlanError as e:
        raise RepairError(str(e)) from None
    swa_full = _swa_full(res, plan)
    if swa_full != ctx.ctx.swa_full:
        ctx = dataclasses.replace(ctx, ctx=dataclasses.replace(ctx.ctx, swa_full=swa_full))
    result = RepairResult(path, out, res.kind, res.layout.name, name, "",
                          {s: len(t) for s, t in plan.seqs.items()})
    result.seconds["parse"] = time.perf_counter() - t0
    scratch = contextlib.ExitStack()  # the folder goes on SIGTERM/SIGINT/SIGHUP too (fsutil), rebuilt copy and all
    work = scratch.enter_context(temporary_folder(tempfile.gettempdir(), "repair"))
    os.chmod(work, 0o700)  # it holds a copy of the state: the user's alone
    janitor().watch_dir(work)  # and after SIGKILL
    try:
        rebuilt = os.path.join(work, "rebuilt" + os.path.splitext(path)[1])
        t0 = time.perf_counter()
        try:
            result.writer = _rebuild(res, model, plan, ctx, name, rebuilt, timeout_s, prof)
        except (EngineError, EngineUnavailable) as e:
            raise RepairError(f"the engine failed rebuilding the state: {e}") from None
        result.seconds["rebuild"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        got = _parsed(rebuilt, prof)
        if (got.kind, got.layout.name) != (res.kind, res.layout.name):
            raise RepairError(f"the rebuilt state is a {got.kind} of layout {got.layout.name}, not a {res.kind} of "
                              f"{res.layout.name}: not written")
        if res.kind in PER_SEQUENCE_KINDS and restore_seq(got) != restore_seq(res):
            raise RepairError(f"the rebuilt state is sequence {restore_seq(got)}'s, the file sequence "
                              f"{restore_seq(res)}'s: not written")
        engine = "server" if result.writer == "llama-server's slot save" else "llama.cpp"
        try:
            v = Verifier(rebuilt, model, engine=engine, build=name, tokens=tokens, profile=prof,
                         timeout_s=timeout_s).run()
        except VerifyError as e:
            raise RepairError(f"the rebuilt state cannot be verified: {e}") from None
        result.seconds["verify"] = time.perf_counter() - t0
        v.file = out
        result.verify = v
        if v.verdict != "ok":
            raise RepairError(f"the rebuilt state does not verify ({v.verdict}: "
                              f"{v.reasons[0] if v.reasons else 'no reason'}): not written")
        with open(rebuilt, "rb") as fh:
            data = fh.read()
        try:
            write_atomic(out, data, "repair")
        except OSError as e:
            raise RepairError(f"{safe_text(out)}: cannot write: {e.strerror or e}") from None
        result.size = len(data)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        scratch.close()
        janitor().forget("dir", work)
    if not swa_full:
        result.notes.append("the file's SWA cache holds only the window: rebuilt without --swa-full, as it was saved")
    return result
