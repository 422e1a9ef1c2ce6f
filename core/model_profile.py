"""Model profiles: the memory layout a llama.cpp state file of a given GGUF model should have.

A llama.cpp state file (session, sequence file, ``llama_state_*_get_data`` blob) carries no
description of the model it came from beyond, at most, the architecture name. To read one, kvscope
needs to know which memory class llama.cpp built for the model (plain KV cache, iSWA pair of KV
caches, recurrent state, or a hybrid of KV cache and recurrent state), which model layers each part
holds, and how wide their rows are. :func:`load_model_profile` reads that from the GGUF metadata
into a :class:`ModelProfile`, mirroring the rules of llama.cpp's ``src/llama-model.cpp``
(``load_hparams`` / ``create_memory``), ``src/llama-hparams.cpp`` and ``src/llama-arch.cpp``.
The profile also carries the vocabulary so token ids found in state files can be shown as text.

Reading the metadata: by default a small, fast scanner reads only the GGUF header and key/value
section (the tensor data of a multi-GB model is never touched, big arrays that are not needed are
skipped, and the token list is read in one pass). ``gguf.GGUFReader`` builds two numpy views per
array element, which costs seconds for a 150k-token vocabulary, so it is kept as the reference
backend (``backend="gguf"``) that the tests compare the scanner with.

This module never imports Qt or torch.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from gguf import GGUFReader, GGUFValueType
from gguf.gguf_reader import ReaderField

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
MemoryClass = Literal["kv", "iswa", "recurrent", "hybrid", "hybrid_iswa", "none"]


class ModelProfileError(Exception):
    """A GGUF model could not be read into a :class:`ModelProfile` (one-line message)."""


# ---------------------------------------------------------------------------------------------
# Architecture knowledge. Keep this a small table of families; every entry names the llama.cpp
# code it mirrors. Architectures not listed get a plain KV cache over all layers, exactly as
# llama.cpp's create_memory() default branch does, unless the GGUF itself says otherwise
# (sliding_window_pattern, per-layer head_count_kv, ...).
# ---------------------------------------------------------------------------------------------

# llm_arch_is_recurrent(): llama_memory_recurrent over every layer.
_RECURRENT_ARCHES = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})

# llm_arch_is_hybrid(): llama_memory_hybrid (or _iswa), a KV cache for the attention layers then a
# llama_memory_recurrent for the recurrent layers. The value says how llama.cpp marks a layer
# recurrent (hparams.recurrent_layer_arr in load_hparams) and which layers the KV cache holds
# (the filter_attn / filter_recr callbacks in create_memory):
#   "kv0"      recurrent <=> head_count_kv[il] == 0; KV cache = the other layers (default filters)
#   "kv0_ff0"  recurrent <=> head_count_kv[il] == 0 and feed_forward_length[il] == 0; the KV cache
#              holds the non-recurrent layers with feed_forward_length 0 (MLP-only layers hold
#              neither) -- nemotron_h
#   "all"      every layer is recurrent AND has a KV cache entry (parallel attention + SSM) -- falcon-h1
#   "interval" recurrent <=> (il + 1) % full_attention_interval != 0 (default 4) -- qwen3next, qwen35
_HYBRID_RULES: dict[str, str] = {
    "jamba": "kv0",
    "plamo2": "kv0",
    "granitehybrid": "kv0",
    "lfm2": "kv0",
    "lfm2moe": "kv0",
    "kimi-linear": "kv0",  # layer rule assumed; its KDA conv-state size (n_embd_r) is not modelled
    "nemotron_h": "kv0_ff0",
    "nemotron_h_moe": "kv0_ff0",
    "falcon-h1": "all",
    "qwen3next": "interval",
    "qwen35": "interval",
    "qwen35moe": "interval",
}

# create_memory() returns no memory at all for these (embedding / diffusion models).
_NO_MEMORY_ARCHES = frozenset(
    {
        "bert",
        "jina-bert-v2",
        "jina-bert-v3",
        "nomic-bert",
        "nomic-bert-moe",
        "neo-bert",
        "eurobert",
        "modern-bert",
        "wavtokenizer-dec",
        "gemma-embedding",
        "dream",
        "llada",
        "llada-moe",
        "rnd1",
    }
)

# Architectures whose cache is a dedicated class with its own state layout (not modelled here).
_SPECIAL_CACHE_ARCHES: dict[str, str] = {
    "deepseek32": "llama_kv_cache_dsa",
    "deepseek4": "llama_kv_cache_dsv4",
}


@dataclass(frozen=True)
class _SwaRule:
    """How load_hparams() sets up sliding-window attention for one architecture."""

    pattern: int  # hparams.set_swa_pattern(pattern): period of SWA / full layers
    dense_first: bool = False  # set_swa_pattern(pattern, dense_first=true)
    default_n_swa: int = 0  # window when the GGUF has no sliding_window key (0: none)
    forced_n_swa: int = 0  # window llama.cpp uses whatever the GGUF says (0: the GGUF's)
    needs_window_key: bool = False  # SWA only when the GGUF has sliding_window > 0


# llama_hparams::set_swa_pattern(n, dense_first):
#   dense_first=false: layer il is SWA <=> n == 0 or il % n < n - 1   (gemma2, n=2: 0, 2, 4, ... SWA)
#   dense_first=true:  layer il is SWA <=> n == 0 or il % n != 0
# A GGUF {arch}.attention.sliding_window_pattern key (a period, or one bool per layer with true =
# SWA) overrides the table, as newer converters write it.
_SWA_RULES: dict[str, _SwaRule] = {
    "gemma2": _SwaRule(2, default_n_swa=4096),
    "gemma3": _SwaRule(6),
    "gemma3n": _SwaRule(5),
    "gemma-embedding": _SwaRule(6),
    "cohere2": _SwaRule(4),
    "gpt-oss": _SwaRule(2),
    "olmo2": _SwaRule(4, needs_window_key=True),
    "smallthinker": _SwaRule(4, dense_first=True, forced_n_swa=4096, needs_window_key=True),
    # exaone4: only the 64-layer (32B) model uses SWA, see _swa_setup()
    "exaone4": _SwaRule(4, default_n_swa=4096),
    # llama4: chunked attention, 3 chunked : 1 full, window 8192 -- unless sliding_window == 0
    "llama4": _SwaRule(4, forced_n_swa=8192),
}
# load_hparams() turns SWA off for these even when the GGUF has a sliding window.
_SWA_DISABLED_ARCHES = frozenset({"phi3"})

# llama_model_rope_type(): LLAMA_ROPE_TYPE_MROPE / _IMROPE -> hparams.n_pos_per_embd() == 4, and
# every KV cell carries a llama_kv_cell_ext record in the state file.
_MROPE_ARCHES = frozenset(
    {"qwen2vl", "paddleocr", "qwen3vl", "qwen3vlmoe", "qwen35", "qwen35moe", "qwen3tts"}
)
# M-RoPE only when rope.dimension_sections is set (hparams.use_mrope()).
_MROPE_IF_SECTIONS_ARCHES = frozenset({"glm4", "glm4moe", "hunyuan_vl"})

# llama_vocab token attributes as stored in tokenizer.ggml.token_type.
_TOKEN_TYPE_CONTROL = 3
_TOKEN_TYPE_USER_DEFINED = 4

_MAX_SANE_LAYERS = 1 << 16


@dataclass(frozen=True)
class ExpectedSection:
    """One memory section of a state file, in the order llama.cpp writes them."""

    role: str  # "kv", "kv_base", "kv_swa", "kv_attn" or "recurrent"
    kind: str  # "kv" (llama_kv_cache) or "recurrent" (llama_memory_recurrent)
    layers: tuple[int, ...]  # model layer indices held by this section, ascending


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

    # --- per-layer sizes ----------------------------------------------------------------------

    def _check_layer(self, il: int) -> None:
        if not 0 <= il < self.n_layer:
            raise IndexError(f"layer {il} out of range (model has {self.n_layer} layers)")

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

    def expected_sections(self, partial: bool) -> list[ExpectedSection]:
        """The memory sections of a state file in write order (``partial``: PARTIAL_ONLY flag).

        Mirrors llama.cpp's memory classes: ``llama_kv_cache`` ignores the flag,
        ``llama_kv_cache_iswa`` writes only its SWA cache and ``llama_memory_hybrid`` only its
        recurrent part when the flag is set.
        """
        kv = ExpectedSection("kv", "kv", self.attn_layers)
        base = ExpectedSection("kv_base", "kv", self.kv_base_layers)
        swa = ExpectedSection("kv_swa", "kv", self.kv_swa_layers)
        attn = ExpectedSection("kv_attn", "kv", self.attn_layers)
        recr = ExpectedSection("recurrent", "recurrent", self.recurrent_layers)
        mc = self.memory_class
        if mc == "kv":
            return [kv]
        if mc == "iswa":
            return [swa] if partial else [base, swa]
        if mc == "recurrent":
            return [recr]
        if mc == "hybrid":
            return [recr] if partial else [attn, recr]
        if mc == "hybrid_iswa":
            return [swa, recr] if partial else [base, swa, recr]
        return []

    # --- vocabulary ---------------------------------------------------------------------------

    def _piece_bytes(self, token_id: int) -> bytes:
        """The bytes token ``token_id`` stands for (it must be in the vocabulary)."""
        piece = self.vocab[token_id]
        if token_id < len(self.token_types) and self.token_types[token_id] in (
            _TOKEN_TYPE_CONTROL,
            _TOKEN_TYPE_USER_DEFINED,
        ):
            return piece.encode("utf-8")
        model = self.tokenizer_model
        if model == "gpt2":
            decoder = _GPT2_BYTE_DECODER
            out = bytearray()
            for ch in piece:
                b = decoder.get(ch)
                if b is None:
                    out += ch.encode("utf-8")
                else:
                    out.append(b)
            return bytes(out)
        if model == "bert":
            return piece[2:].encode("utf-8") if piece.startswith("##") else b" " + piece.encode("utf-8")
        m = _BYTE_TOKEN_RE.fullmatch(piece)
        if m is not None:
            return bytes((int(m.group(1), 16),))
        return piece.replace(_SPM_SPACE, " ").encode("utf-8")

    def token_text(self, token_id: int) -> str | None:
        """Text of one token, or None when ``token_id`` is outside the vocabulary.

        Sentencepiece ``▁`` becomes a space and GPT-2 byte-level pieces are mapped back to their
        bytes. Bytes that are not valid UTF-8 on their own (half of a multi-byte character) are
        shown escaped: a byte token keeps its ``<0xNN>`` text (also for control characters), other
        pieces get ``\\xNN``.
        """
        if not 0 <= token_id < len(self.vocab):
            return None
        raw = self._piece_bytes(token_id)
        piece = self.vocab[token_id]
        is_byte_token = self.tokenizer_model not in ("gpt2", "bert") and _BYTE_TOKEN_RE.fullmatch(piece)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            return piece if is_byte_token else raw.decode("utf-8", errors="backslashreplace")
        if is_byte_token and not (text.isprintable() or text in "\t\n\r"):
            return piece
        return text

    def detokenize(self, ids: Sequence[int]) -> str:
        """Text of a token sequence; bytes are joined before decoding, so split characters survive.

        Ids outside the vocabulary show as ``<?ID>``; invalid UTF-8 becomes U+FFFD.
        """
        out = bytearray()
        n = len(self.vocab)
        for tid in ids:
            tid = int(tid)
            if 0 <= tid < n:
                out += self._piece_bytes(tid)
            else:
                out += f"<?{tid}>".encode()
        text = out.decode("utf-8", errors="replace")
        if self.tokenizer_model == "bert" and text.startswith(" "):
            text = text[1:]
        return text


def _gpt2_byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's ``bytes_to_unicode`` table (printable stand-ins for the 256 bytes)."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    byte_values = printable[:]
    code_points = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            byte_values.append(b)
            code_points.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(byte_values, code_points, strict=True)}


_GPT2_BYTE_DECODER = _gpt2_byte_decoder()
_SPM_SPACE = "\u2581"
_BYTE_TOKEN_RE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


# ---------------------------------------------------------------------------------------------
# GGUF metadata reading
# ---------------------------------------------------------------------------------------------


class _Skipped:
    """Placeholder for a metadata value that was not materialised (unneeded string / nested array)."""

    def __repr__(self) -> str:
        return "<skipped>"


_SKIPPED = _Skipped()

# String arrays worth materialising; the others (merges, ...) are only walked over.
_WANTED_STRING_ARRAYS = frozenset({"tokenizer.ggml.tokens"})

# GGUF value type -> (struct format char, size, numpy kind). Ids come from gguf-py.
_SCALAR_TYPES: dict[int, tuple[str, int, str]] = {
    int(GGUFValueType.UINT8): ("B", 1, "u1"),
    int(GGUFValueType.INT8): ("b", 1, "i1"),
    int(GGUFValueType.UINT16): ("H", 2, "u2"),
    int(GGUFValueType.INT16): ("h", 2, "i2"),
    int(GGUFValueType.UINT32): ("I", 4, "u4"),
    int(GGUFValueType.INT32): ("i", 4, "i4"),
    int(GGUFValueType.FLOAT32): ("f", 4, "f4"),
    int(GGUFValueType.BOOL): ("?", 1, "u1"),
    int(GGUFValueType.UINT64): ("Q", 8, "u8"),
    int(GGUFValueType.INT64): ("q", 8, "i8"),
    int(GGUFValueType.FLOAT64): ("d", 8, "f8"),
}
_T_STRING = int(GGUFValueType.STRING)
_T_ARRAY = int(GGUFValueType.ARRAY)
_T_BOOL = int(GGUFValueType.BOOL)


class _Truncated(Exception):
    """The GGUF header ends before the data it announces."""


class _Scanner:
    """Sequential reader of a GGUF header over an mmap (little- or big-endian)."""

    def __init__(self, buf: mmap.mmap, endian: str, name: str) -> None:
        self.buf = buf
        self.size = len(buf)
        self.e = endian
        self.name = name
        self.pos = 0
        self._u32 = struct.Struct(endian + "I").unpack_from
        self._u64 = struct.Struct(endian + "Q").unpack_from

    def need(self, n: int) -> None:
        if n < 0 or n > self.size - self.pos:
            raise _Truncated

    def u32(self) -> int:
        self.need(4)
        (v,) = self._u32(self.buf, self.pos)
        self.pos += 4
        return int(v)

    def u64(self) -> int:
        self.need(8)
        (v,) = self._u64(self.buf, self.pos)
        self.pos += 8
        return int(v)

    def string(self) -> str:
        n = self.u64()
        self.need(n)
        s = self.buf[self.pos : self.pos + n].decode("utf-8", errors="replace")
        self.pos += n
        return s

    def value(self, vtype: int, key: str) -> object:
        scalar = _SCALAR_TYPES.get(vtype)
        if scalar is not None:
            fmt, size, _ = scalar
            self.need(size)
            (v,) = struct.unpack_from(self.e + fmt, self.buf, self.pos)
            self.pos += size
            return bool(v) if vtype == _T_BOOL else v
        if vtype == _T_STRING:
            return self.string()
        if vtype == _T_ARRAY:
            itype = self.u32()
            count = self.u64()
            return self.array(itype, count, key)
        raise ModelProfileError(f"{self.name}: unknown GGUF value type {vtype} for key '{key}'")

    def array(self, itype: int, count: int, key: str) -> object:
        scalar = _SCALAR_TYPES.get(itype)
        if scalar is not None:
            _, size, kind = scalar
            if count > (self.size - self.pos) // size:
                raise _Truncated
            raw = self.buf[self.pos : self.pos + count * size]
            self.pos += count * size
            arr = np.frombuffer(raw, dtype=np.dtype(self.e + kind))
            return arr.astype(bool) if itype == _T_BOOL else arr
        if itype == _T_STRING:
            if count > (self.size - self.pos) // 8:
                raise _Truncated
            if key in _WANTED_STRING_ARRAYS:
                return self._string_array(count)
            self._skip_strings(count)
            return _SKIPPED
        if itype == _T_ARRAY:
            for _ in range(count):
                inner = self.u32()
                n = self.u64()
                self.array(inner, n, "")
            return _SKIPPED
        raise ModelProfileError(f"{self.name}: unknown GGUF array element type {itype} for key '{key}'")

    def _string_array(self, count: int) -> tuple[str, ...]:
        buf, pos, end, u64 = self.buf, self.pos, self.size, self._u64
        out: list[str] = []
        append = out.append
        for _ in range(count):
            if end - pos < 8:
                raise _Truncated
            (n,) = u64(buf, pos)
            pos += 8
            if n > end - pos:
                raise _Truncated
            append(buf[pos : pos + n].decode("utf-8", errors="replace"))
            pos += n
        self.pos = pos
        return tuple(out)

    def _skip_strings(self, count: int) -> None:
        buf, pos, end, u64 = self.buf, self.pos, self.size, self._u64
        for _ in range(count):
            if end - pos < 8:
                raise _Truncated
            (n,) = u64(buf, pos)
            pos += 8 + n
            if pos > end:
                raise _Truncated
        self.pos = pos


def _scan_metadata(path: str, name: str) -> dict[str, object]:
    """Read the key/value metadata of a GGUF file with the fast scanner."""
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                raise ModelProfileError(f"{name}: empty file, not a GGUF model")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                return _parse_header(mm, name)
    except OSError as e:
        raise ModelProfileError(f"{name}: cannot read file: {e.strerror or e}") from e


def _parse_header(mm: mmap.mmap, name: str) -> dict[str, object]:
    if len(mm) < 4 or mm[:4] != b"GGUF":
        raise ModelProfileError(f"{name}: not a GGUF file (magic {mm[:4]!r}, expected b'GGUF')")
    if len(mm) < 24:
        raise ModelProfileError(f"{name}: truncated GGUF file ({len(mm)} bytes, header needs 24)")
    endian = "<"
    (version,) = struct.unpack_from("<I", mm, 4)
    if version & 0xFFFF == 0:  # written on a big-endian host
        endian = ">"
        (version,) = struct.unpack_from(">I", mm, 4)
    if version not in (2, 3):
        raise ModelProfileError(f"{name}: unsupported GGUF version {version} (kvscope reads 2 and 3)")
    sc = _Scanner(mm, endian, name)
    sc.pos = 8
    sc.u64()  # tensor count: tensors are not needed
    kv_count = sc.u64()
    if kv_count > (sc.size - sc.pos) // 13:  # the smallest key/value takes 13 bytes
        raise ModelProfileError(f"{name}: corrupt GGUF header ({kv_count} metadata keys announced)")
    meta: dict[str, object] = {}
    key = "<header>"
    try:
        for _ in range(kv_count):
            key = "<key name>"
            key = sc.string()
            vtype = sc.u32()
            if key in meta:
                raise ModelProfileError(f"{name}: duplicate GGUF metadata key '{key}'")
            meta[key] = sc.value(vtype, key)
    except _Truncated:
        raise ModelProfileError(
            f"{name}: truncated GGUF file: metadata ends inside '{key}' ({sc.size} bytes)"
        ) from None
    return meta


def _reader_metadata(path: str, name: str) -> dict[str, object]:
    """Read the key/value metadata with ``gguf.GGUFReader`` (reference backend)."""
    try:
        reader = GGUFReader(path)
    except OSError as e:
        raise ModelProfileError(f"{name}: cannot read file: {e.strerror or e}") from e
    except Exception as e:  # GGUFReader raises ValueError/KeyError/IndexError... on bad files
        raise ModelProfileError(f"{name}: gguf.GGUFReader cannot read the file: {_one_line(e)}") from e
    meta: dict[str, object] = {}
    try:
        for key, fld in reader.fields.items():
            if key.startswith("GGUF."):  # the reader's own header pseudo-fields
                continue
            meta[key] = _reader_field_value(key, fld)
    except (IndexError, ValueError) as e:
        raise ModelProfileError(f"{name}: unreadable GGUF metadata: {_one_line(e)}") from e
    return meta


def _reader_field_value(key: str, fld: ReaderField) -> object:
    """One GGUFReader field as the scanner would return it (using ``parts``/``data`` directly)."""
    types = [int(t) for t in fld.types]
    if not types:
        return _SKIPPED
    if types[0] == _T_STRING:
        return bytes(fld.parts[fld.data[0]]).decode("utf-8", errors="replace")
    if types[0] != _T_ARRAY:
        v = fld.parts[fld.data[0]][0].item()
        return bool(v) if types[0] == _T_BOOL else v
    if len(types) < 2:  # empty array: gguf-py records no element type
        return np.zeros(0, dtype=np.uint8)
    if types[1] == _T_STRING:
        if key not in _WANTED_STRING_ARRAYS:
            return _SKIPPED
        parts = fld.parts
        return tuple(parts[i].tobytes().decode("utf-8", errors="replace") for i in fld.data)
    if types[1] == _T_ARRAY:
        return _SKIPPED
    arr = np.concatenate([fld.parts[i] for i in fld.data]) if fld.data else np.zeros(0, dtype=np.uint8)
    return arr.astype(bool) if types[1] == _T_BOOL else arr


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 200 else text[:197] + "..."


class _Meta:
    """Typed access to the metadata dict, raising ModelProfileError on wrong types."""

    def __init__(self, values: dict[str, object], name: str) -> None:
        self.values = values
        self.name = name

    def has(self, key: str) -> bool:
        return key in self.values

    def _type_error(self, key: str, expected: str) -> ModelProfileError:
        v = self.values[key]
        got = "array" if isinstance(v, (np.ndarray, tuple, _Skipped)) else type(v).__name__
        return ModelProfileError(f"{self.name}: GGUF key '{key}' is {got}, expected {expected}")

    def int_(self, key: str) -> int | None:
        """A non-negative integer scalar, or None when the key is absent."""
        if key not in self.values:
            return None
        v = self.values[key]
        if isinstance(v, (bool, int)):
            if v < 0:
                raise ModelProfileError(f"{self.name}: GGUF key '{key}' is negative ({v})")
            return int(v)
        raise self._type_error(key, "an integer")

    def require_int(self, key: str) -> int:
        v = self.int_(key)
        if v is None:
            raise ModelProfileError(f"{self.name}: GGUF metadata lacks required key '{key}'")
        return v

    def str_(self, key: str) -> str | None:
        if key not in self.values:
            return None
        v = self.values[key]
        if isinstance(v, str):
            return v
        raise self._type_error(key, "a string")

    def int_array(self, key: str) -> tuple[int, ...] | None:
        """An integer (or bool) array as non-negative ints; None when absent."""
        if key not in self.values:
            return None
        v = self.values[key]
        if not isinstance(v, np.ndarray) or v.dtype.kind not in "biu":
            raise self._type_error(key, "an integer array")
        out = tuple(int(x) for x in v.tolist())
        if any(x < 0 for x in out):
            raise ModelProfileError(f"{self.name}: GGUF key '{key}' has negative entries")
        return out

    def int_or_array(self, key: str, n_layer: int) -> tuple[int, ...] | None:
        """llama_model_loader::get_key_or_arr: a scalar for every layer or one value per layer."""
        if key not in self.values:
            return None
        v = self.values[key]
        if isinstance(v, np.ndarray):
            arr = self.int_array(key)
            assert arr is not None
            if len(arr) != n_layer:
                raise ModelProfileError(
                    f"{self.name}: GGUF key '{key}' has {len(arr)} entries, the model has {n_layer} layers"
                )
            return arr
        scalar = self.int_(key)
        assert scalar is not None
        return (scalar,) * n_layer

    def str_array(self, key: str) -> tuple[str, ...] | None:
        if key not in self.values:
            return None
        v = self.values[key]
        if isinstance(v, tuple):
            return v
        if isinstance(v, np.ndarray) and v.size == 0:
            return ()
        raise self._type_error(key, "a string array")


# ---------------------------------------------------------------------------------------------
# Profile building
# ---------------------------------------------------------------------------------------------


def _pattern_layers(n_layer: int, pattern: int, dense_first: bool) -> tuple[int, ...]:
    """Layers llama_hparams::set_swa_pattern(pattern, dense_first) marks as SWA."""
    if dense_first:
        return tuple(il for il in range(n_layer) if pattern == 0 or il % pattern != 0)
    return tuple(il for il in range(n_layer) if pattern == 0 or il % pattern < pattern - 1)


def _swa_setup(meta: _Meta, arch: str, n_layer: int) -> tuple[int, tuple[int, ...]]:
    """(n_swa, swa_layers) as load_hparams() sets them; (0, ()) when the model has no SWA."""
    if arch in _SWA_DISABLED_ARCHES:
        return 0, ()
    window = meta.int_(f"{arch}.attention.sliding_window")
    pattern_key = f"{arch}.attention.sliding_window_pattern"
    rule = _SWA_RULES.get(arch)
    if arch == "exaone4" and n_layer != 64 and not meta.has(pattern_key):
        rule = None
    if arch == "llama4" and window == 0:
        return 0, ()
    if rule is not None and rule.needs_window_key and not window:
        return 0, ()

    layers: tuple[int, ...] | None = None
    if meta.has(pattern_key):
        value = meta.values[pattern_key]
        if isinstance(value, np.ndarray):
            flags = meta.int_array(pattern_key)
            assert flags is not None
            if len(flags) != n_layer:
                raise ModelProfileError(
                    f"{meta.name}: GGUF key '{pattern_key}' has {len(flags)} entries, "
                    f"the model has {n_layer} layers"
                )
            layers = tuple(il for il, f in enumerate(flags) if f)
        else:
            period = meta.require_int(pattern_key)
            layers = _pattern_layers(n_layer, period, rule.dense_first if rule else False)
    elif rule is not None:
        layers = _pattern_layers(n_layer, rule.pattern, rule.dense_first)
    if not layers:
        return 0, ()

    if rule is not None and rule.forced_n_swa:
        n_swa = rule.forced_n_swa
    elif window is not None:
        n_swa = window
    else:
        n_swa = rule.default_n_swa if rule is not None else 0
    if n_swa <= 0:
        return 0, ()
    return n_swa, layers


def _recurrent_sizes(meta: _Meta, arch: str, n_embd: int) -> tuple[int, int]:
    """(n_embd_r, n_embd_s): llama_hparams::n_embd_r() / n_embd_s()."""
    wkv_head_size = meta.int_(f"{arch}.wkv.head_size") or 0
    if wkv_head_size:  # RWKV: token shift rows, wkv state
        token_shift_count = meta.int_(f"{arch}.token_shift_count")
        return (2 if token_shift_count is None else token_shift_count) * n_embd, n_embd * wkv_head_size
    d_conv = meta.int_(f"{arch}.ssm.conv_kernel") or 0
    d_inner = meta.int_(f"{arch}.ssm.inner_size") or 0
    d_state = meta.int_(f"{arch}.ssm.state_size") or 0
    n_group = meta.int_(f"{arch}.ssm.group_count") or 0
    n_embd_s = d_state * d_inner
    l_cache = meta.int_(f"{arch}.shortconv.l_cache") or 0
    if l_cache:  # LFM2 short convolution
        return n_embd * (l_cache - 1), n_embd_s
    # Mamba: the first conv column is shifted out, so d_conv - 1 columns are kept
    return (d_conv - 1 if d_conv > 0 else 0) * (d_inner + 2 * n_group * d_state), n_embd_s


def _build_profile(meta: _Meta, path: str) -> ModelProfile:
    name = meta.name
    arch = meta.str_("general.architecture")
    if arch is None:
        raise ModelProfileError(f"{name}: GGUF metadata lacks required key 'general.architecture'")
    if arch == "clip":
        raise ModelProfileError(f"{name}: a 'clip' GGUF is a multimodal projector, not a language model")
    notes: list[str] = []

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
    n_swa, swa_layers = _swa_setup(meta, arch, n_layer)
    hybrid_rule = _HYBRID_RULES.get(arch)
    is_recurrent_arch = arch in _RECURRENT_ARCHES
    if (
        hybrid_rule is None
        and not is_recurrent_arch
        and arch not in _NO_MEMORY_ARCHES
        and any(meta.has(f"{arch}.{k}") for k in ("ssm.conv_kernel", "shortconv.l_cache", "wkv.head_size"))
    ):
        # An architecture this table does not know, but with recurrent-state metadata.
        if any(n_head_kv) and not all(n_head_kv):
            hybrid_rule = "kv0"
            notes.append(
                f"architecture '{arch}' is not in kvscope's table; guessed hybrid (kv heads 0 = recurrent)"
            )
        elif not any(n_head_kv):
            is_recurrent_arch = True
            notes.append(f"architecture '{arch}' is not in kvscope's table; guessed recurrent")

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
        interval = meta.int_(f"{arch}.full_attention_interval") or 4
        recurrent_flags = [(il + 1) % interval != 0 for il in range(n_layer)]

    if arch in _NO_MEMORY_ARCHES:
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
        n_embd_r, n_embd_s = _recurrent_sizes(meta, arch, n_embd)
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
    mrope = arch in _MROPE_ARCHES or (arch in _MROPE_IF_SECTIONS_ARCHES and use_mrope)
    n_pos_per_embd = 4 if mrope else 1
    ple_key = f"{arch}.ple.layers"
    ple = meta.values.get(ple_key)
    has_ple = (isinstance(ple, np.ndarray) and ple.size > 0) or (isinstance(ple, int) and ple > 0)

    # --- caveats ----------------------------------------------------------------------------
    if arch in _SPECIAL_CACHE_ARCHES:
        notes.append(
            f"'{arch}' uses {_SPECIAL_CACHE_ARCHES[arch]}, whose state layout kvscope does not model"
        )
    if arch == "kimi-linear":
        notes.append("kimi-linear KDA state sizes (n_embd_r / n_embd_s) are not modelled")
    if recurrent_layers and not (n_embd_r or n_embd_s):
        notes.append("no recurrent state size found in the metadata (ssm / shortconv / wkv keys)")
    if n_vocab and vocab and n_vocab != len(vocab):
        notes.append(f"{arch}.vocab_size is {n_vocab} but tokenizer.ggml.tokens has {len(vocab)} entries")
    if is_mla and memory_class != "none":
        notes.append("MLA: the KV cache holds K rows only (no V records)")

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
    )


def load_model_profile(
    path: str | os.PathLike[str], *, backend: Literal["fast", "gguf"] = "fast"
) -> ModelProfile:
    """Read the GGUF model at ``path`` into a :class:`ModelProfile`.

    ``backend="fast"`` (default) scans the metadata directly; ``backend="gguf"`` uses
    ``gguf.GGUFReader`` (same result, much slower on large vocabularies). Raises
    :class:`ModelProfileError` with a one-line message for unreadable, non-GGUF or truncated
    files and for missing or mistyped required keys.
    """
    fspath = os.fspath(path)
    name = os.path.basename(fspath) or fspath
    if backend == "fast":
        values = _scan_metadata(fspath, name)
    elif backend == "gguf":
        values = _reader_metadata(fspath, name)
    else:
        raise ValueError(f"unknown backend {backend!r}")
    return _build_profile(_Meta(values, name), fspath)
