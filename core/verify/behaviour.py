"""The model's behaviour after a restore against after a fresh prefill: a teacher-forced continuation.

After the fresh prefill of the file's tokens the engine generates ``steps`` tokens greedily, the
first being the next token (``--next-token``, default the file's last token); the restored state,
and every calibration schedule's state (``calibrate``), then decode the same tokens
(teacher-forced). At every step the distribution is compared with the fresh path's: KL(fresh ||
other), the largest logit difference (log-probability for a server), the overlap of the top-k
tokens and the argmax (:func:`figures`).

The schedules' own figures are the engine's variation. A step is beyond it when both its KL and its
largest logit difference exceed ``margin x`` the largest the schedules gave at any step, with fixed
floors (:data:`KL_FLOOR`, :data:`LOGIT_FLOOR`) for models whose schedules agree bit for bit; the
first such step makes verify's verdict ``diverges`` (:func:`judge`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from kvscope.core.textsafe import plural
from kvscope.core.verify.engines import Logits

STEPS = 8  # continuation tokens decoded on every path
TOP_K = 10  # the top tokens whose overlap is reported
MARGIN = 5.0  # a step diverges beyond this many times the schedules' own figures
KL_FLOOR = 1e-3  # nats: below this a KL is never a divergence (the schedules may agree bit for bit)
LOGIT_FLOOR = 0.05  # the same for the largest logit difference
F64A = npt.NDArray[np.float64]
NextLogits = Callable[[int, list[int], int], tuple[Logits | None, str]]  # engine.next_logits


@dataclass
class Figures:
    """One distribution against the fresh path's."""

    kl: float | None = None  # KL(fresh || other), nats
    max_abs: float | None = None  # the largest |logit difference| (log-probabilities for a server's top-K)
    top_k_overlap: float | None = None  # |top-k(fresh) & top-k(other)| / k
    argmax: int | None = None
    argmax_fresh: int | None = None
    basis: str = "logits"
    comparable: bool = True

    @property
    def same_argmax(self) -> bool | None:
        return None if self.argmax is None or self.argmax_fresh is None else self.argmax == self.argmax_fresh


def _softmax(x: F64A) -> F64A:
    e = np.exp(x - np.max(x))
    out: F64A = e / e.sum()
    return out


def _top(values: dict[int, float], k: int) -> set[int]:
    return set(sorted(values, key=lambda t: -values[t])[:k])


def figures(other: Logits, fresh: Logits, k: int = TOP_K) -> Figures:
    """KL, largest difference, top-k overlap and argmax of ``other`` against ``fresh``: full logits, or a
    server's top-K log-probabilities (KL over the fresh top-K, renormalized)."""
    out = Figures(basis=fresh.basis)
    if other.values is not None and fresh.values is not None:
        a, b = other.values.astype(np.float64), fresh.values.astype(np.float64)
        out.argmax, out.argmax_fresh = int(np.argmax(a)), int(np.argmax(b))
        if not np.isfinite(a).all():
            out.kl = out.max_abs = math.inf
            out.top_k_overlap = 0.0
            return out
        out.max_abs = float(np.max(np.abs(a - b)))
        p, q = _softmax(b), _softmax(a)
        with np.errstate(divide="ignore", invalid="ignore"):
            out.kl = max(0.0, float(np.sum(np.where(p > 0, p * (np.log(p) - np.log(np.maximum(q, 1e-300))), 0.0))))
        kk = min(k, a.size)
        ta, tb = set(np.argpartition(-a, kk - 1)[:kk].tolist()), set(np.argpartition(-b, kk - 1)[:kk].tolist())
        out.top_k_overlap = len(ta & tb) / kk
        return out
    if other.top and fresh.top:
        common = [t for t in fresh.top if t in other.top]
        out.max_abs = max((abs(fresh.top[t] - other.top[t]) for t in common), default=math.inf)
        floor = min(other.top.values())
        p = np.exp(np.array(list(fresh.top.values()), dtype=np.float64))
        p = p / p.sum()
        q = np.exp(np.array([other.top.get(t, floor) for t in fresh.top], dtype=np.float64))
        q = q / q.sum()
        out.kl = max(0.0, float(np.sum(p * (np.log(p) - np.log(q)))))
        kk = min(k, len(fresh.top), len(other.top))
        out.top_k_overlap = len(_top(fresh.top, kk) & _top(other.top, kk)) / kk if kk else None
        out.argmax = max(other.top, key=lambda t: other.top[t] if other.top else 0.0)
        out.argmax_fresh = max(fresh.top, key=lambda t: fresh.top[t] if fresh.top else 0.0)
        out.basis += " (KL over the fresh top-K, renormalized)"
        return out
    out.comparable = False
    return out


