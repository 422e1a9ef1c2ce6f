"""Each validation point of ``state_read``, hit by a corrupted copy of a real blob, fails at that
check and reports that byte offset. Expected offsets come from the reader's parse tree of the
clean file (``res.root.find(path)``, cell tables' ``record_offset``), never from arithmetic.
"""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest

from kvharness.fixtures import DATA, profile
from kvscope.core.memory import MemoryContext, ReadResult, Ubatch
from kvscope.core.reader.parse import read_state
from kvscope.core.reader.records import ParseResult
from tests.support.mem_helpers import live_context, scenarios

D = DATA / "llamacpp-2026-10-01"
VT_BLOB = D / "llama-f16-fa0-unified0-seq0.seqdata.bin"  # 3 streams, transposed V
ROW_BLOB = D / "llama-f16-fa1-unified0-seq0.seqdata.bin"  # 3 streams, V in rows
MAMBA_BLOB = D / "mamba-f32state-n3-seq0.seqdata.bin"
LFM2_BLOB = D / "lfm2-f16-fa0-unified0-seq0.seqdata.bin"


def _live(blob: Path) -> MemoryContext:
    stem = blob.name.split("-seq")[0]
    for folder, gen, key, files in scenarios():
        if folder == D and any(e["file"] == f"{stem}-ctx.state.bin" for e in files):
            return live_context(folder, gen, key, files)
    raise LookupError(stem)


def _tree(path: Path) -> ParseResult:
    return read_state(path, profile=profile(path.name.split("-")[0]))


def _off(res: ParseResult, node: str) -> int:
    n = res.root.find(node)
    assert n is not None, node
    return n.offset


def _put(data: bytes, off: int, fmt: str, value: int) -> bytes:
    b = bytearray(data)
    struct.pack_into(fmt, b, off, value)
    return bytes(b)


def _restore(blob: Path, data: bytes) -> tuple[MemoryContext, ReadResult, list[int]]:
    ctx = _live(blob)
    before = [ctx.memory.seq_pos_min(0), ctx.memory.seq_pos_max(0)]
    return ctx, ctx.seq_set_data(data, 0), before


# (name, blob, node of the corrupted field, relative byte, struct format, value, check, node of the offset)
KV_CASES = [
    ("n_stream", VT_BLOB, "/memory/kv/n_stream", 0, "<I", 2, "n_stream", "/memory/kv/n_stream"),
    ("cell_count", VT_BLOB, "/memory/kv/stream0/cell_count", 0, "<I", 100000, "cell_count_bound",
     "/memory/kv/stream0/cell_count"),
    ("n_layer", VT_BLOB, "/memory/kv/stream0/n_layer", 0, "<I", 3, "n_layer", "/memory/kv/stream0/n_layer"),
    ("v_trans", VT_BLOB, "/memory/kv/stream0/v_trans", 0, "<I", 0, "v_trans", "/memory/kv/stream0/v_trans"),
    ("k_type", VT_BLOB, "/memory/kv/stream0/K1/header", 0, "<i", 0, "k_type", "/memory/kv/stream0/K1/header"),
    ("k_row_size", VT_BLOB, "/memory/kv/stream0/K2/header", 4, "<Q", 999, "k_row_size",
     "/memory/kv/stream0/K2/header"),
    ("v_type", VT_BLOB, "/memory/kv/stream0/V3/header", 0, "<i", 0, "v_type", "/memory/kv/stream0/V3/header"),
    ("v_el_size", VT_BLOB, "/memory/kv/stream0/V1/header", 4, "<I", 4, "v_el_size", "/memory/kv/stream0/V1/header"),
    ("v_n_embd", VT_BLOB, "/memory/kv/stream0/V0/header", 8, "<I", 65, "v_n_embd", "/memory/kv/stream0/V0/header"),
    ("v_row_size", ROW_BLOB, "/memory/kv/stream0/V2/header", 4, "<Q", 64, "v_row_size",
     "/memory/kv/stream0/V2/header"),
    ("r_type", MAMBA_BLOB, "/memory/recurrent/r1/header", 0, "<i", 1, "r_type", "/memory/recurrent/r1/header"),
    ("s_row_size", MAMBA_BLOB, "/memory/recurrent/s2/header", 4, "<Q", 4, "s_row_size",
     "/memory/recurrent/s2/header"),
    ("s_trans", MAMBA_BLOB, "/memory/recurrent/s_trans", 0, "<I", 1, "s_trans", "/memory/recurrent/s_trans"),
    ("recurrent_n_layer", MAMBA_BLOB, "/memory/recurrent/n_layer", 0, "<I", 2, "n_layer",
     "/memory/recurrent/n_layer"),
]


