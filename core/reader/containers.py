"""File-level wrappers around a memory state: session and sequence files, blobs, context blobs.

Each ``parse_*`` reads its header fields into the tree, then hands the memory range to
``memory.parse_memory``. Token arrays are bounded by the bytes present; a llama-server slot
file's packed ``server_tokens`` payload is unpacked to the real token ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvscope.core.reader.cells import MAX_RECORDS
from kvscope.core.reader.context import ParseCtx, Stop
from kvscope.core.reader.layouts import BLOB_IO_MAGIC, SERVER_TOKENS_MARKER
from kvscope.core.reader.memory_state import PlanItem, parse_memory
from kvscope.core.reader.records import Section
from kvscope.core.reader.source import ByteSource
from kvscope.core.reader.state_kinds import FILE_KINDS, WHOLE_CONTEXT_KINDS
from kvscope.core.reader.tree import Node

MAX_ARCH_LEN = 128
SHOWN_OUTPUT_IDS = 64  # output ids kept (and reported); the rest are counted and their largest kept
MAX_TOKENS = 1 << 26  # token ids read at most (the longest known context is 10M tokens)


@dataclass
class Container:
    """What the wrapper around the memory state held."""

    header: dict[str, Any] = field(default_factory=dict)
    tokens: list[int] = field(default_factory=list)
    token_payload: dict[str, Any] | None = None
    outputs: dict[str, Any] | None = None
    sections: list[Section] = field(default_factory=list)
    memory_offset: int | None = None
    memory_end: int | None = None


def _tokens(ctx: ParseCtx, root: Node, off: int, n: int, out: Container) -> int:
    src = ctx.src
    need = 4 * n
    if need > src.remaining(off):
        raise ctx.truncated(root, f"the token array (n_token_count {n})", off, need)
    node = ctx.leaf(root, "tokens", "tokens", off, need, f"{n} tokens")
    if n > MAX_TOKENS:  # bounded allocation: a sparse file can hold 2**32 zero tokens on no disk
        ctx.find("info", "value_invalid", off, need, f"{n:,} tokens: more than kvscope reads ({MAX_TOKENS:,}); "
                 "the token ids are not shown", node)
        return off + need
    arr = src.i32_array(off, n)
    if n and int(arr[0]) == SERVER_TOKENS_MARKER:
        packed = _server_tokens(ctx, node, off, n)
        if packed is not None:
            out.token_payload = packed
            out.tokens = packed["tokens"]
            return off + need
    out.tokens = arr.tolist()  # int32 to Python ints directly (no int64 copy of a big array)
    return off + need


def _server_tokens(ctx: ParseCtx, node: Node, off: int, n: int) -> dict[str, Any] | None:
    """Unpack llama-server's ``server_tokens::serialize`` payload held in the token array."""
    src = ctx.src
    end = off + 4 * n
    version = src.u32(off + 4)
    n_tok = src.u32(off + 8)
    if version is None or n_tok is None or off + 12 + 4 * n_tok + 4 > end:
        ctx.find("warning", "value_invalid", off, 4 * n,
                 "token array starts with -1 (llama-server packed payload) but is not a valid payload; "
                 "read as a plain token list", node)
        return None
    tok_off = off + 12
    tokens = [int(x) for x in src.i32_array(tok_off, n_tok).tolist()]
    cur = tok_off + 4 * n_tok
    n_media = src.u32(cur) or 0
    if cur + 4 + 4 * n_media > end:
        ctx.find("warning", "value_invalid", cur, 4, f"packed payload: n_media {n_media} runs past the payload", node)
        return None
    media_idx = [int(x) for x in src.i32_array(cur + 4, n_media).tolist()]
    cur += 4 + 4 * n_media
    node.kind = "tokens"
    node.value = f"llama-server packed payload: {n_tok} tokens, {n_media} media"
    for name, o, size, val in (
        ("marker", off, 4, -1),
        ("payload_version", off + 4, 4, version),
        ("n_tokens", off + 8, 4, n_tok),
    ):
        ctx.leaf(node, name, "field", o, size, val)
    if n_tok:
        ctx.leaf(node, "token_ids", "tokens", tok_off, 4 * n_tok, f"{n_tok} tokens")
    ctx.leaf(node, "n_media", "field", tok_off + 4 * n_tok, 4, n_media)
    if n_media:
        ctx.leaf(node, "media_index", "field", tok_off + 4 * n_tok + 4, 4 * n_media, media_idx)
    chunks = []
    for i in range(n_media):
        ln = src.u32(cur)
        if ln is None or cur + 4 + ln > end:
            ctx.find("warning", "value_invalid", cur, end - cur,
                     f"packed payload: media chunk {i} runs past the payload", node)
            ctx.leaf(node, f"media{i}", "tokens", cur, end - cur, "bad media chunk")
            cur = end
            break
        ctx.leaf(node, f"media{i}", "tokens", cur, 4 + ln, f"media chunk, {ln} bytes")
        chunks.append({"offset": cur, "size": ln})
        cur += 4 + ln
    if cur < end:
        ctx.leaf(node, "padding", "field", cur, end - cur, "zero padding")
        if src.any_nonzero(cur, end - cur):
            ctx.find("warning", "value_invalid", cur, end - cur, "packed payload padding is not zero", node)
    return {
        "format": "server_tokens",
        "version": version,
        "n_token_count": n,
        "tokens": tokens,
        "n_media": n_media,
        "media_index": media_idx,
        "media_chunks": chunks,
    }


