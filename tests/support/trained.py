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
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvscope.core.engine.server import ServerProcess
from kvscope.core.engine.trained_model import GEMMA3_270M, ModelError, ensure_model, installed_model, require_model

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
