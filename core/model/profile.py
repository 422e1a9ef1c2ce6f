"""Model profiles: the memory layout a llama.cpp state file of a given GGUF model should have.

A llama.cpp state file (session, sequence file, ``llama_state_*_get_data`` blob) carries no
description of the model it came from beyond, at most, the architecture name. To read one, kvscope
needs to know which memory class llama.cpp built for the model (plain KV cache, iSWA pair of KV
caches, recurrent state, or a hybrid of KV cache and recurrent state), which model layers each part
holds, and how wide their rows are. :func:`load_model_profile` reads that from the GGUF metadata
into a :class:`ModelProfile`, mirroring the rules of llama.cpp's ``src/llama-model.cpp``
(``load_hparams`` / ``create_memory``), ``src/llama-hparams.cpp`` and ``src/llama-arch.cpp``.
The profile also carries the vocabulary so token ids found in state files can be shown as text.

The work is split over small modules: :mod:`kvscope.core.model.gguf_metadata` reads the GGUF metadata
(a fast scanner, with ``gguf.GGUFReader`` as the reference backend), :mod:`kvscope.core.model.architectures`
holds the per-architecture rules, and :mod:`kvscope.core.model.detokenize` turns token ids into text. This
module puts them together and keeps the public API.

This module never imports Qt or torch.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from kvscope.core.errors import InputError
from kvscope.core.model import detokenize as _detok
from kvscope.core.model.architectures import (
    DEFAULT_ATTENTION_INTERVAL,
    HYBRID_RULES,
    MROPE_ARCHES,
    MROPE_IF_SECTIONS_ARCHES,
    NO_MEMORY_ARCHES,
    RECURRENT_ARCHES,
    SWA_IF_WINDOW_ON_ATTENTION,
    recurrent_sizes,
    swa_setup,
)
from kvscope.core.model.gguf_metadata import Backend, GGUFMetadata, GGUFMetadataError, read_gguf_metadata
from kvscope.core.model.memory_plan import ExpectedSection, PlanInputs, build_plan
from kvscope.core.textsafe import safe_text

__all__ = [
    "ExpectedSection",
    "ModelProfile",
    "ModelProfileError",
    "MemoryClass",
    "load_model_profile",
]

# The memory llama.cpp's create_memory() builds: llama_kv_cache ("kv"), llama_kv_cache_iswa ("iswa"),
# llama_memory_recurrent ("recurrent"), llama_memory_hybrid ("hybrid"), llama_memory_hybrid_iswa
# ("hybrid_iswa"), or nothing ("none": embedding / diffusion models).
MemoryClass = Literal["kv", "iswa", "recurrent", "hybrid", "hybrid_iswa", "hybrid_idx", "dsa", "dsa_iswa", "msa",
                      "dsv4", "none"]


class ModelProfileError(InputError):
    """A GGUF model could not be read into a :class:`ModelProfile` (one-line message, escaped:
    architecture names and keys in it come from the file)."""

    def __init__(self, message: str) -> None:
        super().__init__(safe_text(message, 400))


_MAX_SANE_LAYERS = 1 << 16


@dataclass(frozen=True)
class ModelProfile:
    """What a llama.cpp state reader needs to know about a model, read from its GGUF file.

    Per-layer tuples have ``n_layer`` entries. The fields after ``tokenizer_model`` are extras
    (with defaults, so a profile can be built by hand from the required fields alone).
    """

    path: str
    arch: str  # general.architecture
    n_layer: int  # {arch}.block_count
    n_embd: int
    n_vocab: int
    n_head: tuple[int, ...]
    n_head_kv: tuple[int, ...]
    head_dim_k: int  # {arch}.attention.key_length
    head_dim_v: int  # {arch}.attention.value_length
    n_swa: int  # sliding window, 0 if none
    swa_layers: tuple[int, ...]  # layers using the sliding window
    recurrent_layers: tuple[int, ...]  # layers with recurrent (r/s) state
    n_embd_r: int  # recurrent "r" (conv / token shift) row elements per cell
    n_embd_s: int  # recurrent "s" (ssm / wkv) row elements per cell
    n_pos_per_embd: int  # 4 for M-RoPE architectures, else 1
    memory_class: str  # "kv" | "iswa" | "recurrent" | "hybrid" | "hybrid_iswa" | "none"
    vocab: tuple[str, ...] = field(repr=False)  # tokenizer.ggml.tokens (may be empty)
    tokenizer_model: str  # tokenizer.ggml.model or ''
    # --- extras -------------------------------------------------------------------------------
    token_types: tuple[int, ...] = field(default=(), repr=False)  # tokenizer.ggml.token_type
    n_ff: tuple[int, ...] = ()  # {arch}.feed_forward_length per layer (() if unknown)
    head_dim_k_swa: int = 0  # {arch}.attention.key_length_swa for SWA layers (0: same as head_dim_k)
    head_dim_v_swa: int = 0  # {arch}.attention.value_length_swa (0: same as head_dim_v)
    is_mla: bool = False  # key_length_mla and value_length_mla set: the KV cache holds K only
    has_ple: bool = False  # {arch}.ple.layers set: KV cells carry a cell ext (token id)
    # Exact KV-cache layer list worked out by the loader (has_kv(), hybrid layer filters); None
    # derives it from n_head_kv and recurrent_layers.
    attn_layers_override: tuple[int, ...] | None = None
    notes: tuple[str, ...] = ()  # caveats about how well this profile models the architecture
    # the memory sections in write order (kvscope.core.model.memory_plan); () derives the classic ones
    plan: tuple[ExpectedSection, ...] = ()
    ple_layers: tuple[int, ...] = ()  # recurrent layers with a PLE conv-history ``p`` record
    n_embd_p: int = 0  # elements of a ``p`` row (hparams.ple_conv_state())
    n_layer_nextn: int = 0  # {arch}.nextn_predict_layers: the last blocks are MTP/NextN, not the trunk

    # --- per-layer sizes ----------------------------------------------------------------------

    def _check_layer(self, il: int) -> None:
        if not 0 <= il < self.n_layer:
            raise IndexError(f"layer {il} out of range (model has {self.n_layer} layers)")

    def head_size_k(self, il: int) -> int:
        """K head size of layer ``il`` (``llama_hparams::n_embd_head_k(il)``: the SWA size on SWA layers)."""
        self._check_layer(il)
        return self.head_dim_k_swa if self.head_dim_k_swa and il in self.swa_layers else self.head_dim_k

    def head_size_v(self, il: int) -> int:
        """V head size of layer ``il`` (``llama_hparams::n_embd_head_v(il)``)."""
        self._check_layer(il)
        return self.head_dim_v_swa if self.head_dim_v_swa and il in self.swa_layers else self.head_dim_v

    def n_embd_k_gqa(self, il: int) -> int:
        """K row elements of layer ``il``: ``head_dim_k * n_head_kv[il]`` (llama_hparams::n_embd_k_gqa)."""
        self._check_layer(il)
        head = self.head_dim_k_swa if self.head_dim_k_swa and il in self.swa_layers else self.head_dim_k
        return head * self.n_head_kv[il]

    def n_embd_v_gqa(self, il: int) -> int:
        """V row elements of layer ``il``: ``head_dim_v * n_head_kv[il]`` (llama_hparams::n_embd_v_gqa)."""
        self._check_layer(il)
        head = self.head_dim_v_swa if self.head_dim_v_swa and il in self.swa_layers else self.head_dim_v
        return head * self.n_head_kv[il]

    def has_v(self, il: int) -> bool:
        """False when layer ``il`` keeps no V cache (MLA: K only); True for normal layers."""
        self._check_layer(il)
        return not self.is_mla

    def has_cell_ext(self) -> bool:
        """True when each KV cell's metadata carries a ``llama_kv_cell_ext`` (M-RoPE or PLE models)."""
        return self.n_pos_per_embd > 1 or self.has_ple

    # --- layer sets ---------------------------------------------------------------------------

    @property
    def attn_layers(self) -> tuple[int, ...]:
        """Layers with a KV cache entry (default: ``n_head_kv > 0`` and not recurrent)."""
        if self.attn_layers_override is not None:
            return self.attn_layers_override
        recurrent = set(self.recurrent_layers)
        return tuple(il for il in range(self.n_layer) if self.n_head_kv[il] > 0 and il not in recurrent)

    @property
    def kv_base_layers(self) -> tuple[int, ...]:
        """KV-cache layers that use full attention (the iSWA base cache)."""
        swa = set(self.swa_layers)
        return tuple(il for il in self.attn_layers if il not in swa)

    @property
    def kv_swa_layers(self) -> tuple[int, ...]:
        """KV-cache layers that use the sliding window (the iSWA SWA cache)."""
        swa = set(self.swa_layers)
        return tuple(il for il in self.attn_layers if il in swa)

    def expected_sections(self, partial: bool, kv_rot: bool = False) -> list[ExpectedSection]:
        """The memory sections of a state file in write order (``partial``: PARTIAL_ONLY flag).

        Mirrors llama.cpp's memory classes (``create_memory``): ``llama_kv_cache`` ignores the
        flag, ``llama_kv_cache_iswa`` writes only its SWA cache and ``llama_memory_hybrid``
        only its recurrent part when it is set, and so on (:mod:`kvscope.core.model.memory_plan`).
        ``kv_rot``: the layout is v11/v4 or later (Qwen4exp's indexer rows are wider there).
        """
        plan = self.plan or self._classic_plan()
        return [s.for_layout(kv_rot) for s in plan if s.partial_keep or not partial]

    def _classic_plan(self) -> tuple[ExpectedSection, ...]:
        def kv(role: str, layers: tuple[int, ...], keep: bool = True) -> ExpectedSection:
            return ExpectedSection(role, "kv", layers, v_elems=() if self.is_mla else None, partial_keep=keep)

        recr = ExpectedSection("recurrent", "recurrent", self.recurrent_layers)
        mc = self.memory_class
        if mc == "kv":
            return (kv("kv", self.attn_layers),)
        if mc == "iswa":
            return (kv("kv_base", self.kv_base_layers, False), kv("kv_swa", self.kv_swa_layers))
        if mc == "recurrent":
            return (recr,)
        if mc == "hybrid":
            return (kv("kv_attn", self.attn_layers, False), recr)
        if mc == "hybrid_iswa":
            return (kv("kv_base", self.kv_base_layers, False), kv("kv_swa", self.kv_swa_layers), recr)
        return ()

    def section_plan(self, role: str) -> ExpectedSection | None:
        """The planned section called ``role`` (first match), or None."""
        return next((s for s in (self.plan or self._classic_plan()) if s.role == role), None)

    # --- vocabulary ---------------------------------------------------------------------------

    def token_text(self, token_id: int) -> str | None:
        """Text of one token, or None when ``token_id`` is outside the vocabulary.

        Sentencepiece ``▁`` becomes a space and GPT-2 byte-level pieces are mapped back to their
        bytes. Bytes that are not valid UTF-8 on their own (half of a multi-byte character) are
        shown escaped: a byte token keeps its ``<0xNN>`` text (also for control characters), other
        pieces get ``\\xNN``.
        """
        return _detok.token_text(self.vocab, self.token_types, self.tokenizer_model, token_id)

    def detokenize(self, ids: Sequence[int]) -> str:
        """Text of a token sequence; bytes are joined before decoding, so split characters survive.

        Ids outside the vocabulary show as ``<?ID>``; invalid UTF-8 becomes U+FFFD.
        """
        return _detok.detokenize(self.vocab, self.token_types, self.tokenizer_model, ids)


