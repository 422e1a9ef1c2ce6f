"""Which tokens to re-prefill for a state file, into which sequences, and what can be compared.

A session or sequence file carries its tokens; a blob does not (the caller gives them). A
per-sequence file's tokens go into its sequence from position 0. A whole-context file lists one
flat token array: with one sequence it is that sequence's; with several it is split in ascending
sequence order by each sequence's cell count, when those counts add up to it (as a caller that
saved ``seq 0 tokens + seq 1 tokens`` wrote it), else the file cannot be re-prefilled.

:class:`Schedule` says how the tokens are fed to the engine: in one batch (the default), or in
chunks; a schedule that keeps the first positions of the previous prefill (``keep``) decodes only
the rest, so the calibration's schedules (``calibrate``) cost little beyond the main prefill.

A llama-server slot file of a multimodal prompt holds media chunks (``LLAMA_TOKEN_NULL``
positions in its packed token payload): they cannot be re-prefilled from the file, so only the
text before the first chunk is, and only the cells before it are compared.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from kvscope.core.analysis.slot_tokens import TOKEN_NULL
from kvscope.core.errors import UsageError
from kvscope.core.fileio import read_bounded
from kvscope.core.reader.records import CellTable, ParseResult
from kvscope.core.reader.state_kinds import BLOB_KINDS


@dataclass(frozen=True)
class Schedule:
    """How a prefill feeds ``n`` tokens: the first ``keep`` share of them taken from the previous prefill
    of the same tokens (0: from an empty sequence), the rest up to the tail in ``pieces`` chunks (one
    ``llama_decode`` call each), then the last ``tail`` tokens one at a time, as a server decodes what it
    generates."""

    name: str
    keep: float = 0.0
    pieces: int = 1
    tail: int = 0

    def chunks(self, n: int) -> list[tuple[int, int]]:
        """The ``[start, end)`` ranges decoded in order (at least one token is decoded)."""
        if n <= 0:
            return [(0, 0)]
        tail = min(max(0, self.tail), n - 1)
        cut = n - tail
        keep = max(0, min(int(n * self.keep), cut, n - 1))
        span = cut - keep
        step = -(-span // max(1, self.pieces)) if span else 1
        batches = [(a, min(a + step, cut)) for a in range(keep, cut, step)]
        return batches + [(i, i + 1) for i in range(max(cut, keep), n)]

    def start(self, n: int) -> int:
        """The first position decoded: the positions before it are the previous prefill's."""
        return self.chunks(n)[0][0]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "keep": self.keep, "pieces": self.pieces, "tail": self.tail}


WHOLE = Schedule("whole")  # the whole prompt in one batch (split into ubatches by llama.cpp)


@dataclass
class PrefillPlan:
    """The tokens to decode per sequence (from position 0) and the limits of the comparison."""

    seqs: dict[int, list[int]] = field(default_factory=dict)
    reason: str = ""  # why nothing can be re-prefilled (empty when something can)
    limit_pos: int | None = None  # compare only cells below this position (media chunks follow)
    n_media: int = 0
    next_seq: int = 0
    next_token: int | None = None  # decoded after the restore and after the prefill (None: step skipped)
    notes: list[str] = field(default_factory=list)

    @property
    def possible(self) -> bool:
        return bool(self.seqs)

    @property
    def n_tokens(self) -> int:
        return max((len(t) for t in self.seqs.values()), default=0)

    def to_json(self) -> dict[str, Any]:
        return {"possible": self.possible, "reason": self.reason or None,
                "seqs": {str(s): len(t) for s, t in self.seqs.items()}, "limit_pos": self.limit_pos,
                "n_media": self.n_media, "next_seq": self.next_seq, "next_token": self.next_token,
                "notes": list(self.notes)}


def _tables(res: ParseResult) -> list[CellTable]:
    """The cell tables of the first section (every section of a state holds the same sequences)."""
    for sec in res.sections:
        if sec.kind == "kv":
            tabs = [st.cells for st in sec.streams if st.cells is not None and st.cells.count]
            if tabs:
                return tabs
        elif sec.kind == "recurrent" and sec.cells is not None and sec.cells.count:
            return [sec.cells]
    return []


