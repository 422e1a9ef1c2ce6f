"""The app's document shows the one inspection pipeline's answer (#22 item 2): its verdict, findings,
compatibility, consumers, reuse prediction and statistics are ``kvscope inspect --json --stats``'s, for real
files of every kind (slot file, sequence blob, session, context blob, a damaged file, files with NaN rows
the statistics find, a truncated copy), with and without the model, and in both pinned
builds' layouts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvscope.app.document.document import Document
from kvscope.core.cli import main as core_cli
from tests.support.gui_helpers import DATA, STATE, model
from tests.support.report_paths import EXAMPLES, NAN_FILE

pytestmark = pytest.mark.slow  # every fixture kind through the app's document

GEN_V4 = DATA / "gen-b11434"
NAN_ONLY = NAN_FILE.parent.parent / "nan_rows_valid.seqdata.bin"  # NaN rows, nothing else wrong

CASES = [
    (STATE / "llama-f16-fa0-unified0-seq0.seqstate", "llama"),  # slot / sequence file
    (STATE / "llama-f16-fa0-unified0-seq1.seqdata.bin", "llama"),  # sequence blob
    (STATE / "llama-f16-fa0-unified0-ctx.session", "llama"),  # session file
    (STATE / "llama-f16-fa0-unified0-ctx.state.bin", "llama"),  # context blob
    (STATE / "gemma2-f16-fa0-unified1-swafull0-seq0.seqstate", "gemma2"),  # iSWA
    (STATE / "lfm2-f16-fa0-unified0-seq0-partial.seqdata.bin", "lfm2"),  # hybrid, a partial sequence
    (EXAMPLES / "llama-dropped-layer.seqdata.bin", "llama"),  # damaged: a dropped layer record
    (NAN_FILE, "llama"),  # NaN rows and a V record cut short
    (NAN_ONLY, "llama"),  # NaN rows only: the statistics' findings change the compatibility
    (GEN_V4 / "llama-f16-fa0-unified0-slot.seqstate", "gen-llama"),  # b11434's v4 layout
    ("truncated", "llama"),  # a real slot file cut short
]
PARAMS = [pytest.param(p, m if with_model else None, id=f"{Path(p).name}-{'model' if with_model else 'bytes'}")
          for p, m in CASES for with_model in (True, False)]

SHOWN = ("verdict", "findings", "compatibility", "consumers", "reuse_prediction", "stats")


def _model(key: str | None) -> str | None:
    if key is None:
        return None
    if key.startswith("gen-"):
        return str(DATA / "gen-models" / f"{key[4:]}.gguf")
    return model(key)


def _open(qtbot, window, path: str, model_path: str | None) -> Document:  # type: ignore[no-untyped-def]
    """Open ``path`` in the window and wait until its inspection is complete (statistics and compatibility in)."""
    w = window.open_file(path, model=model_path)
    assert w is not None
    qtbot.waitUntil(lambda: w.doc.compat is not None and w.doc.stats is not None and not w.doc.busy, timeout=30000)
    assert window.wait_idle(30000)
    return w.doc  # type: ignore[no-any-return]


def _cli(path: str, model_path: str | None, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """``kvscope inspect PATH --json --stats [--model M]``'s object."""
    capsys.readouterr()
    argv = ["inspect", path, "--json", "--stats", *(["--model", model_path] if model_path else [])]
    rc = core_cli.main(argv)
    out = json.loads(capsys.readouterr().out)
    assert rc == (1 if any(f["severity"] == "error" for f in out["findings"]) else 0)
    return out  # type: ignore[no-any-return]


def _shown(doc: Document) -> dict[str, Any]:
    """What the document gives its views, in inspect --json's words."""
    v, res, compat, stats = doc.verdict(), doc.result, doc.compat, doc.stats
    assert v is not None and res is not None and compat is not None and stats is not None
    out: dict[str, Any] = {
        "verdict": v.to_json(),
        "findings": [f.to_json() for f in res.findings],
        "compatibility": [c.to_json() for c in compat],
        "consumers": [a.to_json() for a in doc.consumers()],
        "reuse_prediction": [e.to_json() for e in doc.reuse_prediction()],
        "stats": stats.to_json(),
    }
    return out


@pytest.mark.parametrize(("path", "model_key"), PARAMS)
def test_document_shows_what_inspect_json_says(qtbot, window, tmp_path, capsys, path, model_key):  # type: ignore[no-untyped-def]
    if path == "truncated":
        src = STATE / "llama-f16-fa0-unified0-seq0.seqstate"
        path = tmp_path / "cut.seqstate"
        data = src.read_bytes()
        path.write_bytes(data[: len(data) * 2 // 3])
    path = str(Path(path).resolve())
    doc = _open(qtbot, window, path, _model(model_key))
    assert doc.stats_error is None and doc.compat_error is None and doc.model_error is None
    assert (doc.profile is not None) == (model_key is not None)
    shown = _shown(doc)
    full = _cli(path, _model(model_key), capsys)
    assert set(SHOWN) <= set(full)
    for key in SHOWN:
        assert shown[key] == full[key], key
    # and the whole object (a report's or an export's inspect key) is the command's
    assert doc.inspection is not None
    assert json.loads(json.dumps(doc.inspection.to_json())) == full


def test_the_compatibility_follows_the_statistics(qtbot, window, capsys) -> None:  # type: ignore[no-untyped-def]
    """The compatibility the document ends with is worked out after the statistics, as in the pipeline: the
    NaN rows they find change every generation's answer (a migration is no longer exact, the file's own
    generation loads the bad values with a note), so the table worked out beside the scan is replaced."""
    path, model_path = str(NAN_ONLY.resolve()), model("llama")
    doc = _open(qtbot, window, path, model_path)
    assert doc.compat is not None and doc.result is not None
    shown = [c.to_json() for c in doc.compat]
    capsys.readouterr()
    core_cli.main(["inspect", path, "--json", "--model", model_path, "--no-stats"])  # the table before the scan
    before = json.loads(capsys.readouterr().out)["compatibility"]
    assert shown == _cli(path, model_path, capsys)["compatibility"] and shown != before
    own = next(c for c in doc.compat if c.generation == doc.result.layout.name)
    assert own.loads is True and any("non-finite" in n for n in own.notes)
