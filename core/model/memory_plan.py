"""The memory sections a model's state holds, in write order: llama.cpp's ``create_memory`` as data.

Every memory class is a sequence of sections: ``llama_kv_cache`` sections (``kv``), recurrent
sections, and DeepSeek-V4's own blocks. :func:`build_plan` turns a model's hyperparameters into
that sequence, one :class:`ExpectedSection` each, saying which layers it holds, how wide its K
and V rows are (sub-caches such as lightning indexers have their own geometry), whether its rows
are stored Hadamard-rotated, whether its cells carry an extension, and whether a PARTIAL_ONLY
write keeps it. The sources are ``src/llama-model.cpp`` (``create_memory``), the per-class
constructors ``src/llama-kv-cache-{iswa,dsa,dsa-iswa,msa,dsv4}.cpp`` and
``src/llama-memory-hybrid{,-iswa,-idx}.cpp`` of llama.cpp b11434 (and 0c1e5709), as documented
in ``docs/state-format-classes.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from kvscope.core.model.gguf_metadata import GGUFMetadata

# classes with their own plan builder below; the others are plain compositions
DSA_ARCHES = frozenset({"deepseek32", "glm-dsa", "hy_v4"})
DSA_ROTATED_LID = frozenset({"deepseek32", "glm-dsa", "dots3note", "deepseek4"})  # forced indexer rotation
GLM52_CONTEXT = 1048576  # glm-dsa: at or above this context length the built-in indexer pattern applies
KPOOL_ROW_GLM5_NEXT = 3  # indexer row = key | gate | pooled (hparams.indexer_kpool_row default)
KPOOL_ROW_QWEN4EXP_V4 = 2  # b11434: raw key | pooled key


@dataclass(frozen=True)
class ExpectedSection:
    """One memory section of a state file, in the order llama.cpp writes them.

    ``k_elems``/``v_elems`` give the K and V row elements per layer of ``layers`` when the
    section has its own geometry (an indexer cache); None means the model's own
    ``n_embd_k_gqa(il)``/``n_embd_v_gqa(il)``. ``v_elems == ()`` is a K-only cache (MLA-shaped:
    no V records). ``rotation``: ``quantized`` (rows rotated when the cache type is quantized and
    the head size allows it), ``never`` (a non-zero ``n_rot`` may be written, the rows are not
    rotated), ``always`` (DeepSeek lightning indexers). ``params`` hold the fixed header values
    of DeepSeek-V4 blocks (ratio, state_size, n_embd_state, ne0).
    """

    role: str
    kind: str  # "kv" | "recurrent" | "dsv4_header" | "dsv4_kcache" | "dsv4_comp"
    layers: tuple[int, ...]
    k_elems: tuple[int, ...] | None = None
    v_elems: tuple[int, ...] | None = None
    head_k: tuple[int, ...] = ()  # head sizes of the layers (for the rotation rule)
    head_v: tuple[int, ...] = ()
    rotation: str = "quantized"
    cell_ext: bool | None = None  # None: the model's rule
    partial_keep: bool = True  # written under PARTIAL_ONLY
    k_mult_v4: int = 1  # K rows this many times wider in v11/v4 layouts (Qwen4exp's pooled indexer)
    unified: bool | None = None  # None: the context's kv_unified; False: always one stream per sequence
    params: tuple[tuple[str, int], ...] = ()

    def param(self, name: str) -> int | None:
        return dict(self.params).get(name)

    @property
    def k_only(self) -> bool:
        return self.v_elems == ()

    def for_layout(self, kv_rot: bool) -> ExpectedSection:
        """This section as a layout writes it (the v4 layouts widen some indexer rows)."""
        if not kv_rot or self.k_mult_v4 == 1 or self.k_elems is None:
            return self
        # the cache's K head size widens with its rows (n_embd_head_k_full = key_length x kpool_row):
        # it is what the rotation rule sees
        return replace(self, k_elems=tuple(n * self.k_mult_v4 for n in self.k_elems),
                       head_k=tuple(n * self.k_mult_v4 for n in self.head_k), k_mult_v4=1)


@dataclass
class PlanInputs:
    """What :func:`build_plan` needs of a model, as :mod:`kvscope.core.model.profile` worked it out."""

    arch: str
    n_layer: int  # all layers, nextn included
    main_end: int  # trunk layers: il < main_end
    n_embd: int
    n_head: tuple[int, ...]
    n_head_kv: tuple[int, ...]
    head_dim_k: int
    head_dim_v: int
    head_dim_k_swa: int
    head_dim_v_swa: int
    swa_layers: tuple[int, ...]
    attn_layers: tuple[int, ...]
    recurrent_layers: tuple[int, ...]
    memory_class: str
    is_mla: bool
    has_cell_ext: bool
    notes: list[str] = field(default_factory=list)

    def head_k(self, il: int) -> int:
        return self.head_dim_k_swa if self.head_dim_k_swa and il in self.swa_layers else self.head_dim_k

    def head_v(self, il: int) -> int:
        return self.head_dim_v_swa if self.head_dim_v_swa and il in self.swa_layers else self.head_dim_v


def _kv(p: PlanInputs, role: str, layers: Sequence[int], **kw: object) -> ExpectedSection:
    layers = tuple(layers)
    k_only = bool(kw.pop("k_only", p.is_mla))
    heads_k = tuple(p.head_k(il) for il in layers)
    heads_v = () if k_only else tuple(p.head_v(il) for il in layers)
    v_elems: tuple[int, ...] | None = () if k_only else None
    if "v_elems" in kw:
        v_elems = kw.pop("v_elems")  # type: ignore[assignment]
    return ExpectedSection(role, "kv", layers, v_elems=v_elems, head_k=heads_k, head_v=heads_v,
                           **kw)  # type: ignore[arg-type]


def _recurrent(p: PlanInputs, **kw: object) -> ExpectedSection:
    return ExpectedSection("recurrent", "recurrent", p.recurrent_layers, **kw)  # type: ignore[arg-type]


def _indexer_full(meta: GGUFMetadata, p: PlanInputs, default: int) -> tuple[bool, ...]:
    """``hparams.is_indexer_full(il)`` per trunk layer: the GGUF key, else the arch's default."""
    key = f"{p.arch}.attention.indexer.types"
    flags = meta.int_or_array(key, p.main_end) if meta.has(key) else None
    if flags is not None:
        return tuple(bool(f) for f in flags[: p.main_end])
    if p.arch == "glm-dsa" and (meta.int_(f"{p.arch}.context_length") or 0) >= GLM52_CONTEXT:
        # GLM_5_2_DEFAULT_INDEXER_TYPES (src/models/glm-dsa.cpp): 1, 1, then 1, 0, 0, 0 for 78 layers
        return tuple(il < 2 or (il < 78 and (il - 2) % 4 == 0) for il in range(p.main_end))
    return (bool(default),) * p.main_end


