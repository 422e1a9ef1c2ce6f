"""Architecture recipes: the committed metadata and tensor inventory of each generated model.

``archs/<model>.json`` holds, per model key, the architecture, the GGUF metadata llama.cpp needs
for it (minimal: every key there changes what llama.cpp builds) and the tensor inventory (names
and ggml shapes ``ne``) as llama.cpp itself creates it for that metadata. The files are derived
from the pinned builds by ``tools/modelgen_probe.py`` and need no build to be used.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

ARCH_DIR = Path(__file__).parent / "archs"

MetaItem = tuple[str, str, Any]

# matrix weights are stored as F16, every other tensor as F32: vectors, and the 2-D tensors llama.cpp
# uses outside matrix products (convolutions, SSM parameters, norms, hyper-connection mixers,
# compressor position embeddings, attention sinks)
_F32_PARTS = ("ssm_", "conv", "norm", "hc_", "_ape", "sinks", "shortconv")
@dataclass(frozen=True)
class Recipe:
    """What a generated model is made of."""

    model: str  # model key, e.g. "llama", "lfm2-swa"
    architecture: str  # general.architecture
    memory: str  # the llama.cpp memory class the model gets
    metadata: tuple[MetaItem, ...]
    tensors: tuple[tuple[str, tuple[int, ...]], ...]  # (name, ggml ne)

    def dtype(self, name: str) -> str:
        """"F16" or "F32": the storage type of tensor ``name``."""
        ne = dict(self.tensors)[name]
        if len(ne) >= 2 and name.endswith(".weight") and not any(p in name for p in _F32_PARTS):
            return "F16"
        return "F32"

    def meta_value(self, key: str) -> Any:
        k = key.replace("{a}", self.architecture)
        for name, _t, value in self.metadata:
            if name == k:
                return value
        raise KeyError(k)


def recipe_from_dict(d: dict[str, Any]) -> Recipe:
    return Recipe(
        model=str(d["model"]),
        architecture=str(d["architecture"]),
        memory=str(d["memory"]),
        metadata=tuple((str(k), str(t), v) for k, t, v in d["metadata"]),
        tensors=tuple((str(n), tuple(int(x) for x in s)) for n, s in d["tensors"]),
    )


@cache
def load_recipe(model: str) -> Recipe:
    """The committed recipe of ``model``; KeyError if there is none."""
    path = ARCH_DIR / f"{model}.json"
    if not path.is_file():
        raise KeyError(f"no recipe for model {model!r} (known: {', '.join(model_keys())})")
    return recipe_from_dict(json.loads(path.read_text()))


def model_keys() -> list[str]:
    """Every model key with a committed recipe, sorted."""
    return sorted(p.stem for p in ARCH_DIR.glob("*.json"))