def _file_header(ctx: ParseCtx, root: Node, out: Container) -> int:
    magic = ctx.u32(root, "magic", 0)
    version = ctx.u32(root, "version", 4)
    n_tok = ctx.u32(root, "n_token_count", 8)
    out.header.update(magic=f"0x{magic:08x}", version=version, n_token_count=n_tok)
    return _tokens(ctx, root, 12, n_tok, out)


def _context_body(ctx: ParseCtx, root: Node, off: int, out: Container) -> tuple[int, str | None]:
    """Arch string and (older layouts) the outputs sections of a context state."""
    src = ctx.src
    ln = src.u32(off)
    if ln is None:
        raise ctx.truncated(root, "the arch string length", off, 4)
    if ln == 0 or ln > MAX_ARCH_LEN or not src.has(off + 4, ln):
        ctx.find("error", "unknown_format", off, 4, f"arch string length {ln} is implausible", root)
        raise Stop(off)
    raw = src.raw(off + 4, ln) or b""
    arch = raw.decode("ascii", errors="replace")
    node = root.add(Node("arch", "arch", off, 4 + ln, arch, ctx.status()))
    ctx.leaf(node, "length", "field", off, 4, ln)
    ctx.leaf(node, "name", "arch", off + 4, ln, arch)
    out.header["arch"] = arch
    cur = off + 4 + ln
    if ctx.gen.ctx_outputs:
        cur = _outputs(ctx, root, cur, out)
    return cur, arch


def arch_string(src: ByteSource, kind: str) -> str | None:
    """The architecture string a session file or context blob carries, read without parsing (None if none)."""
    if kind == "context_blob":
        off: int | None = 0
    elif kind == "session_file":
        n_tok = src.u32(8)
        off = 12 + 4 * n_tok if n_tok is not None else None
    else:
        return None
    ln = src.u32(off) if off is not None else None
    if off is None or ln is None or not 0 < ln <= MAX_ARCH_LEN or not src.has(off + 4, ln):
        return None
    return (src.raw(off + 4, ln) or b"").decode("ascii", errors="replace")


def _outputs(ctx: ParseCtx, root: Node, off: int, out: Container) -> int:
    src = ctx.src
    node = root.add(Node("outputs", "outputs", off, 0, None, ctx.status()))
    n_out = ctx.u32(node, "n_outputs", off)
    cur = off + 4
    if n_out > MAX_RECORDS:  # a fixed budget: llama.cpp reserves at most n_batch (<= n_ctx) outputs
        ctx.find("error", "value_invalid", off, 4, f"n_outputs {n_out:,} is implausible (more than "
                 f"{MAX_RECORDS:,})", node)
        raise Stop(cur)
    if 4 * n_out > src.remaining(cur):
        raise ctx.truncated(node, f"the output ids ({n_out})", cur, 4 * n_out)
    arr = src.i32_array(cur, n_out)
    ids = [int(x) for x in arr[:SHOWN_OUTPUT_IDS].tolist()]
    if n_out:
        ctx.leaf(node, "output_ids", "outputs", cur, 4 * n_out, ids[:16])
    cur += 4 * n_out
    info: dict[str, Any] = {"offset": off, "n_outputs": n_out, "output_ids": ids,
                            "max_output_id": int(arr.max()) if arr.size else None}
    for what in ("logits", "embd"):
        size = ctx.u64(node, f"{what}_size", cur)
        cur += 8
        if 4 * size > src.remaining(cur) and size <= 1 << 34:
            raise ctx.truncated(node, f"the {what} ({size} x f32)", cur, 4 * size)
        if 4 * size > src.remaining(cur):
            ctx.find("error", "value_invalid", cur - 8, 8, f"{what}_size {size} runs past the end of the file", node)
            raise Stop(cur)
        if size:
            ctx.leaf(node, what, "outputs", cur, 4 * size, f"{size} x f32")
        info[f"{what}_size"] = size
        info[f"{what}_offset"] = cur
        cur += 4 * size
    node.fit_to_children()
    out.outputs = info
    return cur


def parse_container(ctx: ParseCtx, root: Node, kind: str, plan: list[PlanItem] | None) -> Container:
    """Parse a whole file of ``kind``; the memory state goes to ``out.sections``."""
    out = Container()
    src = ctx.src
    try:
        cur = _file_header(ctx, root, out) if kind in FILE_KINDS else 0
        if kind == "seq_blob" and ctx.gen.blob_header:
            magic = ctx.u32(root, "io_magic", 0)
            seq = ctx.i32(root, "seq_id", 4)
            out.header.update(io_magic=f"0x{magic:08x}", seq_id=seq)
            ctx.seq_hint = seq
            if magic != BLOB_IO_MAGIC:
                ctx.find("error", "unknown_format", 0, 4, f"io_magic 0x{magic:08x}, expected 0x{BLOB_IO_MAGIC:08x}",
                         root)
            cur = 8
        if kind in WHOLE_CONTEXT_KINDS:
            cur, _ = _context_body(ctx, root, cur, out)
        out.memory_offset = cur
        sections, end = parse_memory(ctx, root, cur, src.size, plan)
        out.sections = sections
        out.memory_end = end
    except Stop as stop:
        ctx.unparsed(root, stop.offset, src.size, note="after an unrecoverable error")
    return out
