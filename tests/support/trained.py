"""The trained model in tests: its path, and REAL llama-server slot files written with it.

``trained_model()`` is the cached Gemma 3 270M (:mod:`kvscope.core.engine.trained_model`); when it
is missing the test fails with the command that fetches it (nothing here skips). ``trained_slot(spec)``
starts the pinned build's llama-server on it with the spec's settings (cache type, flash attention,
``--swa-full``, slot count), sends a greedy completion of a fixed prompt (short, or longer than the
512-token sliding window) to every slot, saves each slot and returns the files with their tokens.
The files are written once per test session into a temporary folder (removed at exit), so tests that
share a spec share the files. ``SPECS`` is the set the suites use: f16/q8_0/q4_0 caches, flash
attention on and off, a long prompt, ``--swa-full`` on and off, two slots, for both pinned builds.
Cost on 2 cores: a short spec about 10 s (the server's start included), a long one about 30 s.

``SharedVerifier`` verifies many damaged copies of one slot at the cost of one prefill and one
calibration: its :class:`SharedEngine` keeps the real libllama engine between verifications and
replays the prefills it already made for the same tokens and context (the restore of each file and
what follows it run for real).
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kvscope.core.engine.llamacpp import CtxParams, EngineSetupError
from kvscope.core.engine.server import ServerProcess
from kvscope.core.engine.trained_model import GEMMA3_270M, ModelError, ensure_model, installed_model, require_model
from kvscope.core.model.profile import ModelProfile
from kvscope.core.reader.records import ParseResult
from kvscope.core.verify.context_plan import ContextPlan
from kvscope.core.verify.engines import EngineUnavailable, LlamaCppEngine, Logits, RestoreReport, VerifyEngine
from kvscope.core.verify.prefill import WHOLE, PrefillPlan, Schedule
from kvscope.core.verify.run import Verifier, VerifyError

N_CTX = 1024  # the slot context of every server here: the long prompt fits, the SWA cache is the whole context
N_PREDICT = 8  # greedy tokens generated after the prompt (the last one is not in the saved cache)
SHORT_TOKENS = 96
LONG_TOKENS = 600  # longer than Gemma 3's 512-token window
_TEXT = ("the river runs past the old mill and under the stone bridge where the children wait for "
         "the evening light to fall across the water")
_WORDS = tuple(_TEXT.split(" "))
_DIR: Path | None = None
_CACHE: dict[SlotSpec, list[TrainedSlot]] = {}


@dataclass(frozen=True)
class SlotSpec:
    """The server settings one set of slot files is written with."""

    build: str = "b11434"
    cache_type: str = "f16"  # -ctk and -ctv
    flash_attn: bool = False
    swa_full: bool = False
    long: bool = False  # a prompt longer than the sliding window
    n_parallel: int = 1  # slots: every one gets a completion and is saved

    @property
    def name(self) -> str:
        return (f"{self.build}-{self.cache_type}-fa{int(self.flash_attn)}-swafull{int(self.swa_full)}"
                f"-{'long' if self.long else 'short'}-np{self.n_parallel}")

    def server_args(self) -> list[str]:
        args = ["-ctk", self.cache_type, "-ctv", self.cache_type, "-fa", "on" if self.flash_attn else "off",
                "--no-warmup", "-lv", "4"]
        return [*args, "--swa-full"] if self.swa_full else args


@dataclass(frozen=True)
class TrainedSlot:
    """One saved slot: the file, the slot it came from, its tokens (as the server holds them)."""

    spec: SlotSpec
    path: Path
    id_slot: int
    tokens: tuple[int, ...]
    n_saved: int


SPECS: tuple[SlotSpec, ...] = tuple(
    s for b in ("b11434", "0c1e5709") for s in (
        SlotSpec(b, "f16", flash_attn=False),
        SlotSpec(b, "q8_0", flash_attn=True),
        SlotSpec(b, "q4_0", flash_attn=True, swa_full=True),
        SlotSpec(b, "f16", flash_attn=True, long=True),
        SlotSpec(b, "f16", flash_attn=False, swa_full=True, long=True),
        SlotSpec(b, "f16", flash_attn=True, n_parallel=2),
    )
)


def trained_model() -> Path:
    """The trained GGUF, or a test failure naming the command that fetches it."""
    try:
        return require_model(GEMMA3_270M)
    except ModelError as e:
        pytest.fail(str(e))


def fetch_if_missing() -> None:
    """For a conftest: fetch the model once (about 15 s) when it is not cached; a failure is left to
    :func:`trained_model` to report in each test."""
    if installed_model(GEMMA3_270M) is None:
        with contextlib.suppress(ModelError):
            ensure_model(GEMMA3_270M)


def _folder() -> Path:
    global _DIR
    if _DIR is None:
        _DIR = Path(tempfile.mkdtemp(prefix="kvscope-trained-slots-"))
        atexit.register(shutil.rmtree, _DIR, True)
    return _DIR


def prompt_tokens(srv: ServerProcess, n: int, salt: int = 0) -> list[int]:
    """``n`` tokens of plain English from the server's own tokenizer (BOS first); ``salt`` varies the text."""
    c = srv.client()
    words = list(_WORDS[salt % len(_WORDS):]) + list(_WORDS)
    text = " ".join(words * (n // len(words) + 2))
    return c.tokenize(text)[:n]


def trained_slot(spec: SlotSpec) -> list[TrainedSlot]:
    """The slot files of ``spec`` (one per slot), written on the first call of the session."""
    if spec in _CACHE:
        return _CACHE[spec]
    model = trained_model()
    out: list[TrainedSlot] = []
    slot_dir = _folder() / spec.name
    slot_dir.mkdir(exist_ok=True)
    with ServerProcess(model, build=spec.build, n_ctx=N_CTX * spec.n_parallel, n_parallel=spec.n_parallel,
                       slot_dir=slot_dir, args=[*spec.server_args(), "--kv-unified" if spec.n_parallel > 1
                                                else "--no-kv-unified"], timeout_s=180.0) as srv:
        c = srv.client(timeout_s=600.0)
        for slot in range(spec.n_parallel):
            toks = prompt_tokens(srv, LONG_TOKENS if spec.long else SHORT_TOKENS, salt=slot)
            done = c.complete(toks, n_predict=N_PREDICT, id_slot=slot, temperature=0.0, return_tokens=True)
            name = f"slot{slot}.bin"
            saved = c.slot_save(slot, name)
            generated = [int(t) for t in done.get("tokens") or []]
            held = (toks + generated)[: int(saved["n_saved"])]
            out.append(TrainedSlot(spec, slot_dir / name, slot, tuple(held), int(saved["n_saved"])))
    _CACHE[spec] = out
    return out


# ---------------------------------------------------------------------------------------------
# verify many damaged copies of one slot at the cost of one calibration


@dataclass
class _Path:
    """One recorded prefill: its state, and the decodes that followed it (args -> scores, why)."""

    state: bytes
    decodes: list[tuple[tuple[int, int, int], tuple[Logits | None, str]]]


class SharedEngine(VerifyEngine):
    """A real :class:`LlamaCppEngine` kept across verifications, whose prefills (and the decodes that follow
    each, before the next restore) are recorded per (tokens, context, schedule) and replayed when a later
    verification asks for the same one. The engine is deterministic on those inputs (same build, threads
    and batch sizes), so a damaged copy of a slot is verified against the very prefill, calibration and
    continuations the healthy slot got; the restore of each file, and everything after it, runs for real.
    A prefill that was never recorded runs for real (a file whose tokens or context differ)."""

    kind = "llama.cpp"

    def __init__(self, model: str, ctx: CtxParams, build: str | None, timeout_s: float) -> None:
        self.inner = LlamaCppEngine(model, ctx, build=build, timeout_s=timeout_s)
        self.warnings = self.inner.warnings
        self.paths: dict[tuple[Any, ...], _Path] = {}
        self.real_prefills = self.replayed = 0
        self._replay: list[tuple[tuple[int, int, int], tuple[Logits | None, str]]] | None = None
        self._record: _Path | None = None
        self._engine_holds_whole: tuple[Any, ...] | None = None  # the WHOLE prefill the engine's state continues

    def describe(self) -> dict[str, Any]:
        return self.inner.describe()

    def restore(self, path: str, res: ParseResult, plan: ContextPlan) -> RestoreReport:
        self._replay = self._record = None
        self._engine_holds_whole = None
        return self.inner.restore(path, res, plan)

    def next_logits(self, seq: int, tokens_before: list[int], token: int) -> tuple[Logits | None, str]:
        key = (seq, len(tokens_before), token)
        if self._replay is not None:
            assert self._replay, "a replayed prefill was followed by a decode it was not followed by when recorded"
            want, got = self._replay.pop(0)
            assert want == key, (want, key)
            return got
        out = self.inner.next_logits(seq, tokens_before, token)
        if self._record is not None:
            self._record.decodes.append((key, out))
        return out

    def prefill(self, plan: PrefillPlan, ctx: ContextPlan, schedule: Schedule = WHOLE) -> bytes:
        base = (tuple((s, tuple(t)) for s, t in sorted(plan.seqs.items())), ctx.ctx, ctx.per_seq, ctx.dest_seq,
                ctx.flags)
        key = (*base, schedule)
        have = self.paths.get(key)
        if have is not None:
            self.replayed += 1
            self._record, self._replay = None, list(have.decodes)
            return have.state
        if schedule != WHOLE and self._engine_holds_whole != base:  # a schedule keeps the WHOLE prefill's prefix
            self.inner.prefill(plan, ctx, WHOLE)
        self._replay = None
        state = self.inner.prefill(plan, ctx, schedule)
        self.real_prefills += 1
        self._engine_holds_whole = base
        self._record = self.paths[key] = _Path(state, [])
        return state

    def kill(self) -> None:
        self.inner.kill()

    def close(self) -> None:
        """Kept open for the next verification: :meth:`shutdown` closes it."""

    def shutdown(self) -> None:
        self.inner.close()


class SharedVerifier(Verifier):
    """:class:`~kvscope.core.verify.run.Verifier` on the libllama engine, with one :class:`SharedEngine` per
    (build, context) from ``pool`` (the caller closes them with :func:`close_pool`)."""

    def __init__(self, *args: Any, pool: dict[tuple[Any, ...], SharedEngine], **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.pool = pool

    def _start(self, ctx: ContextPlan, build: str | None, prof: ModelProfile) -> VerifyEngine:
        if self.engine_kind != "llama.cpp" or self.lib_path is not None:
            return super()._start(ctx, build, prof)
        key = (build, ctx.ctx)
        eng = self.pool.get(key)
        if eng is None:
            try:
                eng = self.pool[key] = SharedEngine(self.model, ctx.ctx, build, self.timeout_s)
            except (EngineSetupError, EngineUnavailable) as e:  # as Verifier._start answers it
                raise VerifyError(str(e)) from None
        return eng


def close_pool(pool: dict[tuple[Any, ...], SharedEngine]) -> None:
    for eng in pool.values():
        eng.shutdown()
    pool.clear()
