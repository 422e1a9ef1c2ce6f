"""The checks llama-server makes of a slot file's tokens when it restores it, in one place.

llama-server's slot restore (``server_context_impl::process_single_task``, ``SERVER_TASK_TYPE_SLOT_RESTORE``,
in tools/server/server-context.cpp at b11434) refuses a slot whose prompt does not fit the slot's
context ("Restored prompt does not fit in the slot context") and one holding a token its
``validate`` rejects, outside the model's vocabulary ("Invalid tokens in slot save file"). The reuse prediction
(:mod:`kvscope.core.analysis.reuse`) and the per-consumer answers (:mod:`kvscope.core.analysis.consumers`)
both ask them; a prompt of 100,000 tokens is one numpy pass here, not a Python loop per token.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

TOKEN_NULL = -1  # LLAMA_TOKEN_NULL: a media position in llama-server's token list


def token_array(tokens: Sequence[int] | npt.NDArray[np.integer]) -> npt.NDArray[np.int64]:
    """The tokens as one int64 array."""
    return np.asarray(tokens, dtype=np.int64).reshape(-1)


def first_outside_vocab(tokens: npt.NDArray[np.int64], n_vocab: int) -> int | None:
    """The first token id that is negative or not below ``n_vocab`` (the server's "Invalid tokens"), or None."""
    bad = np.flatnonzero((tokens < 0) | (tokens >= n_vocab))
    return int(tokens[bad[0]]) if bad.size else None


def holds_media(tokens: npt.NDArray[np.int64]) -> bool:
    """A ``LLAMA_TOKEN_NULL`` position: the prompt holds a media chunk."""
    return bool((tokens == TOKEN_NULL).any())
