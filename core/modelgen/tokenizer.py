"""The tiny SentencePiece-style vocabulary every generated model carries.

379 tokens: ``<unk>``, ``<s>``, ``</s>``, the 256 byte tokens, ``▁``, a-z, 0-9, then every prefix
of a few words ("▁t", "▁th", "▁the", ...) scored by length so that the llama tokenizer merges
them. It is the vocabulary of ``tests/data/llamacpp-2026-10-01/tiny-llama.gguf``, which both
pinned llama.cpp builds (and llama-server) accept; ``TOKENIZER_META`` is it as GGUF metadata.
"""

from __future__ import annotations

from typing import Any

WORDS = (
    "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "world",
    "llama", "state", "file", "cache", "sequence", "token", "save", "load", "slot", "server",
)

# token type ids of llama.cpp's vocab: NORMAL = 1, UNKNOWN = 2, CONTROL = 3, BYTE = 6
_NORMAL, _UNKNOWN, _CONTROL, _BYTE = 1, 2, 3, 6


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """(tokens, scores, token types) of the vocabulary, in id order."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    scores = [0.0] * len(tokens)
    types = [_UNKNOWN, _CONTROL, _CONTROL] + [_BYTE] * 256
    singles = ["\u2581"] + [chr(c) for c in range(ord("a"), ord("z") + 1)] + [str(d) for d in range(10)]
    tokens += singles
    scores += [-1.0] * len(singles)
    types += [_NORMAL] * len(singles)
    seen = set(tokens)
    for word in WORDS:
        for i in range(1, len(word) + 1):
            piece = "\u2581" + word[:i]
            if piece not in seen:
                seen.add(piece)
                tokens.append(piece)
                scores.append(float(len(piece)))
                types.append(_NORMAL)
    return tokens, scores, types


def _meta() -> list[tuple[str, str, Any]]:
    tokens, scores, types = vocabulary()
    return [
        ("tokenizer.ggml.model", "str", "llama"),
        ("tokenizer.ggml.tokens", "arr_str", tokens),
        ("tokenizer.ggml.scores", "arr_f32", scores),
        ("tokenizer.ggml.token_type", "arr_i32", types),
        ("tokenizer.ggml.bos_token_id", "u32", 1),
        ("tokenizer.ggml.eos_token_id", "u32", 2),
        ("tokenizer.ggml.unknown_token_id", "u32", 0),
        ("tokenizer.ggml.add_bos_token", "bool", True),
        ("tokenizer.ggml.add_eos_token", "bool", False),
    ]


TOKENIZER_META: list[tuple[str, str, Any]] = _meta()
N_VOCAB = len(TOKENIZER_META[1][2])
