"""``kvscope inspect`` of a file that is not a state file: the output, one line on stderr, exit 2.

The ``--json`` branch once died after printing its JSON (``UnboundLocalError`` on ``safe_text``,
exit 1): the text branch imported the name locally, which made it local to the whole function.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kvharness.fixtures import model_path
from kvscope.core.cli.main import main


@pytest.mark.parametrize("mode", [[], ["--json"], ["--markdown"]])
@pytest.mark.parametrize("content", [b"", os.urandom(4096)], ids=["empty", "random"])
@pytest.mark.parametrize("with_model", [False, True])
def test_not_a_state_file_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path, mode: list[str],
                                 content: bytes, with_model: bool) -> None:
    f = tmp_path / "x.bin"
    f.write_bytes(content)
    model = ["--model", str(model_path("llama"))] if with_model else []
    rc = main(["inspect", str(f), *mode, *model])
    out, err = capsys.readouterr()
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("kvscope: ") and "Traceback" not in err
    if mode == ["--json"]:
        assert json.loads(out)["kind"] == "unknown"


def test_gguf_given_as_the_state(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["inspect", "--json", str(model_path("llama"))])
    _, err = capsys.readouterr()
    assert rc == 2 and err.count("\n") == 1 and err.startswith("kvscope: ")
