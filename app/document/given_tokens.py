"""The tokens a state blob was made of, as the user gives them (Tools → Tokens for this blob…).

A blob (``llama_state_seq_get_data`` / ``llama_state_get_data`` output) carries no tokens, so neither Verify
nor Repair can re-prefill it from the file alone; on the command line ``--tokens IDS`` gives them, and the
app takes the same syntax (:func:`kvscope.core.verify.prefill.parse_tokens`): comma-separated ids, or
``@FILE`` holding a JSON list or an object of sequence -> list. :func:`parse_given` reads the text (an
``@FILE`` that is relative is taken beside the blob, and it must be a regular file of a bounded size, so a
FIFO cannot hang the window); :func:`tokens_problem` says why parsed tokens cannot be used for the file
(empty, outside the model's vocabulary, or what the core's :func:`~kvscope.core.verify.prefill.plan_prefill`
refuses: another sequence's, or not as many as the positions the blob spans). No widgets here.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from kvscope.core.analysis.verdict import plural
from kvscope.core.errors import UsageError
from kvscope.core.reader.state_kinds import BLOB_KINDS
from kvscope.core.textsafe import safe_text

if TYPE_CHECKING:
    from kvscope.core.model.profile import ModelProfile
    from kvscope.core.reader.records import ParseResult

GivenTokens = list[int] | dict[int, list[int]]
MAX_LINE = 200  # characters of a refusal shown (the text typed can be a long paste)
ACTION = "Tools → Tokens for this blob…"


def takes_tokens(res: ParseResult | None) -> bool:
    """A state blob with no tokens of its own: the tokens it was made of can be given."""
    return res is not None and res.kind in BLOB_KINDS and not res.tokens


def all_ids(tokens: GivenTokens) -> list[int]:
    return [t for s in sorted(tokens) for t in tokens[s]] if isinstance(tokens, dict) else list(tokens)


def count_text(tokens: GivenTokens) -> str:
    """``12 tokens``, ``14 tokens (sequence 0: 5, sequence 1: 9)``."""
    n = plural(len(all_ids(tokens)), "token")
    if isinstance(tokens, dict):
        n += " (" + ", ".join(f"sequence {s}: {len(tokens[s])}" for s in sorted(tokens)) + ")"
    return n


def to_json(tokens: GivenTokens) -> list[int] | dict[str, list[int]]:
    """What ``--tokens @FILE`` reads back as ``tokens``."""
    return {str(s): list(v) for s, v in sorted(tokens.items())} if isinstance(tokens, dict) else list(tokens)


def _line(text: str) -> str:
    text = safe_text(text)
    return text if len(text) <= MAX_LINE else text[:MAX_LINE - 1] + "…"


def parse_given(text: str, base_dir: str) -> GivenTokens:
    """The tokens ``text`` gives (``--tokens``'s syntax); ValueError with one line when it gives none."""
    from kvscope.core.verify.prefill import parse_tokens

    text = text.strip()
    if not text:
        raise ValueError("no token ids given: type comma-separated ids, or @FILE of a JSON list")
    spec = text
    if text.startswith("@"):
        name = os.path.expanduser(text[1:].strip())
        if not name:
            raise ValueError("@ needs a file: @tokens.json (a JSON list of ids, or an object of sequence -> list)")
        spec = "@" + os.path.join(base_dir, name)  # an absolute name stays as it is
    try:  # @FILE: the core's one bounded reader (a regular file of at most 64 MiB: a FIFO cannot hang the window)
        tokens = parse_tokens(spec)
    except UsageError as e:
        raise ValueError(_line(str(e).removeprefix("--tokens "))) from None
    assert tokens is not None
    if not all_ids(tokens):
        raise ValueError("no token ids given: the list is empty")
    return tokens


def tokens_problem(res: ParseResult | None, profile: ModelProfile | None, tokens: GivenTokens) -> str | None:
    """Why ``tokens`` cannot be re-prefilled for ``res`` (one line), or None when they can."""
    if res is None:
        return "the file is still being read"
    if not takes_tokens(res):
        return f"only a state blob takes tokens: this file is a {res.kind} and carries its own"
    from kvscope.core.verify.preconditions import given_tokens_problem  # the check kvscope repair/verify make

    return given_tokens_problem(res, profile, tokens)
