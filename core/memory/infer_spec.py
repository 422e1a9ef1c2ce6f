"""A :class:`MemorySpec` from the structure of a parsed state file alone (no model).

The sections the reader found name the memory class (their roles, in write order); each KV
section's first data stream gives its layer widths, types and V transposition; the recurrent
section gives the row widths and the model's layer count; DeepSeek-V4's blocks give their layers,
row widths and compressor geometry. What the bytes do not record is assumed and said in the
notes: the model's layer numbering (layers are numbered by position), the sliding window (no cell
is outside it), whether a 12-byte cell ext is M-RoPE or PLE.
"""

from __future__ import annotations

from kvscope.core import ggml_types as gt
from kvscope.core.errors import InputError
from kvscope.core.memory.spec import SWA_STANDARD, AttnLayer, CacheSpec, Dsv4Block, Dsv4Spec, MemorySpec
from kvscope.core.reader.records import KvStream, ParseResult, Section

UNKNOWN_SWA = 1 << 30  # "no cell is outside the window": the window of a model not given
Facts = dict[str, int | bool | None]

_DSV4_ROLES = ("dsv4", "kv_raw_base", "kv_raw_swa", "kcache_csa", "kcache_hca", "kcache_lid", "comp_csa", "comp_hca",
               "comp_lid")
_CLASS_BY_ROLES = {
    ("kv",): "kv",
    ("kv_base", "kv_swa"): "iswa",
    ("recurrent",): "recurrent",
    ("kv_attn", "recurrent"): "hybrid",
    ("kv_base", "kv_swa", "recurrent"): "hybrid_iswa",
    ("kv_attn", "recurrent", "kv_idx"): "hybrid_idx",
    ("kv_mla", "kv_lid"): "dsa",
    ("kv_mla", "kv_lid", "kv_swa"): "dsa_iswa",
    _DSV4_ROLES: "dsv4",
    tuple(r for r in _DSV4_ROLES if r not in ("kv_raw_base", "kcache_csa", "kcache_hca", "kcache_lid")): "dsv4",
}
_KCACHE_RATIO = {"kcache_csa": 4, "kcache_hca": 128, "kcache_lid": 4}  # DSV4_CSA_RATIO, DSV4_HCA_RATIO
_SWA_ROLES = ("kv_swa", "kv_raw_swa")


class StructureError(InputError, ValueError):
    """The sections are not a memory class the core knows (one-line message)."""


def data_streams(sec: Section) -> list[KvStream]:
    """The streams of a KV section that carry a data header and records."""
    return [st for st in sec.streams if st.k_layers]


def kv_layers(sec: Section, first_il: int) -> tuple[tuple[AttnLayer, ...], int | None, int | None, bool | None]:
    """Layer widths, K / V types and V transposition of a KV section (from its first data stream)."""
    streams = data_streams(sec)
    if not streams:
        st0 = next((st for st in sec.streams if st.data_offset is not None), None)
        return (), None, None, None if st0 is None or st0.v_trans is None else bool(st0.v_trans)
    st = streams[0]
    layers = []
    for j, k in enumerate(st.k_layers):
        n_k = gt.elements_in_row(k.type_id, k.row_bytes) or 0
        n_v = 0
        if j < len(st.v_layers):
            v = st.v_layers[j]
            n_v = v.n_embd_v_gqa if v.transposed else gt.elements_in_row(v.type_id, v.row_bytes) or 0
        layers.append(AttnLayer(first_il + j, n_k, n_v))
    type_v = st.v_layers[0].type_id if st.v_layers else None
    return tuple(layers), st.k_layers[0].type_id, type_v, bool(st.v_trans)


def section_ext(sec: Section) -> bool | None:
    """Whether the section's cell records carry an ext (None: it has no cell)."""
    for st in sec.streams:
        if st.cells is not None and st.cells.count:
            return st.cells.ext_bytes > 0
    return None


def memory_class_of(res: ParseResult) -> str:
    """The memory class the file's sections make up (:class:`StructureError` when none)."""
    roles = tuple(sec.role for sec in res.sections)
    mc = _CLASS_BY_ROLES.get(roles)
    if mc is None:
        raise StructureError(f"sections {list(roles)} are not a memory class the core knows")
    return mc


