"""How kvscope names a layer record: one rule for the tree, the findings, the layers view, bookmarks and reports.

A record is keyed by where it is in the file: its section, stream, role and index (its position among the
records of its role there). That key never changes with the model, so node paths are built from it:
``/memory/kv_swa/stream0/K5`` is the sixth K record of the SWA cache, with or without a model.

What a user reads is the label: the section, the role and the model layer where the layer is known
(``kv_swa K layer 6``), else the index said as an index (``kv_swa K #5``). The model layer is known when the
file was read with a model, when the file itself says it (DeepSeek-V4 blocks write each record's layer), or in
a plain ``kv`` cache (one cache of every layer: record ``i`` is layer ``i``). Without a model the records of
an iSWA pair or a hybrid's caches hold only their index: the SWA cache's fifth record is not layer 5.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvscope.core.findings import Finding
    from kvscope.core.model.memory_plan import ExpectedSection
    from kvscope.core.model.profile import ModelProfile
    from kvscope.core.reader.records import LayerRecord, ParseResult, Section

_NODE = re.compile(r"([KVrsp])(\d+)")
ROLE_WORD = {"k": "K", "v": "V", "r": "r", "s": "s", "p": "p", "ckv": "compressor_kv", "csc": "compressor_score"}


def record_node_name(role: str, index: int) -> str:
    """The node name of a record: its role and index (``K5``), the same with and without a model."""
    return f"{ROLE_WORD.get(role, role)}{index}"


def record_label(section: str, role: str, index: int, il: int | None, stream: int | None = None) -> str:
    """``kv_swa K layer 6`` when the model layer ``il`` is known, ``kv_swa K #5`` (the index) when not;
    ``stream`` (a cache of several streams) comes after the section: ``kv stream 1 V layer 2``."""
    where = section if stream is None else f"{section} stream {stream}"
    what = f"layer {il}" if il is not None else f"#{index}"
    return f"{where} {ROLE_WORD.get(role, role)} {what}"


def short_label(role: str, index: int, il: int | None) -> str:
    """A record named where its section and stream are already said (the tree, under its section and stream
    nodes): ``K layer 6`` when the model layer is known, ``K #5`` when not."""
    word = ROLE_WORD.get(role, role)
    return f"{word} layer {il}" if il is not None else f"{word} #{index}"


def located_label(section: str, role: str, index: int, il: int | None, stream: int | None = None,
                  rest: bool = False) -> str:
    """A record in a list of records of several sections (what a cut file misses): the record first, then
    where it is, ``K layer 3 (rest) in kv stream 0``, so that a narrow column still shows which record."""
    where = section if stream is None else f"{section} stream {stream}"
    return f"{short_label(role, index, il)}{' (rest)' if rest else ''} in {where}"


def layer_known(sec: Section, with_model: bool) -> bool:
    """Whether the records of ``sec`` carry their model layer (see the module's rule)."""
    return with_model or sec.role == "kv" or sec.kind.startswith("dsv4")


def model_layer(res: ParseResult, sec: Section, rec: LayerRecord) -> int | None:
    """The model layer of ``rec`` where it is known, else None."""
    return rec.il if layer_known(sec, res.model_path is not None) else None


def stream_of(sec: Section, rec: LayerRecord) -> int | None:
    """The stream of ``rec`` when its section has more than one (None: one stream, or not a KV cache)."""
    if sec.kind != "kv" or max(sec.n_stream or 0, len(sec.streams)) <= 1:
        return None
    return next((st.index for st in sec.streams if any(r is rec for r in (*st.k_layers, *st.v_layers))), None)


def label_of(res: ParseResult, sec: Section, rec: LayerRecord) -> str:
    """The label of a record of ``res`` (:func:`record_label`)."""
    return record_label(sec.role, rec.role, rec.index, model_layer(res, sec, rec), stream_of(sec, rec))


