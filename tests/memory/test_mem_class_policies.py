"""Failed restores of the newer memory classes under the three failure policies (docs C0-C8).

Small synthetic memories (``mem_helpers.class_spec``) with sequences 0 and 1, random payloads, and a
per-sequence blob of sequence 0 damaged in one place. What is left behind is checked against what
llama.cpp's code does (``contained``), what the builds before PR #27530 did (``legacy``) and all or
nothing (``transactional``). The real engine's answers for the same kinds of damage are compared in
test_mem_class_engine.py.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch

from kvscope.core.memory import FLAG_PARTIAL_ONLY, ContextParams, MemoryContext, ReadResult, Ubatch
from kvscope.core.memory.cells import SlotInfo
from kvscope.core.memory.io import BufferReader
from kvscope.core.memory.kv_state import read_kv
from kvscope.core.memory.layout import Layout
from kvscope.core.memory.policy import FailurePolicy
from kvscope.core.memory.result import RestoreFailure
from kvscope.core.memory.state_ctx import ReadCtx
from kvscope.core.reader.parse import read_state
from kvscope.core.reader.records import ParseResult, Section
from tests.support.mem_helpers import class_spec

POLICIES = ["contained", "legacy", "transactional"]
READERS = ["buffer", "file"]


def _ctx(memory_class: str, unified: bool = True, seed: int = 3) -> MemoryContext:
    params = ContextParams(n_seq_max=2, kv_unified=unified, flash_attn=True, type_k="q8_0", type_v="q8_0",
                           kv_size=16, kv_size_swa=16, kv_size_compressed=(4, 4, 4))
    ctx = MemoryContext.create(class_spec(memory_class), params)
    for seq, n in ((0, 5), (1, 3)):
        ctx.memory.apply(Ubatch(list(range(n)), [[seq]] * n))
    gen = torch.Generator().manual_seed(seed)
    for p in ctx.memory.parts:
        for t in p.mem.tensors():
            t.copy_(torch.randint(1, 150, t.shape, dtype=torch.uint8, generator=gen))
    return ctx


def _state(ctx: MemoryContext) -> tuple[bytes, bytes]:
    """Every tensor byte and the cell metadata, to compare before and after."""
    tensors = b"".join(t.numpy().tobytes() for p in ctx.memory.parts for t in p.mem.tensors())
    meta = ctx.memory.snapshot()
    flat = [np.asarray(x).tobytes() for m in meta for x in (m if isinstance(m, tuple) else [a for c in m for a in c])]
    return tensors, b"".join(flat)


def _parse(blob: bytes) -> ParseResult:
    res = read_state(data=blob)
    assert res.n_errors == 0, [f.message for f in res.findings if f.severity == "error"]
    return res


def _sec(res: ParseResult, role: str) -> Section:
    return next(s for s in res.sections if s.role == role)


def _put(blob: bytes, off: int, fmt: str, value: int) -> bytes:
    out = bytearray(blob)
    struct.pack_into(fmt, out, off, value)
    return bytes(out)


def _bad_k_type(blob: bytes, role: str, layer: int = -1) -> bytes:
    st = next(s for s in _sec(_parse(blob), role).streams if s.k_layers)
    return _put(blob, st.k_layers[layer].header_offset, "<i", 7)  # q5_1


def _cells_of(ctx: MemoryContext, role: str, seq: int) -> int:
    c = ctx.memory.kv(role)
    return int(sum(cells.seq[:, seq].sum() for cells in c.cells))


def _restore(ctx: MemoryContext, blob: bytes, policy: str, reader: str, flags: int = 0) -> ReadResult:
    before = _state(ctx)
    seq1 = bytes(ctx.seq_get_data(1))
    res = ctx.seq_set_data(blob, 0, flags, policy=policy, reader=reader)
    assert not res.ok and res.returned == 0 and (res.policy, res.reader) == (policy, reader)
    assert bytes(ctx.seq_get_data(1)) == seq1  # the other sequence is intact under every policy
    if policy == "transactional":
        assert _state(ctx) == before
    return res


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("policy", POLICIES)
def test_dsa_indexer_failure_undoes_the_mla_part(policy: str, reader: str) -> None:
    ctx = _ctx("dsa")
    res = _restore(ctx, _bad_k_type(bytes(ctx.seq_get_data(0)), "kv_lid"), policy, reader)
    assert (res.check, res.section, res.layer) == ("k_type", "kv_lid", 1)
    if policy == "transactional":
        assert ctx.memory.seq_pos_max(0) == 4
        return
    assert _cells_of(ctx, "kv_lid", 0) == 0
    # contained: kv_mla->state_clear(seq) after the indexer failed; before PR #27530 nothing undid it
    assert _cells_of(ctx, "kv_mla", 0) == (5 if policy == "legacy" else 0)
    assert any("DSA undo" in a for a in res.actions)


@pytest.mark.parametrize("policy", POLICIES)
def test_dsa_iswa_failures_stay_inside_their_half(policy: str) -> None:
    ctx = _ctx("dsa_iswa")
    res = _restore(ctx, _bad_k_type(bytes(ctx.seq_get_data(0)), "kv_swa"), policy, "buffer")
    assert (res.check, res.section) == ("k_type", "kv_swa")
    if policy != "transactional":  # the SWA cache fails after the DSA half was restored: it stays
        assert (_cells_of(ctx, "kv_mla", 0), _cells_of(ctx, "kv_lid", 0), _cells_of(ctx, "kv_swa", 0)) == (5, 5, 0)
    ctx = _ctx("dsa_iswa")
    res = _restore(ctx, _bad_k_type(bytes(ctx.seq_get_data(0)), "kv_lid"), policy, "buffer")
    if policy != "transactional":  # the indexer undoes its MLA cache (contained) and the SWA cache is untouched
        assert _cells_of(ctx, "kv_mla", 0) == (5 if policy == "legacy" else 0)
        assert _cells_of(ctx, "kv_swa", 0) == 5


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("where", ["kv_idx", "recurrent", "kv_attn"])
def test_hybrid_idx_drops_the_sequence_everywhere(where: str, policy: str, reader: str) -> None:
    ctx = _ctx("hybrid_idx")
    blob = bytes(ctx.seq_get_data(0))
    if where == "recurrent":
        rec = _sec(_parse(blob), "recurrent").r_layers[-1]
        blob = _put(blob, rec.header_offset, "<i", 7)
    else:
        blob = _bad_k_type(blob, where)
    res = _restore(ctx, blob, policy, reader)
    assert res.section == where
    if policy == "transactional":
        return
    mem = ctx.memory
    assert (_cells_of(ctx, "kv_attn", 0), _cells_of(ctx, "kv_idx", 0), mem.recurrent().seq_pos_max(0)) == (0, 0, -1)
    drops = [a for a in res.actions if "hybrid-idx drop" in a]
    assert drops and all("zero" not in a for a in drops) == (policy == "legacy")


def test_hybrid_idx_mirror_checks() -> None:
    ctx = _ctx("hybrid_idx")
    blob = bytes(ctx.seq_get_data(0))
    idx = _sec(_parse(blob), "kv_idx")
    st = idx.streams[0]
    # the indexer restores one cell less than the attention cache did
    short = _put(blob, st.offset, "<I", st.cell_count - 1)
    res = ctx.seq_set_data(short, 0)
    assert (res.check, res.message) == ("mirror_count", "mirrored slot layout holds 5 cells, this cache restores 4")
    assert _cells_of(ctx, "kv_attn", 0) == 0 and _cells_of(ctx, "kv_idx", 0) == 0
    # the indexer holds a cell the attention cache does not: the adopted cell is not free
    ctx = _ctx("hybrid_idx")
    ctx.memory.seq_rm(0)
    cells = ctx.memory.kv("kv_idx").cells[0]
    stray = int(np.flatnonzero(cells.pos < 0)[0])
    cells.pos[stray] = 40
    cells.seq[stray, 1] = True
    res = ctx.seq_set_data(blob, 0)
    assert (res.check, res.message) == ("mirror_busy", f"cell {stray} of the mirrored slot layout is not free")
    # an empty indexer stream where the attention cache restored cells
    ctx = _ctx("hybrid_idx")
    empty = blob[: idx.offset] + struct.pack("<II", 1, 0)
    res = ctx.seq_set_data(empty, 0)
    assert res.check == "mirror_cells" and "mirrored cache holds cells this one does not" in res.message


def test_mirror_of_the_wrong_stream_count() -> None:
    ctx = _ctx("hybrid_idx", unified=False)
    blob = bytes(ctx.state_write(0))
    idx = ctx.memory.kv("kv_idx")
    start = _sec(_parse(bytes(ctx.seq_get_data(0))), "kv_idx").offset - 8
    r = ReadCtx(BufferReader(blob, start=start), Layout.named(None), FailurePolicy(), 12, 4)
    with pytest.raises(RestoreFailure) as e:
        read_kv(idx, r, 0, mirror=[SlotInfo()])
    assert e.value.check == "mirror_streams" and e.value.thrown


@pytest.mark.parametrize("policy", POLICIES)
def test_msa_undoes_nothing_across_its_caches(policy: str) -> None:
    ctx = _ctx("msa")
    # without a model the reader cannot tell MSA's indexer from an iSWA pair's SWA cache: the second section
    res = _restore(ctx, _bad_k_type(bytes(ctx.seq_get_data(0)), "kv_swa"), policy, "buffer")
    assert res.section == "kv_idx"
    if policy != "transactional":
        assert (_cells_of(ctx, "kv_base", 0), _cells_of(ctx, "kv_idx", 0)) == (5, 0)


@pytest.mark.parametrize("policy", POLICIES)
def test_hybrid_iswa_with_an_empty_base_undoes_nothing(policy: str) -> None:
    ctx = _ctx("hybrid_iswa0")
    blob = bytes(ctx.seq_get_data(0))
    rec = _sec(_parse(blob), "recurrent").r_layers[0]
    res = _restore(ctx, _put(blob, rec.header_offset, "<i", 7), policy, "buffer")
    assert res.check == "r_type"
    if policy != "transactional":
        assert ctx.memory.kv("kv_swa").seq_pos_max(0) == 4 and ctx.memory.recurrent().seq_pos_max(0) == -1


@pytest.mark.parametrize("policy", POLICIES)
def test_dsv4_header_checks_change_nothing(policy: str) -> None:
    ctx = _ctx("dsv4")
    full = bytes(ctx.seq_get_data(0))
    partial = bytes(ctx.seq_get_data(0, FLAG_PARTIAL_ONLY))
    before = _state(ctx)
    cases = [(_put(full, 8, "<I", 7), 0, "dsv4_magic", "DSV4 state magic mismatch"),
             (_put(full, 12, "<I", 2), 0, "dsv4_version", "DSV4 state version mismatch"),
             (_put(full, 16, "<I", 2), 0, "dsv4_mode", "DSV4 state mode mismatch"),
             (partial, 0, "dsv4_flags", "DSV4 state flags mismatch"),
             (full, FLAG_PARTIAL_ONLY, "dsv4_flags", "DSV4 state flags mismatch")]
    for blob, flags, check, msg in cases:
        res = ctx.seq_set_data(blob, 0, flags, policy=policy)
        assert res.check == check and res.message.startswith(msg) and res.returned == 0
        assert _state(ctx) == before


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("policy", POLICIES)
def test_dsv4_late_failure_leaves_the_raw_cache_restored(policy: str, reader: str) -> None:
    ctx = _ctx("dsv4")
    blob = bytes(ctx.seq_get_data(0))
    comp = _sec(_parse(blob), "comp_lid")
    res = _restore(ctx, _put(blob, comp.offset + 8, "<I", 9), policy, reader)  # state_size
    assert (res.check, res.section) == ("dsv4_comp_meta", "comp_lid")
    assert res.message.startswith("DSV4 compressor state metadata mismatch")
    if policy == "transactional":
        return
    # no rollback: the raw cache holds the restored sequence, the compressed state was cleared first
    assert ctx.memory.kv("kv_raw_swa").seq_pos_max(0) == 4 and ctx.memory.kv("kv_raw_base").seq_pos_max(0) == 4
    blocks = ctx.memory.dsv4()
    kc = blocks.kcache[0][2][0]  # csa K cache, layer 2, stream 0: the blob holds its first (4 + 1) // 4 rows
    source = _ctx("dsv4").memory.dsv4().kcache[0][2][0]
    assert bool((kc[1:] == 0).all())  # cleared before the K-cache blocks were read
    # the row read is in place when tensor writes are immediate (file) or applied despite the failure (legacy)
    assert bool((kc[0] == source[0]).all()) == (reader == "file" or policy == "legacy")
    assert bool((kc[0] == 0).all()) == (reader == "buffer" and policy == "contained")
    assert bool((blocks.comp[2][2][0][0] == 0).all())  # cleared, and its block failed before any row


def test_dsv4_kcache_checks() -> None:
    ctx = _ctx("dsv4")
    blob = bytes(ctx.seq_get_data(0))
    res = _parse(blob)
    csa = _sec(res, "kcache_csa")
    cases = [(csa.offset, 3, "dsv4_kcache_version", "DSV4 K-cache state version mismatch"),
             (csa.offset, 1, "dsv4_kcache_size", "DSV4 K-cache state size mismatch"),  # version 1 needs n_rows == size
             (csa.offset + 4, 5, "dsv4_kcache_size", "DSV4 K-cache state size mismatch"),
             (csa.offset + 8, 2, "dsv4_stream_count", "DSV4 sequence state stream count mismatch"),
             (csa.offset + 12, 2, "dsv4_layer_count", "DSV4 K-cache layer count mismatch"),
             (csa.offset + 16, 3, "dsv4_layer_id", "DSV4 K-cache layer id mismatch")]
    for off, value, check, msg in cases:
        out = ctx.seq_set_data(_put(blob, off, "<I", value), 0)
        assert (out.check, out.section) == (check, "kcache_csa") and out.message.startswith(msg), (check, out)
    rec = csa.records[0].header_offset
    out = ctx.seq_set_data(_put(blob, rec + 4, "<Q", 32), 0)  # ne0
    assert out.check == "dsv4_tensor_meta" and out.message.startswith("DSV4 state tensor metadata mismatch")
    whole = bytes(ctx.get_data())
    hca = _sec(_parse(whole), "kcache_hca")
    out = ctx.set_data(_put(whole, hca.offset + 8, "<I", 1))
    assert out.check == "dsv4_stream_count" and out.message.startswith("DSV4 full state stream count mismatch")


def test_ple_row_size_is_checked() -> None:
    ctx = _ctx("hybrid_idx")
    blob = bytes(ctx.seq_get_data(0))
    rec = _sec(_parse(blob), "recurrent")
    assert rec.p_layers
    res = ctx.seq_set_data(_put(blob, rec.p_layers[0].header_offset, "<Q", 4), 0)
    assert (res.check, res.layer) == ("p_row_size", 0)
    assert res.message == "mismatched ple row size (384 != 4, layer 0)"


def test_rotation_mismatch_after_the_cell_meta() -> None:
    ctx = _ctx("dsa")
    blob = bytes(ctx.seq_get_data(0))
    lid = next(s for s in _sec(_parse(blob), "kv_lid").streams if s.data_offset is not None)
    assert lid.data_offset is not None
    for off, check, msg in ((lid.data_offset + 8, "n_rot_k", "incompatible key rotation (128 instead of 64)"),
                            (lid.data_offset + 12, "n_rot_v", "incompatible value rotation (128 instead of 0)")):
        res = ctx.seq_set_data(_put(blob, off, "<I", 128), 0)
        assert (res.check, res.offset, res.message) == (check, off, msg)
        # checked after the cells were placed: the destination sequence is gone (and the MLA part undone)
        assert ctx.memory.seq_pos_max(0) == -1
        ctx = _ctx("dsa")
    v3 = bytes(ctx.seq_get_data(0, layout="2026-10"))
    fresh = MemoryContext(ctx.memory.__class__(ctx.memory.spec, ctx.memory.params), "2026-10")
    assert fresh.seq_set_data(v3, 0).ok  # no rotation words in v3, nothing to check
