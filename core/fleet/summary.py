"""The summary of a scan, kept as results stream past: counts and the worst files, in bounded memory.

:class:`Summary` adds one result at a time (``add``) and keeps counters (files by status, kind,
layout generation, verdict, target compatibility, findings by severity and code) and the
:data:`WORST` worst files in a heap, never the results themselves. Worst first means: a file the
scan could not read (its worker died, an I/O error), then damaged files (most errors first),
files that will not load in the target generation and cannot be migrated, suspicious ones, and
those whose migration the memory core has to decide.

:class:`Summary` also counts the parsed files whose tensor values were not scanned (``scan`` without
``--stats``): :func:`format_summary` says so, since their verdicts do not weigh NaN/Inf or zero rows.

:func:`format_line` is the text line of one result; :func:`format_summary` the closing lines;
:func:`exit_code` the command's status (0 clean, 1 something needs attention).
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Callable
from typing import Any

from kvscope.core.analysis.verdict import NOT_SCANNED
from kvscope.core.findings import SEVERITY_RANK
from kvscope.core.textsafe import plural, safe_text

WORST = 10
REASON_CHARS = 160

# how bad a result is (higher: listed first); 0 is not listed among the worst
_RANK_STATUS = {"error": 60, "unreadable": 50}
_RANK_VERDICT = {"damaged": 40, "newer": 25, "suspicious": 20}
_RANK_TARGET = {"not migratable": 30, "unknown": 10}


def badness(r: dict[str, Any]) -> tuple[int, int, int]:
    """(rank, errors, warnings) of a result; rank 0: nothing to report."""
    rank = _RANK_STATUS.get(r["status"], 0)
    if r["status"] == "parsed":
        rank = max(_RANK_VERDICT.get(str(r.get("verdict")), 0),
                   _RANK_TARGET.get(str((r.get("target") or {}).get("status")), 0))
    f = r.get("findings") or {}
    return rank, int(f.get("error", 0)), int(f.get("warning", 0))


def _why(r: dict[str, Any]) -> str:
    if r["status"] != "parsed":
        return str(r.get("reason", ""))
    tgt = r.get("target") or {}
    if r.get("verdict") in ("damaged", "newer", "suspicious") or not tgt:
        return f"{r.get('verdict')}: {r.get('verdict_reason', '')}"
    return f"{_target_name(tgt)}: {tgt['status']}: {tgt.get('reason', '')}"


class Summary:
    """Counters over a stream of scan results (see the module docstring)."""

    def __init__(self, target: str | None = None, worst: int = WORST) -> None:
        self.target = target
        self.files = 0
        self.status: Counter[str] = Counter()
        self.kinds: Counter[str] = Counter()
        self.layouts: Counter[str] = Counter()
        self.verdicts: Counter[str] = Counter()
        self.targets: Counter[str] = Counter()
        self.not_reused = 0  # slot files the target's llama-server restores but will not reuse
        self.findings: Counter[str] = Counter()
        self.codes: Counter[str] = Counter()
        self.worst_severity: str | None = None
        self.files_with_errors = 0
        self.values_not_scanned = 0  # parsed files whose tensor values were not scanned (no --stats)
        self.workers_lost = 0
        self._keep = worst
        self._heap: list[tuple[tuple[int, int, int], int, str, str, str]] = []
        self._tie = itertools.count()

    def add(self, r: dict[str, Any]) -> None:
        self.files += 1
        self.status[r["status"]] += 1
        if r["status"] == "error" and str(r.get("reason", "")).startswith("worker died"):
            self.workers_lost += 1
        if r["status"] == "parsed":
            self.kinds[r["kind"]] += 1
            self.layouts[r["layout"]] += 1
            self.verdicts[r.get("verdict") or "?"] += 1
            self.findings.update({k: v for k, v in r["findings"].items() if v})
            self.codes.update(r["codes"])
            self.values_not_scanned += r.get("values_scanned") is False
            if r.get("target"):
                self.targets[r["target"]["status"]] += 1
                self.not_reused += bool((r["target"].get("server") or {}).get("wasted"))
        elif r["status"] == "skipped":
            self.verdicts["not_state"] += 1
        w = r.get("worst")
        if w and (self.worst_severity is None or SEVERITY_RANK[w] > SEVERITY_RANK[self.worst_severity]):
            self.worst_severity = str(w)
        if w == "error":
            self.files_with_errors += 1
        bad = badness(r)
        if bad[0]:
            # a min-heap of the worst: the least bad (and, at equal badness, the last path) goes first
            key = (bad, -next(self._tie), str(r["path"]), str(r["status"]), _why(r)[:REASON_CHARS])
            if len(self._heap) < self._keep:
                heapq.heappush(self._heap, key)
            elif key > self._heap[0]:
                heapq.heapreplace(self._heap, key)

    def worst_files(self) -> list[dict[str, Any]]:
        """The worst files, worst first (see the module docstring)."""
        return [{"path": p, "status": s, "why": why, "errors": b[1], "warnings": b[2]}
                for b, _, p, s, why in sorted(self._heap, reverse=True)]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "files": self.files,
            "status": dict(self.status),
            "kinds": dict(self.kinds),
            "layouts": dict(self.layouts),
            "verdicts": dict(self.verdicts),
            "findings": dict(self.findings),
            "codes": dict(self.codes),
            "worst": self.worst_severity,
            "files_with_errors": self.files_with_errors,
            "values_not_scanned": self.values_not_scanned,
            "workers_lost": self.workers_lost,
            "worst_files": self.worst_files(),
        }
        if self.target is not None:
            out["target"] = {"generation": self.target, **{k: self.targets.get(k, 0) for k in
                                                            ("loads", "migratable", "unknown", "not migratable")},
                             "restore_not_reused": self.not_reused}
        return out


def summarise(results: list[dict[str, Any]], target: str | None = None) -> dict[str, Any]:
    """The summary of a list of results (the streaming :class:`Summary` over it)."""
    s = Summary(target)
    for r in results:
        s.add(r)
    return s.to_json()


def _target_name(t: dict[str, Any]) -> str:
    """The target's generation, or with ``scan --target RELEASE`` the release and the layout it reads the file as."""
    if t.get("release"):
        return f"{t['release']}" + (f" ({t['generation']})" if t.get("generation") else "")
    return str(t["generation"])


