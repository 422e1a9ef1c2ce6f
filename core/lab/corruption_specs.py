"""The corruption specs' vocabulary and their strict check, no file needed: the kinds and the keys each takes,
the fields ``set`` knows, the value forms, :class:`CorruptionError` (a part of :mod:`kvscope.core.lab.corruptions`,
which is what the rest of kvscope imports)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping

from kvscope.core import ggml_types as gt
from kvscope.core.errors import UsageError

MAX_TRAILER = 1 << 30  # trailer:bytes= above this is a mistake, not a test; also the total of a chain's trailers
MAX_VALUE = 64  # characters of one parameter value (a 100,000-digit number is not an offset)
KINDS = ("truncate", "set", "fill", "drop", "swap", "dup-cell", "trailer")

SELECT_KEYS = ("section", "stream", "role", "index", "il", "kv_layer")  # which layer records
KEYS: dict[str, tuple[str, ...]] = {  # every key each kind takes; any other is refused
    "truncate": ("at", "node", "section"),
    "set": ("field", "value", "cell", *SELECT_KEYS),
    "fill": ("value", "cells", "then_fail", *SELECT_KEYS),
    "drop": SELECT_KEYS,
    "swap": ("a", "b", "section", "stream", "role"),
    "dup-cell": ("cell", "into", "section", "stream"),
    "trailer": ("bytes", "byte"),
}
HEADER_FIELDS = ("magic", "version", "n_token_count", "io_magic", "seq_id_header")
CELL_FIELDS = ("pos", "n_seq_id", "seq_id")
SECTION_FIELDS = ("v_trans", "s_trans", "n_layer")
RECORD_FIELDS = ("type", "row_size", "el_size", "n_embd_v_gqa")
FIELD_KEYS: dict[str, tuple[str, ...]] = {  # set: the keys besides field= and value= each field takes
    **{f: () for f in HEADER_FIELDS},
    "n_stream": ("section",),
    "cell_count": ("section", "stream"),
    **{f: ("section", "stream", "cell") for f in CELL_FIELDS},
    **{f: ("section", "stream") for f in SECTION_FIELDS},
    **{f: SELECT_KEYS for f in RECORD_FIELDS},
}
ROLES = ("k", "v", "r", "s", "kv")
FILL_VALUES = ("nan", "inf", "zeros", "zero", "0", "0xff", "ff")
AT_WORDS = ("half", "middle", "start", "end")
_INT = re.compile(r"[+-]?(?:0[xX][0-9a-fA-F]+|0[oO][0-7]+|0[bB][01]+|[0-9]+)", re.ASCII)
_RELATIVE = re.compile(r"[+-][0-9]+", re.ASCII)


class CorruptionError(UsageError, ValueError):
    """The mutation does not apply to this state (no such section, layer, cell...), or the spec is malformed."""



def _show(text: str) -> str:
    """``text`` quoted for a message, cut when long (a spec can be as long as a command line allows)."""
    return repr(text if len(text) <= MAX_VALUE else text[:MAX_VALUE] + "…")



# ---------------------------------------------------------------------------------------------
# the strict parameter check (no file needed)


def _int(key: str, value: str) -> int:
    """An integer (decimal, 0x, 0o, 0b; ASCII digits only) of at most :data:`MAX_VALUE` characters."""
    if len(value) > MAX_VALUE:
        raise CorruptionError(f"{key}=: a value of {len(value):,} characters (at most {MAX_VALUE})")
    if _INT.fullmatch(value):
        try:
            return int(value, 0)
        except ValueError:
            pass  # 010: a leading zero
    raise CorruptionError(f"{key}={_show(value)}: not an integer")


def _at_least(key: str, value: str, low: int) -> int:
    n = _int(key, value)
    if n < low:
        raise CorruptionError(f"{key}={n}: must be {low} or more")
    return n


def _cells_of(value: str) -> tuple[int, int]:
    """``cells=A`` or ``A-B`` (whole cells, ``A <= B``) as the half-open ``(A, B + 1)``."""
    lo, dash, hi = value.partition("-")
    a = _at_least("cells", lo, 0) if lo else _int("cells", value)  # "-3": refused as not an integer
    b = _at_least("cells", hi, 0) if dash else a
    if b < a:
        raise CorruptionError(f"cells={value}: the last cell comes before the first")
    return a, b + 1


def cells_text(a: int, b: int) -> str:
    """The half-open cell range ``[a, b)`` in words: ``cell 3`` for one cell, ``cells 3-5`` for more."""
    return f"cell {a}" if b - a == 1 else f"cells {a}-{b - 1}"


def check_params(kind: str, p: Mapping[str, str]) -> None:
    """Refuse (:class:`CorruptionError`, one line naming the key) what ``kind`` does not take or cannot mean,
    before any file is read; what needs the file (does cell 9 exist?) is checked when it is planned."""
    known = KEYS[kind]
    for key, value in p.items():
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise CorruptionError(f"unknown key {_show(key)} for {kind}{hint}; it takes {', '.join(known)}")
        if not value:
            raise CorruptionError(f"{key}= has no value")
        if len(value) > MAX_VALUE:
            raise CorruptionError(f"{key}=: a value of {len(value):,} characters (at most {MAX_VALUE})")
    chosen = [k for k in ("index", "il", "kv_layer") if k in p]
    if len(chosen) > 1:
        raise CorruptionError(f"{' and '.join(k + '=' for k in chosen)} both select records: give one of them")
    for key in ("il", "kv_layer", "cell", "into"):
        if key in p:
            _at_least(key, p[key], 0)
    for key in ("index", "a", "b"):
        if key in p:
            _int(key, p[key])
    if "role" in p and p["role"] not in ROLES:
        raise CorruptionError(f"role={_show(p['role'])}: one of {', '.join(ROLES)}")
    if "stream" in p and p["stream"] != "first-nonempty":
        _at_least("stream", p["stream"], 0)
    if "section" in p and p["section"].lstrip("-").isdigit():
        _int("section", p["section"])
    if "cells" in p:
        _cells_of(p["cells"])
    check = _CHECK.get(kind)
    if check is not None:
        check(p)


def _check_truncate(p: Mapping[str, str]) -> None:
    if "node" in p and "section" in p:
        raise CorruptionError("node= and section= both say what to cut: give one of them")
    if "node" in p and not p["node"].startswith("/"):
        raise CorruptionError(f"node={_show(p['node'])}: a structure path such as /memory")
    at = p.get("at")
    if at is not None and at not in AT_WORDS:
        _int("at", at)


def _check_set(p: Mapping[str, str]) -> None:
    name = p.get("field")
    if name is None:
        raise CorruptionError("set needs field= (one of " + ", ".join(FIELD_KEYS) + ")")
    if name not in FIELD_KEYS:
        close = difflib.get_close_matches(name, FIELD_KEYS, n=1)
        raise CorruptionError(f"field={_show(name)}: unknown field" + (f" (did you mean {close[0]}?)" if close else "")
                              + "; known: " + ", ".join(FIELD_KEYS))
    extra = [k for k in p if k not in ("field", "value", *FIELD_KEYS[name])]
    if extra:
        takes = ", ".join(FIELD_KEYS[name]) or "no other key"
        raise CorruptionError(f"{extra[0]}= does not apply to field={name} (it takes {takes})")
    raw = p.get("value")
    if raw is None:
        raise CorruptionError("set needs value= (N, +N, -N, 0x.., other" + (", a ggml type name)" if name == "type"
                                                                             else ")"))
    if raw == "other" or _RELATIVE.fullmatch(raw):
        return
    if name == "type" and not _INT.fullmatch(raw):
        try:
            gt.type_id_from_name(raw)
        except KeyError:
            raise CorruptionError(f"value={_show(raw)}: unknown ggml type") from None
        return
    _int("value", raw)


def _check_fill(p: Mapping[str, str]) -> None:
    if p.get("value", "nan") not in FILL_VALUES:
        raise CorruptionError(f"value={_show(p['value'])}: one of nan, inf, zeros, 0xff")
    if "then_fail" in p and p["then_fail"] not in ("k", "v", "r", "s"):
        raise CorruptionError(f"then_fail={_show(p['then_fail'])}: one of k, v, r, s (the role whose last record "
                              "fails)")


def _check_trailer(p: Mapping[str, str]) -> None:
    n = _int("bytes", p.get("bytes", "16"))
    if not 0 < n <= MAX_TRAILER:
        raise CorruptionError(f"bytes={n}: between 1 and {MAX_TRAILER:,}")
    b = _int("byte", p.get("byte", "0x41"))
    if not 0 <= b <= 0xFF:
        raise CorruptionError(f"byte={p['byte']}: a byte is 0 to 255 (0x00 to 0xff)")


_CHECK: dict[str, Callable[[Mapping[str, str]], None]] = {
    "truncate": _check_truncate, "set": _check_set, "fill": _check_fill, "trailer": _check_trailer,
}
