"""The Overview's "Verification" section: a ``kvscope verify`` result (or the run in progress, or why it could
not run) as HTML, with links the Overview acts on (``verify:`` again, ``cancel-verify:``, ``vrec:N`` for
a record, which the Layers view then shows).

The verdict comes first, in its colour, with the verifier's reasons; then the engine and build (and why
that build), the restore, the records by status with every record that is not a match listed, the
cells only one state holds, the next token's logits, and the verifier's notes.
"""

from __future__ import annotations

from typing import Any

from kvscope.app.base.theme import VERIFY_LEVELS, VERIFY_STATUS_COLORS, verdict_color
from kvscope.app.document.verify_marks import status_counts
from kvscope.core.analysis.overview import NOT_VERIFIED
from kvscope.core.textsafe import html_text as escape  # one visible line (bidi, controls escaped), then entities

MAX_LISTED = 24  # records that are not a match, listed one by one
MAX_NOTES = 6


def verdict_title(result: dict[str, Any], loud: bool = False) -> str:
    """``ok in llama.cpp b11434`` (``loud``: ``OK in llama.cpp 0c1e5709``: the verdict upper-cased, never the
    engine or the build, whose names are case-sensitive)."""
    eng = result.get("engine") or {}
    name = "llama-server" if eng.get("kind") == "server" else str(eng.get("kind") or "the engine")
    verdict = str(result.get("verdict", "no verdict"))
    return f"{verdict.upper() if loud else verdict} in {name}" + (f" {eng['build']}" if eng.get("build") else "")


def summary_line(result: dict[str, Any]) -> str:
    """One line for the top of the Overview: ``Verify: ok in llama.cpp b11434 — all 4 records match ...``."""
    reasons = [str(r) for r in result.get("reasons") or []]
    return f"Verify: {verdict_title(result)}" + (f" — {reasons[0]}" if reasons else "")


def _color(result: dict[str, Any], dark: bool) -> str:
    return verdict_color(VERIFY_LEVELS.get(str(result.get("verdict")), "suspicious"), dark).name()


def _status_span(status: str) -> str:
    col = VERIFY_STATUS_COLORS.get(status, "#888888")
    return f'<span style="color:{col}">■</span> {escape(status)}'


def running_html(engine: str) -> str:
    """The section while a Verify runs: its step and fraction are in the strip above the page (a progress
    tick updates that strip, never this page)."""
    return (f"<p><b>Verifying in {escape(engine)}…</b> (its progress is shown above) · "
            '<a href="cancel-verify:">Cancel</a></p>')


def error_html(engine: str, error: str, dark: bool) -> str:
    col = verdict_color("suspicious", dark).name()
    return (f'<p><span style="color:{col}"><b>Verify could not run</b></span> ({escape(engine)}): {escape(error)}</p>'
            '<p><a href="verify:">Verify again</a> · Tools → Engine Settings… chooses the engine</p>')


def not_verified_html(engine: str, can: bool, why: str = "") -> str:
    text = escape(NOT_VERIFIED.replace("`", ""))
    if can:
        return (f'<p>{text}.</p><p><a href="verify:">Verify now</a> (Tools → Verify, Ctrl+Shift+V) in '
                f"{escape(engine)}; Tools → Engine Settings chooses the engine.</p>")
    return f"<p>{text}.</p><p>{escape(why)}</p>"


