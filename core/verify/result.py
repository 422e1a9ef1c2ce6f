"""The result of ``kvscope verify``: plain data with a JSON rendering, a text rendering and the verdict rule.

Verdicts:

* ``ok``: the file restores and every record matches the engine's prefill of the file's tokens
  (or, where nothing can be re-prefilled, the file restores cleanly: ``compared`` is false); or some
  records differ beyond the engine's variation by rounding-sized amounts only (each one's largest
  difference at most :data:`DRIFT_MAX_REL` of its largest value, finite, no cell missing or moved) while
  the continuation stays within the engine's own variation: a slot a server wrote in other batches,
  or continued over several turns (the records are named as differing); or most records differ from one
  cell on, with every earlier cell and the first layer matching and the continuation within the engine's
  variation: a chunk llama-server reused from another prefix (``--cache-reuse``);
* ``incompatible``: the build refuses the file's layout generation (the compatibility
  information names the builds that load it), or the engine is set up otherwise than the file needs
  (a user's llama-server with other slots, KV streams, V layout or cache types: ``setup_mismatch``
  names each setting) and refuses it;
* ``stale``: the file restores, but its K/V are not what the model computes for its own tokens
  (every record differs, or the file holds none of the cells the tokens give): written by
  another model or build, for another prefix, or after a botched restore (records whose bad cells
  are all zeroed rows are wiped, not stale: ``damaged``);
* ``diverges``: the file restores and its records are within the engine's own variation (or
  only some differ), but the model computes differently after the restore than after the fresh
  prefill: a continuation step beyond the calibration's limits (``behaviour``), named with its
  figures; the records that differ, if any, are named too;
* ``damaged``: anything else (a failed restore, a record missing, extra, non-finite or
  differing in some layers or cells), with the records and cells named.

A record ``differs`` only beyond the engine's own variation on the same tokens, measured by
prefilling them under other schedules (``calibrate``), with the fixed tolerances as the floor.

JSON keys fixed by the command's contract: ``engine`` {``kind``, ``build``}, ``restore`` {``ok``,
``message``}, ``records`` [{``section``, ``stream``, ``role``, ``il``, ``status``, ``max_abs``}],
``next_token`` {``max_abs_logit_diff``, ``same_argmax``, ``kl``}, ``verdict``; per record also
``max_rel``/``rms_rel`` and the engine's own ``spread_max_rel``/``spread_rms_rel``; ``behaviour``
(the continuation, step by step) and ``calibration`` (schedules, margin).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvscope.core.analysis.verdict import plural
from kvscope.core.textsafe import safe_text
from kvscope.core.verify.behaviour import Behaviour, spread_note
from kvscope.core.verify.comparison import Comparison, RecordCheck
from kvscope.core.verify.engines import Logits, RestoreReport

VERDICTS = ("ok", "damaged", "stale", "incompatible", "diverges")
# a record that differs by at most this share of its largest |value| has drifted (rounding, a quantum of a
# quantized cache, a re-rotated chunk), not been overwritten: swapped layers, another prompt's K/V, a flipped
# exponent or garbage differ by about its largest value or more
DRIFT_MAX_REL = 0.25
# cells llama-server reused from another prefix (--cache-reuse) differ by up to this share of a record's RMS
REUSED_MAX_RMS = 0.25


@dataclass
class NextToken:
    """The next token's scores after the restore against after the fresh prefill."""

    token: int | None
    seq: int
    max_abs_logit_diff: float | None = None
    same_argmax: bool | None = None
    kl: float | None = None  # KL(fresh || restored), nats
    argmax_restored: int | None = None
    argmax_fresh: int | None = None
    basis: str = "logits"
    skipped: str = ""  # why the step did not run

    def to_json(self) -> dict[str, Any]:
        return {"token": self.token, "seq": self.seq, "max_abs_logit_diff": _num(self.max_abs_logit_diff),
                "same_argmax": self.same_argmax, "kl": _num(self.kl), "argmax_restored": self.argmax_restored,
                "argmax_fresh": self.argmax_fresh, "basis": self.basis, "skipped": self.skipped or None}


