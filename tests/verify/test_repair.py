"""``kvscope repair``: a damaged state rebuilt from its own tokens, verified, written atomically (#17 item 4).

Real engines throughout: a damaged llama-server slot of the trained model comes back as a slot file
that llama-server restores (its verification runs ``--engine server``), a libllama sequence file and
a blob (``--tokens``) of the random-weight model come back as the same kind, layout and sequence; the
refusals are one line and exit 2, and the input is never touched.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from kvharness.fixtures import model_path
from kvharness.states import PROMPT, drop_records, kv_records, with_media_payload, write_states
from kvscope.core.cli.main import main
from kvscope.core.engine.builds import InstalledBuild
from kvscope.core.engine.server import ServerProcess
from kvscope.core.lab.corruptions import parse_spec
from kvscope.core.model.profile import load_model_profile
from kvscope.core.reader.parse import read_state
from kvscope.core.reader.seq_owner import restore_seq
from kvscope.core.verify.repair import repair
from kvscope.core.verify.run import verify
from tests.support.trained import SlotSpec, trained_model, trained_slot


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(["repair", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_a_damaged_trained_slot_comes_back_as_a_slot_llama_server_restores(
        builds: dict[str, InstalledBuild], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    slot = trained_slot(SlotSpec("b11434", "q8_0", flash_attn=True))[0]
    prof = load_model_profile(trained_model())
    bad = tmp_path / "dropped.bin"
    bad.write_bytes(parse_spec("drop:section=kv_swa,role=v,il=4").apply(slot.path.read_bytes(), prof).data)
    assert verify(bad, trained_model()).verdict == "damaged"
    before = _sha(bad)
    out = tmp_path / "repaired.bin"
    rc, text, err = _run(capsys, str(bad), "--model", str(trained_model()), "-o", str(out))
    assert rc == 0, err
    assert "verified: ok" in text and "llama-server's slot save" in text
    assert _sha(bad) == before  # the input is never modified
    got, orig = read_state(out, profile=prof), read_state(slot.path, profile=prof)
    assert (got.kind, got.layout.name, restore_seq(got)) == (orig.kind, orig.layout.name, restore_seq(orig))
    assert got.token_payload is not None and got.token_payload.get("format") == "server_tokens"
    assert list(got.tokens) == list(slot.tokens)
    again = verify(out, trained_model(), engine="server")  # llama-server itself restores the rebuilt slot
    assert again.restore is not None and again.restore.ok and again.verdict == "ok", again.reasons
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".kvscope-tmp-")]


def test_a_sequence_file_and_a_blob_keep_their_kind_layout_and_sequence(builds: dict[str, InstalledBuild],
                                                                         tmp_path: Path) -> None:
    paths = write_states("0c1e5709", tmp_path)
    k, _v = kv_records(paths["seq_file"])
    bad = drop_records(paths["seq_file"], tmp_path / "dropped.seqstate", [k[1]])
    r = repair(bad, model_path("llama"), tmp_path / "fixed.seqstate")
    assert r.writer == "llama_state_seq_save_file" and r.build == "0c1e5709" and r.verify is not None
    fixed = read_state(tmp_path / "fixed.seqstate")
    assert (fixed.kind, fixed.layout.name, list(fixed.tokens)) == ("seq_file", "2026-10", PROMPT)
    assert verify(tmp_path / "fixed.seqstate", model_path("llama")).verdict == "ok"
    blob = repair(paths["seq_blob"], model_path("llama"), tmp_path / "fixed.seqdata.bin", tokens=PROMPT)
    assert blob.writer == "llama_state_seq_get_data_ext"
    assert read_state(tmp_path / "fixed.seqdata.bin").kind == "seq_blob"
    sess = repair(paths["session"], model_path("llama"), tmp_path / "fixed.session")
    assert sess.writer == "llama_state_save_file" and read_state(tmp_path / "fixed.session").kind == "session_file"


def test_refusals_are_one_line_and_exit_2(builds: dict[str, InstalledBuild], tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    paths = write_states("b11434", tmp_path)
    model = str(model_path("llama"))
    seq = paths["seq_file"]
    link = tmp_path / "link.seqstate"
    link.symlink_to(seq)
    before = _sha(seq)
    for target in (seq, link):  # never over the input, by its name or another
        rc, _out, err = _run(capsys, str(seq), "--model", model, "-o", str(target))
        assert rc == 2 and err.count("\n") == 1 and "is the input" in err, err
    assert _sha(seq) == before
    rc, _out, err = _run(capsys, str(paths["seq_blob"]), "--model", model, "-o", str(tmp_path / "x.bin"))
    assert rc == 2 and err.count("\n") == 1 and "--tokens" in err, err
    with ServerProcess(model_path("llama"), build="b11434", n_ctx=512) as srv:
        c = srv.client()
        c.complete(PROMPT, n_predict=0)
        c.slot_save(0, "slot0.bin")
        slot = shutil.copy(Path(srv.slot_dir) / "slot0.bin", tmp_path / "slot0.bin")
    mm = with_media_payload(Path(slot), tmp_path / "mm.bin", media_at=5, media_len=4)
    rc, _out, err = _run(capsys, str(mm), "--model", model, "-o", str(tmp_path / "y.bin"))
    assert rc == 2 and err.count("\n") == 1 and "media chunk" in err, err
    assert not (tmp_path / "x.bin").exists() and not (tmp_path / "y.bin").exists()
