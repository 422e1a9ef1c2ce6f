"""The per-file scan every executor runs: a path (or an :class:`~.source.Entry`) in, a JSON-able dict out.

:func:`scan_file` is pure: it opens the file read-only, parses it, and summarises kind, layout,
sequences, tokens, findings by severity and the verdict (:mod:`kvscope.core.analysis.verdict`); with
``stats`` the tensor values are scanned first (NaN/Inf, zero rows: their findings count in the verdict, as
``kvscope inspect`` does by default), else the result says ``values_scanned: false``; with
``target`` also whether a build of that layout generation loads it and, if not, whether
``kvscope rewrite``/``migrate`` can convert it exactly (:func:`kvscope.core.analysis.compat.compatibility`),
and for a slot file what that build's llama-server does with it (``target.server``: restores or
refuses, and the tokens it would reuse, :mod:`kvscope.core.analysis.reuse`).
It never raises: an unreadable file, a file that changed while it was read, a model that cannot
be loaded or a reader bug each give a result with a ``status`` and a ``reason``. Results depend
on nothing but the file's bytes and the arguments, so every executor reports the same lines.
"""

from __future__ import annotations

from collections import Counter
from functools import lru_cache
from typing import Any

from kvscope.core.findings import SEVERITY_RANK
from kvscope.core.fleet.source import Entry, local_copy

# what the target check says, from best to worst
TARGET_STATUSES = ("loads", "migratable", "unknown", "not migratable")


@lru_cache(maxsize=4)
def _profile(model: str) -> Any:
    from kvscope.core.model.profile import load_model_profile

    return load_model_profile(model)


def scan_file(path: str, model: str | None = None, target: str | None = None, stats: bool = False) -> dict[str, Any]:
    """Summarise one file (see the module docstring); ``target`` is a layout generation name, ``stats``: scan
    the tensor values too."""
    from kvscope.core.reader.source import ByteSource, FileChangedError

    out: dict[str, Any] = {"path": path}
    try:
        src = ByteSource.open(path)
    except OSError as e:
        return out | {"status": "unreadable", "reason": e.strerror or str(e)}
    except ValueError as e:  # not a regular file
        return out | {"status": "unreadable", "reason": str(e)}
    try:
        out["size"] = src.size
        return out | _summarise(src, model, target, stats)
    except FileChangedError as e:
        return out | {"status": "unreadable", "reason": str(e)}
    except OSError as e:
        return out | {"status": "unreadable", "reason": e.strerror or str(e)}
    except Exception as e:  # a model that cannot be loaded, or a reader bug: report, never stop the scan
        return out | {"status": "error", "reason": f"{type(e).__name__}: {e}"}
    finally:
        src.close()


def scan_entry(entry: Entry, model: str | None = None, target: str | None = None,
               stats: bool = False) -> dict[str, Any]:
    """:func:`scan_file` of an entry of a walk (a remote one is copied to a local temporary file first)."""
    if entry.status != "file":  # a folder the walk did not enter
        return {"path": entry.ref, "status": entry.status, "reason": entry.reason}
    try:
        with local_copy(entry) as path:
            res = scan_file(path, model, target, stats)
    except Exception as e:  # the remote read failed
        return {"path": entry.ref, "status": "unreadable", "reason": f"{type(e).__name__}: {e}"}
    res["path"] = entry.ref
    return res


def _summarise(src: Any, model: str | None, target: str | None, stats: bool = False) -> dict[str, Any]:
    from kvscope.core.analysis.inspection import inspect_source

    profile = _profile(model) if model else None
    # the one pipeline (the target's table comes below); one scan thread: the executor runs a worker per core
    found = inspect_source(src, profile, compat=False, stats=stats, threads=1)
    res = found.result
    if not found.is_state:
        return {"status": "skipped", "reason": found.not_state_reason()}
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
    v = found.verdict
    out: dict[str, Any] = {
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
        "verdict": v.level,
        "verdict_reason": v.reason,
        "values_scanned": found.values_scanned,
    }
    if target is not None:
        out["target"] = target_check(res, profile, src, target, v.reason)
        has_gen = out["target"].get("generation") is not None  # a release kvscope has no layout for: no server
        out["target"]["server"] = server_reuse(res, profile, out["target"]) if has_gen else None
    src.check()
    return out