def _indexer_key_length(meta: GGUFMetadata, p: PlanInputs) -> int:
    return meta.int_(f"{p.arch}.attention.indexer.key_length") or 0


def build_plan(meta: GGUFMetadata, p: PlanInputs) -> tuple[str, tuple[ExpectedSection, ...]]:
    """(memory class, sections in write order) for the model described by ``meta`` and ``p``."""
    arch = p.arch
    trunk = tuple(range(p.main_end))
    if arch == "minimax-m3":
        return "msa", _msa(meta, p)
    if arch in DSA_ARCHES and (arch != "hy_v4" or (meta.int_(f"{arch}.attention.indexer.top_k") or 0) > 0):
        return "dsa", _dsa(meta, p, trunk)
    if arch == "dots3note":
        return "dsa_iswa", _dsa_iswa(meta, p, trunk)
    if arch == "deepseek4":
        return "dsv4", _dsv4(meta, p, trunk)
    if arch == "glm5-next":
        return "hybrid_idx", _hybrid_idx(meta, p, trunk, kpool_row=KPOOL_ROW_GLM5_NEXT, v4_mult=1)
    if arch == "qwen4exp" and not p.swa_layers:
        ratios = meta.int_array(f"{arch}.attention.compress_ratios") or ()
        pooled = {r for r in ratios if r}
        v4_mult = KPOOL_ROW_QWEN4EXP_V4 if len(pooled) == 1 and next(iter(pooled)) > 1 else 1
        return "hybrid_idx", _hybrid_idx(meta, p, trunk, kpool_row=1, v4_mult=v4_mult)
    return p.memory_class, _classic(p)


