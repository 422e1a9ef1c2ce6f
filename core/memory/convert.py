"""Converting a loaded state to another layout generation: what it needs, and the one gap it can
fill (cell ext token ids from the file's own token list). Memories whose shape differs between the
builds (Qwen4exp's indexer rows) are carried over by :func:`kvscope.core.memory.infer.write`.

:func:`conversion_problems` lists, in words, every fact the target layout writes that the source
file does not record; an empty list means the target bytes are exactly what the target build
would have written for the same memory. :func:`fill_cell_tokens` supplies ``llama_kv_cell_ext.tok``
when a 12-byte-ext target needs it and the token list maps 1:1 onto the cells.
"""

from __future__ import annotations

import numpy as np

from kvscope.core.memory.infer import Inferred
from kvscope.core.memory.kv_cache import KvCache
from kvscope.core.memory.layout import Layout, LayoutError
from kvscope.core.reader.records import ParseResult
from kvscope.core.reader.state_kinds import FILE_KINDS, PER_SEQUENCE_KINDS, WHOLE_CONTEXT_KINDS

# the memory class whose PARTIAL_ONLY blob has the same sections as a full blob of the key
_PARTIAL_OF = {"kv": "iswa", "recurrent": "hybrid", "hybrid": "hybrid_iswa"}


def _file_tokens(inf: Inferred, res: ParseResult) -> list[int] | None:
    """The token ids of a session / sequence file (unpacked from a llama-server payload)."""
    if inf.kind not in FILE_KINDS:
        return None
    if res.token_payload is not None:
        return [int(t) for t in res.token_payload.get("tokens", [])]
    return list(inf.tokens or res.tokens)


def fill_cell_tokens(inf: Inferred, res: ParseResult) -> str | None:
    """Set ``ext.tok`` of every KV cell from the file's tokens; returns why it cannot, or None."""
    tokens = _file_tokens(inf, res)
    if tokens is None:
        return "the token id of every cell (llama_kv_cell_ext.tok): a blob carries no token list"
    mem = inf.ctx.memory
    caches = [p.mem for p in mem.parts if isinstance(p.mem, KvCache)]
    seqs = {int(s) for c in caches for cells in c.cells for s in np.flatnonzero(cells.seq.any(axis=0))}
    if len(seqs) > 1:
        return (f"the token id of every cell (llama_kv_cell_ext.tok): {len(seqs)} sequences share one token "
                "list, which does not map 1:1 onto the cells")
    for cache in caches:
        for cells in cache.cells:
            idx = np.flatnonzero(cells.pos >= 0)
            if not idx.size:
                continue
            pos = cells.pos[idx]
            if sorted(pos.tolist()) != list(range(len(tokens))) or idx.size != len(tokens):
                return (f"the token id of every cell (llama_kv_cell_ext.tok): {len(tokens)} tokens do not map 1:1 "
                        f"onto the {idx.size} cells (positions {int(pos.min())}..{int(pos.max())}) of {cache.name}")
            cells.ext[idx, 2] = np.asarray(tokens, dtype=np.int32)[pos]
    return None


def _swa_complete(inf: Inferred) -> bool:
    """Does the SWA cache hold every position of the sequence its base cache holds."""
    mem = inf.ctx.memory
    try:
        base, swa = mem.kv("kv_base"), mem.kv("kv_swa")
    except KeyError:
        return False
    s = inf.seq_id
    bpos = sorted(int(p) for c in base.cells for p in c.pos[c.seq[:, s]].tolist())
    spos = sorted(int(p) for c in swa.cells for p in c.pos[c.seq[:, s]].tolist())
    return bool(bpos) and bpos == spos


def conversion_problems(inf: Inferred, res: ParseResult, target: Layout) -> list[str]:
    """Facts ``target`` needs that the source does not record (after :func:`fill_cell_tokens`)."""
    src, mem = inf.layout, inf.ctx.memory
    spec = mem.spec
    if target.name == src.name:
        return []
    out: list[str] = []
    try:
        target.check_spec(spec, mem.n_stream)
    except LayoutError as e:
        out.append(str(e))
    per_seq = inf.kind in PER_SEQUENCE_KINDS
    has_kv = any(isinstance(p.mem, KvCache) for p in mem.parts)
    if inf.kind in WHOLE_CONTEXT_KINDS and target.ctx_outputs and inf.ctx.outputs is None:
        out.append("the n_outputs / output ids / logits / embeddings sections of the context state (builds before "
                   "PR #18862 wrote them; the source has none)")
    if per_seq and not inf.seq_id_known and (
            (inf.kind == "seq_blob" and target.blob_header) or (has_kv and target.perseq_kv_nseq == 1)):
        out.append("the source sequence id (the source layout does not record it; give --seq-id)")
    if target.empty_section_data and has_kv and not inf.headers_known:
        out.append("V transposition and the K/V record headers of an empty KV section (not in the source)")
    tgt_ext = target.ext_bytes(spec)
    if has_kv and not inf.model_given and inf.ext_bytes == 0 and target.gen.cell_ext > src.gen.cell_ext:
        out.append(f"whether the model's KV cells carry an ext (M-RoPE or PLE), which layout {target.name} writes "
                   f"and layout {src.name} does not record (give --model)")
    if tgt_ext:
        if inf.ext_bytes == 0:
            out.append("the M-RoPE 2-D positions of the cells (llama_kv_cell_ext x, y)" if spec.n_pos_per_embd > 1
                       else "the token id of every cell (llama_kv_cell_ext.tok)")
        elif inf.ext_bytes < tgt_ext:
            why = fill_cell_tokens(inf, res)
            if why:
                out.append(why)
        elif inf.ext_bytes > tgt_ext and not inf.model_given:
            out.append("whether the 12-byte cell ext is M-RoPE or PLE (only M-RoPE writes the 8-byte ext; "
                       "give --model)")
    if per_seq and spec.is_iswa:
        if target.swa_perseq_masked and not src.swa_perseq_masked and not inf.model_given:
            out.append("the model's sliding window, to drop the cells outside it as the target build does "
                       "(give --model)")
        if src.swa_perseq_masked and not target.swa_perseq_masked and not _swa_complete(inf):
            out.append("the cells outside the sliding window, which the source build did not write")
    if target.kv_rot and not src.kv_rot and has_kv and not inf.rot_known:
        out.append("the rotation block sizes (n_rot_k, n_rot_v) the target build checks in every KV section: they "
                   "follow from the model's head sizes and the cache types (give --model)")
    if target.kv_rot != src.kv_rot and spec.memory_class == "hybrid_idx" and not inf.model_given:
        out.append(f"whether the model's indexer rows change width in layout {target.name} (Qwen4exp with compression "
                   "ratios caches raw | pooled keys in b11434, raw keys before; give --model)")
    if inf.kind == "seq_blob":
        mc = spec.memory_class
        if not inf.model_given:
            whole = _PARTIAL_OF.get(mc)
            if whole in src.gen.partial_kinds and whole not in target.gen.partial_kinds:
                out.append(f"whether the blob is a PARTIAL_ONLY blob of a {whole} model, whose other parts the "
                           "target build would write (give --model)")
        elif src.partial(mc, inf.flags) and not target.partial(mc, inf.flags):
            out.append("the parts a PARTIAL_ONLY blob leaves out, which the target build writes")
    return out
