"""The inputs of the long fuzz run (``bench/fuzz_long.py``): seed files, their models, mutations.

Input ``i`` of a run is a function of (run seed, ``i``) alone: a real fixture (a state file of
``tests/data``, with its model half of the time), one to four mutations of the state or, for a
share of the inputs, of the model's GGUF structural fields, and now and then a sparse giant tail
or a race with a thread that cuts the file. The byte mutations are ``tests/fuzz_mutations.py``'s,
shared with the CI fuzz test.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvscope.core.model.profile import ModelProfile, load_model_profile
from kvscope.core.reader.parse import read_state

ROOT = Path(__file__).resolve().parent.parent
from kvharness.fuzz_mutations import apply_mutations as apply_byte_mutations  # noqa: E402  (shared with the CI test)
from kvharness.fuzz_mutations import gguf_fields, gguf_kv_end  # noqa: E402

DATA = ROOT / "tests" / "data"
MODELS = DATA / "llamacpp-2026-10-01"
MODEL_KEYS = ("llama", "mamba", "gemma2", "lfm2", "qwen2vl")
SKIP_SUFFIXES = (".json", ".gguf", ".npy", ".md")

EXTREMES_32 = (0, 1, 2, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xFFFFFFFE)
EXTREMES_64 = (0, 1, 0x7FFFFFFF, 0xFFFFFFFF, 2**32, 2**63 - 1, 2**63, 2**64 - 1)

Mutation = tuple[Any, ...]


# -- seeds ----------------------------------------------------------------------------------


GEN_MODELS = DATA / "gen-models"


def model_key(path: Path) -> str | None:
    """The model that wrote a fixture: its file-name prefix (``gen/<model>`` for the generated
    fixtures of tests/data/gen-*), or its lab folder."""
    if path.parent.name.startswith("gen-") and path.parent != GEN_MODELS:
        gen = sorted((m.stem for m in GEN_MODELS.glob("*.gguf")), key=len, reverse=True)
        hit = next((m for m in gen if path.name.startswith(m + "-")), None)
        return f"gen/{hit}" if hit else None
    first = path.name.split("-", 1)[0]
    if first in MODEL_KEYS:
        return first
    return path.parent.name if path.parent.name in MODEL_KEYS else None


def model_file(key: str) -> Path:
    """The GGUF of a model key (``gen/<model>``: tests/data/gen-models)."""
    return GEN_MODELS / f"{key[4:]}.gguf" if key.startswith("gen/") else MODELS / f"tiny-{key}.gguf"


def seed_files() -> list[Path]:
    files = [p for p in sorted(DATA.rglob("*")) if p.is_file() and not p.name.endswith(SKIP_SUFFIXES)]
    return [p for p in files if p.stat().st_size > 0]


_PROFILES: dict[str, ModelProfile] = {}


def profile_for(key: str | None) -> ModelProfile | None:
    if key is None:
        return None
    if key not in _PROFILES:
        _PROFILES[key] = load_model_profile(model_file(key))
    return _PROFILES[key]


@dataclass
class Seed:
    path: Path
    key: str | None
    data: bytes
    fields: list[tuple[int, int]]  # (offset, width) of structural scalar fields in the clean parse


def load_seed(path: Path) -> Seed:
    key = model_key(path)
    data = path.read_bytes()
    res = read_state(data=data, profile=profile_for(key))
    out: set[tuple[int, int]] = set()
    for leaf in res.root.leaves():
        if leaf.kind == "field" and leaf.size in (4, 8):
            out.add((leaf.offset, leaf.size))
        elif leaf.kind == "layer_header":  # i32 type, then u64 row size or u32 el + u32 n_embd
            out.update({(leaf.offset, 4), (leaf.offset + 4, 8), (leaf.offset + 4, 4), (leaf.offset + 8, 4)})
        elif leaf.kind in ("cell_meta", "tokens", "outputs") and leaf.size >= 8:
            out.update((leaf.offset + 4 * k, 4) for k in range(min(leaf.size // 4, 6)))
    return Seed(path, key, data, sorted(out))


# -- mutators ------------------------------------------------------------------------------


def draw_value(rng: random.Random, width: int) -> int:
    r = rng.random()
    if r < 0.6:
        return rng.choice(EXTREMES_64 if width == 8 else EXTREMES_32)
    if r < 0.8:
        return rng.randrange(0, 1 << 16)
    return rng.getrandbits(8 * width)


def draw_mutation(rng: random.Random, seed: Seed, n: int) -> Mutation:
    op = rng.choices(("truncate", "flip", "field", "word", "insert", "delete", "append"),
                     weights=(2, 3, 4, 2, 1, 1, 1))[0]
    if op == "truncate":
        return (op, rng.randrange(n + 1))
    if op == "flip":
        return (op, rng.randrange(max(n, 1)), 1 << rng.randrange(8) if rng.random() < 0.7 else rng.randrange(1, 256))
    if op in ("field", "word"):
        width = rng.choice((4, 8))
        return (op, rng.randrange(1 << 20), width, draw_value(rng, width))
    if op == "insert":
        return (op, rng.randrange(n + 1), rng.randbytes(rng.randint(1, 8)))
    if op == "delete":
        return (op, rng.randrange(max(n, 1)), rng.randint(1, 8))
    return (op, rng.randbytes(rng.randint(1, 64)))


def apply_mutations(seed: Seed, muts: list[Mutation]) -> bytes:
    """The same mutations as the CI fuzz test (``tests/fuzz_mutations.py``)."""
    return apply_byte_mutations(seed.data, seed.fields, muts)


@dataclass
class ModelSeed:
    data: bytes  # the tiny model's header and key/value section
    fields: list[tuple[int, int]]


_MODEL_SEEDS: dict[str, ModelSeed] = {}


def model_seed(key: str) -> ModelSeed:
    if key not in _MODEL_SEEDS:
        raw = model_file(key).read_bytes()
        prefix = raw[: gguf_kv_end(raw) + 64]
        _MODEL_SEEDS[key] = ModelSeed(prefix, gguf_fields(prefix))
    return _MODEL_SEEDS[key]


@dataclass
class Input:
    seed: Seed
    with_model: bool
    muts: list[Mutation]
    data: bytes  # the mutated state, or the mutated model when target == "model"
    target: str = "state"  # "state" | "model"
    sparse: int = 0  # extend the state with a hole to this size (0: no)
    race: bool = False  # parse while a thread cuts the file
    name: str = ""  # a hostile file name to write the state under (its renderings are checked)


NAMES_EVERY = 97  # one input in this many is written under a hostile name and its renderings checked
# file names with control, bidi and HTML/Markdown characters (no "/" or NUL: a file system refuses them)
HOSTILE_NAMES = ("a\u202eb.bin", "x\x1b[31my\x1b[0m.bin", "<img src=x onerror=alert(1)>.bin",
                 "l1\nl2\r.bin", "*b*|[x](y)&amp;`c`.bin", "\u2066rtl\u2069\u200f.bin", "tab\tbell\x07\x7f.bin",
                 "<script>alert(1)<script>")


def make_input(seeds: list[Seed], run_seed: int, index: int, model_share: float = 0.25, sparse_every: int = 0,
               race_every: int = 0) -> Input:
    """Input ``index`` of run ``run_seed``: a fixture, whether to use its model, what is mutated."""
    rng = random.Random(run_seed * 1_000_000_007 + index)
    seed = seeds[rng.randrange(len(seeds))]
    with_model = seed.key is not None and rng.random() < 0.5
    n_muts = rng.choice((1, 1, 1, 2, 2, 3, 4))
    if seed.key is not None and rng.random() < model_share:
        ms = model_seed(seed.key)
        muts = [draw_mutation(rng, seed, len(ms.data)) for _ in range(n_muts)]
        return Input(seed, True, muts, apply_byte_mutations(ms.data, ms.fields, muts), "model")
    muts = [draw_mutation(rng, seed, len(seed.data)) for _ in range(n_muts)]
    inp = Input(seed, with_model, muts, apply_mutations(seed, muts))
    if sparse_every and index % sparse_every == sparse_every // 2:
        inp.sparse = rng.randint(1, 50) << 30
    elif race_every and index % race_every == race_every // 3:
        inp.race = True
    elif index % NAMES_EVERY == NAMES_EVERY // 2:  # no draw from rng: the other inputs stay as they were
        inp.name = HOSTILE_NAMES[(index // NAMES_EVERY) % len(HOSTILE_NAMES)]
    return inp
