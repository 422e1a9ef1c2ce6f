"""Does a sequence file's token list agree with the cells of its memory? The one copy of the rule.

A sequence file (``llama_state_seq_save_file``, a llama-server slot) holds the tokens its writer passed
and the memory of one sequence. llama.cpp's restore does not compare the two (it places the cells at
the positions written, §5.1 of the spec), but llama-server relies on them agreeing: after a restore it
keeps the token list as the slot's prompt, and for a prompt that continues it
(``tools/server/server-context.cpp``, ``update_slots``, both pinned builds) it removes the cells from
position ``n`` (the number of tokens kept) on and decodes the new tokens from position ``n``; the batch
check (``src/llama-batch.cpp``, ``llama_batch_allocr::init``) requires the memory's last position for the
sequence to be ``n - 1`` ("inconsistent sequence positions ... Y = X + 1"), else ``llama_decode`` returns
-1 and the server answers HTTP 500 "Invalid input batch.". So a slot of text tokens must hold, in every
attention cache that keeps all positions, exactly the positions ``0..n-1`` (one cell each, in any
cell order); a sliding-window cache a consecutive run of positions ending at ``n - 1`` (the cells of
the window; all of them with ``--swa-full``); a recurrent state one cell at position ``n - 1``.

What is not checked, because llama.cpp legitimately writes it: blobs and session files (no token
list of one sequence: a session file's tokens are its application's, for any number of sequences),
a file without tokens, a slot with media chunks (its positions are not one per token), DeepSeek-V4's
compressed blocks (their raw caches are checked like any KV cache). A token list written by llama-server
(the packed ``server_tokens`` payload) that disagrees is an error; a plain list may be a libllama
application's, whose own ``llama_memory_seq_rm``/``seq_add`` leave gaps or shifts that are no damage
(the real ``frag`` fixtures: ``seq_rm(seq 0, 5, 9)``, then one more token: positions 0-4, 9-13 for 10
tokens), so there a count that differs is a warning and positions alone an info.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from kvscope.core.reader.records import CellTable, ParseResult, Section
from kvscope.core.textsafe import plural

CODE = "token_cell_mismatch"
TOKEN_NULL = -1  # LLAMA_TOKEN_NULL: a media position in llama-server's token list


@dataclass(frozen=True)
class PartCells:
    """The cells one memory part (a KV cache or a recurrent state) holds for the file's sequence."""

    section: Section
    pos: npt.NDArray[np.int64]  # sorted
    offset: int  # the first cell record, or the section's offset when it has none
    size: int  # bytes of its cell records


@dataclass
class Agreement:
    """The token list against each memory part: ``problems`` (empty: they agree), one line each."""

    n_tokens: int
    parts: list[PartCells] = field(default_factory=list)
    problems: list[tuple[PartCells, str]] = field(default_factory=list)
    server_tokens: bool = False  # the list is llama-server's packed payload

    @property
    def agrees(self) -> bool:
        return not self.problems


def _tables(sec: Section) -> list[CellTable]:
    if sec.kind == "kv":
        return [st.cells for st in sec.streams if st.cells is not None and st.cells.count]
    if sec.kind == "recurrent" and sec.cells is not None and sec.cells.count:
        return [sec.cells]
    return []


def part_cells(res: ParseResult) -> list[PartCells]:
    """Every KV cache and recurrent state of the file with its cells' positions (DeepSeek-V4's compressed
    blocks have no cells and are left out)."""
    out = []
    for sec in res.sections:
        if sec.kind not in ("kv", "recurrent"):
            continue
        tables = _tables(sec)
        pos = np.sort(np.concatenate([t.pos.astype(np.int64) for t in tables])) if tables else np.zeros(0, np.int64)
        off = tables[0].offset if tables else sec.offset
        size = (tables[-1].offset + tables[-1].size - off) if tables else 0
        out.append(PartCells(sec, pos, off, max(0, size)))
    return out


def is_swa(sec: Section) -> bool:
    """A sliding-window cache: it keeps only the window's cells (positions need not start at 0)."""
    return sec.role.endswith("_swa")


def _span(pos: npt.NDArray[np.int64]) -> str:
    if not pos.size:
        return "no cell"
    lo, hi = int(pos[0]), int(pos[-1])
    gaps = int(np.count_nonzero(np.diff(pos) != 1)) if pos.size > 1 else 0
    run = f"positions {lo}..{hi}" if lo != hi else f"position {lo}"
    return f"{plural(int(pos.size), 'cell')} at {run}" + (f" with {plural(gaps, 'break')}" if gaps else "")


def _check_part(p: PartCells, n: int, may_be_window: bool) -> str | None:
    pos = p.pos
    if p.section.kind == "recurrent":
        if pos.size == 1 and int(pos[0]) == n - 1:
            return None
        return f"the recurrent state holds {_span(pos)}, not one cell at the last token's position {n - 1}"
    if pos.size == n and bool(np.array_equal(pos, np.arange(n))):
        return None
    window = is_swa(p.section) or (may_be_window and p.section.role == "kv")
    if window and 0 < pos.size < n and int(pos[0]) == n - pos.size and bool(np.all(np.diff(pos) == 1)):
        return None  # the window's cells: a consecutive run that ends at the last token
    want = f"its window, positions ending at {n - 1}" if is_swa(p.section) else f"positions 0..{n - 1}"
    return f"{_span(pos)} for {n} tokens ({want} expected)"


def agreement(res: ParseResult, may_be_window: bool | None = None) -> Agreement | None:
    """The tokens against the cells (None where the rule does not apply: see the module docstring).
    ``may_be_window``: the one ``kv`` cache of a model may be a sliding-window one (None: not known, so it may)."""
    if res.kind != "seq_file" or not res.tokens:
        return None
    payload = res.token_payload or {}
    toks = np.asarray(res.tokens, dtype=np.int64)
    if payload.get("n_media") or bool((toks == TOKEN_NULL).any()):
        return None
    parts = part_cells(res)
    if not parts:
        return None
    n = int(toks.size)
    out = Agreement(n, parts, server_tokens=payload.get("format") == "server_tokens")
    for p in parts:
        why = _check_part(p, n, may_be_window is not False)
        if why is not None:
            out.problems.append((p, why))
    return out


def memory_pos_max_before(res: ParseResult, n: int) -> int:
    """``llama_memory_seq_pos_max`` after llama-server's ``seq_rm(slot, n, -1)``: the smallest of the parts'
    last positions below ``n`` (an iSWA cache answers with its SWA cache's, which the base cache contains; a
    hybrid memory with the smaller of its parts'), -1 where a part holds none."""
    ends = []
    for p in part_cells(res):
        below = p.pos[p.pos < n]
        ends.append(int(below[-1]) if below.size else -1)
    return min(ends) if ends else -1
