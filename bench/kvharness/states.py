"""Real states for the verify tests: written by the pinned builds (llama-cpp-python child, llama-server),
and damaged from them through the reader's structure (never by hand-computed offsets)."""

from __future__ import annotations

import struct
from pathlib import Path

import gguf
import numpy as np

from kvharness.fixtures import model_path
from kvscope.core.engine.llamacpp import CtxParams, LlamaProcess
from kvscope.core.reader.parse import read_state
from kvscope.core.reader.records import LayerRecord

PROMPT = [1, 298, 303, 308, 311, 316, 320, 298, 324, 327, 332, 337]
OTHER = [1, 332, 337, 47, 298, 324, 327, 303, 308, 311, 316, 320]  # same length, another prefix


def write_states(build: str, out: Path, key: str = "llama", tokens: list[int] = PROMPT,
                 ctx: CtxParams | None = None, saved_tokens: list[int] | None = None,
                 model: Path | None = None) -> dict[str, Path]:
    """Decode ``tokens`` into seq 0 with ``build`` and write every kind of state file; the file APIs record
    ``saved_tokens`` (default: the decoded tokens)."""
    ctx = ctx or CtxParams(n_ctx=512, n_seq_max=1)
    saved = tokens if saved_tokens is None else saved_tokens
    out.mkdir(parents=True, exist_ok=True)
    paths = {k: out / f"{key}-{build}.{ext}" for k, ext in (("seq_file", "seqstate"), ("seq_blob", "seqdata.bin"),
                                                            ("session", "session"), ("ctx_blob", "state.bin"))}
    with LlamaProcess(model or model_path(key), ctx, build=build) as p:
        assert p.decode(0, tokens).rc == 0
        assert p.state_seq_save_file(paths["seq_file"], 0, saved).value
        paths["seq_blob"].write_bytes(p.state_seq_get_data(0))
        assert p.state_save_file(paths["session"], saved).value is True
        paths["ctx_blob"].write_bytes(p.state_get_data())
    return paths


def kv_records(path: Path, key: str = "llama") -> tuple[list[LayerRecord], list[LayerRecord]]:
    """(K records, V records) of the first KV stream holding cells."""
    from kvharness.fixtures import profile

    res = read_state(path, profile=profile(key))
    st = next(st for sec in res.sections if sec.kind == "kv" for st in sec.streams if st.k_layers)
    return st.k_layers, st.v_layers


def drop_records(src: Path, dst: Path, recs: list[LayerRecord]) -> Path:
    """``src`` without the given records (header and rows): the PR #21576 pattern, n_layer unchanged."""
    data = bytearray(src.read_bytes())
    for rec in sorted(recs, key=lambda r: -r.header_offset):
        del data[rec.header_offset : rec.data_offset + rec.data_size]
    dst.write_bytes(bytes(data))
    return dst


def model_with_permuted_embeddings(src: Path, dst: Path) -> Path:
    """The model ``src`` with its token embedding rows reversed: same shapes, other K/V for every token."""
    reader = gguf.GGUFReader(src)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(dst, arch=arch, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    datas = {t.name: (t.data[::-1].copy() if t.name == "token_embd.weight" else t.data) for t in reader.tensors}
    for t in reader.tensors:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in reader.tensors:
        writer.write_tensor_data(np.ascontiguousarray(datas[t.name]), tensor_endianess=reader.endianess)
    writer.close()
    return dst


def with_media_payload(slot_file: Path, dst: Path, media_at: int, media_len: int) -> Path:
    """A llama-server slot file whose packed token payload marks positions ``media_at .. media_at+media_len-1``
    as one media chunk (LLAMA_TOKEN_NULL ids, a chunk record): what a multimodal prompt's slot holds.
    The KV cells stay the slot's own."""
    res = read_state(slot_file)
    assert res.token_payload is not None, "not a llama-server slot file"
    toks = list(res.tokens)
    for i in range(media_at, media_at + media_len):
        toks[i] = -1
    chunk = b"kvscope-test-media-chunk"
    words = struct.pack("<iII", -1, 1, len(toks)) + struct.pack(f"<{len(toks)}i", *toks)
    words += struct.pack("<II", 1, media_at) + struct.pack("<I", len(chunk)) + chunk
    words += b"\0" * (-len(words) % 4)
    data = slot_file.read_bytes()
    n_words = struct.unpack_from("<I", data, 8)[0]
    memory = data[12 + 4 * n_words:]
    dst.write_bytes(data[:8] + struct.pack("<I", len(words) // 4) + words + memory)
    return dst
