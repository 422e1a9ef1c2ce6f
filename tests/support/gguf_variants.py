"""Variants of the tiny test models, made with gguf-py for the engine tests.

``with_metadata`` copies a GGUF with some key/value fields changed and every tensor unchanged:
tiny-llama with 2 heads instead of 4 (and 1 KV head instead of 2) has the same tensor shapes but a
head size of 64, the size at which llama.cpp rotates quantized K/V rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf


def with_metadata(src: Path, dst: Path, changes: dict[str, Any]) -> Path:
    """Copy ``src`` to ``dst`` with the scalar fields in ``changes`` set (same value types)."""
    reader = gguf.GGUFReader(src)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(dst, arch=arch, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = changes.get(field.name, field.contents())
        writer.add_key_value(field.name, value, vtype, sub_type=sub)
    for t in reader.tensors:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in reader.tensors:
        writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    writer.close()
    return dst


def llama_head64(src: Path, dst: Path) -> Path:
    """tiny-llama with head size 64 (2 heads, 1 KV head; the tensors are the same)."""
    return with_metadata(src, dst, {"llama.attention.head_count": 2, "llama.attention.head_count_kv": 1,
                                    "llama.rope.dimension_count": 64})


def qwen35_mtp(dst: Path) -> Path:
    """tiny Qwen3.5 (hybrid) with an MTP block: the committed qwen35 recipe with ``block_count`` 3 and
    ``nextn_predict_layers`` 1, block 2 a full-attention decoder block plus the NextN projections llama.cpp
    requires of it (``src/models/qwen35.cpp``: ``load_block_mtp``). Random weights from the recipe's seed."""
    from kvscope.core.modelgen.recipes import load_recipe, recipe_from_dict
    from kvscope.core.modelgen.write import write_model

    base = load_recipe("qwen35")
    meta = [[k, t, v] for k, t, v in base.metadata if k != "qwen35.block_count"]
    meta += [["qwen35.block_count", "u32", 3], ["qwen35.nextn_predict_layers", "u32", 1]]
    tensors = [[name, list(shape)] for name, shape in base.tensors]
    tensors += [[name.replace("blk.1.", "blk.2."), shape] for name, shape in tensors if name.startswith("blk.1.")]
    n_embd = int(base.meta_value("qwen35.embedding_length"))
    tensors += [["blk.2.nextn.eh_proj.weight", [2 * n_embd, n_embd]], ["blk.2.nextn.enorm.weight", [n_embd]],
                ["blk.2.nextn.hnorm.weight", [n_embd]]]
    recipe = recipe_from_dict({"model": "qwen35-mtp", "architecture": base.architecture, "memory": base.memory,
                               "metadata": meta, "tensors": tensors})
    write_model(recipe, dst)
    return dst