def _cells_per_seq(res: ParseResult) -> tuple[dict[int, int], bool]:
    """Tokens each sequence holds (KV: cells; recurrent: last position + 1), and whether any cell is shared."""
    out: dict[int, int] = {}
    shared = False
    rec_only = all(s.kind == "recurrent" for s in res.sections)
    for t in _tables(res):
        start = t.seq_start
        for i in range(t.count):
            ids = t.seq_ids[start[i]:start[i + 1]].tolist()
            if len(ids) > 1:
                shared = True
            for s in ids:
                n = int(t.pos[i]) + 1 if rec_only else 1
                out[int(s)] = max(out.get(int(s), 0), n) if rec_only else out.get(int(s), 0) + n
    return out, shared


def _media_cut(tokens: list[int], res: ParseResult) -> tuple[int | None, int]:
    payload = res.token_payload or {}
    n_media = int(payload.get("n_media") or 0)
    cut = next((i for i, t in enumerate(tokens) if t == TOKEN_NULL), None)
    idx = [int(i) for i in payload.get("media_index") or []]
    if idx:
        cut = min(idx) if cut is None else min(cut, min(idx))
    if cut is not None and not n_media:
        n_media = 1
    return cut, n_media


MAX_TOKENS_FILE = 64 << 20  # bytes of an @FILE of token ids (--tokens, the app's Tokens for this blob…)
TOKEN_LIMIT = 1 << 31  # a token id is a llama_token: a signed 32-bit integer
WRONG_SHAPE = "expected a JSON list of token ids or an object of sequence -> list"
_JSON_WS = b" \t\n\r"
_PIECE = 1 << 20  # bytes of a list's text checked and converted at once
_MAX_KEY = 40  # bytes of a sequence key ("12")
_SHARED_IDS = 1 << 21  # ids below this share one int object each in a long list (:class:`_SharedIds`)
# byte classes of a list's text: 0 anything else, 1 a digit 1-9, 2 the digit 0, 3 '-', 4 ',', 5 JSON white space
_CLASS = np.zeros(256, np.uint8)
_CLASS[list(b"123456789")] = 1
_CLASS[ord("0")] = 2
_CLASS[ord("-")] = 3
_CLASS[ord(",")] = 4
_CLASS[list(_JSON_WS)] = 5
_KEY = re.compile(rb'"(?:[^"\\\x00-\x1f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*"')


def parse_tokens(spec: str | None) -> list[int] | dict[int, list[int]] | None:
    """``1,2,3`` or ``@FILE`` (a JSON list, or an object of sequence -> list): the syntax of ``--tokens``
    (``kvscope verify``, ``kvscope repair``) and of the app's Tools → Tokens for this blob…; a bad one raises
    :class:`~kvscope.core.errors.UsageError` (one line).

    ``@FILE`` is read by the one bounded reader (:func:`kvscope.core.fileio.read_bounded`: a regular file of
    at most :data:`MAX_TOKENS_FILE` bytes; a FIFO or a device is refused before it is opened) and parsed
    without a general JSON parser (:func:`token_ids_json`): piece by piece, nothing nested, so memory stays
    near the ids themselves and a deeply nested file is one refusal, not a recursion error."""
    if spec is None:
        return None
    if spec.startswith("@"):
        try:
            raw = read_bounded(spec[1:], MAX_TOKENS_FILE)
        except OSError as e:
            raise UsageError(f"--tokens {spec}: {e.strerror or e}") from None
        except ValueError as e:
            raise UsageError(f"--tokens {spec}: {e}") from None
        try:
            return token_ids_json(raw)
        except ValueError as e:
            raise UsageError(f"--tokens {spec}: {e}") from None
    try:
        ids = [int(t) for t in spec.replace(" ", "").split(",") if t]
    except ValueError:
        raise UsageError(f"--tokens {spec!r}: expected comma-separated token ids") from None
    bad = next((t for t in ids if not -TOKEN_LIMIT <= t < TOKEN_LIMIT), None)
    if bad is not None:
        raise UsageError(f"--tokens: token id {bad} does not fit a 32-bit llama_token")
    return ids


