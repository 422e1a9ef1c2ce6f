"""A llama model of realistic shape (many layers, wide), for benchmarks: the committed ``llama``
recipe's tensor layout at other dimensions.

``realistic_llama()`` gives 12 layers of width 1024 with 16 query heads and 8 KV heads of size 64
(so a quantized cache is rotated): 512 K and 512 V values per token and layer. It is about
150 MB, too big for the repository; write it where it is needed
(``python -m kvscope.core.modelgen --realistic --out DIR``). With ``n_layer=2, n_embd=128,
n_head=2, n_head_kv=1, n_ff=256, n_ctx_train=256`` it is exactly the committed ``llama`` recipe.
"""

from __future__ import annotations

from kvscope.core.modelgen.recipes import Recipe, load_recipe
from kvscope.core.modelgen.tokenizer import N_VOCAB


def realistic_llama(
    n_layer: int = 12, n_embd: int = 1024, n_head: int = 16, n_head_kv: int = 8, n_ff: int = 1024,
    n_ctx_train: int = 131072,
) -> Recipe:
    """The llama recipe at these dimensions (head size ``n_embd // n_head``)."""
    if min(n_layer, n_embd, n_head, n_head_kv, n_ff, n_ctx_train) < 1:
        raise ValueError("every dimension must be positive")
    if n_embd % n_head or n_head % n_head_kv:
        raise ValueError(f"n_embd ({n_embd}) must divide by n_head ({n_head}), n_head by n_head_kv ({n_head_kv})")
    base = load_recipe("llama")
    hd = n_embd // n_head
    values = {
        "llama.context_length": n_ctx_train,
        "llama.embedding_length": n_embd,
        "llama.block_count": n_layer,
        "llama.feed_forward_length": n_ff,
        "llama.attention.head_count": n_head,
        "llama.attention.head_count_kv": n_head_kv,
    }
    metadata = tuple((k, t, values.get(k, v)) for k, t, v in base.metadata)
    shapes = {
        "attn_norm.weight": (n_embd,),
        "attn_q.weight": (n_embd, n_head * hd),
        "attn_k.weight": (n_embd, n_head_kv * hd),
        "attn_v.weight": (n_embd, n_head_kv * hd),
        "attn_output.weight": (n_head * hd, n_embd),
        "ffn_norm.weight": (n_embd,),
        "ffn_gate.weight": (n_embd, n_ff),
        "ffn_down.weight": (n_ff, n_embd),
        "ffn_up.weight": (n_embd, n_ff),
    }
    layer0 = [n.removeprefix("blk.0.") for n, _ in base.tensors if n.startswith("blk.0.")]
    tensors: list[tuple[str, tuple[int, ...]]] = [
        ("token_embd.weight", (n_embd, N_VOCAB)),
        ("output_norm.weight", (n_embd,)),
    ]
    for il in range(n_layer):
        tensors += [(f"blk.{il}.{name}", shapes[name]) for name in layer0]
    model = "llama" if (n_layer, n_embd, n_head, n_head_kv, n_ff) == (2, 128, 2, 1, 256) else (
        f"llama-{n_layer}x{n_embd}")
    return Recipe(model=model, architecture="llama", memory=base.memory, metadata=metadata, tensors=tuple(tensors))