def planned_layer(plan: ExpectedSection | None, section: str, role: str, index: int) -> int | None:
    """The model layer of record ``index`` of ``role`` in a section the model planned (``plan``: None without a
    model); a plain ``kv`` cache's index is its layer. For records the file does not hold (past its end)."""
    if plan is not None:
        return plan.layers[index] if 0 <= index < len(plan.layers) and role in ("k", "v", "r", "s") else None
    return index if section == "kv" else None


def record_labels(res: ParseResult, profile: ModelProfile | None = None) -> dict[int, str]:
    """``id(node) -> label`` of every record node of ``res`` (the tree's name column, where each record sits under
    its section and stream: :func:`short_label`), the nodes of records cut short (no :class:`LayerRecord` holds
    them) included: their layer comes from ``profile``'s plan."""
    out: dict[int, str] = {}
    for sec in res.sections:
        for rec in sec.all_layers():
            if rec.node is not None:
                out[id(rec.node)] = short_label(rec.role, rec.index, model_layer(res, sec, rec))
        if sec.node is None or sec.kind.startswith("dsv4"):
            continue
        plan = profile.section_plan(sec.role) if profile is not None and res.model_path is not None else None
        for parent in sec.node.children if sec.kind == "kv" else [sec.node]:
            for node in parent.children:
                m = _NODE.fullmatch(node.name)
                if node.kind == "layer" and m is not None and id(node) not in out:
                    role, index = m.group(1).lower(), int(m.group(2))
                    out[id(node)] = short_label(role, index, planned_layer(plan, sec.role, role, index))
    return out


def finding_name(section: str | None, role: str, index: int, il: int | None, with_model: bool) -> str:
    """How a finding's message names a record: ``K layer 3`` in a plain ``kv`` cache (record ``i`` is layer ``i``),
    else with its section, the model layer where it is known (read with a model: ``kv_swa K layer 6``) and the
    index said as an index where not (``kv_swa K #5``), as the tree's labels say it."""
    word = ROLE_WORD.get(role, role)
    if section is None or section == "kv":
        return f"{word} layer {il}" if il is not None else f"{word} #{index}"
    return record_label(section, role, index, il if with_model else None)


_PLAIN_NAME = re.compile(r"\b([KV]) layer (\d+)\b")
_EMPTY_SLOT = re.compile(r"the first empty slot is layer (\d+) \(candidates: layers (\d+)\.\.(\d+)\)")


def forget_layers(sec: Section, findings: list[Finding]) -> None:
    """``sec`` was read without a model as a plain KV cache (record ``i`` is layer ``i``), then named as one
    of several caches (an iSWA's half, a hybrid's attention cache), whose record ``i`` is not layer ``i``.
    Its records lose the layer they were given, and so do the findings about them: the index moves to the
    finding's ``index`` and its message names the record by it (``K layer 3`` becomes ``kv_swa K #3``); a
    dropped record's candidates are indexes too (``candidates_are``: ``"index"``)."""
    if sec.kind != "kv" or sec.role == "kv":
        return
    for st in sec.streams:
        for rec in (*st.k_layers, *st.v_layers):
            rec.il = None
    inside = {id(n) for n in sec.node.walk()} if sec.node is not None else set()
    for f in findings:
        if f.layer is None or id(f.node) not in inside:
            continue
        f.extra.setdefault("index", f.layer)
        f.layer = None
        f.message = _PLAIN_NAME.sub(lambda m: f"{sec.role} {m.group(1)} #{m.group(2)}", f.message)
        if f.code == "missing_layer":
            f.extra["candidates_are"] = "index"
            f.message = _EMPTY_SLOT.sub(lambda m: f"the first empty slot is {sec.role}'s record #{m.group(1)} "
                                                  f"(candidates: #{m.group(2)}..#{m.group(3)})", f.message)


def section_of_path(path: str) -> str | None:
    """The section a node path lies in (``/memory/kv_swa/stream0`` -> ``kv_swa``), None outside the memory."""
    parts = path.split("/")
    return parts[2] if len(parts) > 2 and parts[1] == "memory" else None