def token_ids_json(doc: bytes) -> list[int] | dict[int, list[int]]:
    """The token ids of a tokens file: a JSON list of whole numbers, or an object of sequence -> such a list.

    ValueError (one line) for anything else: malformed JSON (where, as ``json`` says it), or well-formed JSON
    of another shape (a float, a string, ``true``, a list in a list...: :data:`WRONG_SHAPE`), or an id that
    is not a 32-bit token id. Nothing is parsed recursively and the text is converted in pieces."""
    i = _skip_ws(doc, 0)
    if i == len(doc):
        raise ValueError(_where("Expecting value", doc, i))
    if doc[i] == ord("["):
        ids, end = _list_at(doc, i)
        _at_end(doc, end)
        return ids
    if doc[i] != ord("{"):
        raise ValueError(WRONG_SHAPE if doc[i] in b'"-0123456789tfn' else _where("Expecting value", doc, i))
    out: dict[int, list[int]] = {}
    i = _skip_ws(doc, i + 1)
    if doc[i : i + 1] == b"}":
        _at_end(doc, i + 1)
        return out
    while True:
        m = _KEY.match(doc, i, min(len(doc), i + _MAX_KEY))
        if m is None:
            raise ValueError(WRONG_SHAPE if doc[i : i + 1] == b'"' else
                             _where("Expecting property name enclosed in double quotes", doc, i))
        try:
            seq = int(json.loads(m.group()))
        except ValueError:  # not a number ("a"), or not UTF-8
            raise ValueError(WRONG_SHAPE) from None
        i = _skip_ws(doc, m.end())
        if doc[i : i + 1] != b":":
            raise ValueError(_where("Expecting ':' delimiter", doc, i))
        i = _skip_ws(doc, i + 1)
        if doc[i : i + 1] != b"[":
            raise ValueError(WRONG_SHAPE if i < len(doc) and doc[i] in b'"-0123456789tfn{' else
                             _where("Expecting value", doc, i))
        out[seq], i = _list_at(doc, i)
        i = _skip_ws(doc, i)
        if doc[i : i + 1] == b"}":
            _at_end(doc, i + 1)
            return out
        if doc[i : i + 1] != b",":
            raise ValueError(_where("Expecting ',' delimiter", doc, i))
        i = _skip_ws(doc, i + 1)


def _skip_ws(doc: bytes, i: int) -> int:
    while i < len(doc) and doc[i] in _JSON_WS:
        i += 1
    return i


def _where(what: str, doc: bytes, i: int) -> str:
    """``json``'s way of saying where: ``Expecting value: line 1 column 7 (char 6)``."""
    line, column = doc.count(b"\n", 0, i) + 1, i - doc.rfind(b"\n", 0, i)
    return f"{what}: line {line} column {column} (char {i})"


def _at_end(doc: bytes, i: int) -> None:
    j = _skip_ws(doc, i)
    if j != len(doc):
        raise ValueError(_where("Extra data", doc, j))


def _list_at(doc: bytes, i: int) -> tuple[list[int], int]:
    """The ids of the JSON list opening at ``doc[i]`` (a ``[``) and the offset after its ``]``."""
    end = doc.find(b"]", i + 1)
    stop = len(doc) if end < 0 else end
    out: list[Any] = [None] * (doc.count(b",", i + 1, stop) + 1)  # made once: no copy as it grows
    shared = _SharedIds() if stop - i > _PIECE else None
    a, at = i + 1, 0
    while a < stop:  # pieces that end just after a comma: each holds whole ids
        b = stop if stop - a <= _PIECE else doc.rfind(b",", a, a + _PIECE) + 1
        if b <= a:  # no comma in a whole piece: a number that long is no token id
            b = stop
        ids = _ids_in(doc, a, b, last=b == stop)
        out[at : at + ids.size] = shared.objects(ids) if shared is not None else ids.tolist()
        at += ids.size
        a = b
    if end < 0:
        tail = doc[i + 1 :].rstrip(_JSON_WS)
        raise ValueError(_where("Expecting value" if tail.endswith(b",") or not tail else "Expecting ',' delimiter",
                                doc, len(doc)))
    del out[at:]  # "[]": no id, where one was made room for
    return out, end + 1


class _SharedIds:
    """One int object per distinct id below :data:`_SHARED_IDS` (a vocabulary's worth), so a long list costs
    8 bytes an id, not the 40 of an int object each: a table of the objects made so far, indexed by id."""

    def __init__(self) -> None:
        self.table = np.empty(_SHARED_IDS, dtype=object)
        self.made = np.zeros(_SHARED_IDS, bool)

    def objects(self, ids: npt.NDArray[np.int64]) -> list[int]:
        if not ids.size or int(ids.min()) < 0 or int(ids.max()) >= _SHARED_IDS:
            return list(ids.tolist())
        new = np.unique(ids[~self.made[ids]])
        if new.size:
            self.table[new] = new.tolist()
            self.made[new] = True
        return list(self.table[ids].tolist())


