"""What a memory needs to know about the model: the hparams subset llama.cpp's memories read.

:class:`MemorySpec` is built from a :class:`~kvscope.core.model_profile.ModelProfile`
(:meth:`MemorySpec.from_profile`) or, without a model, from the structure of a state file
(``infer.py``). It holds per-layer K/V widths, the recurrent row widths, the sliding window and
whether KV cells carry a ``llama_kv_cell_ext`` -- nothing about weights or the vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvscope.core.model_profile import ModelProfile

# llama_swa_type (include/llama.h)
SWA_NONE, SWA_STANDARD, SWA_CHUNKED, SWA_SYMMETRIC = 0, 1, 2, 3

# Architectures whose sliding window is not LLAMA_SWA_TYPE_STANDARD (llama-model.cpp load_hparams).
_SWA_TYPE_BY_ARCH = {"llama4": SWA_CHUNKED}

MEMORY_CLASSES = ("kv", "iswa", "recurrent", "hybrid", "hybrid_iswa")
LLAMA_MAX_SEQ = 256


class SpecError(ValueError):
    """The model (or the inferred structure) cannot be held by one of the memory classes."""


@dataclass(frozen=True)
class AttnLayer:
    """One model layer with a KV cache entry: K row width and V row width (0: no V, MLA)."""

    il: int
    n_embd_k: int
    n_embd_v: int


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
        needs_recr = self.memory_class in ("recurrent", "hybrid", "hybrid_iswa")
        if needs_attn and not self.attn:
            raise SpecError(f"a {self.memory_class} memory needs attention layers")
        if needs_recr and not rl:
            raise SpecError(f"a {self.memory_class} memory needs recurrent layers")
        if not needs_recr and rl:
            raise SpecError(f"a {self.memory_class} memory has no recurrent part, but layers {rl} are recurrent")
        if self.memory_class in ("iswa", "hybrid_iswa") and self.n_swa <= 0:
            raise SpecError("an iSWA memory needs a sliding window (n_swa > 0)")
        if self.n_embd_r < 0 or self.n_embd_s < 0:
            raise SpecError("recurrent row widths must not be negative")

    # -- derived ----------------------------------------------------------------------------
    def has_cell_ext(self) -> bool:
        """``llama_kv_cache::has_cell_ext()`` at 0c1e5709: M-RoPE or PLE."""
        return self.n_pos_per_embd > 1 or self.has_ple

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
    def from_profile(cls, p: ModelProfile) -> MemorySpec:
        """The spec llama.cpp's ``create_memory()`` would use for the model in ``p``."""
        if p.memory_class not in MEMORY_CLASSES:
            raise SpecError(f"model {p.arch}: memory class {p.memory_class!r} has no memory to model")
        attn = tuple(AttnLayer(il, p.n_embd_k_gqa(il), p.n_embd_v_gqa(il) if p.has_v(il) else 0)
                     for il in p.attn_layers)
        n_swa = p.n_swa if p.swa_layers else 0
        swa_type = _SWA_TYPE_BY_ARCH.get(p.arch, SWA_STANDARD) if n_swa > 0 else SWA_NONE
        recr = p.recurrent_layers if p.memory_class in ("recurrent", "hybrid", "hybrid_iswa") else ()
        return cls(
            arch=p.arch,
            n_layer=p.n_layer,
            memory_class=p.memory_class,
            attn=attn,
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
        )


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
