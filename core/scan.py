"""Fleet scan: every state file under a directory, one JSON-able summary per file.

``scan_file`` is a pure function from a path (and an optional model path) to a plain dict, so
the per-file work can move to any process pool or distributed engine unchanged.
``scan_tree`` runs it over a directory in parallel processes and yields results as they finish.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from functools import lru_cache
from typing import Any

from kvscope.core.findings import SEVERITY_RANK


@lru_cache(maxsize=4)
def _profile(model: str) -> Any:
    from kvscope.core.model_profile import load_model_profile

    return load_model_profile(model)


def scan_file(path: str, model: str | None = None) -> dict[str, Any]:
    """Summarise one file: kind, layout, sequences, tokens and findings by severity (never raises)."""
    from kvscope.core.reader.parse import ReadError, read_state

    out: dict[str, Any] = {"path": path}
    try:
        out["size"] = os.path.getsize(path)
        res = read_state(path, profile=_profile(model) if model else None)
    except ReadError as e:
        return out | {"status": "unreadable", "reason": str(e)}
    except OSError as e:
        return out | {"status": "unreadable", "reason": e.strerror or str(e)}
    except Exception as e:  # a model that cannot be loaded, or a reader bug: report, never stop the scan
        return out | {"status": "error", "reason": f"{type(e).__name__}: {e}"}
    if res.kind == "unknown":
        return out | {"status": "skipped", "reason": res.findings[0].message if res.findings else "not a state file"}
    sev = Counter(f.severity for f in res.findings)
    seqs: dict[str, int] = {}
    named = {s for sec in res.sections for st in sec.streams if st.cells is not None for s in st.cells.seq_set()}
    own = res.header.get("seq_id", next(iter(named)) if len(named) == 1 else "?")  # a per-sequence state's seq
    for sec in res.sections:
        tables = [st.cells for st in sec.streams] if sec.kind == "kv" else [sec.cells]
        for t in tables:
            if t is None or not t.count:
                continue
            if not t.seq_ids.size:  # per-sequence recurrent meta names no sequence
                key = str(own)
                seqs[key] = max(seqs.get(key, 0), t.count)
            for s in t.seq_set():
                seqs[str(s)] = max(seqs.get(str(s), 0), int(t.cells_of_seq(s).size))
    worst = max((f.severity for f in res.findings), key=lambda s: SEVERITY_RANK[s], default=None)
    return out | {
        "status": "parsed",
        "kind": res.kind,
        "layout": res.layout.name,
        "confidence": round(res.layout.confidence, 3),
        "sections": [s.role for s in res.sections],
        "sequences": dict(sorted(seqs.items())),
        "n_tokens": len(res.tokens),
        "findings": {"error": sev.get("error", 0), "warning": sev.get("warning", 0), "info": sev.get("info", 0)},
        "codes": sorted({f.code for f in res.findings}),
        "worst": worst,
    }


def candidate_files(root: str) -> Iterator[str]:
    """Every regular file under ``root`` (sorted, hidden folders skipped); the reader decides what is state."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            p = os.path.join(dirpath, name)
            if os.path.isfile(p) and not os.path.islink(p):
                yield p


def scan_tree(root: str, model: str | None = None, jobs: int | None = None) -> Iterator[dict[str, Any]]:
    """Results of :func:`scan_file` for every file under ``root``, in completion order."""
    files = list(candidate_files(root))
    jobs = max(1, jobs or (os.cpu_count() or 1))
    if jobs == 1 or len(files) < 2:
        for p in files:
            yield scan_file(p, model)
        return
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures: list[Future[dict[str, Any]]] = [pool.submit(scan_file, p, model) for p in files]
        for fut in futures:
            yield fut.result()


def summarise(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts over a scan: files by status and kind, findings by severity and code, the worst file."""
    status = Counter(r["status"] for r in results)
    kinds = Counter(r["kind"] for r in results if r["status"] == "parsed")
    sev: Counter[str] = Counter()
    codes: Counter[str] = Counter()
    for r in results:
        if r["status"] == "parsed":
            sev.update({k: v for k, v in r["findings"].items() if v})
            codes.update(r["codes"])
    severities: list[str] = [str(r["worst"]) for r in results if r.get("worst")]
    worst = max(severities, key=lambda s: SEVERITY_RANK[s], default=None)
    return {
        "files": len(results),
        "status": dict(status),
        "kinds": dict(kinds),
        "findings": dict(sev),
        "codes": dict(codes),
        "worst": worst,
        "files_with_errors": sum(1 for r in results if r.get("worst") == "error"),
    }


def format_line(r: dict[str, Any], root: str) -> str:
    rel = os.path.relpath(r["path"], root)
    if r["status"] != "parsed":
        return f"{r['status']:10s} {rel}: {r.get('reason', '')}"
    f = r["findings"]
    seqs = ",".join(f"{k}:{v}" for k, v in r["sequences"].items()) or "-"
    mark = "ERROR" if f["error"] else ("warn" if f["warning"] else "ok")
    return (f"{mark:10s} {rel}: {r['kind']} {r['layout']} [{'+'.join(r['sections']) or '-'}] seqs {seqs} "
            f"tokens {r['n_tokens']} | {f['error']} errors, {f['warning']} warnings"
            + (f" ({', '.join(r['codes'])})" if r["codes"] else ""))


def format_summary(s: dict[str, Any]) -> str:
    parts = [f"{s['files']} files"] + [f"{v} {k}" for k, v in sorted(s["status"].items())]
    line = "summary: " + ", ".join(parts)
    if s["kinds"]:
        line += " | kinds: " + ", ".join(f"{k} {v}" for k, v in sorted(s["kinds"].items()))
    if s["findings"]:
        line += " | findings: " + ", ".join(f"{k} {v}" for k, v in sorted(s["findings"].items()))
    line += f" | files with errors: {s['files_with_errors']}"
    return line


def exit_code(s: dict[str, Any]) -> int:
    """0: no error findings; 1: some file has error findings (unreadable files count as errors)."""
    return 1 if s["files_with_errors"] or s["status"].get("unreadable") or s["status"].get("error") else 0


def scan_main(root: str, model: str | None, jobs: int | None, as_json: bool, write: Any) -> int:
    """Stream one line (or JSON object) per file, then the summary; returns the exit code."""
    import json

    results: list[dict[str, Any]] = []
    for r in scan_tree(root, model, jobs):
        results.append(r)
        write((json.dumps(r) if as_json else format_line(r, root)) + "\n")
    s = summarise(results)
    write((json.dumps({"summary": s}) if as_json else format_summary(s)) + "\n")
    return exit_code(s)

