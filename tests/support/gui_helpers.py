"""Paths of the real fixtures the GUI tests open, and opening one in the window."""

from __future__ import annotations

from pathlib import Path
from typing import Any

DATA = Path(__file__).parent.parent / "data"
STATE = DATA / "llamacpp-2026-10-01"
LAB = DATA / "lab" / "llamacpp-2026-10-01" / "llama"


def model(key: str) -> str:
    """The tiny GGUF model of a fixture family (llama, gemma2, lfm2, mamba, qwen2vl)."""
    return str(STATE / f"tiny-{key}.gguf")


def open_loaded(window: Any, qtbot: Any, path: Path | str, model_path: Path | str | None) -> Any:
    """Open ``path`` in ``window`` (with ``model_path``) and wait until it is read, its compatibility known
    and every background job done: the DocumentWidget."""
    w = window.open_file(str(path), model=str(model_path) if model_path else None)
    assert w is not None
    qtbot.waitUntil(lambda: w.doc.result is not None and w.doc.compat is not None and not w.doc.busy, timeout=30000)
    assert window.wait_idle(30000)
    return w


def count_page_renders(w: Any) -> list[str]:
    """Every HTML the Overview's page of document widget ``w`` is set to from now on (a render each)."""
    sets: list[str] = []
    browser = w.overview.browser
    real = browser.setHtml

    def set_html(html: str) -> None:
        sets.append(html)
        real(html)

    browser.setHtml = set_html
    return sets
