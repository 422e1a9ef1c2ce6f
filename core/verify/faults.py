"""What llama.cpp itself gets wrong with a state, named as its own failure with the evidence (issue #20).

One source for ``kvscope verify`` (:class:`~kvscope.core.verify.engines.LlamaCppEngine`: a file restored
into a fresh context) and the lab's engine runs (:mod:`kvscope.core.lab.engine_lab`: a case restored into
a live context). Three failures, each from what the engine itself reports:

* :func:`abort_fault`: the engine died on the input with a ``GGML_ASSERT`` where a bad input must be
  refused (the assert line is the evidence);
* :func:`half_restored_fault`: the load was refused, yet the sequences it writes hold cells afterwards
  (llama.cpp's own ``seq_pos_min``/``seq_pos_max`` are the evidence): a failed load must leave them as
  they were (verify: empty; the lab: removed, which is what the failure containment of PR #27530 does,
  or unchanged);
* :func:`behaviour_fault`: the load succeeded with an input that llama.cpp wrote itself for those tokens,
  yet the model then computes other next-token logits than after a fresh prefill, beyond the engine's
  own variation (:func:`~kvscope.core.verify.behaviour.judge` decides; its figures are the evidence).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from kvscope.core.engine.session import short_line

EMPTY = "a failed load should leave the context as it was, empty"


class Judged(Protocol):
    """What :func:`behaviour_fault` reads of a :class:`~kvscope.core.verify.behaviour.Behaviour` (named as a
    protocol: ``behaviour`` imports the engines, which import this module)."""

    seq: int
    skipped: str

    @property
    def diverges(self) -> bool: ...

    def summary(self) -> str: ...


def assert_line(log: Iterable[str]) -> str | None:
    """The engine's ``GGML_ASSERT`` line, shortened (None when it died otherwise)."""
    return next((short_line(ln) for ln in log if "GGML_ASSERT" in ln), None)


def abort_fault(aborted: str | None, log: Iterable[str], what: str = "this file") -> str | None:
    """llama.cpp died on the input in an assert instead of refusing it (None: it did not abort, or died
    without an assert, e.g. killed for its memory: then the input may be to blame)."""
    if aborted is None:
        return None
    asserted = assert_line(log)
    return f"llama.cpp aborts on {what} ({asserted}) where it should refuse it" if asserted else None


def held_positions(held: Mapping[int, tuple[int, int]]) -> list[str]:
    """``sequence S holds positions LO..HI`` for every sequence holding a cell (``pos_max >= 0``)."""
    return [f"sequence {s} holds positions {lo}..{hi}" for s, (lo, hi) in sorted(held.items()) if hi >= 0]


def half_restored_fault(held: Mapping[int, tuple[int, int]], what: str = "the file", should: str = EMPTY,
                        extra: Sequence[str] = ()) -> str | None:
    """A refused load that left cells behind: ``held`` maps each sequence the load writes (and should have
    left without cells) to llama.cpp's own ``(seq_pos_min, seq_pos_max)`` after it; ``extra`` adds evidence
    (what else the failed load changed). None when every one of them is empty and nothing else is named."""
    left = [*held_positions(held), *extra]
    if not left:
        return None
    return (f"llama.cpp refused {what} but left it half-restored: after the failed load " + ", ".join(left)
            + f" ({should})")


def behaviour_fault(beh: Judged | None, after: str = "llama.cpp restored the input without an error") -> str | None:
    """A restore after which sequence ``beh.seq`` computes beyond the engine's own variation (None: within it,
    or not compared); ``after`` says what happened before."""
    if beh is None or beh.skipped or not beh.diverges:
        return None
    return (f"{after}, but sequence {beh.seq} then computes other logits than after a fresh prefill of its tokens: "
            f"{beh.summary()}")
