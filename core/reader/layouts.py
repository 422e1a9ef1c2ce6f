"""Layout generations of llama.cpp state (spec §8) and the candidates a reader tries.

The (magic, version) pair does not identify a layout: the same 9/2 covers four byte layouts.
A :class:`Generation` lists the features that change the bytes; the reader parses a file under
each plausible generation and scores the results (see ``parse.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cache
from typing import Any

from kvscope.core.reader.state_kinds import ALL_KINDS

SESSION_MAGIC = 0x6767736E  # 'ggsn'
SEQ_MAGIC = 0x67677371  # 'ggsq'
BLOB_IO_MAGIC = 0xAF143CD8
SERVER_TOKENS_MARKER = -1

KINDS: tuple[str, ...] = ALL_KINDS  # the kinds a reader tries (kvscope.core.reader.state_kinds)


@dataclass(frozen=True)
class Generation:
    """One byte layout of llama.cpp's state, named after the build that wrote our fixtures."""

    name: str
    title: str
    session_version: int
    seq_version: int
    n_stream: bool  # u32 n_stream prefix, per-seq KV meta n_seq_id=1 + id, n_layer = cache layers
    ctx_outputs: bool  # context state has n_outputs / output ids / logits / embeddings
    blob_header: bool  # buffer-API seq blob starts with u32 0xaf143cd8 + i32 seq_id
    cell_ext: int  # bytes of llama_kv_cell_ext per cell for models that have one (0 = never)
    partial_kinds: tuple[str, ...]  # memory classes whose PARTIAL/SWA_ONLY blobs differ from full
    swa_perseq_masked: bool  # per-seq SWA cache writes only cells inside the window
    kv_rot: bool = False  # KV data header carries u32 n_rot_k, u32 n_rot_v after v_trans, n_layer
    rot_default: bool = False  # quantized K/V with head size 64*k are stored Hadamard-rotated by default
    # a recurrent section's n_layer counts the trunk only, block_count - nextn_predict_layers (b9544: an MTP
    # model's Qwen3.5 / Qwen3-Next hybrid); before, every layer. ``recurrent_trunk_mixed``: releases of this
    # layout wrote either (b9479-b9543 the full count, b9544 on the trunk; the named build the trunk)
    recurrent_trunk: bool = False
    recurrent_trunk_mixed: bool = False

    @property
    def kv_data_header(self) -> int:
        """Bytes of a KV stream's data header: v_trans, n_layer (and n_rot_k, n_rot_v)."""
        return 16 if self.kv_rot else 8

    def to_json(self) -> dict[str, Any]:
        return dict(_json_of(self))


@cache
def _json_of(gen: Generation) -> dict[str, Any]:  # asdict() per parse attempt cost 0.1 ms
    return {f.name: getattr(gen, f.name) for f in fields(gen)}


GENERATIONS: tuple[Generation, ...] = (
    Generation(
        "2025-05",
        "pre-n_stream (llama_kv_cache_unified): per-seq meta n_seq_id=0, n_layer = all layers",
        9, 2, n_stream=False, ctx_outputs=True, blob_header=False, cell_ext=0,
        partial_kinds=(), swa_perseq_masked=False,
    ),
    Generation(
        "2025-08",
        "n_stream + per-stream sections; context state still has outputs/logits",
        9, 2, n_stream=True, ctx_outputs=True, blob_header=False, cell_ext=0,
        partial_kinds=("iswa",), swa_perseq_masked=False,
    ),
    Generation(
        "2026-04",
        "outputs removed from context state (PR #18862); 8-byte M-RoPE cell ext",
        9, 2, n_stream=True, ctx_outputs=False, blob_header=False, cell_ext=8,
        partial_kinds=("iswa", "hybrid", "hybrid_iswa"), swa_perseq_masked=False, rot_default=True,
    ),
    Generation(
        "2026-08",
        "buffer-API seq blob header 0xaf143cd8 + seq_id (PR #22679)",
        9, 2, n_stream=True, ctx_outputs=False, blob_header=True, cell_ext=8,
        partial_kinds=("iswa", "hybrid", "hybrid_iswa"), swa_perseq_masked=True, rot_default=True,
        recurrent_trunk=True, recurrent_trunk_mixed=True,
    ),
    Generation(
        "2026-10",
        "v10/v3: 12-byte cell ext (x, y, tok), read-side failure containment",
        10, 3, n_stream=True, ctx_outputs=False, blob_header=True, cell_ext=12,
        partial_kinds=("iswa", "hybrid", "hybrid_iswa"), swa_perseq_masked=True, rot_default=True,
        recurrent_trunk=True,
    ),
    Generation(
        "2026-10-v4",
        "v11/v4: n_rot_k, n_rot_v in every KV data header (llama.cpp b11434, 2026-10-06)",
        11, 4, n_stream=True, ctx_outputs=False, blob_header=True, cell_ext=12,
        partial_kinds=("iswa", "hybrid", "hybrid_iswa"), swa_perseq_masked=True, kv_rot=True, rot_default=True,
        recurrent_trunk=True,
    ),
)

