"""Deterministic random weights for the generated models.

Each tensor's values depend only on the model seed and the tensor's name: a legacy NumPy
``RandomState`` (a stream NumPy keeps frozen across releases) seeded from sha256(seed, name)
draws standard normals scaled by ``stdev``. As in llama.cpp's ``tests/test-llama-archs.cpp``,
``ssm_a`` (state decay) is made negative; norm weights are centred on 1.
"""

from __future__ import annotations

import hashlib

import numpy as np
import numpy.typing as npt

STDEV = 0.1


def tensor_seed(name: str, seed: int) -> int:
    """The 32-bit RandomState seed of tensor ``name`` in a model of seed ``seed``."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def tensor_values(name: str, shape: tuple[int, ...], seed: int, stdev: float = STDEV) -> npt.NDArray[np.float32]:
    """float32 values of shape ``shape`` (NumPy order) for tensor ``name``."""
    n = int(np.prod(shape)) if shape else 1
    vals = np.random.RandomState(tensor_seed(name, seed)).standard_normal(n) * stdev
    if "ssm_a" in name:
        vals = -np.abs(vals)
    elif "norm" in name:
        vals = 1.0 + vals
    return vals.astype(np.float32).reshape(shape)