@pytest.mark.parametrize("case", KV_CASES, ids=[c[0] for c in KV_CASES])
def test_field_corruption_fails_at_its_check(case: tuple[str, Path, str, int, str, int, str, str]) -> None:
    _, blob, node, rel, fmt, value, check, where = case
    tree = _tree(blob)
    data = _put(blob.read_bytes(), _off(tree, node) + rel, fmt, value)
    ctx, res, before = _restore(blob, data)
    assert (res.ok, res.returned, res.check, res.offset) == (False, 0, check, _off(tree, where)), res
    after = [ctx.memory.seq_pos_min(0), ctx.memory.seq_pos_max(0)]
    if check == "n_stream":  # thrown before anything changed
        assert after == before and res.actions == ["io.discard()"]
    else:  # the destination sequence is removed (llama.cpp 0c1e5709)
        assert after == [-1, -1] and before != after
    assert ctx.memory.seq_pos_max(1) >= 0  # the other sequence lives on


@pytest.mark.parametrize("blob", [VT_BLOB, MAMBA_BLOB], ids=["kv", "recurrent"])
def test_n_seq_id(blob: Path) -> None:
    tree = _tree(blob)
    sec = tree.sections[0]
    cells = sec.streams[0].cells if sec.kind == "kv" else sec.cells
    assert cells is not None
    i = cells.count - 1
    rec = cells.record_offset(i)
    data = _put(blob.read_bytes(), rec + 4, "<I", 2)
    _, res, _ = _restore(blob, data)
    assert (res.check, res.offset) == ("n_seq_id", rec), res


