"""Context parameters as ``llama_init_from_model`` takes them, and the cache sizes they produce.

The sizing rules are llama.cpp's (0c1e5709, ``llama_context::llama_context`` and
``llama_kv_cache_iswa``): ``n_ctx`` is padded to 256; a unified cache has one stream of
``n_ctx`` cells, otherwise ``n_seq_max`` streams of ``pad(n_ctx / n_seq_max, 256)`` cells each;
the SWA cache of an iSWA memory holds ``pad(min(size, n_swa * (unified ? n_seq_max : 1) +
n_ubatch), 256)`` cells unless ``swa_full``; a recurrent memory has ``max(1, n_seq_max)`` cells; DeepSeek-V4's
compressed caches hold ``pad(max(1, ceil(n_ctx_seq / ratio)), 256)`` rows per stream.
``rot_disabled`` is the environment variable ``LLAMA_ATTN_ROT_DISABLE`` the caches read.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.core import ggml_types as gt
from kvscope.core.errors import UsageError
from kvscope.core.memory.spec import LLAMA_MAX_SEQ

PAD = 256


class ParamsError(UsageError, ValueError):
    """Context parameters llama.cpp would refuse (one-line message)."""


def ggml_pad(x: int, n: int) -> int:
    """``GGML_PAD(x, n)``: ``x`` rounded up to a multiple of ``n``."""
    return (x + n - 1) // n * n


@dataclass(frozen=True)
class ContextParams:
    """The ``llama_context_params`` fields that shape the memory (defaults as llama.cpp's)."""

    n_ctx: int = 512
    n_seq_max: int = 1
    kv_unified: bool = False
    flash_attn: bool = True
    type_k: str = "f16"
    type_v: str = "f16"
    swa_full: bool = True
    n_batch: int = 2048
    n_ubatch: int = 512
    type_r: str = "f32"
    type_s: str = "f32"
    kv_size: int | None = None  # cells per stream, overriding the padding rules (inferred contexts)
    kv_size_swa: int | None = None  # SWA cache cells per stream, overriding the rules
    rot_disabled: bool = False  # LLAMA_ATTN_ROT_DISABLE=1: no Hadamard rotation of quantized K/V
    kv_size_compressed: tuple[int, ...] | None = None  # DeepSeek-V4 K-cache rows per stream (csa, hca, lid)

    def __post_init__(self) -> None:
        if not 1 <= self.n_seq_max <= LLAMA_MAX_SEQ:
            raise ParamsError(f"n_seq_max {self.n_seq_max} must be in [1, {LLAMA_MAX_SEQ}]")
        if self.n_ctx < 0 or self.n_ubatch <= 0 or self.n_batch <= 0:
            raise ParamsError("n_ctx, n_batch and n_ubatch must be positive")
        for name in ("type_k", "type_v"):
            t = getattr(self, name)
            if t not in gt.KV_CACHE_TYPE_NAMES:
                raise ParamsError(f"{name} {t!r} is not a KV cache type ({', '.join(gt.KV_CACHE_TYPE_NAMES)})")
        for name in ("type_r", "type_s"):
            try:
                gt.type_id_from_name(getattr(self, name))
            except KeyError:
                raise ParamsError(f"{name} {getattr(self, name)!r} is not a ggml type") from None
        if not self.flash_attn and not gt.is_element_addressable(self.type_id_v):
            raise ParamsError(f"a {self.type_v} V cache needs flash attention (a transposed V holds single "
                              "elements; llama.cpp refuses a quantized V cache without flash_attn)")
        for name in ("kv_size", "kv_size_swa"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                raise ParamsError(f"{name} {v} must be positive")
        if self.kv_size_compressed is not None and (len(self.kv_size_compressed) != 3
                                                    or any(v <= 0 for v in self.kv_size_compressed)):
            raise ParamsError(f"kv_size_compressed {self.kv_size_compressed} must be three positive row counts")

    # -- derived ----------------------------------------------------------------------------
    @property
    def n_stream(self) -> int:
        """KV streams: one when unified, else one per sequence."""
        return 1 if self.kv_unified else self.n_seq_max

    @property
    def v_trans(self) -> bool:
        """V is stored transposed unless flash attention is on (``attn_v_trans``)."""
        return not self.flash_attn

    @property
    def type_id_k(self) -> int:
        """ggml type id of K."""
        return gt.type_id_from_name(self.type_k)

    @property
    def type_id_v(self) -> int:
        """ggml type id of V."""
        return gt.type_id_from_name(self.type_v)

    @property
    def type_id_r(self) -> int:
        """ggml type id of the recurrent r state."""
        return gt.type_id_from_name(self.type_r)

    @property
    def type_id_s(self) -> int:
        """ggml type id of the recurrent s state."""
        return gt.type_id_from_name(self.type_s)

    @property
    def n_ctx_actual(self) -> int:
        """``cparams.n_ctx`` after padding (and rounding to whole streams)."""
        n_ctx = ggml_pad(self.n_ctx, PAD)
        if self.kv_unified:
            return n_ctx
        return self.n_ctx_seq * self.n_seq_max

    @property
    def n_ctx_seq(self) -> int:
        """``cparams.n_ctx_seq``: cells per stream of the (base) KV cache."""
        if self.kv_size is not None:
            return self.kv_size
        n_ctx = ggml_pad(self.n_ctx, PAD)
        if self.kv_unified:
            return n_ctx
        n = ggml_pad(n_ctx // self.n_seq_max, PAD)
        if n == 0:
            raise ParamsError("n_ctx_seq == 0")
        return n

    def swa_size(self, n_swa: int, unified: bool | None = None) -> int:
        """Cells per stream of the SWA cache of an iSWA memory (``unified``: the cache's, default the context's)."""
        if self.kv_size_swa is not None:
            return self.kv_size_swa
        base = self.n_ctx_seq
        if self.swa_full:
            return base
        uni = self.kv_unified if unified is None else unified
        return ggml_pad(min(base, n_swa * (self.n_seq_max if uni else 1) + self.n_ubatch), PAD)

    def compressed_size(self, index: int, ratio: int) -> int:
        """Rows per stream of DeepSeek-V4 compressed cache ``index`` (0 csa, 1 hca, 2 lid) of ``ratio``."""
        if self.kv_size_compressed is not None:
            return self.kv_size_compressed[index]
        return ggml_pad(max(1, -(-self.n_ctx_seq // ratio)), PAD)

    @property
    def recurrent_size(self) -> int:
        """Cells of a recurrent memory: one per sequence."""
        return max(1, self.n_seq_max)
