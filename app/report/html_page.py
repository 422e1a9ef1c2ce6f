"""``report.html``: one self-contained page (pictures as ``data:`` URIs, inline CSS, no scripts, no links out)."""

from __future__ import annotations

import base64
import math
from typing import TYPE_CHECKING

from kvscope.core.analysis.verdict import plural
from kvscope.core.report.bookmarks import bookmarks_html
from kvscope.core.report.model import ReportData, ReportImage
from kvscope.core.report.summary import counts_text, flagged_note, kvscope_version, overview, top_findings
from kvscope.core.textsafe import html_block
from kvscope.core.textsafe import html_text as escape  # every string: one visible line (bidi shown), then entities

if TYPE_CHECKING:
    from kvscope.core.lab.report import LabRun

MAX_ROWS = 1000  # findings / statistics rows shown; report.json has them all

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1240px;color:#202020;
background:#fff;padding:0 16px}
h1{font-size:22px;margin:0 0 12px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
h3{font-size:15px;margin:18px 0 6px}
table{border-collapse:collapse;margin:6px 0 12px;font-size:13px}
td,th{border:1px solid #d8d8d8;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f3f3f3}
table.kv th{width:110px}
code,pre,.mono{font-family:ui-monospace,"DejaVu Sans Mono",Menlo,monospace;font-size:12.5px}
pre{background:#f7f7f7;border:1px solid #e2e2e2;padding:8px;overflow:auto;max-height:480px}
figure{margin:8px 0 18px}figure img{max-width:100%;border:1px solid #ddd}
figcaption{color:#555;font-size:13px;margin-top:4px}
.sev-error{color:#c62828;font-weight:600}.sev-warning{color:#c26100;font-weight:600}.sev-info{color:#1f5fa8}
.badge{display:inline-block;padding:2px 8px;border-radius:10px;font-weight:600}
.bad{background:#fde2e2;color:#a11}.ok{background:#e3f3df;color:#25631b}
.verdict{font-size:17px;padding:8px 12px;border-radius:6px;margin:8px 0 14px}
.v-healthy{background:#e3f3df;color:#1f5a18}.v-suspicious{background:#fdebd3;color:#7a3e00}
.v-damaged{background:#fde2e2;color:#8e1414}.v-not_state{background:#efe2f7;color:#4a1470}
.v-newer{background:#e0ebfa;color:#0f3f78}
ul.compat{margin:4px 0 12px;padding-left:20px}
td.restored{background:#b9e3ad}td.unchanged{background:#dde3ea}td.removed{background:#f7d794}
td.changed{background:#f4a6a6}td.undetermined{background:#dcc3ea}td.error{background:#b03030;color:#fff}
nav a{margin-right:12px}
"""


def _img(im: ReportImage) -> str:
    b64 = base64.b64encode(im.png).decode("ascii")
    return (f'<figure><img alt="{escape(im.title)}" width="{im.width}" src="data:image/png;base64,{b64}">'
            f"<figcaption>{escape(im.caption)}</figcaption></figure>")


def _figures(images: list[ReportImage], prefix: str) -> list[str]:
    return [f"<h3>{escape(im.title)}</h3>{_img(im)}" for im in images if im.file.startswith(prefix)]


def _table(head: list[str], rows: list[list[str]], cls: str = "") -> str:
    """A table of already escaped cells."""
    h = "".join(f"<th>{c}</th>" for c in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table{f" class={cls!r}" if cls else ""}><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>'


def _findings(data: ReportData) -> str:
    fs = data.result.findings
    if not fs:
        return "<p>No findings.</p>"
    from kvscope.core.analysis.measured import measured_message

    verify = data.overview.verify  # a record Verify names replaces the reader's guess at it
    rows = [[f'<span class="sev-{escape(f.severity)}">{escape(f.severity)}</span>', f"<code>{escape(f.code)}</code>",
             f"{f.offset:,}", f"{f.length:,}", f.layer_text(),
             escape(measured_message(f, verify) or f.message)]
            for f in fs[:MAX_ROWS]]
    more = f"<p>{len(fs) - MAX_ROWS} more in report.json.</p>" if len(fs) > MAX_ROWS else ""
    return _table(["severity", "code", "offset", "length", "layer", "message"], rows) + more


def _sections(data: ReportData) -> str:
    rows = []
    for sec in data.result.sections:
        if sec.kind == "kv":
            cells = ", ".join(f"stream {st.index}: {plural(st.cell_count, 'cell')}" for st in sec.streams)
            recs = sum(len(st.k_layers) + len(st.v_layers) for st in sec.streams)
        else:
            cells, recs = plural(sec.cell_count, "cell"), len(sec.all_layers())
        rows.append([escape(sec.role), escape(sec.kind), f"{sec.offset:,}", f"{sec.size:,}", escape(cells), str(recs),
                     "yes" if sec.trusted else '<span class="sev-error">no</span>'])
    if not rows:
        return "<p>No memory sections.</p>"
    return _table(["section", "kind", "offset", "size", "cells", "records", "trusted"], rows)


def _g(v: float) -> str:
    return f"{v:.4g}" if math.isfinite(v) else "–"


def _stats_table(data: ReportData) -> str:
    if data.stats is None:
        return f"<p>No statistics: {escape(data.stats_error or 'not computed')}.</p>"
    rows = [[escape(ls.section), "" if ls.stream is None else f"s{ls.stream}", escape(ls.role.upper()),
             "?" if ls.il is None else str(ls.il), escape(ls.type), str(ls.n_rows),
             f'<span class="sev-error">{ls.n_nonfinite}</span>' if ls.n_nonfinite else "0",
             f'<span class="sev-warning">{ls.zero_rows}</span>' if ls.zero_rows else "0",
             _g(ls.min), _g(ls.max), _g(ls.mean), _g(ls.rms), escape(ls.note)] for ls in data.stats.layers[:MAX_ROWS]]
    return _table(["section", "stream", "rec", "layer", "type", "rows", "non-finite", "zero rows", "min", "max",
                   "mean", "rms", "note"], rows)


def _lab_table(run: LabRun) -> str:
    from kvscope.core.lab.report import AS_IS, cell_text

    cols = [(p, r) for p in run.policies for r in run.readers]
    rows = []
    for name, desc in run.cases:
        cells = []
        for c in cols:
            r = run.cell(name, *c)
            cls = "" if r is None else "error" if r.error else "undetermined" if r.hazard else r.target.state
            cells.append(f'<td class="{escape(cls)}">{escape(cell_text(r))}</td>')
        label = "as-is (the file)" if name == AS_IS else name
        rows.append(f'<tr><th title="{escape(desc)}"><code>{escape(label)}</code></th>{"".join(cells)}</tr>')
    head = "".join(f"<th>{escape(p)} · {escape(r)}</th>" for p, r in cols)
    notes = [r for r in run.results if r.hazard or r.error]
    extra = ""
    if notes:
        extra += "<p>Notes:</p><ul>" + "".join(
            f"<li><code>{escape(r.corruption)}</code> · {escape(r.policy)} · {escape(r.reader)}: "
            f"{escape(r.error or r.restore.message)}</li>" for r in notes) + "</ul>"
    if run.skipped:
        extra += "<p>Not applicable: " + "; ".join(f"<code>{escape(n)}</code> ({escape(w)})"
                                                    for n, w in run.skipped) + ".</p>"
    if run.cancelled:
        extra += f"<p>Cancelled after {plural(len(run.results), 'cell')}.</p>"
    return f"<table><thead><tr><th>case</th>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>{extra}"


def _lab(data: ReportData, images: list[ReportImage]) -> list[str]:
    lab = data.lab
    if lab is None:
        return []
    out = ['<h2 id="lab">Lab</h2>']
    if lab.run is None:
        return out + [f'<p><span class="badge bad">not run</span> {escape(lab.reason)}.</p>']
    sc = lab.run.scenario
    restore = sc.get("restore", {})
    out.append(f"<p>Scenario <code>{escape(str(sc.get('name') or lab.context))}</code>: model "
               f"<code>{escape(str(sc.get('arch')))}</code> ({escape(str(sc.get('memory_class')))}), "
               f"{escape(str(sc.get('n_stream')))} stream(s), flash attention "
               f"{'on' if sc.get('flash_attn') else 'off'}, layout {escape(str(sc.get('layout')))}; the file restored "
               f"with <code>{escape(str(restore.get('api')))}</code> into seq {escape(str(sc.get('target')))}, live "
               f"sequences {escape(str(sc.get('live_sequences')))}.</p>")
    out += _figures(images, "lab-")
    out.append(_lab_table(lab.run))
    return out


def _verdict(data: ReportData) -> str:
    v = data.overview.verdict
    top = top_findings(data)
    items = "".join(f"<li>{escape(line)}</li>" for line in top)
    return (f'<p class="verdict v-{escape(v.level)}"><b>{escape(v.title.upper())}</b>: {escape(v.reason)}</p>'
            + (f"<p>Top findings:</p><ul>{items}</ul>" if top else ""))


def _verify_banner(data: ReportData) -> str:
    """The verdict Verify measured in real llama.cpp (``kvscope report --verify``), first on the page; "" without."""
    verify = data.overview.verify
    if not verify:
        return ""
    from kvscope.core.analysis.verdict import VERIFY_VERDICT_LEVEL
    from kvscope.core.report.verified import verify_headline, verify_lines

    title, reason = verify_headline(verify)
    level = VERIFY_VERDICT_LEVEL.get(str(verify.get("verdict")), "suspicious")
    items = "".join(f"<li>{escape(line)}</li>" for line in verify_lines(verify))
    return (f'<section id="verify"><p class="verdict v-{escape(level)}"><b>{escape(title)}</b>'
            + (f": {escape(reason)}" if reason else "") + f'</p><ul class="compat">{items}</ul></section>')


def _compat(data: ReportData) -> str:
    from kvscope.core.report.build_lines import head_text, text_lines

    ov = data.overview
    bold, rest = head_text(ov)  # per pinned build and consumer, as the app's Overview says it
    head = (f"<p>{escape(bold)} <b>{escape(rest)}</b>.</p>" if bold.startswith("Loads")
            else f"<p><b>{escape(bold)}</b>" + (f" {escape(rest)}" if rest else "") + "</p>")
    return head + '<ul class="compat">' + "".join(f"<li>{escape(line)}</li>" for line in text_lines(ov)) + "</ul>"


def render_html(data: ReportData, images: list[ReportImage]) -> str:
    """The whole page."""
    from kvscope.core.reader.render import result_to_text

    names = data.options.names()
    c = data.finding_counts()
    badge = (f'<span class="badge {"bad" if c["error"] else "ok"}">{escape(counts_text(data))}</span>')
    kv = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in overview(data))
    nav = ['<a href="#findings">Findings</a>', '<a href="#structure">Structure</a>']
    nav += ['<a href="#cells">Cells</a>'] if any(i.file.startswith("cells-") for i in images) else []
    nav += ['<a href="#stats">Statistics</a>', '<a href="#heatmaps">Heatmaps</a>']
    nav += ['<a href="#lab">Lab</a>'] if data.lab is not None else []
    nav += ['<a href="#diff">Diff</a>'] if data.diff is not None else []
    nav += ['<a href="#bookmarks">Bookmarks</a>'] if data.options.bookmarks else []
    nav += ['<a href="#details">Details</a>']
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>kvscope report: {escape(data.name)}</title><style>{CSS}</style></head><body>",
        f"<h1>kvscope report: <code>{escape(data.name)}</code></h1>", _verify_banner(data), _verdict(data),
        f"<p>{badge}</p>",
        f"<nav>{''.join(nav)}</nav>", '<h2 id="overview">Overview</h2>', f'<table class="kv">{kv}</table>',
        "<h3>Which llama.cpp builds load it</h3>", _compat(data),
        '<h2 id="findings">Findings</h2>', _findings(data),
        '<h2 id="structure">Structure</h2>', *_figures(images, "bytemap"), _sections(data),
    ]
    cells = _figures(images, "cells-")
    if cells:
        parts += ['<h2 id="cells">Cells</h2>', *cells]
    parts += ['<h2 id="stats">Per-layer statistics</h2>', *_figures(images, "stats-"), _stats_table(data)]
    parts += ['<h2 id="heatmaps">Layer heatmaps</h2>', *_figures(images, "heatmap-")]
    note = flagged_note(data)
    if note:
        parts.append(f"<p>{escape(note)}</p>")
    parts += _lab(data, images)
    if data.diff is not None:
        parts += ['<h2 id="diff">Diff</h2>', f"<pre>{html_block(names.text(data.diff.to_text()))}</pre>"]
    parts += bookmarks_html(data)
    details = names.text(result_to_text(data.result, data.profile))
    parts += ['<h2 id="details">Details</h2>', f"<pre>{html_block(details)}</pre>",
              f"<footer><p>Written by kvscope {escape(kvscope_version())} (<code>kvscope report</code>). "
              "The same data is in report.json beside this page.</p></footer>", "</body></html>", ""]
    return names.text("\n".join(parts))
