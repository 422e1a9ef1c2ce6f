"""Which tokens a state is re-prefilled from: the file's, or those the caller gives for a blob.

Tokens given must be the ones the state was made of, as many as the positions each sequence spans
(its last position + 1): a list of another length would rebuild a state of other tokens, which then
verifies against itself (``kvscope repair --tokens`` said ``verified: ok`` for such a rebuild). Real
blobs of the 2026-10-01 build: KV, sliding-window (partial: the window's cells only), recurrent,
and whole-context blobs of several sequences.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from kvharness.fixtures import entry_model, entry_profile, manifest_entries
from kvscope.core.reader.parse import read_state
from kvscope.core.reader.records import ParseResult
from kvscope.core.verify.prefill import plan_prefill

ENTRIES = {p.name: (p, e) for p, e in manifest_entries() if p.parent.name == "llamacpp-2026-10-01"}


def _blob(name: str) -> tuple[ParseResult, dict[int, list[int]]]:
    path, entry = ENTRIES[name]
    res = read_state(str(path), profile=entry_profile(path, entry))
    return res, {int(s): list(v["token_ids"]) for s, v in entry["seqs"].items()}


@pytest.mark.parametrize("name", [
    "llama-f16-fa0-unified0-seq1.seqdata.bin",  # KV
    "llama-f16-fa0-unified1-frag-seq1.seqdata.bin",  # KV, cells out of order
    "gemma2-f16-fa0-unified1-swafull0-seq0-partial.seqdata.bin",  # the sliding window's cells only
    "mamba-f32state-n3-seq1.seqdata.bin",  # recurrent: one cell at the last position
    "lfm2-f16-fa0-unified0-seq1-partial.seqdata.bin",  # hybrid, recurrent part only
])
def test_a_blob_takes_exactly_its_own_tokens(name: str) -> None:
    res, seqs = _blob(name)
    (seq, tokens), = seqs.items()
    assert res.kind == "seq_blob" and not res.tokens
    plan = plan_prefill(res, seq)
    assert not plan.possible and "give them with --tokens" in plan.reason
    plan = plan_prefill(res, seq, tokens)
    assert plan.possible and plan.seqs == {seq: tokens}, plan.reason
    for wrong in (tokens[:-1], [*tokens, tokens[-1]]):
        plan = plan_prefill(res, seq, wrong)
        assert not plan.possible
        assert plan.reason == (f"{len(wrong)} token(s) given, but the file spans {len(tokens)} position(s): "
                               f"give the {len(tokens)} tokens it was made of")


def test_a_per_sequence_blob_takes_the_list_for_its_sequence_from_a_mapping() -> None:
    res, seqs = _blob("llama-f16-fa0-unified0-seq1.seqdata.bin")
    tokens = seqs[1]
    assert plan_prefill(res, 1, {1: tokens, 0: [5]}).seqs == {1: tokens}
    plan = plan_prefill(res, 1, {0: tokens})  # was a KeyError (an internal error in the CLI)
    assert not plan.possible and plan.reason == 'the tokens are for sequence 0; the file is sequence 1\'s: give a ' \
        'list, or {"1": [ids]}'
    plan = plan_prefill(res, 1, {0: tokens, 2: tokens})
    assert not plan.possible and plan.reason.startswith("the tokens are for sequences 0, 2;")


def test_a_context_blob_takes_each_sequences_tokens() -> None:
    res, seqs = _blob("llama-f16-fa0-unified0-ctx.state.bin")
    assert res.kind == "context_blob" and sorted(seqs) == [0, 1, 2]
    assert plan_prefill(res, -1, seqs).seqs == seqs
    flat = [t for s in sorted(seqs) for t in seqs[s]]
    assert plan_prefill(res, -1, flat).seqs == seqs  # split by the cells, in sequence order
    plan = plan_prefill(res, -1, {0: seqs[0], 1: seqs[1]})
    assert not plan.possible and plan.reason == "no tokens given for sequence(s) [2], which the file holds"
    plan = plan_prefill(res, -1, {**seqs, 1: seqs[1][:-2]})
    assert not plan.possible and plan.reason.startswith("10 token(s) given, but the file's sequence 1 spans 12")


def test_a_files_own_tokens_are_not_held_to_the_rule() -> None:
    """A slot file whose tokens disagree with its cells is a finding of the file (verify judges what the
    restore computes), not a usage error: only tokens a caller gives must span the file's positions."""
    path = Path(ENTRIES["llama-f16-fa0-unified0-seq1.slot-emulated.seqstate"][0])
    res = read_state(str(path))
    short = dataclasses.replace(res, tokens=list(res.tokens)[:-3])  # 9 tokens, 12 cells
    plan = plan_prefill(short, 1)
    assert plan.possible and plan.seqs == {1: list(res.tokens)[:-3]}
    plan = plan_prefill(short, 1, list(res.tokens)[:-3])  # the same 9 tokens, given
    assert not plan.possible and plan.reason.startswith("9 token(s) given, but the file spans 12 position(s)")


@pytest.mark.parametrize("command", ["verify", "repair"])
def test_the_commands_refuse_tokens_that_cannot_be_the_blobs(command: str, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Before any engine starts: exit 2, one line (verify used to say 'ok: nothing to re-prefill')."""
    from kvscope.core.cli.main import main

    path, entry = ENTRIES["llama-f16-fa0-unified0-seq1.seqdata.bin"]
    extra = ["-o", str(tmp_path / "out.bin")] if command == "repair" else []
    for tokens, says in (("1,2,3", "3 token(s) given, but the file spans 12 position(s)"),
                         ('{"0": [1, 2]}', "the tokens are for sequence 0; the file is sequence 1's")):
        spec = tokens
        if tokens.startswith("{"):
            (tmp_path / "t.json").write_text(tokens)
            spec = f"@{tmp_path / 't.json'}"
        assert main([command, str(path), "--model", str(entry_model(path, entry)), "--tokens", spec, *extra]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and says in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]


@pytest.mark.parametrize(("doc", "want"), [("[1, 2, 3]", [1, 2, 3]), ('{"1": [4, 5]}', {1: [4, 5]}),
                                           ("[1.5, 2]", None), ("[true, 2]", None), ('{"1": [2.0]}', None),
                                           ('{"x": [1]}', None), ('"1,2"', None), ("[[1]]", None)])
def test_a_tokens_file_holds_whole_numbers_only(doc: str, want: object, tmp_path: Path) -> None:
    from kvscope.core.errors import UsageError
    from kvscope.core.verify.prefill import parse_tokens

    (tmp_path / "t.json").write_text(doc)
    if want is None:
        with pytest.raises(UsageError, match="expected a JSON list of token ids"):
            parse_tokens(f"@{tmp_path / 't.json'}")
    else:
        assert parse_tokens(f"@{tmp_path / 't.json'}") == want