def _target_text(t: dict[str, Any]) -> str:
    text = f"{_target_name(t)}: {t['status']}"
    if t["status"] == "migratable":
        text += f" (refused as it is: {t.get('answer', '')})"
    elif t["status"] != "loads" and t.get("reason"):
        text += f": {t['reason']}"
    srv = t.get("server")
    if srv:
        if srv["restore"] == "refuses":
            text += f"; llama-server {srv['build']} refuses it"
        elif srv["reused_tokens"] is not None:
            text += (f"; llama-server {srv['build']} {'restores, ' if srv['restore'] == 'loads' else ''}reuses "
                     f"{srv['reused_tokens']}/{srv['restored_tokens']} tokens")
            if srv["swa_full_reused_tokens"] != srv["reused_tokens"]:
                text += f" (--swa-full: {srv['swa_full_reused_tokens']})"
    return text


def format_line(r: dict[str, Any], rel: str) -> str:
    """One result as a text line; ``rel`` is the file's path relative to SOURCE."""
    rel = safe_text(rel)
    if r["status"] != "parsed":
        return f"{r['status']:10s} {rel}: {safe_text(str(r.get('reason', '')))}"
    f = r["findings"]
    seqs = ",".join(f"{k}:{v}" for k, v in r["sequences"].items()) or "-"
    mark = "ERROR" if f["error"] else ("warn" if f["warning"] else "ok")
    line = (f"{mark:10s} {rel}: {r['kind']} {r['layout']} [{'+'.join(r['sections']) or '-'}] seqs {seqs} "
            f"tokens {r['n_tokens']} | {plural(f['error'], 'error')}, {plural(f['warning'], 'warning')}"
            + (f" ({', '.join(r['codes'])})" if r["codes"] else ""))
    if r.get("target"):
        line += " | " + safe_text(_target_text(r["target"]))
    return line


def _counts(c: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(c.items()))


def format_summary(s: dict[str, Any], display: Callable[[str], str] | None = None) -> str:
    """The closing lines: counts, then the worst files (their paths through ``display`` when given)."""
    parts = [f"{s['files']} files"] + [f"{v} {k}" for k, v in sorted(s["status"].items())]
    line = "summary: " + ", ".join(parts)
    for key, title in (("kinds", "kinds"), ("layouts", "layouts"), ("verdicts", "verdicts"),
                       ("findings", "findings")):
        if s.get(key):
            line += f" | {title}: {_counts(s[key])}"
    line += f" | files with errors: {s['files_with_errors']}"
    unscanned = int(s.get("values_not_scanned") or 0)
    if unscanned:
        every = unscanned == s["status"].get("parsed", 0)
        line += (f" | {NOT_SCANNED}{'' if every else ' in ' + plural(unscanned, 'file')} "
                 "(--stats scans them: NaN/Inf, zero rows)")
    if s.get("workers_lost"):
        line += f" | workers lost: {s['workers_lost']}"
    lines = [line] + [f"executor: {safe_text(e)}" for e in s.get("executor_events", ())]
    if s.get("not_scanned"):
        lines.append(f"not scanned: {s['not_scanned']} files (the executor died)")
    t = s.get("target")
    if t:
        lines.append(f"target {t['generation']}: {t['loads']} load, {t['migratable']} migratable, "
                     f"{t['not migratable']} not migratable, {t['unknown']} unknown"
                     + (f"; {plural(t['restore_not_reused'], 'slot')} "
                        f"restore{'s' if t['restore_not_reused'] == 1 else ''} but will not be reused by llama-server"
                        if t.get("restore_not_reused") else ""))
    if s.get("worst_files"):
        lines.append("worst files:")
        for w in s["worst_files"]:
            p = display(str(w["path"])) if display is not None else str(w["path"])
            lines.append(f"  {safe_text(p)}: {safe_text(w['why'])}")
    return "\n".join(lines)


def exit_code(s: dict[str, Any]) -> int:
    """0: nothing to act on; 1: a file has error findings, could not be read, or (with a target)
    will not load in the target and cannot be migrated exactly."""
    st = s["status"]
    bad_target = bool(s.get("target") and s["target"]["not migratable"])
    return 1 if s["files_with_errors"] or st.get("unreadable") or st.get("error") or bad_target else 0