def _ids_in(doc: bytes, a: int, b: int, last: bool) -> npt.NDArray[np.int64]:
    """The ids in ``doc[a:b]``: whole ids each followed by a comma (the last piece: the last one by none)."""
    piece = doc[a:b]
    cls = _CLASS[np.frombuffer(piece, np.uint8)]
    bad = np.flatnonzero(cls == 0)
    if bad.size:
        at = a + int(bad[0])
        c = doc[at : at + 1]
        if c in (b"[", b"{", b'"', b"t", b"f", b"n", b".", b"e", b"E", b"+"):  # JSON, but not a whole number
            raise ValueError(WRONG_SHAPE + (" (a list in a list)" if c == b"[" else ""))
        raise ValueError(_where("Expecting ',' delimiter" if c == b"]" else "Expecting value", doc, at))
    solid = cls != 5
    k = cls[solid]  # the text without white space...
    spaced = np.zeros(cls.size, bool)
    spaced[1:] = cls[:-1] == 5
    gap = spaced[solid]  # ...and whether white space came before each of its bytes
    del spaced, cls
    n = k.size
    if n == 0:
        return np.zeros(0, np.int64)
    num, digit = k <= 3, k <= 2
    prev, cur = k[:-1], k[1:]
    empty = np.zeros(n, bool)  # where a value is missing
    empty[0] = k[0] == 4  # a comma first
    empty[1:] = ((prev == 4) & (cur == 4)) | ((prev == 3) & (cur > 2))  # two commas; '-' not before a digit
    joined = np.zeros(n, bool)  # where a comma is missing
    joined[1:] = (num[:-1] & num[1:] & gap[1:]) | ((cur == 3) & (prev <= 2))  # "1 2", "1-2"
    first = np.ones(n, bool)
    first[1:] = prev >= 3  # the first digit of a number comes after ',' or '-' (or first)
    joined[1:] |= first[:-1] & (k[:-1] == 2) & digit[1:]  # a leading zero: json reads 0, then wants a comma
    for mask, what in ((empty, "Expecting value"), (joined, "Expecting ',' delimiter")):
        if mask.any():
            raise ValueError(_where(what, doc, a + int(np.flatnonzero(solid)[int(np.argmax(mask))])))
    if k[-1] == 3 or (last and k[-1] == 4):  # '-' at the end, or a comma before ']'
        raise ValueError(_where("Expecting value", doc, b))
    ends = np.flatnonzero(k >= 3)  # the '-' and ',' around the numbers: an id of more than 10 digits does not
    longest = int(np.diff(ends, prepend=-1, append=n).max()) - 1  # fit 32 bits (and might not fit 64)
    del ends
    if longest > 10:
        raise ValueError("a token id of more than 10 digits does not fit a 32-bit llama_token")
    text = piece if last else piece.rstrip(_JSON_WS)[:-1]  # without the comma that ends a piece
    ids = np.fromstring(text, dtype=np.int64, sep=",")
    if ids.size != int(np.count_nonzero(k == 4)) + (1 if last else 0):
        raise ValueError(_where("Expecting value", doc, a))  # a safety net: the checks above leave no other way
    outside = np.flatnonzero((ids < -TOKEN_LIMIT) | (ids >= TOKEN_LIMIT))
    if outside.size:
        raise ValueError(f"token id {int(ids[outside[0]])} does not fit a 32-bit llama_token")
    return ids


def _positions_per_seq(res: ParseResult) -> tuple[dict[int, int], int | None]:
    """The positions each sequence's state spans (its last position + 1, from the first section's cells: a
    sliding-window cache and a recurrent state hold fewer cells than tokens, their last position does not
    change), and the same over every cell (a per-sequence state, whose cells may list no sequence); None
    there when the state holds no cell."""
    out: dict[int, int] = {}
    top: int | None = None
    for t in _tables(res):
        ends = t.pos[:t.count].astype(np.int64) + 1  # one numpy pass: a table can hold 100,000s of cells
        top = max(int(ends.max()), top or 0)
        counts = t.n_seq[:t.count].astype(np.int64)
        ids = t.seq_ids[:int(counts.sum())].astype(np.int64)
        owner_ends = np.repeat(ends, counts)[:ids.size]
        for sid in np.unique(ids).tolist():
            out[int(sid)] = max(out.get(int(sid), 0), int(owner_ends[ids == sid].max()))
    return out, top


