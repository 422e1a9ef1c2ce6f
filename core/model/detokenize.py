"""Token ids to text for the tokenizers a GGUF vocabulary can use.

A GGUF model stores its vocabulary as pieces (``tokenizer.ggml.tokens``) with a tokenizer family
(``tokenizer.ggml.model``) and per-token attributes (``tokenizer.ggml.token_type``). This module
turns pieces back into the bytes they stand for and joins them into text:

* sentencepiece (``llama`` and others): ``▁`` is a space, ``<0xNN>`` pieces are single bytes;
* ``gpt2``: byte-level BPE, each piece character is a printable stand-in for one byte;
* ``bert``: WordPiece, ``##`` continues a word, any other piece starts one after a space.

Control and user-defined tokens are shown as their piece text, whatever the tokenizer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["detokenize", "piece_bytes", "token_text"]

# llama_vocab token attributes as stored in tokenizer.ggml.token_type.
_TOKEN_TYPE_CONTROL = 3
_TOKEN_TYPE_USER_DEFINED = 4


def _gpt2_byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's ``bytes_to_unicode`` table (printable stand-ins for the 256 bytes)."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    byte_values = printable[:]
    code_points = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            byte_values.append(b)
            code_points.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(byte_values, code_points, strict=True)}


_GPT2_BYTE_DECODER = _gpt2_byte_decoder()
_SPM_SPACE = "\u2581"
_BYTE_TOKEN_RE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def piece_bytes(vocab: Sequence[str], token_types: Sequence[int], tokenizer_model: str, token_id: int) -> bytes:
    """The bytes token ``token_id`` stands for (it must be in ``vocab``)."""
    piece = vocab[token_id]
    if token_id < len(token_types) and token_types[token_id] in (
        _TOKEN_TYPE_CONTROL,
        _TOKEN_TYPE_USER_DEFINED,
    ):
        return piece.encode("utf-8")
    if tokenizer_model == "gpt2":
        decoder = _GPT2_BYTE_DECODER
        out = bytearray()
        for ch in piece:
            b = decoder.get(ch)
            if b is None:
                out += ch.encode("utf-8")
            else:
                out.append(b)
        return bytes(out)
    if tokenizer_model == "bert":
        return piece[2:].encode("utf-8") if piece.startswith("##") else b" " + piece.encode("utf-8")
    m = _BYTE_TOKEN_RE.fullmatch(piece)
    if m is not None:
        return bytes((int(m.group(1), 16),))
    return piece.replace(_SPM_SPACE, " ").encode("utf-8")


def token_text(vocab: Sequence[str], token_types: Sequence[int], tokenizer_model: str, token_id: int) -> str | None:
    """Text of one token, or None when ``token_id`` is outside the vocabulary.

    Sentencepiece ``▁`` becomes a space and GPT-2 byte-level pieces are mapped back to their
    bytes. Bytes that are not valid UTF-8 on their own (half of a multi-byte character) are
    shown escaped: a byte token keeps its ``<0xNN>`` text (also for control characters), other
    pieces get ``\\xNN``.
    """
    if not 0 <= token_id < len(vocab):
        return None
    raw = piece_bytes(vocab, token_types, tokenizer_model, token_id)
    piece = vocab[token_id]
    is_byte_token = tokenizer_model not in ("gpt2", "bert") and _BYTE_TOKEN_RE.fullmatch(piece)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return piece if is_byte_token else raw.decode("utf-8", errors="backslashreplace")
    if is_byte_token and not (text.isprintable() or text in "\t\n\r"):
        return piece
    return text


def detokenize(vocab: Sequence[str], token_types: Sequence[int], tokenizer_model: str, ids: Sequence[int]) -> str:
    """Text of a token sequence; bytes are joined before decoding, so split characters survive.

    Ids outside the vocabulary show as ``<?ID>``; invalid UTF-8 becomes U+FFFD.
    """
    out = bytearray()
    n = len(vocab)
    for tid in ids:
        tid = int(tid)
        if 0 <= tid < n:
            out += piece_bytes(vocab, token_types, tokenizer_model, tid)
        else:
            out += f"<?{tid}>".encode()
    text = out.decode("utf-8", errors="replace")
    if tokenizer_model == "bert" and text.startswith(" "):
        text = text[1:]
    return text