GENERATION_BY_NAME: dict[str, Generation] = {g.name: g for g in GENERATIONS}

# Other names users give a generation: the format versions and the llama.cpp builds.
GENERATION_ALIASES: dict[str, str] = {
    "v3": "2026-10", "0c1e5709": "2026-10",
    "v4": "2026-10-v4", "b11434": "2026-10-v4", "2026-10-06": "2026-10-v4",
}


def generation_named(name: str) -> Generation | None:
    """The generation called ``name`` (a generation name or an alias), or None."""
    return GENERATION_BY_NAME.get(GENERATION_ALIASES.get(name, name))


def recurrent_n_layers(gen: Generation, n_layer: int, n_nextn: int) -> tuple[int, ...]:
    """The ``n_layer`` words a recurrent section of layout ``gen`` holds for a model of ``n_layer`` blocks, ``n_nextn``
    of them MTP/NextN blocks: what the layout's named build writes first, then what other releases of it wrote
    (``llama_memory_recurrent::state_write_data``: ``hparams.n_layer()`` = ``n_layer_all - n_layer_nextn`` from
    b9544, ``hparams.n_layer`` before)."""
    trunk = max(0, n_layer - n_nextn)
    if not n_nextn or not gen.recurrent_trunk:
        return (n_layer,)
    return (trunk, n_layer) if gen.recurrent_trunk_mixed else (trunk,)


def generation_rank(gen: Generation) -> int:
    """Newer generations rank higher (the tie-break between byte-identical layouts)."""
    return GENERATIONS.index(gen)


def version_word(kind: str) -> str:
    """What a file of ``kind``'s version word is called: ``session`` or ``seq``."""
    return "session" if kind == "session_file" else "seq"


def file_version(gen: Generation, kind: str) -> int:
    """The version word a file of ``kind`` carries in layout ``gen``."""
    return gen.session_version if kind == "session_file" else gen.seq_version


def newest_generation(kind: str) -> Generation:
    """The newest generation of the table for a file of ``kind``: the one with the highest version word
    (the newest of those when several share it)."""
    top = max(file_version(g, kind) for g in GENERATIONS)
    return max((g for g in GENERATIONS if file_version(g, kind) == top), key=generation_rank)


def is_newer_version(kind: str, version: int | None) -> bool:
    """``version`` is above every version word the table knows for a file of ``kind``: a llama.cpp newer
    than this kvscope wrote it (read as :func:`newest_generation` where the bytes fit)."""
    return version is not None and version > file_version(newest_generation(kind), kind)


def candidate_generations(kind: str, version: int | None, has_blob_header: bool | None) -> list[Generation]:
    """Generations worth trying for a file of ``kind`` whose header says ``version`` (a version above the
    newest known: every generation, the reader keeps the one that fits the bytes best, the newest of equals)."""
    cands = list(GENERATIONS)
    if kind == "seq_blob" and has_blob_header is not None:
        cands = [g for g in cands if g.blob_header == has_blob_header]
    if version is not None:
        attr = "session_version" if kind == "session_file" else "seq_version"
        matching = [g for g in cands if getattr(g, attr) == version]
        if matching:
            cands = matching
    return cands


def ext_choices(gen: Generation, model_has_ext: bool | None) -> list[int]:
    """Cell-extension sizes a file of ``gen`` may use: fixed by the model when one is given."""
    if gen.cell_ext == 0:
        return [0]
    if model_has_ext is None:
        return [0, gen.cell_ext]
    return [gen.cell_ext] if model_has_ext else [0]
