"""``kvscope corrupt``: the lab's corruptions written to a damaged copy on disk, the input never touched."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvharness.fixtures import entry_model, manifest_entries, profile
from kvscope.core.cli.main import main
from kvscope.core.lab.corruptions import CATALOG, CorruptionError, parse_spec
from kvscope.core.lab.damaged_copy import CorruptCopyError, corrupt_file
from kvscope.core.model.profile import ModelProfile, load_model_profile

pytestmark = pytest.mark.slow  # kvscope corrupt in subprocesses over the catalog

ROOT = Path(__file__).resolve().parents[2]
SLOT = ROOT / "resources/examples/llama-slot.seqstate"
TINY = ROOT / "resources/examples/tiny-llama.gguf"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["corrupt", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_nan_cell_copy_is_what_inspect_calls_damaged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = _sha(SLOT)
    out = tmp_path / "slot-nan.seqstate"
    code, text, err = _run(capsys, str(SLOT), "--corrupt", "fill:value=nan,role=v,index=1,cells=3", "-o", str(out),
                           "--model", str(TINY))
    assert code == 0 and err == ""
    assert text.splitlines()[-1] == f"written: {out} (12,628 bytes)"
    assert "fill:value=nan,role=v,index=1,cells=3: filled" in text and "[input 64 byte ranges within" in text
    assert _sha(SLOT) == before
    assert main(["inspect", str(out), "--model", str(TINY), "--stats"]) == 1
    assert "damaged: V layer 1: 64 non-finite values" in capsys.readouterr().out
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~_umask()
    assert sorted(os.listdir(tmp_path)) == ["slot-nan.seqstate"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_several_corruptions_apply_in_order(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "two.seqstate"
    code, text, _ = _run(capsys, str(SLOT), "--corrupt", "drop:role=k,il=1", "--corrupt", "truncated_last_byte",
                         "-o", str(out), "--model", str(TINY))
    assert code == 0
    lines = text.splitlines()
    assert lines[0].startswith("drop:role=k,il=1: removed the K layer 1") and lines[1].startswith("truncated_last")
    data = SLOT.read_bytes()
    first = parse_spec("drop:role=k,il=1").apply(data, profile("llama")).data
    assert out.read_bytes() == CATALOG["truncated_last_byte"].apply(first, profile("llama")).data
    assert len(out.read_bytes()) == len(data) - 1548 - 1


def _state_fixtures() -> list[tuple[Path, Path]]:
    """Every 20th file of every manifest (all five builds and the generated ones), with its model."""
    return [(p, entry_model(p, e)) for p, e in manifest_entries() if not p.name.endswith(".gguf")][::20]


@pytest.mark.parametrize(("path", "model"), _state_fixtures(), ids=lambda v: v.name)
def test_the_copy_is_the_catalogs_own_mutation_for_every_entry_that_applies(path: Path, model: Path,
                                                                              tmp_path: Path) -> None:
    """The general rule on real files of every build: the copy is byte for byte what the corruption makes,
    and where the corruption does not apply, nothing is written and the one line names it."""
    data, out, applied = path.read_bytes(), tmp_path / "out.bin", 0
    before, prof = _sha(path), _profile_of(model)
    for name, c in CATALOG.items():
        try:
            want = c.apply(data, prof).data
        except CorruptionError:
            with pytest.raises(CorruptCopyError, match=name):
                corrupt_file(path, out, [name], str(model))
            assert not out.exists()
            continue
        done = corrupt_file(path, out, [name], str(model))
        assert out.read_bytes() == want and done.size == len(want), name
        out.unlink()
        applied += 1
    assert applied > 0 and _sha(path) == before


def _profile_of(model: Path) -> ModelProfile:
    return load_model_profile(str(model))


def test_the_output_never_names_the_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "slot.seqstate"
    src.write_bytes(SLOT.read_bytes())
    os.symlink(src, tmp_path / "link.seqstate")
    for target in (src, tmp_path / "link.seqstate", tmp_path / "sub" / ".." / "slot.seqstate"):
        (tmp_path / "sub").mkdir(exist_ok=True)
        code, out, err = _run(capsys, str(src), "--corrupt", "truncated_half", "-o", str(target))
        assert code == 2 and out == "" and err.count("\n") == 1 and "is the input" in err
    assert src.read_bytes() == SLOT.read_bytes()


@pytest.mark.parametrize(("argv", "says"), [
    (["{slot}", "--corrupt", "bogus", "-o", "{out}"], "unknown corruption kind 'bogus'"),
    (["{slot}", "--corrupt", "fill:value=nan,role=v,index=9", "-o", "{out}"], "no layer record matches"),
    (["{slot}", "--corrupt", "fill:value", "-o", "{out}"], "expected key=value"),
    (["{model}", "--corrupt", "truncated_half", "-o", "{out}"], "not a state file"),
    (["{tmp}/missing", "--corrupt", "truncated_half", "-o", "{out}"], "No such file or directory"),
    (["{tmp}", "--corrupt", "truncated_half", "-o", "{out}"], "is a directory"),
    (["{slot}", "--corrupt", "truncated_half", "-o", "{tmp}/no/such/folder/out"], "cannot write"),
    (["{slot}", "--corrupt", "truncated_half", "-o", "{out}", "--model", "{slot}"], "cannot use model"),
    (["{slot}", "-o", "{out}"], "the following arguments are required: --corrupt"),
    (["--corrupt", "truncated_half"], "the following arguments are required: FILE, -o/--output"),
])
def test_bad_input_is_one_line_and_exit_2_with_nothing_written(argv: list[str], says: str, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.bin"
    subst = {"slot": str(SLOT), "model": str(TINY), "out": str(out), "tmp": str(tmp_path)}
    code, text, err = _run(capsys, *(a.format(**subst) for a in argv))
    assert code == 2 and text == ""
    assert err.count("\n") == 1 and err.startswith("kvscope: ") and says in err, err
    assert os.listdir(tmp_path) == []


def test_a_fifo_is_refused_before_it_is_read(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.seqstate"
    os.mkfifo(fifo)
    r = subprocess.run([sys.executable, "-m", "kvscope.core.cli.main", "corrupt", str(fifo), "--corrupt",
                        "truncated_half", "-o", str(tmp_path / "out")], capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and r.stderr == f"kvscope: {fifo}: not a regular file\n"


@pytest.mark.parametrize("argv", [["--list"], ["--list", "nothing.bin", "--corrupt", "x"]])
def test_list_names_every_catalog_entry_with_its_spec(argv: list[str], tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """``--list`` answers as ``--help`` does, whatever else is on the line, and writes nothing."""
    code, text, _ = _run(capsys, *argv, "-o", str(tmp_path / "out"))
    assert code == 0 and os.listdir(tmp_path) == []
    lines = text.splitlines()
    assert [ln.split()[0] for ln in lines[:-1]] == list(CATALOG)
    for ln in lines[:-1]:
        name, spec = ln.split()
        c = parse_spec(spec)
        assert (c.kind, c.params) == (CATALOG[name].kind, CATALOG[name].params)
    assert lines[-1].startswith("kinds: truncate, set, fill")


_SMALL = [p for p, _ in manifest_entries() if not p.name.endswith(".gguf") and p.stat().st_size <= 64 << 10][::5]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_damaged_input_never_gets_past_one_line(data: st.DataObject, tmp_path: Path) -> None:
    """Any catalog entry or hand-written spec on a real file cut, grown or overwritten at random: a copy is
    written or the one-line refusal is raised, never another exception, and the input is never written."""
    src = data.draw(st.sampled_from(_SMALL))
    raw = bytearray(src.read_bytes())
    for _ in range(data.draw(st.integers(0, 4))):
        at = data.draw(st.integers(0, max(0, len(raw) - 1)))
        what = data.draw(st.sampled_from(["cut", "byte", "int32", "grow"]))
        if what == "cut":
            del raw[at:]
        elif what == "grow":
            raw[at:at] = bytes(data.draw(st.integers(1, 64)))
        elif raw:
            width = 1 if what == "byte" else 4
            raw[at:at + width] = data.draw(st.binary(min_size=width, max_size=width))
    case = Path(tempfile.mkdtemp(dir=tmp_path))  # one folder per example: hypothesis reuses tmp_path
    path = case / "in.bin"
    path.write_bytes(bytes(raw))
    spec = data.draw(st.one_of(st.sampled_from(list(CATALOG)), st.builds(
        lambda kind, key, value: f"{kind}:{key}={value}",
        st.sampled_from(["truncate", "set", "fill", "drop", "swap", "dup-cell", "trailer"]),
        st.sampled_from(["at", "field", "value", "role", "index", "il", "cells", "cell", "a", "b", "bytes", "section",
                         "stream", "node"]),
        st.sampled_from(["0", "1", "-1", "half", "nan", "k", "v", "cell_count", "n_layer", "type", "0-3",
                         "99999999999", "-99999999999", "0x7fffffff", "+1", "other", "kv_swa", "/memory", "x"]))))
    before = path.read_bytes()
    out = case / "out.bin"
    try:
        done = corrupt_file(path, out, [spec])
        assert done.size == len(out.read_bytes())  # (a cut at byte 0 writes an empty file)
        assert all(isinstance(line, str) and "\n" not in line for line in done.lines())
    except CorruptCopyError as e:
        assert "\n" not in str(e) and not out.exists()
    assert path.read_bytes() == before
