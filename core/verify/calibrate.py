"""The engine's own variation on a file's tokens: what verify's record limits are calibrated against.

A state a server wrote comes from prompt batches followed by one-token decodes; a re-prefill in one
batch rounds differently (other matrix shapes, thread splits, flash-attention chunks), and a trained
model amplifies that layer by layer. So besides the main prefill (the whole prompt in one batch)
the engine prefills the same tokens under other :data:`SCHEDULES`:

* ``tail``: the main prefill's state with its last :data:`TAIL` tokens decoded again one at a time;
* ``ubatch``: its first three quarters kept, the last quarter decoded in four chunks (another
  ubatch size).

Each keeps what the previous prefill left (``Schedule.keep``), so both cost a few decodes and about
a third of a prefill (the last tokens attend to the most). Every schedule's state is compared with
the main prefill's (:func:`measure`): per record the largest difference of any value and the RMS
over the cells the schedule changes give a :class:`~kvscope.core.verify.compare.RecordSpread`, and
the file's record differs only beyond ``margin x`` that, or ``margin x`` the largest relative
spread of its cache's records (``Calibration.limits``: a few schedules sample one record's
variation thinly). On a model whose schedules agree bit for bit (random weights) the spread is zero
and the fixed tolerance, the floor, decides as before.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from kvscope.core.reader.records import ParseResult
from kvscope.core.reader.source import ByteSource
from kvscope.core.verify.compare import MARGIN, Calibration, RecordKey, RecordSpread, Tolerance, compare_states
from kvscope.core.verify.prefill import PrefillPlan, Schedule

TAIL = 8  # tokens the tail schedule decodes one at a time (a server generates them so)
SCHEDULES = (Schedule("tail", keep=1.0, tail=TAIL), Schedule("ubatch", keep=0.75, pieces=4))
MIN_TOKENS = 4  # a shorter prompt has no schedule worth the name: the floor decides


def schedules_for(plan: PrefillPlan) -> list[Schedule]:
    """The schedules that feed the plan's tokens differently from one batch (none for a few tokens)."""
    if plan.n_tokens < MIN_TOKENS:
        return []
    return list(SCHEDULES)


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
            cal.notes.append(f"schedule {sched.name}: {len(bad)} record(s) and {cmp_.cell_problems} cell(s) do not "
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
