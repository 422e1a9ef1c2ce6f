"""The words of issue #29 item 10, fixed in the core function that formats them (so the CLI, the app and the
report all get them): a count of 1 takes the singular (never ``record(s)``), one cell reads ``cell 3`` (not
``cells 3-3``), a usage error of the top parser is ``kvscope: MESSAGE`` (not ``kvscope: kvscope: ...``), and
without a model no rotation is said to be inferred from it."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvscope.core.analysis.overview import build_overview
from kvscope.core.analysis.stats import scan_stats
from kvscope.core.cli.main import main
from kvscope.core.reader.parse import read_state

EXAMPLES = Path(__file__).parent.parent.parent / "resources" / "examples"
SLOT, MODEL = EXAMPLES / "llama-slot.seqstate", EXAMPLES / "tiny-llama.gguf"
DROPPED = EXAMPLES / "llama-dropped-layer.seqdata.bin"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        rc = main(list(argv))
    except SystemExit as e:
        rc = int(e.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


def test_a_usage_error_has_one_kvscope_prefix(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "--bogus")
    assert (rc, err) == (2, "kvscope: unrecognized arguments: --bogus (see kvscope --help)\n")
    rc, _, err = run(capsys, "inspect", str(SLOT), "--bogus")  # said by the command's own parser
    assert (rc, err) == (2, "kvscope: inspect: unrecognized arguments: --bogus (see kvscope inspect --help)\n")
    rc, _, err = run(capsys, "no-such-command")
    assert rc == 2 and err.startswith("kvscope: argument COMMAND: invalid choice: 'no-such-command'")


def test_corrupt_says_one_record_and_one_cell(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "x.seqstate")
    rc, text, _ = run(capsys, "corrupt", str(SLOT), "--corrupt", "fill:value=nan,role=v,index=1,cells=3-3", "-o", out)
    assert rc == 0 and "filled 1 record, cell 3 with nan (128 bytes)" in text
    rc, text, _ = run(capsys, "corrupt", str(SLOT), "--corrupt", "fill:value=nan,role=v,cells=3-4", "-o", out)
    assert rc == 0 and "filled 4 records, cells 3-4 with nan (1024 bytes)" in text
    rc, text, _ = run(capsys, "corrupt", str(SLOT), "--corrupt", "drop:role=k,index=1", "-o", out)
    assert rc == 0 and "removed the K layer 1 record (1548 bytes)" in text
    rc, text, _ = run(capsys, "corrupt", str(SLOT), "--corrupt", "drop:index=1", "-o", out)
    assert rc == 0 and "removed the K layer 1, V layer 1 records (3096 bytes)" in text


def test_the_readers_counts_take_their_number(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "inspect", str(DROPPED), "--model", str(MODEL))
    assert rc == 1 and "1 K record missing (the PR #21576 pattern)" in out and "record(s)" not in out
    rc, out, _ = run(capsys, "inspect", str(SLOT))
    assert rc == 0 and "the memory state ends after 1 section exactly at the end of the file" in out
    assert "(s)" not in out


def test_one_record_of_statistics_is_one_record() -> None:
    report = scan_stats(read_state(SLOT))
    report.layers = report.layers[:1]
    assert report.to_text().splitlines()[0] == "payload statistics: 1 record"


def test_without_a_model_the_rotation_is_not_said_to_come_from_it() -> None:
    without = build_overview(read_state(SLOT)).rotation
    assert without and all("from the model" not in line for line in without)
    assert "n_rot_k 0, n_rot_v 0 (inferred from the cache types: no build rotates such rows)" in without[0]
    from kvscope.core.model.profile import load_model_profile

    profile = load_model_profile(MODEL)
    with_model = build_overview(read_state(SLOT, profile=profile), profile).rotation
    assert "(inferred from the model and cache types)" in with_model[0]