def _num(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def _softmax(x: np.ndarray[Any, np.dtype[np.float64]]) -> np.ndarray[Any, np.dtype[np.float64]]:
    z = x - np.max(x)
    e = np.exp(z)
    out: np.ndarray[Any, np.dtype[np.float64]] = e / e.sum()
    return out


def compare_logits(restored: Logits, fresh: Logits, token: int, seq: int) -> NextToken:
    """max |Δ| of the logits (log-probabilities for a server), same argmax, KL(fresh || restored)."""
    out = NextToken(token, seq, basis=fresh.basis)
    if restored.values is not None and fresh.values is not None:
        a = restored.values.astype(np.float64)
        b = fresh.values.astype(np.float64)
        if not np.isfinite(a).all():
            out.max_abs_logit_diff, out.kl = math.inf, math.inf
        else:
            out.max_abs_logit_diff = float(np.max(np.abs(a - b)))
            p, q = _softmax(b), _softmax(a)
            with np.errstate(divide="ignore", invalid="ignore"):
                out.kl = float(np.sum(np.where(p > 0, p * (np.log(p) - np.log(np.maximum(q, 1e-300))), 0.0)))
        out.argmax_restored, out.argmax_fresh = int(np.argmax(a)), int(np.argmax(b))
    elif restored.top is not None and fresh.top is not None and restored.top and fresh.top:
        common = [t for t in fresh.top if t in restored.top]
        out.max_abs_logit_diff = max((abs(fresh.top[t] - restored.top[t]) for t in common), default=math.inf)
        floor = min(restored.top.values())
        p = np.exp(np.array(list(fresh.top.values())))
        p = p / p.sum()
        q = np.exp(np.array([restored.top.get(t, floor) for t in fresh.top]))
        q = q / q.sum()
        out.kl = float(np.sum(p * (np.log(p) - np.log(q))))
        out.argmax_restored = max(restored.top, key=lambda t: restored.top[t] if restored.top else 0.0)
        out.argmax_fresh = max(fresh.top, key=lambda t: fresh.top[t] if fresh.top else 0.0)
        out.basis += " (KL over the fresh top-K, renormalized)"
    else:
        out.skipped = "the two scores are not comparable"
        return out
    out.same_argmax = out.argmax_restored == out.argmax_fresh
    return out


@dataclass
class VerifyResult:
    """Everything verify found; ``to_json()`` for the command line and the app."""

    file: str
    kind: str
    layout: str
    model: str
    size: int | None = None  # bytes of the file verify read (its private copy)
    sha256: str | None = None  # their sha256 (None above kvscope.core.fsutil.SHA256_MAX_BYTES): which file it is
    engine: dict[str, Any] = field(default_factory=dict)
    context: dict[str, Any] = field(default_factory=dict)
    restore: RestoreReport | None = None
    prefill: dict[str, Any] = field(default_factory=dict)
    comparison: Comparison | None = None
    next_token: NextToken | None = None
    behaviour: Behaviour | None = None  # the continuation after the restore against after the prefill
    verdict: str = "damaged"
    reasons: list[str] = field(default_factory=list)
    compatibility: list[dict[str, Any]] = field(default_factory=list)
    findings: list[dict[str, Any]] = field(default_factory=list)  # the reader's errors and warnings
    notes: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    cancelled: bool = False
    input_changed: str | None = None  # the path no longer names the file verify read (replaced, rewritten)
    reuse: dict[str, Any] | None = None  # llama-server's reuse of the restored slot (core.verify.reuse_measure)
    # how the engine is set up otherwise than the file needs (a llama-server's slots, streams, V layout, cache
    # types), one line per setting: with a failed restore, the verdict is ``incompatible``, not ``damaged``
    setup_mismatch: list[str] = field(default_factory=list)

    @property
    def compared(self) -> bool:
        return self.comparison is not None

    def damage(self) -> list[dict[str, Any]]:
        """The records and cells that are not right, one entry each."""
        out: list[dict[str, Any]] = []
        if self.comparison is None:
            return out
        for r in self.comparison.bad_records():
            out.append({"section": r.section, "stream": r.stream, "role": r.role, "il": r.il, "status": r.status,
                        "first_cell": r.first_cell, "n_bad_cells": r.n_bad_cells, "note": r.note})
        for c in self.comparison.cells:
            if c.missing or c.extra or c.position_differs:
                out.append({"section": c.section, "stream": c.stream, "cells_missing": c.missing,
                            "cells_extra": c.extra, "position_differs": c.position_differs,
                            "first_missing": c.first_missing, "first_extra": c.first_extra})
        return out

    def to_json(self) -> dict[str, Any]:
        recs = self.comparison.records if self.comparison is not None else []
        restore = self.restore.to_json() if self.restore is not None else {"ok": None, "message": "not run"}
        return {
            "file": self.file, "size": self.size, "sha256": self.sha256, "kind": self.kind, "layout": self.layout,
            "model": self.model,
            "engine": self.engine, "context": self.context, "restore": restore, "prefill": self.prefill,
            "compared": self.compared,
            "records": [_record_json(r) for r in recs],
            "cells": [c.to_json() for c in self.comparison.cells] if self.comparison is not None else [],
            "tolerance": self.comparison.tolerance.to_json() if self.comparison is not None else None,
            "next_token": self.next_token.to_json() if self.next_token is not None else None,
            "behaviour": self.behaviour.to_json() if self.behaviour is not None else None,
            "calibration": (self.comparison.calibration.to_json() if self.comparison is not None
                            and self.comparison.calibration is not None else None),
            # under ``ok`` what differs has drifted (rounding-sized, the continuation inside): not damage
            "verdict": self.verdict, "reasons": list(self.reasons),
            "damage": self.damage() if self.verdict != "ok" else [],
            "drifted": self.damage() if self.verdict == "ok" else [],
            "compatibility": self.compatibility, "findings": self.findings, "notes": list(self.notes),
            "seconds": {k: round(v, 4) for k, v in self.seconds.items()}, "cancelled": self.cancelled,
            "input_changed": self.input_changed, "reuse": self.reuse, "setup_mismatch": list(self.setup_mismatch),
        }


def _record_json(r: RecordCheck) -> dict[str, Any]:
    d = r.to_json()
    for k in ("max_abs", "max_rel", "rms_rel", "cell_rms_rel", "spread_max_rel", "spread_rms_rel", "limit_max_abs",
              "limit_rms_rel"):
        d[k] = _num(d[k])
    return d


def decide(res: VerifyResult, incompatible: bool, reader_errors: int) -> None:
    """Set ``verdict`` and ``reasons`` from the steps' outcomes."""
    r, cmp_ = res.restore, res.comparison
    restored = r is not None and r.ok
    reasons = res.reasons
    if incompatible and not restored and res.setup_mismatch:
        res.verdict = "incompatible"
        where = res.engine.get("url") or res.engine.get("kind")
        reasons.append(f"the engine ({where}) is set up otherwise than the file needs, so it refuses it: "
                       f"{r.message if r else 'not restored'}")
        reasons.extend(res.setup_mismatch)
        reasons.append("run the server with the file's settings (or verify with kvscope's own server: "
                       "--engine server without --server)")
        return
    if incompatible and not restored:
        res.verdict = "incompatible"
        reasons.append(f"{res.engine.get('kind')} {res.engine.get('build') or ''}".strip()
                       + f" cannot load layout {res.layout}: {r.message if r else ''}")
        can = [f"{c['generation']}" + (f" (llama.cpp {c['build']})" if c.get("build") else " (no pinned build)")
               for c in res.compatibility if c.get("loads")]
        reasons.append("layouts that load it: " + (", ".join(can) if can else "none kvscope knows"))
        mine = next((c for c in res.compatibility if c.get("generation") == res.engine.get("writes")), None)
        if mine is not None and mine.get("migratable"):
            reasons.append(f"`kvscope rewrite --layout {mine['generation']}` migrates it exactly for this build")
        return
    if cmp_ is None:
        failed = res.prefill.get("failed")
        res.verdict = "ok" if restored and not reader_errors and not failed else "damaged"
        if not restored:
            reasons.append(f"the restore failed: {r.message if r else 'not run'}")
            if r is not None and r.engine_fault:
                reasons.append(f"llama.cpp's own failure: {r.engine_fault}")
        elif failed:
            reasons.append(f"the re-prefill of {_whose(res)} failed: {failed}")
        elif reader_errors:
            reasons.append(f"the reader found {reader_errors} error(s) in the file")
        else:
            reasons.append("the file restores; its K/V were not compared (nothing to re-prefill)")
        return
    bad = cmp_.bad_records()
    file_cells = sum(c.n_file for c in cmp_.cells)
    common = sum(c.n_common for c in cmp_.cells)
    # a record whose bad cells are all zeroed rows was wiped, not written for another prefix: damage, never stale
    structural = [b for b in bad if b.status in ("missing", "extra", "nonfinite")
                  or (b.n_zero_cells and b.n_zero_cells == b.n_bad_cells)]
    every_differs = bool(cmp_.records) and len(bad) == len(cmp_.records) and not structural
    beh = res.behaviour
    diverging = restored and beh is not None and beh.diverges
    if restored and not bad and not cmp_.cell_problems:
        if diverging:
            assert beh is not None
            res.verdict = "diverges"
            reasons.append(beh.summary())
            reasons.append(f"all {len(cmp_.records)} records match the engine's prefill of {_whose(res)}"
                           + (" within its own variation" if cmp_.calibration is not None else "")
                           + ": what differs is not in the records kvscope compares")
            for note in _partial_notes(res):
                reasons.append(note)
            return
        res.verdict = "ok"
        reasons.append(f"all {len(cmp_.records)} records match the engine's prefill of {_whose(res)}"
                       + (" within its own variation" if cmp_.calibration is not None else ""))
        if beh is not None and not beh.skipped:
            reasons.append(beh.summary())
        return
    if restored and _drifted(bad, structural, cmp_, beh):
        assert beh is not None
        res.verdict = "ok"
        worst = max((b.max_rel or 0.0) for b in bad)
        names = ", ".join(f"layer {b.il} {b.role.upper()}" for b in bad[:6]) + (" ..." if len(bad) > 6 else "")
        reasons.append(f"{plural(len(bad), 'record')} of {len(cmp_.records)} differ beyond the engine's own variation "
                       f"({names}), by rounding-sized amounts only (largest difference {worst:.3g} of a record's "
                       "largest value), and the continuation stays within the engine's own variation: the slot "
                       "computes what a fresh prefill does. Cells differ so when a server wrote the slot in other "
                       "batches or continued it over several turns")
        reasons.append(beh.summary())
        return
    reused = _reused_from(bad, structural, cmp_, beh) if restored else None
    if reused is not None:
        assert beh is not None
        res.verdict = "ok"
        reasons.append(f"the cells from index {reused} on differ in {len(bad)} of {len(cmp_.records)} records while "
                       "every earlier cell and the first layer match and the continuation stays within the engine's "
                       "own variation: those cells' K/V were computed after another prefix (a chunk llama-server "
                       "reused and shifted with --cache-reuse), as the server itself computes with them")
        reasons.append(beh.summary())
        return
    if restored and (every_differs or (not structural and common == 0 and sum(c.n_fresh for c in cmp_.cells) > 0)):
        res.verdict = "stale"
        if common == 0:
            reasons.append("the file holds none of the cells its tokens give "
                           f"({plural(file_cells, 'cell')} in the file)")
        else:
            reasons.append(f"every one of the {len(cmp_.records)} records differs from what the model computes for "
                           "the file's own tokens: another model, build or prefix wrote these K/V")
        return
    res.verdict = "damaged"
    if not restored:
        reasons.append(f"the restore failed: {r.message if r else 'not run'}")
    elif diverging and beh is not None:
        reasons.append(beh.summary())
    if r is not None and r.engine_fault:
        reasons.append(f"llama.cpp's own failure: {r.engine_fault}")
    for b in bad[:12]:
        where = f"{b.section}" + (f" stream {b.stream}" if b.stream is not None else "")
        cell = ""
        if b.first_cell:
            cell = ", first bad cell " + ", ".join(f"{k} {v}" for k, v in b.first_cell.items())
        reasons.append(f"layer {b.il} {b.role.upper()} ({where}): {b.status}{cell}"
                       + (f" ({b.note})" if b.note else ""))
    if len(bad) > 12:
        reasons.append(f"... and {len(bad) - 12} more records")
    for c in cmp_.cells:
        if c.missing or c.extra:
            reasons.append(f"{c.section}" + (f" stream {c.stream}" if c.stream is not None else "")
                           + f": {c.missing} cell(s) missing, {c.extra} extra")


def _drifted(bad: list[RecordCheck], structural: list[RecordCheck], cmp_: Comparison, beh: Behaviour | None) -> bool:
    """Records that differ, all by rounding-sized amounts (:data:`DRIFT_MAX_REL`), with every cell in place and
    a continuation measured within the engine's own variation."""
    if not bad or structural or cmp_.cell_problems or beh is None or beh.skipped or beh.diverges or not beh.steps:
        return False
    return all(b.status == "differs" and b.max_rel is not None and b.max_rel <= DRIFT_MAX_REL
               and not b.n_zero_cells and "cut short" not in (b.note or "") for b in bad)


def _reused_from(bad: list[RecordCheck], structural: list[RecordCheck], cmp_: Comparison,
                 beh: Behaviour | None) -> int | None:
    """The first cell of a chunk computed after another prefix, or None: most records differ, each from that cell
    on (every earlier cell matches) by a modest RMS (:data:`REUSED_MAX_RMS`), the first layer's records match (a
    token's layer-0 K/V depend on it and its position alone), every cell is in place and the continuation is
    within the engine's own variation. llama-server's ``--cache-reuse`` writes such slots: it shifts a chunk of
    an earlier prompt to its new position and keeps its K/V, computed after the earlier prefix."""
    if (not bad or structural or cmp_.cell_problems or beh is None or beh.skipped or beh.diverges or not beh.steps
            or 2 * len(bad) < len(cmp_.records)):
        return None
    firsts: list[int] = []
    for b in bad:
        cell = b.first_cell or {}
        first = cell.get("index", cell.get("pos"))
        if (b.status != "differs" or b.rms_rel is None or b.rms_rel > REUSED_MAX_RMS or b.n_zero_cells
                or "cut short" in (b.note or "") or not isinstance(first, int)):
            return None
        firsts.append(first)
    layers = [r.il for r in cmp_.records if r.il is not None]
    if not layers or any(r.status != "match" for r in cmp_.records if r.il == min(layers)):
        return None
    return min(firsts) if min(firsts) > 0 else None


def _whose(res: VerifyResult) -> str:
    """Whose tokens the re-prefill decoded: the file's, or those the caller gave (``--tokens``, a blob)."""
    return "the tokens given" if res.prefill.get("tokens_given") else "the file's tokens"


def _partial_notes(res: VerifyResult) -> list[str]:
    """Why the restored state can lack what the prefill holds: a partial (PARTIAL_ONLY) per-sequence state."""
    flags = int((res.context or {}).get("flags") or 0)
    if flags & 1:
        return ["the file is a partial per-sequence state (LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY): restored alone it "
                "holds only the part llama.cpp saves with that flag, not the rest of the sequence's memory"]
    return []


def result_text(res: VerifyResult) -> str:
    """A few lines for the terminal."""
    eng = res.engine
    lines = [f"{res.file}: {res.kind}, layout {res.layout}",
             f"engine: {eng.get('kind')}" + (f" {eng.get('build')}" if eng.get("build") else "")
             + (f" ({eng.get('reason')})" if eng.get("reason") else "")]
    if res.restore is not None:
        lines.append(f"restore: {'ok' if res.restore.ok else 'FAILED'}: {res.restore.message}")
    if res.comparison is not None:
        c = res.comparison.counts()
        lines.append("records: " + ", ".join(f"{v} {k}" for k, v in c.items() if v))
    elif res.prefill.get("reason"):
        lines.append(f"records: not compared: {res.prefill['reason']}")
    nt = res.next_token
    if nt is not None:
        if nt.skipped:
            lines.append(f"next token: {nt.skipped}")
        else:
            lines.append(f"next token {nt.token}: max |dlogit| {nt.max_abs_logit_diff:.4g}, same argmax "
                         f"{nt.same_argmax}, KL {nt.kl:.3g}" if nt.max_abs_logit_diff is not None and nt.kl is not None
                         else f"next token {nt.token}: same argmax {nt.same_argmax}")
            spread = spread_note(res.behaviour.to_json() if res.behaviour is not None else None)
            if nt.same_argmax is False and spread:
                lines[-1] += f" ({spread})"
    b = res.behaviour
    if b is not None and not b.skipped and b.steps:
        kls = [x.kl for x in b.steps if x.kl is not None]
        worst = "inf" if kls and not math.isfinite(max(kls)) else f"{max(kls):.3g}" if kls else "?"
        lines.append(f"continuation: {len(b.steps)} steps, largest KL {worst}; the engine's own: KL {b.spread_kl:.3g}, "
                     f"max |dlogit| {b.spread_max_abs:.3g} (limits KL {b.limit_kl:.3g}, max |dlogit| "
                     f"{b.limit_max_abs:.3g})")
    if res.reuse is not None:
        lines.append(f"reuse: {res.reuse['line']}")
    lines.append(f"verdict: {res.verdict}")
    lines += [f"  {r}" for r in res.reasons]
    lines += [f"note: {n}" for n in res.notes]
    # every line holds text from the file, llama.cpp's log or a server: one visible line each, no escapes
    return "\n".join(safe_text(ln) for ln in lines) + "\n"
