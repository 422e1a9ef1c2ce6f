"""One naming of layer records (issue #29, item 4): node paths keyed by section, stream, role and index, the
same with and without the model; labels that say the model layer where it is known and the index where not;
a truncated iSWA file's present and missing records named alike."""

from __future__ import annotations

from pathlib import Path

from kvscope.core.analysis.inspection import inspect_file
from kvscope.core.analysis.verdict import missing_bytes
from kvscope.core.lab.damaged_copy import corrupt_file
from kvscope.core.model.profile import ModelProfile, load_model_profile
from kvscope.core.reader.record_names import label_of, record_label, record_labels
from kvscope.core.reader.records import ParseResult
from tests.support.gui_helpers import STATE, model

# a Gemma-2-like iSWA file: kv_base holds model layers 1 and 3, kv_swa layers 0 and 2
ISWA = STATE / "gemma2-f16-fa0-unified1-swafull0-seq0.seqstate"


def _read(path: Path, profile: ModelProfile | None) -> ParseResult:
    return inspect_file(path, profile, compat=False).result


def _records(res: ParseResult) -> dict[str, str]:
    """node path -> label of every record."""
    return {lr.node.path: label_of(res, sec, lr) for sec in res.sections for lr in sec.all_layers()
            if lr.node is not None}


def test_node_paths_are_the_same_with_and_without_the_model() -> None:
    bare = _records(_read(ISWA, None))
    with_model = _records(_read(ISWA, load_model_profile(model("gemma2"))))
    assert list(bare) == list(with_model)
    assert "/memory/kv_base/stream0/K1" in bare  # the second K record of kv_base, model layer 3


def test_labels_say_the_model_layer_with_the_model_and_the_index_without() -> None:
    bare = _records(_read(ISWA, None))
    with_model = _records(_read(ISWA, load_model_profile(model("gemma2"))))
    assert bare["/memory/kv_base/stream0/K1"] == "kv_base K #1"
    assert bare["/memory/kv_swa/stream0/V1"] == "kv_swa V #1"
    assert with_model["/memory/kv_base/stream0/K1"] == "kv_base K layer 3"
    assert with_model["/memory/kv_base/stream0/K0"] == "kv_base K layer 1"
    assert with_model["/memory/kv_swa/stream0/V1"] == "kv_swa V layer 2"


def test_a_plain_kv_cache_names_its_layers_without_a_model() -> None:
    res = _read(STATE / "llama-f16-fa0-unified0-seq0.seqstate", None)
    labels = _records(res)
    assert labels["/memory/kv/stream0/K3"] == "kv stream 0 K layer 3"  # a non-unified cache: 3 streams
    assert record_label("kv", "v", 2, 2, stream=1) == "kv stream 1 V layer 2"


def _truncated(tmp_path: Path) -> Path:
    out = tmp_path / "cut.seqstate"
    corrupt_file(ISWA, out, ["truncate:node=/memory/kv_swa/stream0/K1,at=half"])
    return out


def test_a_truncated_iswa_file_names_present_and_missing_records_alike(tmp_path: Path) -> None:
    cut = _truncated(tmp_path)
    for profile, k1, v1 in ((None, "K #1", "V #1"), (load_model_profile(model("gemma2")), "K layer 2", "V layer 2")):
        res = _read(cut, profile)
        cut_node = res.root.find("/memory/kv_swa/stream0/K1")  # cut short: no LayerRecord holds it
        assert cut_node is not None
        assert record_labels(res, profile)[id(cut_node)] == k1
        assert _records(res)["/memory/kv_swa/stream0/K0"] == "kv_swa " + k1.replace("K #1", "K #0").replace("layer 2",
                                                                                                        "layer 0")
        m = missing_bytes(res, profile)
        assert m is not None
        labels = [r.label for r in m.records]
        assert labels[0] == k1 + " (rest) in kv_swa" and labels[-1] == v1 + " in kv_swa", labels
        assert [r.name for r in m.records][0] == "stream0/K1 (rest)"  # the key stays the index


def test_inspect_json_says_no_layer_where_it_is_not_known() -> None:
    """The JSON of an iSWA file read without the model: each record's ``il`` is null (its index is not its
    layer) and ``index`` says which record it is; with the model, ``il`` is the model layer."""
    from kvscope.core.reader.render import result_to_json

    for profile, want in ((None, {"kv_base": [None, None], "kv_swa": [None, None]}),
                          (load_model_profile(model("gemma2")), {"kv_base": [1, 3], "kv_swa": [0, 2]})):
        js = result_to_json(_read(ISWA, profile), profile)
        got = {sec["role"]: [r["il"] for r in sec["streams"][0]["k_layers"]] for sec in js["memory"]}
        assert got == want
        assert [r["index"] for r in js["memory"][0]["streams"][0]["k_layers"]] == [0, 1]


def test_a_finding_names_an_iswa_record_by_its_index_without_the_model(tmp_path: Path) -> None:
    """The cut K record of kv_swa, read without the model, is ``kv_swa K #1`` in the message and ``#1`` in the
    finding's layer column, with ``layer`` null and ``index`` 1 in the JSON (it was ``K layer 1``: the plain
    cache's naming, and layer 1 is a kv_base layer); with the model it is layer 2."""
    cut = _truncated(tmp_path)
    bare = next(f for f in _read(cut, None).findings if f.code == "truncated")
    assert "kv_swa K #1" in bare.message and "K layer 1" not in bare.message, bare.message
    assert (bare.layer, bare.layer_text(), bare.to_json()["extra"]["index"]) == (None, "#1", 1)
    profile = load_model_profile(model("gemma2"))
    named = next(f for f in _read(cut, profile).findings if f.code == "truncated")
    assert (named.layer, named.layer_text()) == (2, "2")
    assert "kv_swa K layer 2" in named.message, named.message


def test_the_reports_damaged_record_is_the_cut_one_without_the_model(tmp_path: Path) -> None:
    """The report pictures the record the finding names: without the model, kv_swa's record #1 by its section
    and index (it used to look for a layer 1 among every section's records)."""
    from kvscope.core.report.collect import damaged_record

    res = _read(_truncated(tmp_path), None)
    found = damaged_record(res, None)
    assert found is not None
    sec = next(s for s in res.sections if any(r is found.record for r in s.all_layers()))
    # the cut record holds no values: its section's nearest K record stands in, and the caption says so
    assert (sec.role, found.record.role, found.record.index) == ("kv_swa", "k", 0)
    assert found.why.startswith("the damaged record kv_swa K #1: ") and "the nearest, kv_swa K #0, is shown" in \
        found.why, found.why
