"""What a memory needs to know about the model: the hparams subset llama.cpp's memories read.

:class:`MemorySpec` is built from a :class:`~kvscope.core.model.profile.ModelProfile`
(:meth:`MemorySpec.from_profile`, which follows the model's memory plan,
:mod:`kvscope.core.model.memory_plan`) or, without a model, from the structure of a state file
(``infer.py``). It holds the KV sub-caches of the memory class in write order
(:class:`CacheSpec`: layers, K/V widths, the inputs of the rotation rule, cell ext, PARTIAL_ONLY
handling), the recurrent row widths (and PLE ``p`` rows), DeepSeek-V4's compressed blocks
(:class:`Dsv4Spec`), the sliding window -- nothing about weights or the vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from kvscope.core.errors import InputError
from kvscope.core.model.memory_plan import ExpectedSection
from kvscope.core.model.profile import ModelProfile
from kvscope.core.model.rotation_rule import OWN_HEAD_ROLES, planned_cache_heads

# llama_swa_type (include/llama.h)
SWA_NONE, SWA_STANDARD, SWA_CHUNKED, SWA_SYMMETRIC = 0, 1, 2, 3

# Architectures whose sliding window is not LLAMA_SWA_TYPE_STANDARD (llama-model.cpp load_hparams).
_SWA_TYPE_BY_ARCH = {"llama4": SWA_CHUNKED}

MEMORY_CLASSES = ("kv", "iswa", "recurrent", "hybrid", "hybrid_iswa", "hybrid_idx", "dsa", "dsa_iswa", "msa", "dsv4")
# classes made of more than the classic pieces (and first written by the 2026-10 builds' layouts)
NEW_CLASSES = ("hybrid_idx", "dsa", "dsa_iswa", "msa", "dsv4")
RECURRENT_CLASSES = ("recurrent", "hybrid", "hybrid_iswa", "hybrid_idx")
# KV sub-cache roles of each class, in write order (the recurrent section sits where "recurrent" is)
CLASS_ROLES: dict[str, tuple[str, ...]] = {
    "kv": ("kv",),
    "iswa": ("kv_base", "kv_swa"),
    "recurrent": ("recurrent",),
    "hybrid": ("kv_attn", "recurrent"),
    "hybrid_iswa": ("kv_base", "kv_swa", "recurrent"),
    "hybrid_idx": ("kv_attn", "recurrent", "kv_idx"),
    "dsa": ("kv_mla", "kv_lid"),
    "dsa_iswa": ("kv_mla", "kv_lid", "kv_swa"),
    "msa": ("kv_base", "kv_idx"),
    "dsv4": ("kv_raw_base", "kv_raw_swa"),
}
# sub-caches built on a copy of the model's hparams with their own head size (indexers)
LLAMA_MAX_SEQ = 256


class SpecError(InputError, ValueError):
    """The model (or the inferred structure) cannot be held by one of the memory classes."""


@dataclass(frozen=True)
class AttnLayer:
    """One model layer with a KV cache entry: K row width and V row width (0: no V, MLA)."""

    il: int
    n_embd_k: int
    n_embd_v: int


@dataclass(frozen=True)
class CacheSpec:
    """One ``llama_kv_cache`` of a memory: its layers and what its constructor derives from hparams.

    ``head_k``/``head_v`` are the head sizes of its layers and ``head_k0``/``head_v0`` layer 0's head
    size of the cache's own hparams (``hparams.n_embd_head_k()``), the inputs of llama.cpp's rotation
    rule; ``rot_forced`` is the lightning-indexer rule (K always rotated); ``n_rot`` pins the block
    sizes instead (a context inferred from a v11/v4 file). ``swa``: the cache uses the model's sliding
    window (cell search and per-sequence writes); ``size``: ``base`` (``n_ctx_seq`` cells) or ``swa``
    (the iSWA rule); ``unified`` False: one stream per sequence whatever the context says (DeepSeek-V4);
    ``ext`` None: the model's cell-ext rule; ``partial_keep`` False: PARTIAL_ONLY leaves it out.
    """

    role: str
    layers: tuple[AttnLayer, ...]
    swa: bool = False
    size: str = "base"
    unified: bool | None = None
    ext: bool | None = None
    partial_keep: bool = True
    head_k: tuple[int, ...] = ()
    head_v: tuple[int, ...] = ()
    head_k0: int | None = None
    head_v0: int | None = None
    rot_forced: bool = False
    n_rot: tuple[int, int] | None = None
    n_pos_per_embd: int | None = None  # None: the model's (indexer copies with rope NONE/NEOX: 1)

    @property
    def k_only(self) -> bool:
        """No layer keeps V (MLA-shaped: no V records)."""
        return all(a.n_embd_v == 0 for a in self.layers)


@dataclass(frozen=True)
class Dsv4Block:
    """A DeepSeek-V4 K-cache block (``kind`` kcache: rows of ``ne0`` elements, ``ratio`` positions per
    row) or compressor state (``kind`` comp: F32 ``state_size x n_embd_state`` kv and score planes)."""

    role: str
    kind: str
    layers: tuple[int, ...]
    ratio: int
    ne0: int = 0
    state_size: int = 0
    n_embd_state: int = 0


@dataclass(frozen=True)
class Dsv4Spec:
    """The compressed parts of ``llama_kv_cache_dsv4``: K-cache blocks csa, hca, lid and three compressor states."""

    kcaches: tuple[Dsv4Block, ...]
    comps: tuple[Dsv4Block, ...]


@dataclass(frozen=True)
class MemorySpec:
    """The model facts a llama.cpp memory depends on (``llama_hparams`` as the caches use it)."""

    arch: str
    n_layer: int
    memory_class: str
    attn: tuple[AttnLayer, ...] = ()
    swa_layers: frozenset[int] = field(default_factory=frozenset)
    n_swa: int = 0
    swa_type: int = SWA_NONE
    recurrent_layers: tuple[int, ...] = ()
    n_embd_r: int = 0
    n_embd_s: int = 0
    n_pos_per_embd: int = 1
    has_ple: bool = False
    n_vocab: int = 0
    n_embd: int = 0
    # the KV sub-caches in write order; () derives them from the fields above (classic classes)
    caches: tuple[CacheSpec, ...] = ()
    ple_layers: tuple[int, ...] = ()  # recurrent layers with a PLE conv-history row
    n_embd_p: int = 0  # elements of a PLE row (hparams.ple_conv_state())
    dsv4: Dsv4Spec | None = None
    n_layer_nextn: int = 0  # of the n_layer, the last are MTP/NextN blocks (no recurrent state of their own)

    def __post_init__(self) -> None:
        self.validate()

    # -- checks -----------------------------------------------------------------------------
    def validate(self) -> None:
        """Raise :class:`SpecError` when the fields do not describe a memory llama.cpp builds."""
        if self.memory_class not in MEMORY_CLASSES:
            raise SpecError(f"memory class {self.memory_class!r} is not modelled (known: {', '.join(MEMORY_CLASSES)})")
        if self.n_layer <= 0:
            raise SpecError(f"n_layer {self.n_layer} must be positive")
        ils = [a.il for a in self.attn]
        if ils != sorted(set(ils)) or any(not 0 <= il < self.n_layer for il in ils):
            raise SpecError(f"attention layers {ils} must be ascending, distinct and in [0, {self.n_layer})")
        for a in self.attn:
            if a.n_embd_k <= 0 or a.n_embd_v < 0:
                raise SpecError(f"layer {a.il}: K width {a.n_embd_k} / V width {a.n_embd_v} are not valid")
        rl = list(self.recurrent_layers)
        if rl != sorted(set(rl)) or any(not 0 <= il < self.n_layer for il in rl):
            raise SpecError(f"recurrent layers {rl} must be ascending, distinct and in [0, {self.n_layer})")
        needs_attn = self.memory_class != "recurrent"
        needs_recr = self.memory_class in RECURRENT_CLASSES
        if needs_attn and not self.attn and not any(c.layers for c in self.caches):
            raise SpecError(f"a {self.memory_class} memory needs attention layers")
        if needs_recr and not rl:
            raise SpecError(f"a {self.memory_class} memory needs recurrent layers")
        if not needs_recr and rl:
            raise SpecError(f"a {self.memory_class} memory has no recurrent part, but layers {rl} are recurrent")
        if self.memory_class in ("iswa", "hybrid_iswa", "dsa_iswa", "dsv4") and self.n_swa <= 0:
            raise SpecError("an iSWA memory needs a sliding window (n_swa > 0)")
        if self.n_embd_r < 0 or self.n_embd_s < 0 or self.n_embd_p < 0:
            raise SpecError("recurrent row widths must not be negative")
        if any(il not in rl for il in self.ple_layers):
            raise SpecError(f"PLE layers {list(self.ple_layers)} must be recurrent layers")
        self._validate_caches()

    def _validate_caches(self) -> None:
        want = tuple(r for r in CLASS_ROLES[self.memory_class] if r != "recurrent")
        roles = tuple(c.role for c in self.caches)
        if self.caches and roles != want and not (self.memory_class == "hybrid_idx" and roles == want[:1]):
            raise SpecError(f"a {self.memory_class} memory has the KV caches {list(want)}, not {list(roles)}")
        if not self.caches and self.memory_class in NEW_CLASSES:
            raise SpecError(f"a {self.memory_class} memory needs its KV caches listed (MemorySpec.caches)")
        for c in self.caches:
            ils = [a.il for a in c.layers]
            if ils != sorted(set(ils)) or any(not 0 <= il < self.n_layer for il in ils):
                raise SpecError(f"{c.role}: layers {ils} must be ascending, distinct and in [0, {self.n_layer})")
            for a in c.layers:
                if a.n_embd_k <= 0 or a.n_embd_v < 0:
                    raise SpecError(f"{c.role} layer {a.il}: K width {a.n_embd_k} / V width {a.n_embd_v} are not valid")
            if c.size not in ("base", "swa"):
                raise SpecError(f"{c.role}: cache size rule {c.size!r} is not base or swa")
        if (self.memory_class == "dsv4") != (self.dsv4 is not None):
            raise SpecError("the DeepSeek-V4 blocks belong to a dsv4 memory, and a dsv4 memory needs them")

    # -- derived ----------------------------------------------------------------------------
    def has_cell_ext(self) -> bool:
        """``llama_kv_cache::has_cell_ext()`` at 0c1e5709: M-RoPE or PLE."""
        return self.n_pos_per_embd > 1 or self.has_ple

    def cache_has_ext(self, c: CacheSpec) -> bool:
        """Does sub-cache ``c`` write a cell ext (its own rule, else the model's)."""
        return self.has_cell_ext() if c.ext is None else c.ext

    def kv_caches(self) -> tuple[CacheSpec, ...]:
        """The KV sub-caches in write order (derived from the classic fields when not listed)."""
        if self.caches:
            return self.caches
        mc = self.memory_class
        if mc == "kv":
            return (CacheSpec("kv", self.attn),)
        if mc in ("iswa", "hybrid_iswa"):
            return (CacheSpec("kv_base", self.attn_base(), partial_keep=False),
                    CacheSpec("kv_swa", self.attn_swa(), swa=True, size="swa"))
        if mc == "hybrid":
            return (CacheSpec("kv_attn", self.attn, partial_keep=False),)
        return ()

    def with_rotation(self, pins: dict[str, tuple[int, int]]) -> MemorySpec:
        """This spec with the rotation block sizes of some sub-caches pinned (role -> (n_rot_k, n_rot_v))."""
        caches = tuple(replace(c, n_rot=pins[c.role]) if c.role in pins else c for c in self.kv_caches())
        return replace(self, caches=caches)

    @property
    def is_iswa(self) -> bool:
        """True for the memory classes with a base and an SWA cache."""
        return self.memory_class in ("iswa", "hybrid_iswa")

    def attn_base(self) -> tuple[AttnLayer, ...]:
        """Attention layers of the non-SWA cache (all of them for a non-iSWA memory)."""
        if not self.is_iswa:
            return self.attn
        return tuple(a for a in self.attn if a.il not in self.swa_layers)

    def attn_swa(self) -> tuple[AttnLayer, ...]:
        """Attention layers of the SWA cache of an iSWA memory."""
        return tuple(a for a in self.attn if a.il in self.swa_layers) if self.is_iswa else ()

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def from_profile(cls, p: ModelProfile, kv_rot: bool = True) -> MemorySpec:
        """The spec llama.cpp's ``create_memory()`` would use for the model in ``p``.

        ``kv_rot``: the memory of a v11/v4 build (b11434; Qwen4exp's k-pool indexer rows are twice as
        wide there), else of a 2026-10 build (0c1e5709) or older.
        """
        if p.memory_class not in MEMORY_CLASSES:
            raise SpecError(f"model {p.arch}: memory class {p.memory_class!r} has no memory to model")
        attn = tuple(AttnLayer(il, p.n_embd_k_gqa(il), p.n_embd_v_gqa(il) if p.has_v(il) else 0)
                     for il in p.attn_layers)
        n_swa = p.n_swa if p.swa_layers else 0
        swa_type = _SWA_TYPE_BY_ARCH.get(p.arch, SWA_STANDARD) if n_swa > 0 else SWA_NONE
        recr = p.recurrent_layers if p.memory_class in RECURRENT_CLASSES else ()
        plan = p.expected_sections(False, kv_rot)
        caches = tuple(_cache_of(p, s, plan) for s in plan if s.kind == "kv")
        dsv4 = _dsv4_of(plan) if p.memory_class == "dsv4" else None
        return cls(
            arch=p.arch,
            n_layer=p.n_layer,
            memory_class=p.memory_class,
            attn=attn if p.memory_class not in NEW_CLASSES else tuple(a for c in caches[:1] for a in c.layers),
            swa_layers=frozenset(p.swa_layers),
            n_swa=n_swa,
            swa_type=swa_type,
            recurrent_layers=tuple(recr),
            n_embd_r=p.n_embd_r,
            n_embd_s=p.n_embd_s,
            n_pos_per_embd=p.n_pos_per_embd,
            has_ple=p.has_ple,
            n_vocab=p.n_vocab,
            n_embd=p.n_embd,
            caches=caches,
            ple_layers=tuple(il for il in p.ple_layers if il in set(recr)),
            n_embd_p=p.n_embd_p,
            dsv4=dsv4,
            n_layer_nextn=p.n_layer_nextn,
        )


def _cache_of(p: ModelProfile, s: ExpectedSection, plan: list[ExpectedSection]) -> CacheSpec:
    """The sub-cache ``s`` of the plan, with the widths and rotation inputs its constructor sees."""
    layers = []
    for j, il in enumerate(s.layers):
        n_k = s.k_elems[j] if s.k_elems is not None else p.n_embd_k_gqa(il)
        if s.v_elems == ():
            n_v = 0
        elif s.v_elems is not None:
            n_v = s.v_elems[j]
        else:
            n_v = p.n_embd_v_gqa(il) if p.has_v(il) else 0
        layers.append(AttnLayer(il, n_k, n_v))
    own = s.role in OWN_HEAD_ROLES
    heads = planned_cache_heads(p, plan, s)
    swa = s.role in ("kv_swa", "kv_raw_swa")
    return CacheSpec(
        role=s.role,
        layers=tuple(layers),
        swa=swa,
        size="swa" if swa else "base",
        unified=s.unified,
        ext=s.cell_ext,
        partial_keep=s.partial_keep,
        head_k=s.head_k,
        head_v=s.head_v,
        head_k0=heads.k0,
        head_v0=heads.v0,
        rot_forced=heads.forced_k,
        n_pos_per_embd=1 if own else None,
    )


def _dsv4_of(plan: list[ExpectedSection]) -> Dsv4Spec:
    def block(s: ExpectedSection) -> Dsv4Block:
        kind = "kcache" if s.kind == "dsv4_kcache" else "comp"
        return Dsv4Block(s.role, kind, s.layers, s.param("ratio") or 0, s.param("ne0") or 0,
                         s.param("state_size") or 0, s.param("n_embd_state") or 0)

    return Dsv4Spec(tuple(block(s) for s in plan if s.kind == "dsv4_kcache"),
                    tuple(block(s) for s in plan if s.kind == "dsv4_comp"))


def is_masked_swa(n_swa: int, swa_type: int, p0: int, p1: int) -> bool:
    """``llama_hparams::is_masked_swa``: is position ``p0`` outside the window of ``p1``."""
    if swa_type == SWA_STANDARD:
        return p1 - p0 >= n_swa
    if swa_type == SWA_CHUNKED:
        return p0 < (p1 // n_swa) * n_swa
    if swa_type == SWA_SYMMETRIC:
        half = n_swa // 2
        return p1 - p0 < -half or p1 - p0 > half
    return False