def _build_profile(meta: GGUFMetadata, path: str) -> ModelProfile:
    name = meta.name
    arch = meta.str_("general.architecture")
    if arch is None:
        raise ModelProfileError(f"{name}: GGUF metadata lacks required key 'general.architecture'")
    if arch == "clip":
        raise ModelProfileError(f"{name}: a 'clip' GGUF is a multimodal projector, not a language model")
    notes: list[str] = []
    shown = safe_text(arch, 80)  # the architecture as notes show it (it comes from the file)

    n_layer = meta.require_int(f"{arch}.block_count")
    if n_layer > _MAX_SANE_LAYERS:
        raise ModelProfileError(f"{name}: implausible {arch}.block_count {n_layer}")
    n_embd = meta.require_int(f"{arch}.embedding_length")

    vocab = meta.str_array("tokenizer.ggml.tokens") or ()
    vocab_size = meta.int_(f"{arch}.vocab_size")
    n_vocab = vocab_size if vocab_size is not None else len(vocab)
    tokenizer_model = meta.str_("tokenizer.ggml.model") or ""
    raw_types = meta.values.get("tokenizer.ggml.token_type")
    token_types: tuple[int, ...] = ()
    if isinstance(raw_types, np.ndarray) and raw_types.dtype.kind in "biu":
        token_types = tuple(raw_types.tolist())

    zeros = (0,) * n_layer
    n_head = meta.int_or_array(f"{arch}.attention.head_count", n_layer) or zeros
    n_head_kv = meta.int_or_array(f"{arch}.attention.head_count_kv", n_layer) or n_head
    n_ff = meta.int_or_array(f"{arch}.feed_forward_length", n_layer) or ()

    # Head sizes: llama.cpp divides by n_head(0); a model whose first layer has no heads falls back
    # to the widest layer here. No heads at all: 0, as for non-transformer models.
    n_head_ref = n_head[0] if n_layer and n_head[0] > 0 else max(n_head, default=0)
    if n_head_ref > 0:
        head_default = n_embd // n_head_ref
        key_length = meta.int_(f"{arch}.attention.key_length")
        value_length = meta.int_(f"{arch}.attention.value_length")
        head_dim_k = head_default if key_length is None else key_length
        head_dim_v = head_default if value_length is None else value_length
    else:
        head_dim_k = head_dim_v = 0
    head_dim_k_swa = meta.int_(f"{arch}.attention.key_length_swa") or 0
    head_dim_v_swa = meta.int_(f"{arch}.attention.value_length_swa") or 0
    is_mla = bool(meta.int_(f"{arch}.attention.key_length_mla")) and bool(
        meta.int_(f"{arch}.attention.value_length_mla")
    )

    # Layers past these hold no KV cache of their own: shared-KV layers (gemma3n, gemma4: they read
    # an earlier layer's cache) and NextN / MTP prediction layers (not run in the main context).
    kv_end = n_layer
    shared_kv = meta.int_(f"{arch}.attention.shared_kv_layers")
    if shared_kv:
        kv_end = max(0, n_layer - shared_kv)
    elif arch == "gemma3n":
        kv_end = min(n_layer, 20)  # hparams.n_layer_kv_from_start = 20
    nextn = meta.int_(f"{arch}.nextn_predict_layers") or 0
    main_end = max(0, n_layer - nextn)
    kv_end = min(kv_end, main_end)

    # --- memory class and layer sets --------------------------------------------------------
    n_swa, swa_layers = swa_setup(meta, arch, n_layer)
    hybrid_rule = HYBRID_RULES.get(arch)
    is_recurrent_arch = arch in RECURRENT_ARCHES
    if (
        hybrid_rule is None
        and not is_recurrent_arch
        and arch not in NO_MEMORY_ARCHES
        and any(meta.has(f"{arch}.{k}") for k in ("ssm.conv_kernel", "shortconv.l_cache", "wkv.head_size"))
    ):
        # An architecture this table does not know, but with recurrent-state metadata.
        if any(n_head_kv) and not all(n_head_kv):
            hybrid_rule = "kv0"
            notes.append(
                f"architecture '{shown}' is not in kvscope's table; guessed hybrid (kv heads 0 = recurrent)"
            )
        elif not any(n_head_kv):
            is_recurrent_arch = True
            notes.append(f"architecture '{shown}' is not in kvscope's table; guessed recurrent")

    recurrent_flags = [False] * n_layer
    if is_recurrent_arch:
        recurrent_flags = [True] * n_layer
    elif hybrid_rule == "kv0":
        recurrent_flags = [kv == 0 for kv in n_head_kv]
    elif hybrid_rule == "kv0_ff0":
        ff = n_ff or zeros
        recurrent_flags = [n_head_kv[il] == 0 and ff[il] == 0 for il in range(n_layer)]
    elif hybrid_rule == "all":
        recurrent_flags = [True] * n_layer
    elif hybrid_rule == "interval":
        listed = meta.int_or_array(f"{arch}.attention.recurrent_layers", n_layer) if meta.has(
            f"{arch}.attention.recurrent_layers") else None
        if listed is not None:
            recurrent_flags = [bool(f) for f in listed[:n_layer]]
        else:
            interval = meta.int_(f"{arch}.full_attention_interval") or DEFAULT_ATTENTION_INTERVAL.get(arch, 4)
            recurrent_flags = [il < main_end and (il + 1) % interval != 0 for il in range(n_layer)]
    if arch in SWA_IF_WINDOW_ON_ATTENTION and (meta.int_(f"{arch}.attention.sliding_window") or 0) > 0:
        n_swa = meta.require_int(f"{arch}.attention.sliding_window")
        swa_layers = tuple(il for il in range(n_layer) if not recurrent_flags[il])

    if arch in NO_MEMORY_ARCHES:
        memory_class: MemoryClass = "none"
    elif is_recurrent_arch:
        memory_class = "recurrent"
    elif hybrid_rule is not None:
        memory_class = "hybrid_iswa" if swa_layers else "hybrid"
    else:
        memory_class = "iswa" if swa_layers else "kv"

    if memory_class in ("none", "recurrent"):
        attn: tuple[int, ...] = ()
    elif hybrid_rule == "all":
        attn = tuple(range(kv_end))
    elif hybrid_rule == "kv0_ff0":
        ff = n_ff or zeros
        attn = tuple(il for il in range(kv_end) if not recurrent_flags[il] and ff[il] == 0)
    elif hybrid_rule is not None:
        attn = tuple(il for il in range(kv_end) if not recurrent_flags[il])
    else:
        # llama_kv_cache keeps every layer that has_kv(), whatever its head count
        attn = tuple(range(kv_end))

    if memory_class in ("recurrent", "hybrid", "hybrid_iswa"):
        recurrent_layers = tuple(il for il in range(main_end) if recurrent_flags[il])
        n_embd_r, n_embd_s = recurrent_sizes(meta, arch, n_embd, n_head[0] if n_head else 0, head_dim_k)
    else:
        recurrent_layers = ()
        n_embd_r = n_embd_s = 0
    if memory_class == "none":
        n_swa, swa_layers = 0, ()

    # --- positions and per-cell extension -------------------------------------------------
    sections = (
        meta.int_array(f"{arch}.rope.dimension_sections")
        if meta.has(f"{arch}.rope.dimension_sections")
        else None
    )
    use_mrope = sections is not None and len(sections) >= 2 and sections[0] > 0 and sections[1] > 0
    mrope = arch in MROPE_ARCHES or (arch in MROPE_IF_SECTIONS_ARCHES and use_mrope)
    n_pos_per_embd = 4 if mrope else 1
    ple_key = f"{arch}.ple.layers"
    ple_layers = tuple(il for il in (meta.int_or_array(ple_key, 1) or ()) if 0 <= il < n_layer) if meta.has(
        ple_key) else ()
    has_ple = bool(ple_layers)
    n_embd_p = 0
    if has_ple:  # hparams.ple_conv_state(): (conv_kernel - 1) * ngram_size * hyper_connection.count * n_embd
        kernel = meta.int_(f"{arch}.ple.conv_kernel") or 0
        ngram = meta.int_(f"{arch}.ple.ngram_size") or 0
        hc = meta.int_(f"{arch}.hyper_connection.count") or 1
        n_embd_p = max(0, kernel - 1) * ngram * hc * n_embd if kernel else 0

    # --- caveats ----------------------------------------------------------------------------
    if recurrent_layers and not (n_embd_r or n_embd_s):
        notes.append("no recurrent state size found in the metadata (ssm / shortconv / wkv keys)")
    if n_vocab and vocab and n_vocab != len(vocab):
        notes.append(f"{shown}.vocab_size is {n_vocab} but tokenizer.ggml.tokens has {len(vocab)} entries")
    if is_mla and memory_class != "none":
        notes.append("MLA: the KV cache holds K rows only (no V records)")

    plan_in = PlanInputs(
        arch=arch, n_layer=n_layer, main_end=main_end, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv,
        head_dim_k=head_dim_k, head_dim_v=head_dim_v, head_dim_k_swa=head_dim_k_swa,
        head_dim_v_swa=head_dim_v_swa, swa_layers=swa_layers, attn_layers=attn, recurrent_layers=recurrent_layers,
        memory_class=memory_class, is_mla=is_mla, has_cell_ext=n_pos_per_embd > 1 or has_ple,
    )
    planned_class, plan = build_plan(meta, plan_in)
    memory_class = planned_class  # type: ignore[assignment]
    notes.extend(plan_in.notes)
    return ModelProfile(
        path=path,
        arch=arch,
        n_layer=n_layer,
        n_embd=n_embd,
        n_vocab=n_vocab,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim_k=head_dim_k,
        head_dim_v=head_dim_v,
        n_swa=n_swa,
        swa_layers=swa_layers,
        recurrent_layers=recurrent_layers,
        n_embd_r=n_embd_r,
        n_embd_s=n_embd_s,
        n_pos_per_embd=n_pos_per_embd,
        memory_class=memory_class,
        vocab=vocab,
        tokenizer_model=tokenizer_model,
        token_types=token_types,
        n_ff=n_ff,
        head_dim_k_swa=head_dim_k_swa,
        head_dim_v_swa=head_dim_v_swa,
        is_mla=is_mla,
        has_ple=has_ple,
        attn_layers_override=attn,
        notes=tuple(notes),
        plan=plan,
        ple_layers=ple_layers,
        n_embd_p=n_embd_p,
        n_layer_nextn=n_layer - main_end,
    )


def load_model_or(path: str | os.PathLike[str], error: Callable[[str], Exception]) -> ModelProfile:
    """:func:`load_model_profile`, a failure raised as ``error("cannot use model PATH: why")``: the calling
    command's own error class, with the one sentence every command says."""
    try:
        return load_model_profile(path)
    except (ModelProfileError, OSError) as e:
        raise error(f"cannot use model {os.fspath(path)}: {e}") from None


def load_model_profile(path: str | os.PathLike[str], *, backend: Backend = "fast") -> ModelProfile:
    """Read the GGUF model at ``path`` into a :class:`ModelProfile`.

    ``backend="fast"`` (default) scans the metadata directly; ``backend="gguf"`` uses
    ``gguf.GGUFReader`` (same result, much slower on large vocabularies). Raises
    :class:`ModelProfileError` with a one-line message for unreadable, non-GGUF or truncated
    files and for missing or mistyped required keys.
    """
    fspath = os.fspath(path)
    name = os.path.basename(fspath) or fspath
    try:
        values = read_gguf_metadata(fspath, backend)
        return _build_profile(GGUFMetadata(values, name), fspath)
    except GGUFMetadataError as e:
        raise ModelProfileError(str(e)) from e
