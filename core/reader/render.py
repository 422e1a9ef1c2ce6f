"""JSON, Markdown and text renderings of a :class:`ParseResult` (the ``inspect`` outputs)."""

from __future__ import annotations

from typing import Any

from kvscope.core.jsonout import JsonArray
from kvscope.core.model.profile import ModelProfile
from kvscope.core.reader.records import LayerRecord, ParseResult, Section
from kvscope.core.reader.tree import coverage
from kvscope.core.textsafe import markdown_text, safe_text


def result_to_json(res: ParseResult, profile: ModelProfile | None = None, tree: bool = False,
                   lazy: bool = False) -> dict[str, Any]:
    """The ``inspect --json`` object (key names are fixed: tools depend on them).

    ``lazy``: the big arrays (tokens, cells, cell extensions) are :class:`JsonArray` pieces, to be
    written with :func:`kvscope.core.jsonout.write_json` (same text, bounded memory).
    """
    cov = coverage(res.root)
    out: dict[str, Any] = {
        "file": res.path,
        "size": res.size,
        "kind": res.kind,
        "partial": res.partial,
        "partial_certain": res.partial_certain,
        "layout": res.layout.to_json(),
        "header": res.header,
        "tokens": JsonArray.of_ints(res.tokens) if lazy else res.tokens,
    }
    if profile is not None and res.tokens:
        out["text"] = profile.detokenize(res.tokens)
    if res.token_payload is not None:
        tp = res.token_payload
        out["token_payload"] = {k: JsonArray.of_ints(v) if lazy and k == "tokens" and isinstance(v, list) else v
                                for k, v in tp.items()}
    if res.outputs is not None:
        out["outputs"] = {k: v for k, v in res.outputs.items() if k != "output_ids"} | {
            "output_ids": res.outputs.get("output_ids", [])[:64]
        }
    out["memory"] = [sec.to_json(lazy) for sec in res.sections]
    out["findings"] = [f.to_json() for f in res.findings]
    out["coverage"] = {
        "size": cov["size"],
        "parsed_bytes": cov["parsed_bytes"],
        "untrusted_bytes": cov["untrusted_bytes"],
        "unparsed_bytes": cov["unparsed_bytes"],
        "trailing_bytes": cov["trailing_bytes"],
    }
    if res.model_path:
        out["model"] = res.model_path
    if tree:
        out["tree"] = res.root.to_json()
    return out


def _layer_cell(lr: LayerRecord) -> str:
    """The ``layer`` column: the model layer, or the record's index (``#5``) where the layer is not known."""
    return str(lr.il) if lr.il is not None else f"#{lr.index}"


def _seq_summary(sec: Section) -> str:
    tables = [st.cells for st in sec.streams] if sec.kind == "kv" else [sec.cells]
    parts = []
    for t in tables:
        if t is None or not t.count:
            continue
        for seq in t.seq_set():
            idx = t.cells_of_seq(seq)
            pos = t.pos[idx]
            cells = f"{idx.size} cell{'' if idx.size == 1 else 's'}"
            parts.append(f"seq {seq}: {cells}, pos {int(pos.min())}..{int(pos.max())}")
    return "; ".join(parts)


