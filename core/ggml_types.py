"""ggml tensor types as llama.cpp writes them in state files, backed by gguf-py's tables.

The type table itself is never duplicated here: ids, names, block sizes and byte sizes all come
from ``gguf.GGMLQuantizationType`` and ``gguf.GGML_QUANT_SIZES``. This module only adds the few
derived quantities a state reader needs (``ggml_row_size``, element addressability).
"""

from __future__ import annotations

from functools import cache

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

# Types a KV cache can hold in llama.cpp (``--cache-type-k/-v``); recurrent state is F32.
KV_CACHE_TYPE_NAMES: tuple[str, ...] = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


def is_known_type(type_id: int) -> bool:
    """True when ``type_id`` is a ggml type gguf-py knows the block layout of."""
    try:
        return GGMLQuantizationType(type_id) in GGML_QUANT_SIZES
    except ValueError:
        return False


@cache
def type_name(type_id: int) -> str:
    """Lower-case ggml name (``f16``, ``q8_0``); ``type<N>`` for an id gguf-py does not know."""
    try:
        return GGMLQuantizationType(type_id).name.lower()
    except ValueError:
        return f"type{type_id}"


def type_id_from_name(name: str) -> int:
    """Inverse of :func:`type_name` for known types; raises ``KeyError`` otherwise."""
    return int(GGMLQuantizationType[name.upper()])


def block_size(type_id: int) -> int:
    """Elements per block (1 for plain float types)."""
    return int(GGML_QUANT_SIZES[GGMLQuantizationType(type_id)][0])


def type_size(type_id: int) -> int:
    """Bytes per block: ``ggml_type_size`` (the ``v_size_el`` of a transposed V record)."""
    return int(GGML_QUANT_SIZES[GGMLQuantizationType(type_id)][1])


def row_size(type_id: int, n_elements: int) -> int:
    """``ggml_row_size(type, n)``: bytes of one row of ``n`` elements (``n`` a block multiple)."""
    bs, ts = GGML_QUANT_SIZES[GGMLQuantizationType(type_id)]
    return int(ts) * (n_elements // int(bs))


def elements_in_row(type_id: int, row_bytes: int) -> int | None:
    """Elements held by a row of ``row_bytes`` bytes, or None when it is not whole blocks."""
    bs, ts = GGML_QUANT_SIZES[GGMLQuantizationType(type_id)]
    if int(ts) == 0 or row_bytes % int(ts):
        return None
    return (row_bytes // int(ts)) * int(bs)


def is_element_addressable(type_id: int) -> bool:
    """True for block size 1 types (f32, f16, bf16, ...): the only ones a transposed V can hold."""
    return block_size(type_id) == 1


def is_quantized(type_id: int) -> bool:
    """``ggml_is_quantized``: a block type (q8_0, q4_0, ...), not f32/f16/bf16."""
    return is_known_type(type_id) and block_size(type_id) > 1