def _given_mismatch(res: ParseResult, seqs: Mapping[int, Sequence[int]], per_seq: bool) -> str:
    """Why tokens the caller gave cannot be the ones the state was made of (their count is not the
    positions the state spans), or '' when they can: a state of other tokens would be rebuilt and would
    verify against itself."""
    by_seq, top = _positions_per_seq(res)
    if per_seq:
        counts = {s: top for s in seqs if top is not None}
    else:
        counts = {s: n for s, n in by_seq.items() if s in seqs}
        missing = sorted(s for s in by_seq if s not in seqs)
        if missing:
            return f"no tokens given for sequence(s) {missing}, which the file holds"
    for s, n in sorted(counts.items()):
        if len(seqs[s]) != n:
            where = "the file" if per_seq else f"the file's sequence {s}"
            return (f"{len(seqs[s])} token(s) given, but {where} spans {n} position(s): give the {n} tokens "
                    "it was made of")
    return ""


def plan_prefill(res: ParseResult, dest_seq: int, tokens: Sequence[int] | Mapping[int, Sequence[int]] | None = None,
                 next_token: int | None = None) -> PrefillPlan:
    """The plan for ``res`` (``dest_seq``: the sequence a per-sequence file goes to, -1 for a whole
    context); ``tokens`` replaces the file's (a list, or per sequence), as blobs carry none. Tokens given
    must be as many as the positions the state holds for each sequence (else ``reason`` says so)."""
    plan = PrefillPlan()
    per_seq = dest_seq >= 0
    given = tokens is not None
    if isinstance(tokens, Mapping) and per_seq:  # one sequence's state: the list given for that sequence
        lists = {int(s): list(v) for s, v in tokens.items()}
        if dest_seq not in lists:
            plan.reason = (f"the tokens are for sequence{'s' if len(lists) > 1 else ''} "
                           f"{', '.join(map(str, sorted(lists)))}; the file is sequence {dest_seq}'s: give a list, "
                           f"or {{\"{dest_seq}\": [ids]}}")
            return plan
        tokens = lists[dest_seq]
    if isinstance(tokens, Mapping):
        seqs = {int(s): [int(t) for t in v] for s, v in tokens.items()}
        flat: list[int] | None = None
    else:
        seqs = {}
        flat = [int(t) for t in (tokens if tokens is not None else res.tokens)]
    if flat is not None:
        if not flat:
            plan.reason = ("the file carries no tokens (a blob): give them with --tokens to re-prefill"
                           if res.kind in BLOB_KINDS and not given else "no tokens to re-prefill")
            return plan
        if per_seq:
            seqs = {dest_seq: flat}
        else:
            counts, shared = _cells_per_seq(res)
            if shared:
                plan.reason = "cells are shared by several sequences: a prefill cannot rebuild them"
                return plan
            if len(counts) <= 1:
                seqs = {next(iter(counts), 0): flat}
            elif sum(counts.values()) == len(flat):
                at = 0
                for s in sorted(counts):
                    seqs[s] = flat[at:at + counts[s]]
                    at += counts[s]
                plan.notes.append(f"the {len(flat)} tokens split into sequences {sorted(counts)} by their cell "
                                  f"counts {[counts[s] for s in sorted(counts)]}, in sequence order")
            else:
                plan.reason = (f"the file's {len(flat)} tokens do not split into its sequences' "
                               f"{sum(counts.values())} cells ({dict(sorted(counts.items()))}): give --tokens "
                               "per sequence")
                return plan
    if given and seqs:
        why = _given_mismatch(res, seqs, per_seq)
        if why:
            plan.reason = why
            return plan
    for s in list(seqs):
        cut, n_media = _media_cut(seqs[s], res)
        if cut is not None:
            plan.n_media = n_media
            plan.limit_pos = cut
            plan.notes.append(f"the prompt holds {n_media} media chunk(s) from position {cut}: they cannot be "
                              f"re-prefilled from the file, so only the {cut} text token(s) before them are, and only "
                              "their cells are compared")
            seqs[s] = seqs[s][:cut]
        if not seqs[s]:
            del seqs[s]
    if not seqs:
        plan.reason = plan.reason or "no text tokens before the first media chunk"
        return plan
    plan.seqs = dict(sorted(seqs.items()))
    plan.next_seq = dest_seq if per_seq else min(plan.seqs)
    if plan.limit_pos is not None:
        plan.notes.append("the next-token step is skipped: the restored sequence holds the media, the fresh one "
                          "does not")
        return plan
    plan.next_token = next_token if next_token is not None else plan.seqs[plan.next_seq][-1]
    return plan