def file_facts(res: ParseResult) -> Facts:
    """Cache types and V transposition as the file's first records of each kind show them."""
    facts: Facts = {"type_k": None, "type_v": None, "v_trans": None}
    for sec in res.sections:
        if sec.kind == "kv":
            _, tk, tv, vt = kv_layers(sec, 0)
            for k, v in (("type_k", tk), ("type_v", tv), ("v_trans", vt)):
                if facts[k] is None:
                    facts[k] = v
        elif sec.kind == "dsv4_kcache" and sec.records and facts["type_k"] is None:
            facts["type_k"] = sec.records[0].type_id
        elif sec.kind == "recurrent" and sec.r_layers:
            facts["type_r"] = sec.r_layers[0].type_id
            if sec.s_layers:
                facts["type_s"] = sec.s_layers[0].type_id
    if facts["type_v"] is None and facts["type_k"] is not None:
        facts["type_v"] = facts["type_k"]  # K-only caches: llama.cpp requires type_v == type_k there
    return facts


def structural_spec(res: ParseResult, notes: list[str]) -> MemorySpec:
    """The spec of a memory that holds the file's state, from its structure alone."""
    mc = memory_class_of(res)
    caches: list[CacheSpec] = []
    swa_layers: set[int] = set()
    next_il = 0
    attn_ids: list[int] = []
    for sec in res.sections:
        if sec.kind != "kv":
            continue
        first = next_il
        if sec.role == "kv_idx" and attn_ids:
            first = -1  # the indexer's layers are attention layers (numbered like them below)
        layers, _, _, _ = kv_layers(sec, max(first, 0))
        if sec.role == "kv_idx" and attn_ids and len(layers) <= len(attn_ids):
            layers = tuple(AttnLayer(attn_ids[j], a.n_embd_k, a.n_embd_v) for j, a in enumerate(layers))
        elif sec.role == "kv_raw_swa":
            layers = tuple(AttnLayer(j, a.n_embd_k, a.n_embd_v) for j, a in enumerate(layers))
        if not layers and not any(st.data_offset is not None for st in sec.streams):
            # no stream has cells, so nothing records the widths (a header with n_layer 0 is a cache
            # without layers: LFM2 with SWA, DeepSeek-V4's raw base)
            layers = (AttnLayer(max(first, 0), 32, 32),)
            notes.append(f"{sec.role}: no cells, so its layer widths are not recorded (assumed one 32-wide layer)")
        if sec.role in _SWA_ROLES:
            swa_layers.update(a.il for a in layers)
        if sec.role in ("kv", "kv_base", "kv_attn", "kv_mla"):
            attn_ids += [a.il for a in layers]
        if sec.role not in ("kv_idx", "kv_raw_swa"):
            next_il = max([next_il, *[a.il + 1 for a in layers]])
        caches.append(CacheSpec(sec.role, layers, swa=sec.role in _SWA_ROLES,
                                size="swa" if sec.role in _SWA_ROLES else "base",
                                unified=False if sec.role.startswith("kv_raw") else None, ext=section_ext(sec),
                                partial_keep=_keeps(mc, sec.role), n_pos_per_embd=1 if sec.role in ("kv_lid", "kv_idx")
                                else None))
    if mc == "dsv4":
        caches = _dsv4_caches(caches)
    rec = next((s for s in res.sections if s.kind == "recurrent"), None)
    n_layer = max([1, next_il, *[a.il + 1 for c in caches for a in c.layers]])
    recurrent: tuple[int, ...] = ()
    n_embd_r = n_embd_s = n_embd_p = 0
    ple: list[int] = []
    if rec is not None:
        n_layer = max(n_layer, rec.n_layer_written or len(rec.r_layers))
        nr = len(rec.r_layers)
        n_layer = max(n_layer, rec.n_layer_written or 0, nr)
        start = next_il if next_il + nr <= n_layer else 0
        recurrent = tuple(range(start, start + nr))
        if rec.r_layers:
            n_embd_r = gt.elements_in_row(rec.r_layers[0].type_id, rec.r_layers[0].row_bytes) or 0
        if rec.s_layers:
            n_embd_s = gt.elements_in_row(rec.s_layers[0].type_id, rec.s_layers[0].row_bytes) or 0
        ple, n_embd_p = _ple_layers(rec, recurrent)
    dsv4 = _dsv4_blocks(res) if mc == "dsv4" else None
    if dsv4 is not None:
        n_layer = max([n_layer, *[il + 1 for b in (*dsv4.kcaches, *dsv4.comps) for il in b.layers]])
    if mc not in ("kv", "recurrent"):
        notes.append("without --model the layers of each part are numbered by position (the model's layer "
                     "mapping is not in the file)")
    n_swa = 0
    if swa_layers or mc in ("iswa", "hybrid_iswa", "dsa_iswa", "dsv4"):
        n_swa = UNKNOWN_SWA
        notes.append("without --model the sliding window is unknown: no cell is treated as outside it")
    ext = int(res.layout.features.get("cell_ext_bytes", 0) or 0)
    if ext == 12:
        notes.append("without --model a 12-byte cell ext is taken for M-RoPE (it may be PLE)")
    attn = tuple(a for c in caches if c.role in ("kv", "kv_base", "kv_swa", "kv_attn") for a in c.layers)
    return MemorySpec(
        arch=str(res.header.get("arch") or "unknown"),
        n_layer=n_layer,
        memory_class=mc,
        attn=tuple(sorted(attn, key=lambda a: a.il)) if mc in ("kv", "iswa", "hybrid", "hybrid_iswa") else
        tuple(a for c in caches[:1] for a in c.layers),
        swa_layers=frozenset(swa_layers),
        n_swa=n_swa,
        swa_type=SWA_STANDARD if n_swa else 0,
        recurrent_layers=recurrent,
        n_embd_r=n_embd_r,
        n_embd_s=n_embd_s,
        n_pos_per_embd=4 if ext else 1,
        caches=tuple(caches),
        ple_layers=tuple(ple),
        n_embd_p=n_embd_p,
        dsv4=dsv4,
    )