def _classic(p: PlanInputs) -> tuple[ExpectedSection, ...]:
    mc = p.memory_class
    swa = set(p.swa_layers)
    base = [il for il in p.attn_layers if il not in swa]
    swa_l = [il for il in p.attn_layers if il in swa]
    rot = "never" if p.is_mla else "quantized"  # K-only MLA caches are built without rotation
    if mc == "kv":
        return (_kv(p, "kv", p.attn_layers, rotation=rot),)
    if mc == "iswa":
        return (_kv(p, "kv_base", base, rotation=rot, partial_keep=False), _kv(p, "kv_swa", swa_l, rotation=rot))
    if mc == "recurrent":
        return (_recurrent(p),)
    if mc == "hybrid":
        return (_kv(p, "kv_attn", p.attn_layers, rotation=rot, partial_keep=False), _recurrent(p))
    if mc == "hybrid_iswa":
        return (_kv(p, "kv_base", base, rotation=rot, partial_keep=False), _kv(p, "kv_swa", swa_l, rotation=rot),
                _recurrent(p))
    return ()


def _msa(meta: GGUFMetadata, p: PlanInputs) -> tuple[ExpectedSection, ...]:
    lead = meta.int_(f"{p.arch}.leading_dense_block_count") or 0
    idx_layers = tuple(il for il in p.attn_layers if il >= lead)
    kl = _indexer_key_length(meta, p)
    return (
        _kv(p, "kv_base", p.attn_layers, k_only=False),
        ExpectedSection("kv_idx", "kv", idx_layers, k_elems=(kl,) * len(idx_layers),
                        v_elems=(p.head_dim_v,) * len(idx_layers), head_k=(kl,) * len(idx_layers),
                        head_v=(p.head_dim_v,) * len(idx_layers), rotation="never", cell_ext=False),
    )


def _lid(meta: GGUFMetadata, p: PlanInputs, layers: Sequence[int], partial_keep: bool = True) -> ExpectedSection:
    kl = _indexer_key_length(meta, p)
    n = len(layers)
    return ExpectedSection("kv_lid", "kv", tuple(layers), k_elems=(kl,) * n, v_elems=(), head_k=(kl,) * n,
                           rotation="always" if p.arch in DSA_ROTATED_LID else "never", cell_ext=False,
                           partial_keep=partial_keep)


def _dsa(meta: GGUFMetadata, p: PlanInputs, trunk: tuple[int, ...]) -> tuple[ExpectedSection, ...]:
    mla_layers = trunk if p.arch != "hy_v4" else tuple(range(p.n_layer))
    if p.arch == "deepseek32":
        lid_layers = trunk
    else:
        full = _indexer_full(meta, p, default=1 if p.arch == "glm-dsa" else 0)
        lid_layers = tuple(il for il in trunk if full[il])
    return (_kv(p, "kv_mla", mla_layers, k_only=True, rotation="never", cell_ext=False), _lid(meta, p, lid_layers))


def _dsa_iswa(meta: GGUFMetadata, p: PlanInputs, trunk: tuple[int, ...]) -> tuple[ExpectedSection, ...]:
    swa = set(p.swa_layers)
    full = _indexer_full(meta, p, default=0)
    mla = [il for il in trunk if il not in swa]
    lid = [il for il in trunk if full[il]]
    swa_layers = [il for il in trunk if il in swa]
    return (
        _kv(p, "kv_mla", mla, k_only=True, rotation="never", cell_ext=False, partial_keep=False),
        _lid(meta, p, lid, partial_keep=False),
        _kv(p, "kv_swa", swa_layers, k_only=True, rotation="never", cell_ext=False),
    )


