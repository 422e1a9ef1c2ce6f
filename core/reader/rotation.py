"""Hadamard rotation of K/V cache rows, as llama.cpp applies it (``src/llama-kv-cache.cpp``).

Since its 2026-04 builds llama.cpp stores the rows of a quantized K (V) cache rotated when the
head size is a multiple of 64: before the rows are written, each block of ``n_rot`` consecutive
elements is multiplied by the orthonormal Walsh-Hadamard matrix of size ``n_rot``
(``llama_mul_mat_hadamard`` reshapes the row to ``[n_rot, n/n_rot]`` and multiplies). The matrix
is symmetric and its own inverse, so de-rotating a stored row is the same multiplication.
``n_rot_k`` is the largest power of two >= 64 that divides the cache's head size, ``n_rot_v`` is 64;
``LLAMA_ATTN_ROT_DISABLE=1`` turns both off (the rule: :mod:`kvscope.core.model.rotation_rule`).
The v11/v4 layout writes the two block sizes in every KV data header; older layouts hold rotated
rows with no marker, so :func:`annotate` infers them from the model and the cache types and says so.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import numpy.typing as npt

from kvscope.core import ggml_types as gt
from kvscope.core.model.profile import ModelProfile
from kvscope.core.model.rotation_rule import BLOCK as MIN_BLOCK
from kvscope.core.model.rotation_rule import CacheHeads, planned_cache_heads
from kvscope.core.reader.records import KvStream, LayerRecord, ParseResult, Section

F32A = npt.NDArray[np.float32]


@cache
def hadamard(n: int) -> F32A:
    """The orthonormal Walsh-Hadamard matrix of size ``n`` (a power of two), built as ggml_gen_hadamard does."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"Hadamard size {n} is not a power of two")
    h = np.zeros((n, n), dtype=np.float32)
    h[0, 0] = np.float32(1.0) / np.sqrt(np.float32(n))
    s = 1
    while s < n:
        blk = h[:s, :s].copy()
        h[s : 2 * s, :s] = blk
        h[:s, s : 2 * s] = blk
        h[s : 2 * s, s : 2 * s] = -blk
        s *= 2
    h.setflags(write=False)
    return h


def rotate_blocks(values: F32A, n_rot: int) -> F32A:
    """Multiply every block of ``n_rot`` consecutive values of each row by the Hadamard matrix.

    ``values`` is ``[rows, n]`` with ``n`` a multiple of ``n_rot``. The same call rotates and
    de-rotates (the matrix is its own inverse). Returns a new float32 array.
    """
    if n_rot <= 0:
        return np.asarray(values, dtype=np.float32)
    v = np.asarray(values, dtype=np.float32)
    rows, n = v.shape
    if n % n_rot:
        raise ValueError(f"row of {n} values is not whole rotation blocks of {n_rot}")
    hadamard(n_rot)  # checks the size
    return _fwht(v.reshape(-1, n_rot)).reshape(rows, n)


_INNER = 64  # the block size multiplied as a matrix; larger blocks are butterflies over it


@cache
def _inner(b: int, a: int) -> F32A:
    h: F32A = np.multiply(hadamard(b), np.float32(1.0 / np.sqrt(a)), dtype=np.float32)
    h.setflags(write=False)
    return h


