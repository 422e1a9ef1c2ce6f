"""One story per file (#29): ``kvscope inspect --json``, the app's Overview and ``kvscope report`` give the same
verdict for the same file and model, for a real file of every memory class the fixtures hold, undamaged and
with every damage of the corruption catalog that applies to it.

Each file is the first slot file (``seq_file``) of its memory class in the manifests: the tiny models' files
of the real llama.cpp build 2026-10-01 (plain KV, iSWA, recurrent, hybrid), then the generated fixtures of
the pinned build b11434 for the classes only they hold (hybrid-iSWA, hybrid-idx, DSA, DSA-iSWA, MSA, DSV4).
Every damaged copy is made by ``kvscope corrupt``'s work (:func:`kvscope.core.lab.damaged_copy.corrupt_file`)
from a catalog entry (the catalog is deterministic: no seed to fix); a catalog entry that does not apply to a
file (no SWA section in a plain KV cache, no K record in a recurrent state) is refused by the catalog itself
and is left out of that file's cases, and every catalog entry applies to at least one file here.

The three sides, compared on the whole verdict (level, state, title, reason, counts, top findings, missing
bytes): the ``verdict`` of ``kvscope inspect FILE --model M --json``; the app's document verdict and the
Overview's banner (its verdict, and its first two lines: the title in capitals and the reason) once the
statistics and the compatibility are in; and report.json's ``verdict`` and ``overview.verdict`` of
``kvscope report FILE --model M -o DIR``. The exit codes of inspect and report agree too.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from kvharness.fixtures import entry_model, manifest_entries
from kvscope.core.cli import main as core_cli
from kvscope.core.lab.corruptions import CATALOG, CorruptionError
from kvscope.core.lab.damaged_copy import corrupt_file
from kvscope.core.model.profile import ModelProfile, load_model_profile
from kvscope.core.reader.source import ByteSource

# where each memory class's file is taken from, in order: the real tiny-model files first
FOLDERS = ("llamacpp-2026-10-01", "gen-b11434")
UNDAMAGED = "undamaged"
FAST_DAMAGE = ("truncated_half", "nan_rows_valid")  # the not-slow subset: a parse error and a statistics error
FAST_CLASSES = ("kv", "iswa", "recurrent", "hybrid")


@cache
def class_files() -> dict[str, tuple[Path, Path]]:
    """Memory class -> (the first slot file of that class in :data:`FOLDERS`' manifests, the model that wrote it)."""
    out: dict[str, tuple[Path, Path]] = {}
    for path, entry in manifest_entries(FOLDERS):
        if entry.get("kind") != "seq_file" or not path.is_file():
            continue
        model = entry_model(path, entry)
        out.setdefault(_profile(model).memory_class, (path, model))
    return out


@cache
def _profile(model: Path) -> ModelProfile:
    return load_model_profile(model)


def applies(path: Path, model: Path, name: str) -> bool:
    """Whether the catalog's ``name`` applies to ``path`` (the catalog's own plan says so)."""
    try:
        CATALOG[name].plan(ByteSource(path.read_bytes(), path.name), _profile(model))
    except CorruptionError:
        return False
    return True


def _cases() -> list[Any]:
    out = []
    for mc, (path, model) in class_files().items():
        for name in (UNDAMAGED, *CATALOG):
            if name != UNDAMAGED and not applies(path, model, name):
                continue
            fast = mc in FAST_CLASSES and name in (UNDAMAGED, *FAST_DAMAGE)
            marks = () if fast else (pytest.mark.slow,)  # the whole matrix: a few minutes of GUI loads and reports
            out.append(pytest.param(mc, name, id=f"{mc}-{name}", marks=marks))
    return out


CASES = _cases()


def _inspect(path: Path, model: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    """``kvscope inspect PATH --model M --json``: its exit code and object."""
    capsys.readouterr()
    rc = core_cli.main(["inspect", str(path), "--model", str(model), "--json"])
    return rc, json.loads(capsys.readouterr().out)


def _report(path: Path, model: Path, dest: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    """``kvscope report PATH --model M -o DEST``: its exit code and report.json."""
    capsys.readouterr()
    rc = core_cli.main(["report", str(path), "--model", str(model), "-o", str(dest)])
    capsys.readouterr()
    return rc, json.loads((dest / "report.json").read_text())


def _app(qtbot: Any, window: Any, path: Path, model: Path) -> Any:
    """The DocumentWidget of ``path`` opened in the app with ``model``, once the statistics and the compatibility
    are in and every background job is done."""
    w = window.open_file(str(path), model=str(model))
    assert w is not None
    qtbot.waitUntil(lambda: w.doc.stats is not None and w.doc.compat is not None and not w.doc.busy, timeout=60000)
    assert window.wait_idle(60000)
    assert w.doc.stats_error is None and w.doc.compat_error is None and w.doc.model_error is None
    return w


def _same(sides: dict[str, dict[str, Any]]) -> None:
    """Every side's verdict is the first side's: level and reason first (the message says which side differs)."""
    (first, want), *rest = sides.items()
    for name, got in rest:
        assert (got["level"], got["reason"]) == (want["level"], want["reason"]), f"{name} differs from {first}"
        assert got == want, f"{name}'s verdict differs from {first}'s"


@pytest.mark.parametrize(("memory_class", "damage"), CASES)
def test_cli_app_and_report_tell_one_story(qtbot, window, tmp_path, capsys, memory_class, damage):  # type: ignore[no-untyped-def]
    src, model = class_files()[memory_class]
    path = src
    if damage != UNDAMAGED:
        path = tmp_path / f"{damage}{src.suffix}"
        corrupt_file(src, path, [damage], model=str(model))
        assert path.read_bytes() != src.read_bytes()
    rc, cli = _inspect(path, model, capsys)
    rrc, report = _report(path, model, tmp_path / "report", capsys)
    w = _app(qtbot, window, path, model)
    doc_verdict = w.doc.verdict()
    banner = w.overview.verdict
    assert doc_verdict is not None and banner is not None
    assert cli["values_scanned"] is True and report["values_scanned"] is True  # the three weighed the values
    _same({"inspect --json": cli["verdict"], "the app's document": doc_verdict.to_json(),
           "the Overview's banner": banner.to_json(), "report.json": report["verdict"],
           "report.json's overview": report["overview"]["verdict"]})
    text = w.overview.browser.toPlainText().splitlines()
    assert text[:2] == [cli["verdict"]["title"].upper(), cli["verdict"]["reason"]]
    assert rrc == rc == (1 if cli["verdict"]["counts"]["error"] else 0)
    if damage == UNDAMAGED:  # as llama.cpp wrote it: no error (MSA's reads suspicious: its kv_idx layer 1 is all zeros)
        assert cli["verdict"]["counts"]["error"] == 0


def test_every_damage_of_the_catalog_is_in_the_matrix() -> None:
    """Each catalog entry applies to at least one of the files, and at least the four classes of the tiny
    models' real files are there."""
    covered = {p.values[1] for p in CASES}
    assert covered == {UNDAMAGED, *CATALOG}
    assert set(FAST_CLASSES) <= set(class_files())