def _hybrid_idx(meta: GGUFMetadata, p: PlanInputs, trunk: tuple[int, ...], kpool_row: int,
                v4_mult: int) -> tuple[ExpectedSection, ...]:
    recr = set(p.recurrent_layers)
    attn = [il for il in p.attn_layers if il not in recr]
    kl = _indexer_key_length(meta, p)
    out = [
        _kv(p, "kv_attn", attn, rotation="never" if p.is_mla else "quantized", partial_keep=False),
        _recurrent(p),
    ]
    if kl:
        if p.arch == "glm5-next":
            full = _indexer_full(meta, p, default=1)
            idx = [il for il in trunk if il not in recr and il in set(p.attn_layers) and full[il]]
        else:
            idx = [il for il in trunk if il not in recr]
        n = len(idx)
        ple = meta.has(f"{p.arch}.ple.layers")
        out.append(ExpectedSection("kv_idx", "kv", tuple(idx), k_elems=(kl * kpool_row,) * n, v_elems=(),
                                   head_k=(kl * kpool_row,) * n, rotation="never", cell_ext=ple,
                                   partial_keep=False, k_mult_v4=v4_mult))
    else:
        p.notes.append("no indexer (attention.indexer.key_length 0): the hybrid_idx memory writes no indexer section")
    return tuple(out)


def _dsv4(meta: GGUFMetadata, p: PlanInputs, trunk: tuple[int, ...]) -> tuple[ExpectedSection, ...]:
    ratios = meta.int_array(f"{p.arch}.attention.compress_ratios") or ()
    all_layers = range(p.n_layer)
    swa = set(p.swa_layers) | set(all_layers)  # set_swa_pattern(0): every layer is SWA in kv_raw
    head = p.head_dim_k
    kl = _indexer_key_length(meta, p)
    csa = tuple(il for il in trunk if il < len(ratios) and ratios[il] == 4)
    hca = tuple(il for il in trunk if il < len(ratios) and ratios[il] == 128)
    k_row = head * (p.n_head_kv[0] if p.n_head_kv else 1)

    def raw(role: str, layers: Sequence[int], keep: bool) -> ExpectedSection:
        n = len(layers)
        return ExpectedSection(role, "kv", tuple(layers), k_elems=(k_row,) * n, v_elems=(), head_k=(head,) * n,
                               rotation="quantized", cell_ext=False, partial_keep=keep, unified=False)

    def kcache(role: str, layers: tuple[int, ...], ne0: int, ratio: int) -> ExpectedSection:
        return ExpectedSection(role, "dsv4_kcache", layers, k_elems=(ne0,) * len(layers), head_k=(ne0,) * len(layers),
                               rotation="always" if role == "kcache_lid" else "quantized", partial_keep=False,
                               params=(("ne0", ne0), ("ratio", ratio)))

    def comp(role: str, layers: tuple[int, ...], ratio: int, state: int, n_embd: int) -> ExpectedSection:
        return ExpectedSection(role, "dsv4_comp", layers, rotation="never",
                               params=(("ratio", ratio), ("state_size", state), ("n_embd_state", n_embd)))

    return (
        ExpectedSection("dsv4", "dsv4_header", ()),
        raw("kv_raw_base", [il for il in all_layers if il not in swa], keep=False),
        raw("kv_raw_swa", list(all_layers), keep=True),
        kcache("kcache_csa", csa, k_row, 4),
        kcache("kcache_hca", hca, k_row, 128),
        kcache("kcache_lid", csa, kl, 4),
        comp("comp_csa", csa, 4, 8, 2 * head),
        comp("comp_hca", hca, 128, 128, head),
        comp("comp_lid", csa, 4, 8, 2 * kl),
    )