def _fwht(blocks: F32A) -> F32A:
    """``blocks @ hadamard(n)`` for ``[m, n]`` blocks, in the same order and to float32 rounding.

    H(n) = H(a) ⊗ H(b) (Sylvester order, index i = i_a·b + i_b): the inner ``b`` (at most 64)
    values are multiplied by H(b)/√a as a matrix (2b flops a value instead of 2n), then log2(a)
    butterfly passes (x+y, x-y) apply H(a) across them (1.4x faster than one product for n = 128).
    """
    m, n = blocks.shape
    b = min(n, _INNER)
    a = n // b
    cur = np.ascontiguousarray((blocks.reshape(m * a, b) @ _inner(b, a)).reshape(m, n), dtype=np.float32)
    h = 1
    while h < a:
        v = cur.reshape(m, a // (2 * h), 2, h * b)
        nxt = np.empty_like(cur)
        w = nxt.reshape(m, a // (2 * h), 2, h * b)
        np.add(v[:, :, 0], v[:, :, 1], out=w[:, :, 0])
        np.subtract(v[:, :, 0], v[:, :, 1], out=w[:, :, 1])
        cur, h = nxt, 2 * h
    return cur


derotate = rotate_blocks


def _section_heads(profile: ModelProfile, sec: Section, kv_rot: bool) -> CacheHeads | None:
    plan = profile.expected_sections(False, kv_rot)
    planned = next((s for s in plan if s.role == sec.role), None)
    if planned is not None and planned.head_k:
        # the planned cache: what llama.cpp's constructor sees (an indexer copy with its own hparams too),
        # exactly as the memory core builds it (kvscope.core.memory.spec)
        return planned_cache_heads(profile, plan, planned)
    layers = _section_layers(sec)
    if not layers:
        return None
    try:
        hk = tuple(profile.head_size_k(il) for il in layers)
        hv = tuple(profile.head_size_v(il) for il in layers if profile.has_v(il))
        k0, v0 = profile.head_size_k(0), profile.head_size_v(0)
    except IndexError:
        return None
    return CacheHeads(hk, hv, k0, v0, forced_k=sec.role == "kv_lid")


def _section_layers(sec: Section) -> list[int]:
    out: list[int] = []
    for st in sec.streams:
        out.extend(r.il for r in st.k_layers if r.il is not None)
        if out:
            break
    return out


def _mark(recs: list[LayerRecord], block: int | None) -> None:
    for r in recs:
        if block is None:
            r.rotated, r.rot_block = None, 0
        else:
            r.rotated, r.rot_block = block > 0, block


def _unrotatable(recs: list[LayerRecord]) -> bool:
    """True when no build could have rotated these rows: a float type, or rows not whole 64-blocks."""
    for r in recs:
        if not gt.is_known_type(r.type_id) or not gt.is_quantized(r.type_id):
            continue
        n = gt.elements_in_row(r.type_id, r.row_bytes) if not r.transposed else r.n_embd_v_gqa
        if n and n % MIN_BLOCK == 0:
            return False
    return True


def annotate(result: ParseResult, profile: ModelProfile | None, rot_default: bool | None = None) -> None:
    """Set ``rotated`` on every K/V record and the inferred ``n_rot_k/v`` of layouts without the fields.

    v11/v4 streams carry the fields. For older layouts of builds that rotate by default
    (``Generation.rot_default``) the block sizes are inferred from the model's head sizes and
    the record types (``n_rot_inferred``): ``LLAMA_ATTN_ROT_DISABLE`` may have been set, which no
    byte records, so the inference is stated as such. Without a model, a record that no build
    could have rotated is ``rotated=False``; any other stays ``None``.
    """
    feats = result.layout.features
    if rot_default is None:
        rot_default = bool(feats.get("rot_default"))
    has_fields = bool(feats.get("kv_rot"))
    for sec in result.sections:
        if sec.kind != "kv":
            continue
        heads = section_heads(profile, sec)
        for st in sec.streams:
            _annotate_stream(st, sec, heads, has_fields, rot_default)


def default_rotation(st: KvStream, sec: Section, heads: CacheHeads | None) -> tuple[int | None, int | None]:
    """(n_rot_k, n_rot_v) a default rotating build uses for this stream's cache (None: unknown).

    ``heads`` are what llama.cpp's rule reads of the section's cache, from the model
    (:func:`section_heads`); without them a side is 0 only when no build could rotate its rows
    (float types, rows not whole 64-blocks).
    """
    tk = st.k_layers[0].type_id if st.k_layers else None
    tv = st.v_layers[0].type_id if st.v_layers else None
    lid = sec.role == "kv_lid"
    if heads is not None:
        return heads.blocks(tk, tv)
    rk = 0 if _unrotatable(st.k_layers) and not lid else None
    rv = 0 if _unrotatable(st.v_layers) else None
    return rk, rv


def section_heads(profile: ModelProfile | None, sec: Section, kv_rot: bool = False) -> CacheHeads | None:
    """What the rotation rule reads of a KV section's cache, from the model (None without one);
    ``kv_rot``: in a v11/v4 build's memory (the layouts before it do not store the block sizes, and
    are the ones whose block sizes are inferred)."""
    return _section_heads(profile, sec, kv_rot) if profile is not None else None


def _annotate_stream(
    st: KvStream, sec: Section, heads: CacheHeads | None, has_fields: bool, rot_default: bool
) -> None:
    if has_fields:
        _mark(st.k_layers, st.n_rot_k)
        _mark(st.v_layers, st.n_rot_v)
        return
    if not rot_default:
        st.n_rot_k = st.n_rot_v = None
        _mark(st.k_layers, 0)
        _mark(st.v_layers, 0)
        return
    rk, rv = default_rotation(st, sec, heads)
    if rk is not None and rv is not None:
        st.n_rot_k, st.n_rot_v, st.n_rot_inferred = rk, rv, True
    else:
        st.n_rot_k = st.n_rot_v = None
    _mark(st.k_layers, rk)
    _mark(st.v_layers, rv)
