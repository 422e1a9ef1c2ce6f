"""``kvscope corrupt`` makes the damage asked for or none: a spec it does not understand is refused in one line.

Issue #31 item 8: misspelt keys hit the whole cache, ``fill:...,kv_layer=N`` filled every record, ``then_fail=k`` was
refused or hit an s record, ``byte=0x1ff`` was masked to 0xff, a swap with ``kv_layer=`` was a no-op reported as
done, a 100,000-digit value was an internal error. Each is refused now (exit 2, one line naming the spec and the
key, nothing written, the input untouched) or does what it says; the specs that worked still make the same bytes.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from kvscope.core.cli.main import main
from kvscope.core.lab.corruptions import CATALOG, MAX_TRAILER, Corruption, CorruptionError, parse_spec
from kvscope.core.lab.damaged_copy import CorruptCopyError, corrupt_file
from kvscope.core.model.profile import load_model_profile
from kvscope.core.reader.parse import read_state

ROOT = Path(__file__).resolve().parents[2]
SLOT = ROOT / "resources/examples/llama-slot.seqstate"  # 4 layers, K and V, 3 streams, 12 cells
TINY = ROOT / "resources/examples/tiny-llama.gguf"
MAMBA = ROOT / "tests/data/lab/llamacpp-2026-10-01/mamba/seq0.clean.seqdata.bin"
BIG = "9" * 100_000


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


REFUSED = [  # (spec, what the line says after "kvscope: SPEC: ")
    ("fill:value=nan,cels=3", "unknown key 'cels' for fill (did you mean cells?)"),
    ("fill:value=nan,role=v,index=1,cell=3", "unknown key 'cell' for fill (did you mean cells?)"),
    ("drop:rol=k,il=1", "unknown key 'rol' for drop (did you mean role?)"),
    ("swap:role=k,a=0,b=1,kv_layer=1", "unknown key 'kv_layer' for swap"),
    ("swap:role=k,il=1", "unknown key 'il' for swap"),
    ("trailer:bytes=4,byte=0x1ff", "byte=0x1ff: a byte is 0 to 255"),
    ("trailer:bytes=4,byte=-1", "byte=-1: a byte is 0 to 255"),
    ("trailer:bytes=0", "bytes=0: between 1 and"),
    (f"trailer:bytes={MAX_TRAILER + 1}", "between 1 and 1,073,741,824"),
    ("fill:value=nan,then_fail=x", "then_fail='x': one of k, v, r, s"),
    ("fill:value=nan,then_fail=", "then_fail= has no value"),
    ("fill:value=nan,role=v,index=9", "index=9: no layer record matches (there are 4 V records)"),
    ("fill:value=nan,index=-5", "index=-5: no layer record matches"),
    ("fill:value=nan,il=99", "il=99: no such layer among the records selected (layers 0, 1, 2, 3)"),
    ("fill:value=nan,il=-1", "il=-1: must be 0 or more"),
    ("fill:value=nan,kv_layer=7", "kv_layer=7: the model has 4 layers with a KV cache (0 to 3)"),
    ("drop:kv_layer=4", "kv_layer=4: the model has 4 layers with a KV cache"),
    ("fill:value=nan,index=0,il=1", "index= and il= both select records"),
    ("fill:value=nan,index=0,index=1", "'index' given twice"),
    ("fill:value=nan,role=q", "role='q': one of k, v, r, s, kv"),
    ("fill:value=purple", "value='purple': one of nan, inf, zeros, 0xff"),
    ("fill:value=nan,cells=0-99", "cells=0-99: outside 0..11"),
    ("fill:value=nan,cells=5-2", "cells=5-2: the last cell comes before the first"),
    ("fill:value=nan,stream=7", "stream=7: no such stream in kv (it has 3)"),
    ("fill:value=nan,section=²", "section='²': not an integer"),
    ("fill:value=nan,section=recurrent", "section='recurrent': no such section (sections: kv)"),
    ("set:field=cell_count,section=9,value=1", "section=9: no such section"),
    ("set:field=pos,cell=999,value=1", "cell=999: no such cell (the table has 12: 0 to 11)"),
    ("set:field=magic,cell=3,value=0", "cell= does not apply to field=magic (it takes no other key)"),
    ("set:field=cell_cuont,value=1", "field='cell_cuont': unknown field (did you mean cell_count?)"),
    ("set:field=pos,cell=1", "set needs value="),
    ("set:value=1", "set needs field="),
    ("set:field=type,role=k,index=0,value=q9_9", "value='q9_9': unknown ggml type"),
    ("set:field=n_seq_id,cell=0,value=0x1ffffffff", "does not fit"),
    ("set:field=pos,cell=0,value=١٢", "value='١٢': not an integer"),
    (f"set:field=cell_count,value={BIG}", "value=: a value of 100,000 characters (at most 64)"),
    (f"set:field=cell_count,value=+{BIG}", "value=: a value of 100,001 characters"),
    (f"trailer:bytes=0x{'f' * 100_000}", "bytes=: a value of 100,002 characters"),
    (f"fill:value=nan,section={BIG}", "section=: a value of 100,000 characters"),
    ("dup-cell:cell=999", "cell=999: no such cell"),
    ("dup-cell:cell=0,into=12", "into=12: no such cell"),
    ("dup-cell:cell=1,into=1", "a cell copied onto itself changes nothing"),
    ("swap:role=k,a=1,b=1", "a swap needs two records"),
    ("swap:role=k,a=3,b=-1", "a=3 and b=-1 name the same K record"),
    ("swap:role=k,a=0,b=4", "index=4: no layer record matches"),
    ("truncate:at=99999999", "at=99999999: cut offset 99999999 outside the file"),
    ("truncate:at=somewhere", "at='somewhere': not an integer"),
    ("truncate:node=/memory,section=kv", "node= and section= both say what to cut"),
    ("truncate:node=/nothing/here", "node='/nothing/here': no such node"),
    ("explode:now=1", "unknown corruption kind 'explode'"),
    (":x=1", "no corruption kind"),
    ("fill:value=nan,=3", "bad corruption parameter '=3' (expected key=value)"),
]


@pytest.mark.parametrize(("spec", "says"), REFUSED, ids=[s[:40] for s, _ in REFUSED])
def test_a_spec_that_cannot_mean_what_it_says_is_refused_in_one_line(spec: str, says: str, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    before = _sha(SLOT)
    out = tmp_path / "out.bin"
    code = main(["corrupt", str(SLOT), "--corrupt", spec, "-o", str(out), "--model", str(TINY)])
    text, err = capsys.readouterr()
    assert code == 2 and text == "", (code, text, err)
    assert err.count("\n") == 1 and err.startswith("kvscope: ") and "Traceback" not in err, err
    assert says in err, err
    assert len(err) < 2100  # a 100,000-digit value is not echoed whole
    shown = spec if len(spec) < 80 else spec[:40]
    assert err.startswith(f"kvscope: {shown}"), err  # the line names the spec first
    assert os.listdir(tmp_path) == [] and _sha(SLOT) == before


def test_unknown_keys_are_refused_when_the_corruption_is_made_in_code() -> None:
    with pytest.raises(CorruptionError, match="unknown key 'cels' for fill"):
        Corruption("fill", {"value": "nan", "cels": "3"})
    with pytest.raises(CorruptionError, match="byte=256"):
        Corruption("trailer", {"bytes": "1", "byte": "256"})


def test_chained_trailers_have_a_total_cap(tmp_path: Path) -> None:
    """Each trailer may add up to 2^30 bytes; a chain of them may not add more than that in all (before: two
    specs of 2^30 each were 2 GiB held in memory and written)."""
    out = tmp_path / "out.bin"
    with pytest.raises(CorruptCopyError, match=r"the trailers add 2,147,483,648 bytes in all: at most 1,073,741,824"):
        corrupt_file(SLOT, out, [f"trailer:bytes={MAX_TRAILER}", f"trailer:bytes={MAX_TRAILER}"])
    assert os.listdir(tmp_path) == []
    done = corrupt_file(SLOT, out, ["trailer:bytes=3", "trailer:bytes=5,byte=0"])
    assert out.read_bytes() == SLOT.read_bytes() + b"AAA" + bytes(5) and done.size == SLOT.stat().st_size + 8


def test_fill_with_kv_layer_fills_that_layer_only(tmp_path: Path) -> None:
    """Before: kv_layer= was not a selector for fill, so every record of the cache was filled."""
    prof = load_model_profile(str(TINY))
    il = prof.attn_layers[1]
    out = tmp_path / "kv1.bin"
    done = corrupt_file(SLOT, out, ["fill:value=nan,kv_layer=1"], str(TINY))
    assert out.read_bytes() == parse_spec(f"fill:value=nan,il={il}").apply(SLOT.read_bytes(), prof).data
    res = read_state(SLOT, profile=prof)
    assert "filled 2 records with nan" in done.lines()[0]
    data, clean = out.read_bytes(), SLOT.read_bytes()
    for _, r in res.layer_records():
        payload, was = data[r.data_offset:r.data_offset + r.data_size], clean[r.data_offset:r.data_offset + r.data_size]
        assert (payload != was) == (r.il == il), r


def test_then_fail_k_makes_the_last_k_record_fail(tmp_path: Path) -> None:
    """Before: then_fail=k went to the s records, so a KV cache refused it ('no V or s record')."""
    prof = load_model_profile(str(TINY))
    out = tmp_path / "k.bin"
    done = corrupt_file(SLOT, out, ["fill:value=zeros,role=v,index=0,cells=0,then_fail=k"], str(TINY))
    recs = [r for _, r in read_state(SLOT, profile=prof).layer_records()]
    last_k = max((r for r in recs if r.role == "k"), key=lambda r: r.header_offset)
    assert "then the type of the last K record (layer 3) f16 -> f32" in done.lines()[0]
    data = out.read_bytes()
    types = {(r.role, r.index): int.from_bytes(data[r.header_offset:r.header_offset + 4], "little") for r in recs}
    assert types.pop(("k", last_k.index)) == 0 and set(types.values()) == {1}  # f32 there; f16 everywhere else


def test_then_fail_v_on_a_recurrent_state_is_still_its_last_s_record() -> None:
    data = MAMBA.read_bytes()
    m = parse_spec("fill:value=0xff,then_fail=v").apply(data)
    assert m.data == CATALOG["nan_rows_late_fail_recr"].apply(data).data


VALID = ["fill:value=nan,role=v,index=1,cells=3", "fill:value=inf,role=k,index=0,cells=0-2",
         "fill:value=zeros,section=0", "fill:value=nan,il=1", "fill:value=0xff,cells=1",
         "fill:value=nan,role=v,index=-1,then_fail=v", "fill:value=nan,section=kv,role=kv,index=0", "drop:role=k,il=1",
         "drop:role=kv,index=0", "swap:role=k,a=0,b=1", "swap:a=1,b=0", "dup-cell:cell=1,into=0", "dup-cell:cell=11",
         "set:field=pos,cell=1,value=+5", "set:field=seq_id,cell=0,value=3", "set:field=type,role=k,index=0,value=q8_0",
         "set:field=row_size,role=k,index=1,value=130", "set:field=magic,value=0", "set:field=version,value=+1",
         "set:field=n_layer,value=0", "set:field=cell_count,stream=0,value=1", "set:field=n_seq_id,cell=0,value=0xff",
         "truncate:at=100", "truncate:at=-10", "truncate:section=0,at=start", "truncate:node=/memory,at=8",
         "trailer:bytes=3,byte=255", "set:field=type,kv_layer=1,role=v,value=f32", *CATALOG]


@pytest.mark.parametrize("spec", VALID)
def test_a_valid_spec_makes_the_same_copy_on_disk_as_in_memory(spec: str, tmp_path: Path) -> None:
    """The copy made in place on disk (kvscope corrupt) is byte for byte the one made in memory (the lab, the
    app), and a mutation that keeps the size changes only the bytes its line names."""
    prof = load_model_profile(str(TINY))
    data, out = SLOT.read_bytes(), tmp_path / "out.bin"
    try:
        want = parse_spec(spec).apply(data, prof)
    except CorruptionError:
        assert spec in CATALOG  # a catalog entry made for another kind of file (kv_swa, recurrent, n_stream)
        with pytest.raises(CorruptCopyError):
            corrupt_file(SLOT, out, [spec], str(TINY))
        return
    done = corrupt_file(SLOT, out, [spec], str(TINY))
    assert out.read_bytes() == want.data and done.size == len(want.data)
    assert done.mutations[0].description == want.description and done.mutations[0].ranges == want.ranges
    if len(want.data) == len(data):
        changed = [i for i in range(len(data)) if data[i] != want.data[i]]
        assert all(any(o <= i < o + n for o, n in want.ranges) for i in changed)


def test_a_chain_on_disk_is_the_chain_in_memory(tmp_path: Path) -> None:
    prof = load_model_profile(str(TINY))
    chain = ["swap:role=v,a=0,b=1", "drop:role=k,index=0", "fill:value=nan,role=v,index=0,cells=2-4",
             "dup-cell:cell=3", "trailer:bytes=7,byte=0", "set:field=pos,cell=2,value=-1", "truncate:at=-3"]
    data = SLOT.read_bytes()
    for spec in chain:
        data = parse_spec(spec).apply(data, prof).data
    out = tmp_path / "chain.bin"
    done = corrupt_file(SLOT, out, chain, str(TINY))
    assert out.read_bytes() == data and done.size == len(data) and len(done.lines()) == len(chain) + 1