def result_to_text(res: ParseResult, profile: ModelProfile | None = None, markdown: bool = False) -> str:
    """Human summary: kind, layout, tokens, per-section tables, findings with offsets."""
    h = "## " if markdown else ""
    lines: list[str] = []
    title = f"# {markdown_text(res.path)}" if markdown else safe_text(res.path)
    lines.append("")
    lines.append(f"kind:    {res.kind}" + ("  (PARTIAL_ONLY)" if res.partial else ""))
    lay = res.layout
    alt = ", ".join(a["name"] for a in lay.alternatives if a.get("indistinguishable"))
    lines.append(f"layout:  {lay.name}  (confidence {lay.confidence:.2f}"
                 + (f"; byte-identical under {alt}" if alt else "") + ")")
    if res.header:
        lines.append("header:  " + ", ".join(f"{k}={v}" for k, v in res.header.items()))
    if res.tokens:
        shown = res.tokens[:64]
        lines.append(f"tokens:  {len(res.tokens)}: {shown}{' ...' if len(res.tokens) > 64 else ''}")
        if profile is not None:
            lines.append(f"text:    {profile.detokenize(res.tokens)!r}")
    if res.outputs:
        o = res.outputs
        lines.append(f"outputs: n_outputs={o['n_outputs']}, logits {o.get('logits_size', 0)} x f32, "
                     f"embeddings {o.get('embd_size', 0)} x f32 (pre-2026 context state)")
    if res.token_payload:
        lines.append(f"payload: llama-server packed tokens (version {res.token_payload['version']}, "
                     f"{res.token_payload['n_media']} media)")
    for sec in res.sections:
        lines.append("")
        lines.append(f"{h}section {sec.role} ({sec.kind}) @ {sec.offset}, {sec.size:,} bytes"
                     + ("" if sec.trusted else "  [untrusted]"))
        summ = _seq_summary(sec)
        if summ:
            lines.append(f"  {summ}")
        rows: list[list[str]] = []
        if sec.kind == "kv":
            for st in sec.streams:
                lines.append(f"  stream {st.index}: {st.cell_count} cell{'' if st.cell_count == 1 else 's'}"
                             + (f", v_trans={st.v_trans}, n_layer={st.n_layer}" if st.v_trans is not None else ""))
                for lr in (*st.k_layers, *st.v_layers):
                    rows.append([f"s{st.index}", lr.role.upper(), _layer_cell(lr), lr.type,
                                 str(lr.row_bytes or f"{lr.el_bytes}x{lr.n_embd_v_gqa}"), str(lr.header_offset),
                                 f"{lr.size:,}"])
        else:
            lines.append(f"  {sec.cell_count} cell{'' if sec.cell_count == 1 else 's'}, n_layer={sec.n_layer_written}")
            for lr in sec.all_layers():
                rows.append(["", lr.role, _layer_cell(lr), lr.type, str(lr.row_bytes),
                             str(lr.header_offset), f"{lr.size:,}"])
        if rows:
            lines.extend(_table(["stream", "rec", "layer", "type", "row bytes", "offset", "size"], rows, markdown))
    lines.append("")
    lines.append(f"{h}findings: {len(res.findings)}")
    for f in res.findings:
        lay_s = f" layer {f.layer}" if f.layer is not None else (
            f" record #{f.extra['index']}" if isinstance(f.extra.get("index"), int) else "")
        lines.append(f"  {f.severity:7s} {f.code:20s} @{f.offset} (+{f.length}){lay_s}: {f.message}")
    cov = coverage(res.root)
    lines.append("")
    lines.append(f"coverage: parsed {cov['parsed_bytes']:,}, untrusted {cov['untrusted_bytes']:,}, "
                 f"unparsed {cov['unparsed_bytes']:,}, trailing {cov['trailing_bytes']:,} of {cov['size']:,} bytes")
    # file-derived text escaped for the medium: the terminal's (control and bidi characters), and Markdown's
    # (every line a literal value: no image, link, raw HTML or entity from a token's text or a finding; the
    # headings and tables, built here, escape their parts themselves)
    return "\n".join([f"{title}  ({res.size:,} bytes)", *(_escaped(line, markdown) for line in lines)]) + "\n"


class _Markdown(str):
    """A line of Markdown built with its values escaped already (a heading, a table row)."""


def _escaped(line: str, markdown: bool) -> str:
    if not markdown:
        return safe_text(line)
    if isinstance(line, _Markdown):
        return str(line)
    if line.startswith("## "):
        return "## " + markdown_text(line[3:])
    return markdown_text(line)


def _table(head: list[str], rows: list[list[str]], markdown: bool) -> list[str]:
    if markdown:
        out = ["", _Markdown("| " + " | ".join(head) + " |"), _Markdown("|" + "---|" * len(head))]
        out += [_Markdown("| " + " | ".join(markdown_text(c) for c in r) + " |") for r in rows]
        return out + [""]
    widths = [max(len(head[i]), *(len(r[i]) for r in rows)) for i in range(len(head))]
    fmt = "  " + "  ".join(f"{{:{w}}}" for w in widths)
    return [fmt.format(*head)] + [fmt.format(*r) for r in rows]