def result_html(result: dict[str, Any], dark: bool) -> str:
    """The whole section for a finished verification."""
    col = _color(result, dark)
    out = [f'<p style="font-size:large;margin-bottom:2px"><b><span style="color:{col}">'
           f"{escape(verdict_title(result, loud=True))}</span></b></p>"]
    reasons = [str(r) for r in result.get("reasons") or []]
    if reasons:
        out.append("<ul>" + "".join(f"<li>{escape(r)}</li>" for r in reasons) + "</ul>")
    rows: list[tuple[str, str]] = []
    eng = result.get("engine") or {}
    what = " ".join(str(eng[k]) for k in ("kind", "build") if eng.get(k))
    if eng.get("reason"):
        what += f" — {eng['reason']}"
    rows.append(("engine", escape(what or "unknown")))
    restore = result.get("restore") or {}
    ok = restore.get("ok")
    state = "ok" if ok else ("failed" if ok is not None else "not run")
    rcol = verdict_color("healthy" if ok else "damaged", dark).name()
    rows.append(("restore", f'<span style="color:{rcol}">{state}</span>'
                 + (f": {escape(str(restore['message']))}" if restore.get("message") else "")))
    counts = status_counts(result)
    if counts:
        rows.append(("records", ", ".join(f"{_status_span(k)} {v}" for k, v in counts.items())
                     + ' · <a href="view:layers">on the Layers view</a>'))
    elif not result.get("compared"):
        why = (result.get("prefill") or {}).get("reason")
        rows.append(("records", "not compared" + (f": {escape(str(why))}" if why else "")))
    for c in result.get("cells") or []:
        if isinstance(c, dict) and (c.get("missing") or c.get("extra")):
            where = str(c.get("section")) + (f" · stream {c['stream']}" if c.get("stream") is not None else "")
            rows.append(("cells", escape(f"{where}: {c.get('missing', 0)} missing, {c.get('extra', 0)} extra "
                                         f"(file {c.get('n_file')}, engine {c.get('n_fresh')})")))
    rows.append(("next token", escape(next_token_text(result.get("next_token"), result.get("behaviour")))))
    secs = (result.get("seconds") or {}).get("total")
    if secs is not None:
        rows.append(("time", f"{float(secs):.1f} s"))
    out.append(_table(rows))
    bad = [(i, c) for i, c in enumerate(result.get("records") or [])
           if isinstance(c, dict) and c.get("status") != "match"]
    if bad:
        out.append("<p><b>Records that are not a match</b></p><ul>")
        for i, c in bad[:MAX_LISTED]:
            il = c.get("il")
            where = str(c.get("section")) + (f" · stream {c['stream']}" if c.get("stream") is not None else "")
            detail = []
            if c.get("max_abs") is not None and c.get("status") == "differs":
                detail.append(f"max |Δ| {float(c['max_abs']):.3g}")
            first = c.get("first_cell")
            if isinstance(first, dict) and first:
                detail.append("first bad cell " + ", ".join(f"{k} {v}" for k, v in first.items()))
            if c.get("note"):
                detail.append(str(c["note"]))
            out.append(f'<li>{_status_span(str(c.get("status")))}: <a href="vrec:{i}">layer '
                       f"{'?' if il is None else il} {escape(str(c.get('role', '')).upper())}</a> ({escape(where)})"
                       + (f" — {escape('; '.join(detail))}" if detail else "") + "</li>")
        if len(bad) > MAX_LISTED:
            out.append(f"<li>… and {len(bad) - MAX_LISTED} more</li>")
        out.append("</ul>")
    notes = [str(n) for n in result.get("notes") or []]
    if notes:
        out.append("<p><small>" + "<br>".join(escape("note: " + n) for n in notes[:MAX_NOTES])
                   + (f"<br>… {len(notes) - MAX_NOTES} more notes" if len(notes) > MAX_NOTES else "")
                   + "</small></p>")
    out.append('<p><a href="verify:">Verify again</a></p>')
    return "".join(out)


def next_token_text(nt: Any, behaviour: Any = None) -> str:
    """The next token after the restore against after the fresh prefill; a different argmax comes with the
    engine's own variation at that step (``behaviour``: the result's continuation), which says whether it
    matters."""
    if not isinstance(nt, dict) or not nt:
        return "not decoded"
    if nt.get("skipped"):
        return f"not compared: {nt['skipped']}"
    parts = []
    if nt.get("token") is not None:
        parts.append(f"token {nt['token']}")
    if nt.get("max_abs_logit_diff") is not None:
        parts.append(f"max |Δ logit| {float(nt['max_abs_logit_diff']):.3g}")
    if nt.get("same_argmax") is not None:
        from kvscope.core.verify.behaviour import spread_note

        spread = spread_note(behaviour) if not nt["same_argmax"] else ""
        parts.append("same argmax" if nt["same_argmax"] else
                     f"a DIFFERENT argmax ({nt.get('argmax_restored')} after the restore, "
                     f"{nt.get('argmax_fresh')} after the prefill" + (f"; {spread})" if spread else ")"))
    if nt.get("kl") is not None:
        parts.append(f"KL {float(nt['kl']):.3g}")
    return ", ".join(parts) or "not compared"


def _table(rows: list[tuple[str, str]]) -> str:
    body = "".join(f'<tr><td style="padding-right:14px;vertical-align:top"><b>{escape(k)}</b></td>'
                   f"<td>{v}</td></tr>" for k, v in rows)
    return f'<table cellspacing="0" cellpadding="2">{body}</table>'