def test_truncated_rows_fail_where_the_read_starts() -> None:
    tree = _tree(ROW_BLOB)
    rows = tree.root.find("/memory/kv/stream0/V2/rows")
    assert rows is not None
    data = ROW_BLOB.read_bytes()[: rows.offset + rows.size // 2]
    ctx, res, _ = _restore(ROW_BLOB, data)
    assert (res.check, res.offset, res.returned) == ("truncated", rows.offset, 0), res
    assert ctx.memory.seq_pos_max(0) == -1


def test_truncated_header_and_meta() -> None:
    tree = _tree(VT_BLOB)
    v3 = _off(tree, "/memory/kv/stream0/V3/header")
    _, res, _ = _restore(VT_BLOB, VT_BLOB.read_bytes()[: v3 + 2])
    assert (res.check, res.offset) == ("truncated", v3)
    cells = tree.sections[0].streams[0].cells
    assert cells is not None
    cut = cells.record_offset(3)
    ctx, res, before = _restore(VT_BLOB, VT_BLOB.read_bytes()[:cut])
    assert (res.check, res.offset) == ("truncated", cut)
    # a short read in the cell records is an exception in llama.cpp: no cleanup, seq_rm already done
    assert ctx.memory.seq_pos_max(0) == -1 and res.actions == ["kv: seq_rm(0)", "io.discard()"]


def test_find_slot_when_the_cache_is_full() -> None:
    folder, gen, key, files = next(s for s in scenarios() if s[0] == D and s[3][0]["scenario"] == "f16-fa1-unified1")
    blob = folder / "llama-f16-fa1-unified1-seq3.seqdata.bin"
    ctx = live_context(folder, gen, key, files)
    kv = ctx.memory.kv()
    free = kv.size - kv.cells[0].used()
    start = ctx.memory.seq_pos_max(2) + 1
    kv.apply(Ubatch(list(range(start, start + free)), [[2]] * free))
    assert kv.cells[0].used() == kv.size
    tree = _tree(blob)
    res = ctx.seq_set_data(blob.read_bytes(), 0)
    assert (res.check, res.offset) == ("find_slot", _off(tree, "/memory/kv/stream0/cells")), res
    assert ctx.memory.seq_pos_max(0) == -1 and ctx.memory.seq_pos_max(3) >= 0


def test_container_checks() -> None:
    seq_file = D / "llama-f16-fa0-unified0-seq0.seqstate"
    tree = _tree(seq_file)
    data = seq_file.read_bytes()
    ctx = _live(VT_BLOB)
    for node, fmt, value, check in (("/magic", "<I", 1, "magic"), ("/version", "<I", 2, "version")):
        res = ctx.seq_load_file(None, 0, data=_put(data, _off(tree, node), fmt, value))
        assert (res.check, res.offset, res.returned) == (check, _off(tree, node), 0)
    res = ctx.seq_load_file(None, 0, n_token_capacity=2, data=data)
    assert (res.check, res.offset) == ("token_count", _off(tree, "/n_token_count"))
    assert ctx.memory.seq_pos_max(0) == 4  # all of these fail before the memory is touched
    btree = _tree(VT_BLOB)
    res = ctx.seq_set_data(_put(VT_BLOB.read_bytes(), 0, "<I", 7), 0)
    assert (res.check, res.offset) == ("io_magic", _off(btree, "/io_magic"))
    ctx_blob = D / "llama-f16-fa0-unified0-ctx.state.bin"
    ctree = _tree(ctx_blob)
    raw = ctx_blob.read_bytes()
    res = ctx.set_data(_put(raw, _off(ctree, "/arch") + 4, "<B", ord("x")))
    assert (res.check, res.offset) == ("arch", _off(ctree, "/arch"))
    assert ctx.memory.seq_pos_max(0) == 4
    cells = ctree.sections[0].streams[1].cells
    assert cells is not None
    rec = cells.record_offset(2)
    res = ctx.set_data(_put(raw, rec + 8, "<i", 7))
    assert (res.check, res.offset, res.stream) == ("seq_id_range", rec, 1)
    assert all(ctx.memory.seq_pos_max(s) == -1 for s in range(3))  # a whole-context failure empties the cache


def test_hybrid_recurrent_failure_clears_the_attention_part() -> None:
    tree = _tree(LFM2_BLOB)
    node = "/memory/recurrent/r1/header"  # record 1: model layer 2 (lfm2's recurrent layers are 0 and 2)
    data = _put(LFM2_BLOB.read_bytes(), _off(tree, node), "<i", 1)
    for policy, attn_cells in (("contained", 0), ("legacy", 5)):
        ctx = _live(LFM2_BLOB)
        res = ctx.seq_set_data(data, 0, policy=policy)
        assert (res.check, res.offset, res.section) == ("r_type", _off(tree, node), "recurrent")
        kv = ctx.memory.kv("kv_attn")
        assert int(kv.cells[0].seq[:, 0].sum()) == attn_cells, policy
        assert ctx.memory.recurrent().seq_pos_max(0) == -1


def test_random_damage_never_raises() -> None:
    rng = random.Random(7)
    pool = [s for s in scenarios() if s[0].name in ("llamacpp-2026-10-01", "llamacpp-2025-05-08")]
    for _ in range(120):
        folder, gen, key, files = rng.choice(pool)
        e = rng.choice(files)
        data = bytearray((folder / e["file"]).read_bytes())
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(data))
            if rng.random() < 0.3:
                del data[i:]
            else:
                data[i : i + 4] = rng.choice([b"\xff\xff\xff\x7f", b"\x00\x00\x00\x00", b"\x02\x00\x00\x00"])
        ctx = live_context(folder, gen, key, files)
        policy, reader = rng.choice(["contained", "legacy", "transactional"]), rng.choice(["buffer", "file"])
        if e["kind"] == "seq_blob":
            res = ctx.seq_set_data(bytes(data), e["seq_id"], e.get("flags") or 0, policy=policy, reader=reader)
        elif e["kind"] == "seq_file":
            res = ctx.seq_load_file(None, e["seq_id"], data=bytes(data), policy=policy, reader=reader)
        elif e["kind"] == "ctx_blob":
            res = ctx.set_data(bytes(data), policy=policy, reader=reader)
        else:
            res = ctx.load_file(None, data=bytes(data), policy=policy, reader=reader)
        assert res.ok or res.check is not None
        ctx.get_data()  # whatever was accepted can be written again
