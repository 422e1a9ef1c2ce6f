"""The engine's own variation on a file's tokens: what verify's record limits are calibrated against.

A state a server wrote comes from prompt batches followed by one-token decodes; a re-prefill in one
batch rounds differently (other matrix shapes, thread splits, flash-attention chunks), and a trained
model amplifies that layer by layer. So besides the main prefill (the whole prompt in one batch)
the engine prefills the same tokens under other :data:`SCHEDULES`:

* ``tail``: the main prefill's state with its last tokens decoded again one at a time, as a server decodes
  what it generates: a quarter of them, at least :data:`TAIL` and at most :data:`MAX_TAIL` (a slot continued
  over several turns holds every turn's generated tokens, not only the last 8);
* ``ubatch``: its first three quarters kept, the last quarter decoded in four chunks (another
  ubatch size);
* ``micro``: its first three quarters kept (as ``ubatch``: a sliding-window cache without ``--swa-full``
  cannot take back more), the last quarter decoded in chunks of :data:`MICRO` tokens (at most
  :data:`MICRO_PIECES` chunks), as a server started with a small ``-ub`` (or ``-b``) writes a slot: on a
  quantized cache those shapes round differently enough to move values into the neighbouring quantum,
  which one large batch never shows.

Each keeps what the previous prefill left (``Schedule.keep``), so all three cost some decodes and about
a third of a prefill (the last tokens attend to the most). Every schedule's state is compared with
the main prefill's (:func:`measure`): per record the largest difference of any value and the RMS
over the cells the schedule changes give a :class:`RecordSpread`.

The limits (:meth:`Calibration.record_limits`, which the comparison calls per record): a cell of
the file's record is bad beyond ``margin x`` the record's largest difference, or ``margin x`` the
largest relative difference of its cache's records (``Calibration.limits``: a few schedules sample
one record's variation thinly) times the record's largest value; the record differs beyond
``margin x`` the larger RMS likewise. The fixed tolerance (``comparison.Tolerance``) is the floor of
both. On a model whose schedules agree bit for bit (random weights) the spread is zero and the
floor decides as before.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvscope.core.reader.records import ParseResult
from kvscope.core.reader.source import ByteSource
from kvscope.core.textsafe import plural
from kvscope.core.verify.compare import compare_states
from kvscope.core.verify.comparison import Limits, RecordKey, Tolerance
from kvscope.core.verify.prefill import PrefillPlan, Schedule

TAIL = 8  # tokens the tail schedule decodes one at a time at least (a server generates them so)
MAX_TAIL = 64  # ... and at most (one decode call each)
MICRO = 16  # tokens per chunk of the micro schedule (a server's small -ub)
MICRO_PIECES = 32  # ... and at most this many chunks (a longer prompt gets longer chunks)
SCHEDULES = (Schedule("tail", keep=1.0, tail=TAIL), Schedule("ubatch", keep=0.75, pieces=4))
MIN_TOKENS = 4  # a shorter prompt has no schedule worth the name: the floor decides
MARGIN = 3.0  # a calibrated record differs beyond this many times the engine's own variation


@dataclass(frozen=True)
class RecordSpread:
    """How much the engine's own schedules differ on one record: the largest difference of any value
    (absolute, and relative to the largest value), and the largest RMS difference over the cells a
    schedule changes (relative to the record's RMS)."""

    max_abs: float
    max_rel: float
    rms_rel: float


@dataclass
class Calibration:
    """Per record, the engine's own variation; the schedules it was measured with; the margin."""

    spreads: dict[RecordKey, RecordSpread] = field(default_factory=dict)
    schedules: list[dict[str, Any]] = field(default_factory=list)
    margin: float = MARGIN
    notes: list[str] = field(default_factory=list)

    def limits(self, key: RecordKey) -> tuple[RecordSpread | None, RecordSpread | None]:
        """(the record's own spread, the largest relative spread of the records of its cache: the same section,
        stream and role at any layer). A few schedules sample the engine's variation on one record thinly (a
        layer they leave bit for bit may still vary in a server's own schedule), so the limits take the
        larger of the two, relative to the record's own values."""
        own = self.spreads.get(key)
        pool = [v for k, v in self.spreads.items() if k[:3] == key[:3]]
        if not pool:
            return own, None
        return own, RecordSpread(0.0, max(v.max_rel for v in pool), max(v.rms_rel for v in pool))

    def record_limits(self, key: RecordKey, floor: Limits, ref_max: float) -> Limits:
        """The limits of record ``key``: the larger of ``floor`` (the fixed tolerance), ``margin x`` the record's
        own spread and ``margin x`` its cache's relative spread (times ``ref_max``, the record's largest
        |value|, for a cell's largest difference)."""
        own, pooled = self.limits(key)
        limit_max, limit_rms = floor.max_abs, floor.rms_rel
        if own is not None:
            limit_max, limit_rms = max(limit_max, self.margin * own.max_abs), max(limit_rms, self.margin * own.rms_rel)
        if pooled is not None:
            limit_max = max(limit_max, self.margin * pooled.max_rel * ref_max)
            limit_rms = max(limit_rms, self.margin * pooled.rms_rel)
        return Limits(limit_max, limit_rms, own.max_rel if own is not None else None,
                      own.rms_rel if own is not None else None)

    def to_json(self) -> dict[str, Any]:
        return {"schedules": list(self.schedules), "margin": self.margin, "records": len(self.spreads),
                "notes": list(self.notes)}


def schedules_for(plan: PrefillPlan) -> list[Schedule]:
    """The schedules that feed the plan's tokens differently from one batch (none for a few tokens): the tail
    sized to the prompt, the ubatch one, and the micro one where the last quarter is longer than a chunk."""
    n = plan.n_tokens
    if n < MIN_TOKENS:
        return []
    tail = Schedule("tail", keep=1.0, tail=min(MAX_TAIL, max(TAIL, n // 4)))
    out = [tail, *(s for s in SCHEDULES if s.name != "tail")]
    rest = n - int(n * 0.75)
    if rest > MICRO:
        out.append(Schedule("micro", keep=0.75, pieces=min(MICRO_PIECES, -(-rest // MICRO))))
    return out


def _merge(old: RecordSpread | None, new: RecordSpread) -> RecordSpread:
    if old is None:
        return new
    return RecordSpread(max(old.max_abs, new.max_abs), max(old.max_rel, new.max_rel), max(old.rms_rel, new.rms_rel))


def measure(main_res: ParseResult, main_src: ByteSource, states: list[tuple[Schedule, bytes]], *, per_seq: bool,
            limit_pos: int | None, tolerance: Tolerance, read: Callable[[bytes], ParseResult],
            cancel: Callable[[], bool] | threading.Event | None = None, margin: float = MARGIN) -> Calibration:
    """Per record, the largest variation any schedule's state shows against the main prefill's."""
    cal = Calibration(schedules=[s.to_json() for s, _ in states], margin=margin)
    spreads: dict[RecordKey, RecordSpread] = {}
    for sched, data in states:
        cmp_ = compare_states(read(data), ByteSource(data), main_res, main_src, per_seq=per_seq, limit_pos=limit_pos,
                              tolerance=tolerance, cancel=cancel)
        bad = [r for r in cmp_.records if r.status not in ("match", "differs")]
        if bad or cmp_.cell_problems:
            cal.notes.append(f"schedule {sched.name}: {plural(len(bad), 'record')} and "
                             f"{plural(cmp_.cell_problems, 'cell')} do not "
                             "pair with the main prefill's; they are left out of the calibration")
        for r in cmp_.records:
            if r.status not in ("match", "differs") or r.max_abs is None:
                continue
            key: RecordKey = (r.section, r.stream, r.role, r.il)
            spreads[key] = _merge(spreads.get(key), RecordSpread(r.max_abs, r.max_rel or 0.0, r.cell_rms_rel or 0.0))
    cal.spreads = spreads
    n_var = sum(1 for s in spreads.values() if s.max_abs > 0)
    cal.notes.append(f"{n_var} of {len(spreads)} records vary between the engine's own schedules")
    return cal
