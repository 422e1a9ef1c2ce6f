"""The package list in pyproject.toml covers every package folder (setuptools maps them by hand)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).parent.parent
MAPPING = {"core": "kvscope.core", "app": "kvscope.app", "resources": "kvscope.resources"}


def test_every_package_is_listed() -> None:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    assert cfg["package-dir"] == {v: k for k, v in MAPPING.items()}
    found = set()
    for folder, name in MAPPING.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([name, *rel.parts]))
    assert found == listed, f"missing: {sorted(found - listed)}, stale: {sorted(listed - found)}"