def argmax(lg: Logits) -> int | None:
    if lg.values is not None:
        return int(np.argmax(lg.values))
    if lg.top:
        top = lg.top
        return max(top, key=lambda t: top[t])
    return None


def greedy(next_logits: NextLogits, seq: int, before: list[int], first: int,
           n: int = STEPS) -> tuple[list[int], list[Logits], str]:
    """Decode ``first`` then ``n - 1`` greedy tokens after what ``seq`` holds: (tokens decoded, the
    distribution after each, why it stopped early or "")."""
    toks: list[int] = [first]
    out: list[Logits] = []
    for i in range(n):
        lg, why = next_logits(seq, before + toks[:i], toks[i])
        if lg is None:
            return toks[:i], out, why
        out.append(lg)
        nxt = argmax(lg)
        if i + 1 < n:
            if nxt is None:
                return toks[:i + 1], out, "no scores to pick the next token from"
            toks.append(nxt)
    return toks, out, ""


def forced(next_logits: NextLogits, seq: int, before: list[int], tokens: Sequence[int]) -> tuple[list[Logits], str]:
    """Decode ``tokens`` one at a time after what ``seq`` holds: the distribution after each, and why it
    stopped early (or "")."""
    out: list[Logits] = []
    for i, t in enumerate(tokens):
        lg, why = next_logits(seq, before + list(tokens[:i]), int(t))
        if lg is None:
            return out, why
        out.append(lg)
    return out, ""


def _num(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


@dataclass
class StepCheck:
    """One step: the token decoded, the restored distribution after it against the fresh one."""

    step: int
    token: int
    kl: float | None
    max_abs_logit_diff: float | None
    top_k_overlap: float | None
    same_argmax: bool | None
    argmax_restored: int | None
    argmax_fresh: int | None
    spread_kl: float | None  # the schedules' own figures at this step (largest over them)
    spread_max_abs: float | None
    beyond: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "token": self.token, "kl": _num(self.kl),
                "max_abs_logit_diff": _num(self.max_abs_logit_diff), "top_k_overlap": self.top_k_overlap,
                "same_argmax": self.same_argmax, "argmax_restored": self.argmax_restored,
                "argmax_fresh": self.argmax_fresh, "spread_kl": _num(self.spread_kl),
                "spread_max_abs": _num(self.spread_max_abs), "beyond": self.beyond,
                "kl_is_infinite": self.kl is not None and not math.isfinite(self.kl)}


@dataclass
class Behaviour:
    """The continuation compared step by step, and the limits the engine's own variation sets."""

    seq: int
    wanted: int = STEPS
    tokens: list[int] = field(default_factory=list)
    steps: list[StepCheck] = field(default_factory=list)
    schedules: list[str] = field(default_factory=list)
    basis: str = "logits"
    spread_kl: float = 0.0
    spread_max_abs: float = 0.0
    limit_kl: float = KL_FLOOR
    limit_max_abs: float = LOGIT_FLOOR
    margin: float = MARGIN
    skipped: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def first_beyond(self) -> StepCheck | None:
        return next((s for s in self.steps if s.beyond), None)

    @property
    def diverges(self) -> bool:
        return self.first_beyond is not None

    def summary(self) -> str:
        """One line for the verdict's reasons and the terminal."""
        if self.skipped:
            return f"behaviour: not compared ({self.skipped})"
        s = self.first_beyond
        worst = max(self.steps, key=lambda x: x.kl if x.kl is not None else -1.0, default=None)
        if s is None:
            n = plural(len(self.steps), "continuation step")
            if worst is None or worst.kl is None:
                return f"behaviour: {n} within the engine's own variation (KL not measured)"
            if worst.kl <= self.limit_kl:
                return (f"behaviour: {n} within the engine's own variation (largest KL {worst.kl:.3g}, limit "
                        f"{self.limit_kl:.3g})")
            # a step is beyond only when both its KL and its max |dlogit| are: a figure above its own limit
            # is never called within it
            wdl = worst.max_abs_logit_diff
            tail = (f"its max |dlogit| {wdl:.3g} is within its limit {self.limit_max_abs:.3g}" if wdl is not None
                    else "its max |dlogit| was not measured")
            wkl, lim = _apart(worst.kl, self.limit_kl)
            return (f"behaviour: no step of {n} beyond the engine's own variation on both figures: step "
                    f"{worst.step}'s KL {wkl} is above its limit {lim}, but {tail}")
        kl, lim_kl = ("inf", f"{self.limit_kl:.3g}") if s.kl is None or not math.isfinite(s.kl) else \
            _apart(s.kl, self.limit_kl)
        dl, lim_dl = (("inf", f"{self.limit_max_abs:.3g}") if s.max_abs_logit_diff is None
                      or not math.isfinite(s.max_abs_logit_diff) else _apart(s.max_abs_logit_diff, self.limit_max_abs))
        return (f"the restored state makes the model compute beyond the engine's own variation: step {s.step} "
                f"(after token {s.token}): KL {kl} (limit {lim_kl}), max |dlogit| {dl} (limit "
                f"{lim_dl}), top-{TOP_K} overlap {s.top_k_overlap}, same argmax {s.same_argmax}")

    def to_json(self) -> dict[str, Any]:
        first = self.first_beyond
        return {"seq": self.seq, "steps_wanted": self.wanted, "tokens": list(self.tokens),
                "steps": [s.to_json() for s in self.steps], "schedules": list(self.schedules), "basis": self.basis,
                "spread_kl": _num(self.spread_kl), "spread_max_abs": _num(self.spread_max_abs),
                "limit_kl": _num(self.limit_kl), "limit_max_abs": _num(self.limit_max_abs), "margin": self.margin,
                "floors": {"kl": KL_FLOOR, "max_abs_logit_diff": LOGIT_FLOOR}, "diverges": self.diverges,
                "first_step_beyond": first.step if first is not None else None, "skipped": self.skipped or None,
                "notes": list(self.notes)}


