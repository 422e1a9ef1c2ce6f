"""Write a generated model: a recipe's metadata and tensors, seeded random weights, one GGUF.

The same recipe and seed give the same bytes on every run and machine (``tensor_data`` uses a
frozen random stream, ``gguf_write`` keeps the metadata order).
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import numpy as np
import numpy.typing as npt

from kvscope.core.modelgen.gguf_write import MetaItem, write_gguf
from kvscope.core.modelgen.recipes import Recipe
from kvscope.core.modelgen.tensor_data import tensor_values
from kvscope.core.modelgen.tokenizer import TOKENIZER_META

SEED = 1


def model_metadata(recipe: Recipe, seed: int = SEED) -> list[MetaItem]:
    """Every metadata item of the model file, in file order."""
    head: list[MetaItem] = [
        ("general.architecture", "str", recipe.architecture),
        ("general.name", "str", f"kvscope-tiny-{recipe.model}"),
        ("general.description", "str", f"random weights (seed {seed}); state-file fixture model, not a language model"),
    ]
    return head + list(recipe.metadata) + list(TOKENIZER_META)


def model_tensors(recipe: Recipe, seed: int = SEED) -> list[tuple[str, npt.NDArray[Any]]]:
    """(name, array in NumPy order) of every tensor, F16 or F32 as ``recipe.dtype`` says."""
    out: list[tuple[str, npt.NDArray[Any]]] = []
    for name, ne in recipe.tensors:
        vals = tensor_values(name, tuple(reversed(ne)), seed)
        out.append((name, vals.astype(np.float16) if recipe.dtype(name) == "F16" else vals))
    return out


def write_model(recipe: Recipe, path: str | os.PathLike[str], seed: int = SEED) -> str:
    """Write the model of ``recipe`` to ``path`` (atomically); returns the file's sha256."""
    write_gguf(path, recipe.architecture, model_metadata(recipe, seed), model_tensors(recipe, seed))
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
