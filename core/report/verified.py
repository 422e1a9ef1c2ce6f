"""A report's Verify result (``kvscope report --verify`` / ``--verify-json``): read, checked, and said verdict-first.

``--verify`` runs :mod:`kvscope.core.verify` (the CLI does, with verify's own options); ``--verify-json``
takes what an earlier ``kvscope verify --json`` printed: :func:`load_verify_json` reads it bounded and refuses
anything that is not such a result, :func:`check_same_file` refuses one about another file (its ``size`` and
``sha256``, the bytes verify read, against the file the report is about; its kind and layout too). Every
format then leads with :func:`verify_headline` and :func:`verify_lines`; report.json carries
:func:`verify_json` near its top.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from kvscope.core.report.model import ReportError

if TYPE_CHECKING:
    from kvscope.core.analysis.overview import Overview
    from kvscope.core.reader.records import ParseResult

MAX_VERIFY_JSON = 64 << 20  # bytes a verify --json file may hold (its records, cells and calibration: far less)
# the keys a verify --json result must hold, and of which JSON types (``None``: null allowed)
_SHAPE: dict[str, tuple[type | None, ...]] = {
    "file": (str,), "kind": (str,), "layout": (str,), "verdict": (str,), "reasons": (list,), "engine": (dict,),
    "restore": (dict,), "records": (list,), "next_token": (dict, None), "reuse": (dict, None),
}
SOURCE_RUN = "kvscope report --verify"  # report.json's verify.source when the report ran it


def load_verify_json(path: str) -> dict[str, Any]:
    """The ``kvscope verify --json`` result in ``path`` (at most :data:`MAX_VERIFY_JSON` bytes, a regular file);
    ReportError (one line) when it cannot be read, is not JSON, or is not such a result."""
    from kvscope.core.fileio import read_bounded
    from kvscope.core.verify.result import VERDICTS

    try:
        raw = read_bounded(path, MAX_VERIFY_JSON)
    except FileNotFoundError:
        raise ReportError(f"--verify-json {path}: no such file") from None
    except OSError as e:
        raise ReportError(f"--verify-json {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise ReportError(f"--verify-json {path}: {e}") from None
    try:
        result = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ReportError(f"--verify-json {path}: not JSON ({e})") from None
    if not isinstance(result, dict):
        raise ReportError(f"--verify-json {path}: not the output of kvscope verify --json (a JSON "
                          f"{type(result).__name__}, not an object)")
    for key, types in _SHAPE.items():
        value = result.get(key)
        if not any(value is None if t is None else isinstance(value, t) for t in types) or key not in result:
            raise ReportError(f"--verify-json {path}: not the output of kvscope verify --json (its {key!r} is "
                              + ("missing" if key not in result else f"a {type(value).__name__}") + ")")
    if result["verdict"] not in VERDICTS:
        raise ReportError(f"--verify-json {path}: not the output of kvscope verify --json (verdict "
                          f"{str(result['verdict'])[:40]!r} is none of {', '.join(VERDICTS)})")
    if not all(isinstance(r, dict) for r in result["records"]) or not all(isinstance(r, str)
                                                                          for r in result["reasons"]):
        raise ReportError(f"--verify-json {path}: not the output of kvscope verify --json (its records or reasons "
                          "are not what verify writes)")
    return result


def check_same_file(verify: dict[str, Any], file: str, overview: Overview, res: ParseResult, what: str) -> None:
    """ReportError unless ``verify`` (a verify result) is about the file the report reads: the same size and,
    where both have one, sha256 (the bytes verify read), the same kind and layout. ``what`` names where the
    result came from (``--verify-json PATH``, or the verify the report ran)."""
    size, sha = verify.get("size"), verify.get("sha256")
    same = (sha is None or overview.sha256 is None or sha == overview.sha256) and size == overview.size \
        and verify.get("kind") == res.kind and verify.get("layout") == res.layout.name
    if what == SOURCE_RUN and not same:
        raise ReportError(f"{file} changed while the report ran: Verify read other bytes than the report "
                          f"({_bytes(size)} against {overview.size:,}): run it again")
    if size is None and sha is None:
        raise ReportError(f"{what}: it names no size or sha256 of the file it verified (written by an older "
                          f"kvscope): run kvscope verify --json on {file} again")
    if isinstance(sha, str) and overview.sha256 is not None and sha != overview.sha256:
        raise ReportError(f"{what}: it verified another file (sha256 {sha[:16]}…), not {file} "
                          f"(sha256 {overview.sha256[:16]}…)")
    if size != overview.size:
        raise ReportError(f"{what}: it verified another file ({_bytes(size)}), not {file} "
                          f"({overview.size:,} bytes)")
    for key, mine in (("kind", res.kind), ("layout", res.layout.name)):
        if verify.get(key) != mine:
            raise ReportError(f"{what}: it verified a {key} {str(verify.get(key))[:40]!r} file, {file} reads as "
                              f"{mine!r}")


def _bytes(size: object) -> str:
    return f"{size:,} bytes" if isinstance(size, int) else "no size"


def engine_text(verify: dict[str, Any]) -> str:
    """``llama.cpp 0c1e5709 (libllama)``: the engine Verify restored the file in."""
    from kvscope.core.analysis.overview import VERIFY_CONSUMER

    eng = verify.get("engine") or {}
    kind = str(eng.get("kind") or "?")
    build = str(eng.get("build") or "")
    consumer = VERIFY_CONSUMER.get(kind)
    if kind in VERIFY_CONSUMER:
        return f"llama.cpp {build}".strip() + f" ({consumer})"
    return f"{kind} {build}".strip()


def verify_headline(verify: dict[str, Any]) -> tuple[str, str]:
    """(``VERIFY: OK``, the first reason): the line every format starts with."""
    reasons = [str(r) for r in verify.get("reasons") or []]
    return f"VERIFY: {str(verify.get('verdict')).upper()}", reasons[0] if reasons else ""


def verify_lines(verify: dict[str, Any]) -> list[str]:
    """What Verify measured, one line each: where it ran, the restore, the records, the next token, the
    llama-server reuse it measured, the other reasons, where the result came from."""
    from kvscope.core.analysis.overview import verify_lines as overview_lines

    eng = verify.get("engine") or {}
    lines = [f"measured by Verify in {engine_text(verify)}" + (f": {eng['reason']}" if eng.get("reason") else "")]
    lines += overview_lines(verify)[1:]  # restore, next token, records (the first is the verdict, said above)
    reuse = verify.get("reuse")
    if isinstance(reuse, dict) and reuse.get("line"):
        lines.append(f"llama-server reuse (measured by Verify): {reuse['line']}")
    lines += [str(r) for r in (verify.get("reasons") or [])[1:]]
    lines += [f"engine set up otherwise than the file needs: {m}" for m in verify.get("setup_mismatch") or []]
    if verify.get("source"):
        lines.append(f"from {verify['source']}")
    return lines


def verify_json(verify: dict[str, Any]) -> dict[str, Any]:
    """report.json's ``verify`` object: the verdict and its headline first, then the lines and the result."""
    title, reason = verify_headline(verify)
    return {"verdict": verify.get("verdict"), "summary": f"{title}: {reason}" if reason else title,
            "lines": verify_lines(verify), **{k: v for k, v in verify.items() if k != "verdict"}}