def spread_note(behaviour: dict[str, Any] | None, step: int = 0) -> str:
    """What the engine's own variation was at ``step`` of the continuation (``Behaviour.to_json()``), to show
    beside a different argmax: the schedules' largest KL there and the limit; "" when not measured."""
    if not isinstance(behaviour, dict):
        return ""
    steps = [s for s in behaviour.get("steps") or [] if isinstance(s, dict) and s.get("step") == step]
    spread, limit = (steps[0].get("spread_kl") if steps else None), behaviour.get("limit_kl")
    if not isinstance(spread, int | float) or not isinstance(limit, int | float):
        return ""
    return (f"the engine's own variation at that step: KL up to {spread:.3g} under other batch schedules, "
            f"limit {limit:.3g}")


def _apart(a: float, b: float) -> tuple[str, str]:
    """``a`` and ``b`` shown with the fewest significant digits (3 at least) that keep them apart: a figure
    above its limit never reads equal to it."""
    for digits in (3, 4, 5, 6, 8, 12):
        fa, fb = f"{a:.{digits}g}", f"{b:.{digits}g}"
        if fa != fb:
            break
    return fa, fb


def _finite_max(xs: list[float | None]) -> float:
    vals = [x for x in xs if x is not None and math.isfinite(x)]
    return max(vals, default=0.0)


def judge(seq: int, tokens: list[int], fresh: list[Logits], restored: list[Logits],
          schedules: dict[str, list[Logits]], *, margin: float = MARGIN, wanted: int = STEPS) -> Behaviour:
    """Every step of the restored continuation against the fresh one, limited by the schedules' figures."""
    out = Behaviour(seq, wanted, list(tokens), schedules=sorted(schedules), margin=margin)
    n = min(len(fresh), len(restored))
    per_step: list[list[Figures]] = [[figures(s[i], fresh[i]) for s in schedules.values() if i < len(s)]
                                     for i in range(n)]
    out.spread_kl = _finite_max([f.kl for fs in per_step for f in fs])
    out.spread_max_abs = _finite_max([f.max_abs for fs in per_step for f in fs])
    out.limit_kl = max(KL_FLOOR, margin * out.spread_kl)
    out.limit_max_abs = max(LOGIT_FLOOR, margin * out.spread_max_abs)
    for i in range(n):
        f = figures(restored[i], fresh[i])
        out.basis = f.basis
        if not f.comparable:
            out.skipped = "the two scores are not comparable"
            out.steps = []
            return out
        fs = per_step[i]
        chk = StepCheck(i, tokens[i], f.kl, f.max_abs, f.top_k_overlap, f.same_argmax, f.argmax, f.argmax_fresh,
                        max((x.kl for x in fs if x.kl is not None), default=None),
                        max((x.max_abs for x in fs if x.max_abs is not None), default=None))
        chk.beyond = (f.kl is not None and f.kl > out.limit_kl and f.max_abs is not None
                      and f.max_abs > out.limit_max_abs)
        out.steps.append(chk)
    if not schedules:
        out.notes.append("no calibration schedule ran: the limits are the fixed floors")
    return out