def server_reuse(res: Any, profile: Any, tgt: dict[str, Any]) -> dict[str, Any] | None:
    """What the target generation's llama-server does with a slot file (None for another kind):
    ``restore`` loads / refuses / unknown, and the predicted reuse at its defaults and with
    ``--swa-full`` (:mod:`kvscope.core.analysis.reuse`); ``wasted``: it restores but none is reused."""
    if res.kind != "seq_file":
        return None
    from kvscope.core.analysis.reuse import ServerSettings, predict_one
    from kvscope.core.pinned_builds import build_writing

    build = build_writing(str(tgt.get("generation")))
    loads = tgt.get("loads")
    refusal = str(tgt.get("answer")) if loads is False else None
    default, full = (predict_one(res, profile, ServerSettings(swa_full=f), build, refusal, loads)
                     for f in (False, True))
    restore = "unknown" if default.restores is None else ("loads" if default.restores else "refuses")
    return {"build": build, "restore": restore, "reason": default.reason if restore == "refuses" else "",
            "reused_tokens": default.reused_tokens, "reprocessed_tokens": default.reprocessed_tokens,
            "reuse_reason": default.reason, "fix": default.fix, "swa_full_reused_tokens": full.reused_tokens,
            "restored_tokens": default.restored_tokens, "wasted": default.wasted}


def target_check(res: Any, profile: Any, src: Any, target: str, damage: str) -> dict[str, Any]:
    """Whether a build of ``target`` (a layout generation, or a release: ``release`` and ``epochs`` say which)
    loads the parsed file, and whether it can be migrated exactly.

    ``status`` is one of :data:`TARGET_STATUSES`: ``loads``; ``migratable`` (``kvscope migrate``
    writes it exactly); ``not migratable`` (damaged, or the target layout cannot say everything
    the file holds: ``reason``); ``unknown`` (more than framing changes: the memory core decides
    when ``migrate`` runs, or the model is needed to tell).
    """
    from kvscope.core.analysis.compat import compatibility
    from kvscope.core.reader.layouts import generation_named

    gen = generation_named(target)
    if gen is None:  # a release (scan --target b10700): the generation it reads this file as
        from kvscope.core.analysis.release_answers import release_generation
        from kvscope.core.reader.releases import parse_release

        release = parse_release(target)
        name, why = release_generation(res, profile, release)
        rel = {"release": release.name, "epochs": [e.id for e in release.epochs]}
        if name is None:
            return rel | {"generation": None, "status": "unknown", "loads": None, "migratable": None, "reason": why}
        return rel | target_check(res, profile, src, name, damage)
    entry = next((c for c in compatibility(res, profile, data=src) if c.generation == gen.name), None)
    out: dict[str, Any] = {"generation": gen.name}
    if entry is None:
        return out | {"status": "unknown", "loads": None, "migratable": None,
                      "reason": f"no compatibility answer for layout {res.layout.name}"}
    out |= {"loads": entry.loads, "answer": entry.answer, "stage": entry.stage, "migratable": entry.migratable,
            "migration_missing": list(entry.migration_missing)}
    if res.n_errors:
        return out | {"status": "not migratable", "migratable": False, "reason": f"damaged: {damage}"}
    if entry.loads:
        return out | {"status": "loads", "reason": ""}
    if entry.loads is None:
        return out | {"status": "unknown", "reason": entry.answer}
    if entry.launch_env and entry.launch_answer == "loads":  # refused on a default launch only: say which loads it
        return out | {"status": "unknown", "reason": entry.answer}
    if entry.migratable:
        return out | {"status": "migratable", "reason": entry.answer}
    if entry.migratable is False:
        why = "missing: " + "; ".join(entry.migration_missing) if entry.migration_missing else entry.answer
        return out | {"status": "not migratable", "reason": why}
    why = entry.migration_missing[0] if entry.migration_missing else "not a framing change"
    return out | {"status": "unknown", "reason": f"{why}: the memory core decides (kvscope migrate tries it)"}
