"""Helpers for tests: the real llama.cpp fixtures copied into tests/data and their manifests."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent.parent.parent / "tests" / "data"
MODELS = DATA / "llamacpp-2026-10-01"

# folder -> the generation name the reader should report
FOLDER_GENERATION = {
    "llamacpp-2025-05-08": "2025-05",
    "llamacpp-2025-08-14": "2025-08",
    "llamacpp-2026-04-26": "2026-04",
    "llamacpp-2026-08-16": "2026-08",
    "llamacpp-2026-10-01": "2026-10",
    # written by tools/gen_fixtures.py through the pinned builds, models in gen-models/
    "gen-0c1e5709": "2026-10",
    "gen-b11434": "2026-10-v4",
    # model variants the gen-* models do not cover (tools/gen_variant_fixtures.py); not in manifests()
    "variants-0c1e5709": "2026-10",
    "variants-b11434": "2026-10-v4",
}

KIND = {"session": "session_file", "ctx_blob": "context_blob", "seq_file": "seq_file", "seq_blob": "seq_blob"}


def manifests() -> list[Path]:
    return sorted([*DATA.glob("llamacpp-*/manifest*.json"), *DATA.glob("gen-*/manifest.json")])


@cache
def load_manifest(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())  # type: ignore[no-any-return]


VARIANT_FOLDERS = ("variants-0c1e5709", "variants-b11434")


def manifest_entries(folders: tuple[str, ...] | None = None) -> list[tuple[Path, dict[str, Any]]]:
    """(file path, manifest entry) for every file listed in any manifest (of ``folders`` if given:
    their ``manifest.json``, e.g. :data:`VARIANT_FOLDERS`)."""
    out = []
    for mf in manifests() if folders is None else [DATA / f / "manifest.json" for f in folders]:
        for entry in load_manifest(mf)["files"]:
            out.append((mf.parent / entry["file"], entry))
    return out


GEN_MODELS = DATA / "gen-models"


def model_path(key: str) -> Path:
    """The model of ``key``: ``llama`` is the tiny model beside 2026-10-01, ``gen/llama`` the
    generated one (tests/data/gen-models, the models of the gen-* fixtures)."""
    if key.startswith("gen/"):
        return GEN_MODELS / f"{key[4:]}.gguf"
    return MODELS / f"tiny-{key}.gguf"


@cache
def profile(key: str) -> Any:
    from kvscope.core.model.profile import load_model_profile

    return load_model_profile(model_path(key))


def entry_model(path: Path, entry: dict[str, Any]) -> Path:
    """The model that wrote the manifest entry of ``path`` (its ``model_file``, else the tiny models)."""
    if "model_file" in entry and (path.parent / entry["model_file"]).is_file():
        return (path.parent / entry["model_file"]).resolve()
    return model_path(entry["model_key"])  # the older builds' manifests name the tiny models beside 2026-10-01


@cache
def _profile_at(model: Path) -> Any:
    from kvscope.core.model.profile import load_model_profile

    return load_model_profile(model)


def entry_profile(path: Path, entry: dict[str, Any]) -> Any:
    """The model profile of a manifest entry."""
    return _profile_at(entry_model(path, entry))
