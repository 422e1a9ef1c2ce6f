"""Hadamard rotation as llama.cpp applies it (core/reader/rotation.py): the matrix, the block rule, the round trip."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvscope.core import ggml_types as gt
from kvscope.core.model.rotation_rule import EndlessRotationLoop, rotation_blocks
from kvscope.core.reader.rotation import hadamard, rotate_blocks

Q8, F16 = gt.type_id_from_name("q8_0"), gt.type_id_from_name("f16")


def _sylvester(n: int) -> np.ndarray:
    """The textbook construction, independent of ggml_gen_hadamard's in-place loop."""
    h = np.array([[1.0]])
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)


@pytest.mark.parametrize("n", [1, 2, 64, 128, 256, 512])
def test_matrix_is_orthonormal_symmetric_involutive(n: int) -> None:
    h = hadamard(n).astype(np.float64)
    assert np.allclose(h, _sylvester(n), atol=1e-7)
    assert np.allclose(h, h.T)
    assert np.allclose(h @ h, np.eye(n), atol=1e-5)


@pytest.mark.parametrize("n", [0, 3, 96, 100])
def test_non_power_of_two_is_refused(n: int) -> None:
    with pytest.raises(ValueError):
        hadamard(n)


@pytest.mark.parametrize(("head", "want"), [(16, 0), (32, 0), (64, 64), (96, 0), (128, 128), (192, 64), (256, 256),
                                            (384, 128), (512, 512), (576, 64)])
def test_k_block_is_largest_power_of_two_dividing_the_head(head: int, want: int) -> None:
    assert rotation_blocks([head, head], [head], Q8, Q8) == (want, 64 if want else 0)


def test_mixed_head_sizes_never_rotate_unless_forced() -> None:
    assert rotation_blocks([128, 256], [128, 64], Q8, Q8) == (0, 0)
    # llama.cpp reads the -1 of differing heads as uint32 (odd): a forced K rotation stays at 64
    assert rotation_blocks([128, 256], [], F16, None, forced_k=True) == (64, 0)


def test_layer_zero_of_the_cache_hparams_decides_not_the_cache_layers() -> None:
    """``hparams.n_embd_head_k()`` is layer 0's head size, which need not be one of the cache's layers."""
    assert rotation_blocks([128, 128], [128, 128], Q8, Q8, head_k0=96, head_v0=96) == (0, 0)
    assert rotation_blocks([96, 96], [96, 96], Q8, Q8, head_k0=128, head_v0=128) == (64, 64)


def test_only_quantized_types_rotate_except_the_indexer() -> None:
    assert rotation_blocks([128], [128], F16, F16) == (0, 0)
    assert rotation_blocks([128], [128], Q8, Q8) == (128, 64)
    assert rotation_blocks([128], [128], Q8, F16) == (128, 0)
    assert rotation_blocks([128], [128], F16, F16, forced_k=True) == (128, 0)
    assert rotation_blocks([128], [128], Q8, Q8, disabled=True) == (0, 0)


def test_a_forced_rotation_of_no_layer_is_refused() -> None:
    with pytest.raises(EndlessRotationLoop):
        rotation_blocks([], [], F16, F16, forced_k=True)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([64, 128, 256]), st.integers(1, 4), st.integers(1, 9), st.integers(0, 2**31 - 1))
def test_rotate_twice_is_identity(n_rot: int, blocks: int, rows: int, seed: int) -> None:
    x = np.random.default_rng(seed).standard_normal((rows, n_rot * blocks)).astype(np.float32)
    y = rotate_blocks(x, n_rot)
    assert not np.allclose(y, x)
    assert np.allclose(rotate_blocks(y, n_rot), x, atol=1e-5)
    # orthonormal: row norms are kept
    assert np.allclose(np.linalg.norm(y, axis=1), np.linalg.norm(x, axis=1), rtol=1e-5)


def test_blocks_never_straddle_heads() -> None:
    """Rotating a row of two heads is rotating each head on its own (ggml reshape to [n, ne/n])."""
    x = np.random.default_rng(1).standard_normal((3, 256)).astype(np.float32)
    whole = rotate_blocks(x, 128)
    parts = np.concatenate([rotate_blocks(x[:, :128], 128), rotate_blocks(x[:, 128:], 128)], axis=1)
    # the same sums in float32, grouped as the matrix product's kernel groups them for each shape: equal
    # to float32 rounding of unit-scale values (an absolute bound: a value near 0 has no relative one)
    assert np.allclose(whole, parts, rtol=1e-5, atol=1e-5)