def _keeps(mc: str, role: str) -> bool:
    """Does PARTIAL_ONLY keep the section ``role`` of class ``mc``."""
    if mc in ("iswa", "hybrid_iswa", "dsa_iswa", "dsv4"):
        return role in _SWA_ROLES
    if mc in ("hybrid", "hybrid_idx"):
        return role == "recurrent"
    return True


def _dsv4_caches(found: list[CacheSpec]) -> list[CacheSpec]:
    """Both raw caches of DeepSeek-V4 (a partial state has no base section: it holds no layer)."""
    by_role = {c.role: c for c in found}
    base = by_role.get("kv_raw_base") or CacheSpec("kv_raw_base", (), unified=False, ext=False, partial_keep=False)
    swa = by_role["kv_raw_swa"]
    return [base, swa]


def _ple_layers(rec: Section, recurrent: tuple[int, ...]) -> tuple[list[int], int]:
    """The recurrent layers whose r record is followed by a PLE record, and the PLE row width."""
    ends = {r.data_offset + r.data_size: j for j, r in enumerate(rec.r_layers)}
    out, width = [], 0
    for p in rec.p_layers:
        j = ends.get(p.header_offset)
        if j is not None and j < len(recurrent):
            out.append(recurrent[j])
            width = p.row_bytes // 4
    return out, width


def _dsv4_blocks(res: ParseResult) -> Dsv4Spec:
    """DeepSeek-V4's K-cache and compressor blocks as their bytes describe them."""
    by_role = {s.role: s for s in res.sections}
    kc, comp = [], []
    for role in ("kcache_csa", "kcache_hca", "kcache_lid"):
        sec = by_role.get(role)
        layers: tuple[int, ...] = ()
        ne0 = 0
        if sec is not None:
            layers = _block_layers(sec, 1)
            ne0 = next((gt.elements_in_row(r.type_id, r.row_bytes) or 0 for r in sec.records), 0)
        kc.append(Dsv4Block(role, "kcache", layers, _KCACHE_RATIO[role], ne0))
    for role in ("comp_csa", "comp_hca", "comp_lid"):
        sec = by_role[role]
        f = sec.fields
        comp.append(Dsv4Block(role, "comp", _block_layers(sec, 2), f.get("ratio", 0), 0, f.get("state_size", 0),
                              f.get("n_embd_state", 0)))
    if not any(b.layers for b in kc):  # a partial state: the K caches sit on the compressor layers
        kc = [Dsv4Block(b.role, "kcache", c.layers, b.ratio, b.ne0) for b, c in zip(kc, comp, strict=True)]
    return Dsv4Spec(tuple(kc), tuple(comp))


def _block_layers(sec: Section, per_layer: int) -> tuple[int, ...]:
    """Layer ids of a DSV4 block: the ``u32 il`` before each layer's record(s)."""
    node = sec.node
    if node is None:
        return ()
    ids = [int(str(c.value)) for c in node.children if c.name.startswith("il") and c.value is not None]
    if ids:
        return tuple(ids)
    return tuple(range(len(sec.records) // per_layer))
