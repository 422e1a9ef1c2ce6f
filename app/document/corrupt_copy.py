"""Corrupt a byte range of a state file into a copy (the hex view's "Corrupt these bytes…"; no Qt).

Four modes on the selected bytes ``[start, end)``:

- ``zero``: those bytes become 0;
- ``random``: those bytes become seeded random bytes (the seed is in the description);
- ``nan``: the rows (cells) of the K/V/r/s payload the range touches become NaN, written by the lab's
  ``fill`` corruption (:mod:`kvscope.core.lab.corruptions`: the record's own NaN pattern, 0xFF scales for
  quantized types); a range outside every payload has no values to make NaN and is refused;
- ``drop``: a range inside one layer record removes that whole record, by the lab's ``drop`` (the file
  then lacks a record, as when a writer skipped one); any other range removes exactly those bytes.

The input is never written: :func:`corrupt_range` returns new bytes, :func:`write_copy` writes them
atomically to a path that must not be the input.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from kvscope.core.fsutil import write_atomic
from kvscope.core.lab.corruptions import CorruptionError, parse_spec
from kvscope.core.model.profile import ModelProfile
from kvscope.core.reader.records import LayerRecord, ParseResult, Section

MODES = ("zero", "nan", "random", "drop")
MODE_TITLES = {"zero": "zero", "nan": "NaN", "random": "random bytes", "drop": "drop"}


@dataclass(frozen=True)
class CorruptedCopy:
    """The corrupted bytes, what was done in words, and the lab spec used (None: plain byte edit)."""

    data: bytes
    description: str
    spec: str | None = None


def record_at(res: ParseResult, start: int, end: int) -> tuple[Section, LayerRecord] | None:
    """The layer record (header and payload) holding all of ``[start, end)``, with its section."""
    for sec, rec in res.layer_records():
        if rec.header_offset <= start and end <= rec.data_offset + rec.data_size:
            return sec, rec
    return None


def record_spec(res: ParseResult, sec: Section, rec: LayerRecord) -> str:
    """The lab's address of ``rec``: ``section=S,[stream=T,]role=R,index=I`` (I among that stream's role)."""
    si = res.sections.index(sec)
    if sec.kind == "kv":
        st = next(st for st in sec.streams if any(r is rec for r in (*st.k_layers, *st.v_layers)))
        same = [r for r in (*st.k_layers, *st.v_layers) if r.role == rec.role]
        where = f"section={si},stream={sec.streams.index(st)}"
    else:
        same = [r for r in (*sec.r_layers, *sec.s_layers) if r.role == rec.role]
        where = f"section={si}"
    return f"{where},role={rec.role},index={next(i for i, r in enumerate(same) if r is rec)}"


def _rows(rec: LayerRecord, start: int, end: int) -> tuple[int, int]:
    """The rows (cells) of ``rec``'s payload that ``[start, end)`` touches, first and last."""
    lo, hi = max(start, rec.data_offset), min(end, rec.data_offset + rec.data_size)
    if rec.transposed:  # each column holds every cell: a byte is cell ((off % column) // el_bytes)
        col = rec.n_rows * rec.el_bytes
        if hi - lo >= col:
            return 0, rec.n_rows - 1
        a, b = (lo - rec.data_offset) % col // rec.el_bytes, (hi - 1 - rec.data_offset) % col // rec.el_bytes
        return (a, b) if a <= b else (0, rec.n_rows - 1)
    return (lo - rec.data_offset) // rec.row_bytes, (hi - 1 - rec.data_offset) // rec.row_bytes


def corrupt_range(data: bytes, res: ParseResult, profile: ModelProfile | None, start: int, end: int, mode: str,
                  seed: int = 0) -> CorruptedCopy:
    """``data`` (the file's bytes, parsed as ``res``) with ``[start, end)`` corrupted by ``mode``.

    Raises :class:`~kvscope.core.lab.corruptions.CorruptionError` when the mode does not apply there.
    """
    if mode not in MODES:
        raise CorruptionError(f"unknown mode {mode!r} (known: {', '.join(MODES)})")
    if not 0 <= start < end <= len(data):
        raise CorruptionError(f"bytes [{start:,}, {end:,}) are not inside the file ({len(data):,} bytes)")
    n = end - start
    if mode in ("zero", "random"):
        out = bytearray(data)
        if mode == "zero":
            out[start:end] = bytes(n)
            return CorruptedCopy(bytes(out), f"zeroed {n:,} bytes at {start:,} (0x{start:x})")
        out[start:end] = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()
        return CorruptedCopy(bytes(out), f"{n:,} random bytes (seed {seed}) at {start:,} (0x{start:x})")
    hit = record_at(res, start, end)
    if mode == "nan":
        if hit is None or not (hit[1].data_offset <= start and end <= hit[1].data_offset + hit[1].data_size) \
                or not hit[1].data_size:
            raise CorruptionError("NaN needs bytes inside one K/V/r/s payload (these hold no values)")
        sec, rec = hit
        a, b = _rows(rec, start, end)
        spec = f"fill:value=nan,{record_spec(res, sec, rec)},cells={a}-{b}"
        m = parse_spec(spec).apply(data, profile)
        return CorruptedCopy(m.data, m.description, spec)
    if hit is not None:
        spec = f"drop:{record_spec(res, *hit)}"
        m = parse_spec(spec).apply(data, profile)
        return CorruptedCopy(m.data, m.description, spec)
    return CorruptedCopy(data[:start] + data[end:], f"removed {n:,} bytes at {start:,} (0x{start:x})")


def default_copy_name(path: str, mode: str, start: int, end: int) -> str:
    """``<folder>/<stem>.<mode>-<start hex>-<end hex><ext>``: beside the input, never the input."""
    folder, base = os.path.split(os.path.abspath(path))
    stem, ext = os.path.splitext(base)
    return os.path.join(folder, f"{stem}.{mode}-{start:x}-{end:x}{ext}")


def copy_problem(source: str, dest: str) -> str | None:
    """Why ``dest`` cannot take the copy (it is the input, exists, or its folder does not), or None."""
    if not dest.strip():
        return "give the copy a name"
    dest = os.path.abspath(dest)
    if os.path.abspath(source) == dest or (os.path.exists(dest) and os.path.samefile(source, dest)):
        return "that is the input file: the copy needs a name of its own"
    if os.path.exists(dest):
        return f"{os.path.basename(dest)} exists: choose another name"
    if not os.path.isdir(os.path.dirname(dest)):
        return f"no folder {os.path.dirname(dest)}"
    return None


def write_copy(source: str, dest: str, copy: CorruptedCopy) -> str:
    """Write ``copy`` to ``dest`` atomically (refused as :func:`copy_problem` says); the absolute path."""
    why = copy_problem(source, dest)
    if why is not None:
        raise CorruptionError(why)
    dest = os.path.abspath(dest)
    write_atomic(dest, copy.data, prefix=".kvscope-corrupt-")
    return dest


def plan_text(res: ParseResult, start: int, end: int, mode: str) -> tuple[str, str | None]:
    """What ``mode`` will do to ``[start, end)`` in words, and why it cannot (None: it can); cheap (no copy)."""
    n = end - start
    span = f"{n:,} byte{'' if n == 1 else 's'} at {start:,} (0x{start:x})"
    if mode == "zero":
        return f"set the {span} to 0", None
    if mode == "random":
        return f"overwrite the {span} with seeded random bytes", None
    hit = record_at(res, start, end)
    if mode == "nan":
        if hit is None or not hit[1].data_size or not (hit[1].data_offset <= start
                                                       and end <= hit[1].data_offset + hit[1].data_size):
            return f"NaN into the {span}", "NaN needs bytes inside one K/V/r/s payload (these hold no values)"
        rec = hit[1]
        a, b = _rows(rec, start, end)
        cells = f"cell {a}" if a == b else f"cells {a}-{b}"
        return (f"make {cells} of {rec.role.upper()} layer {rec.il if rec.il is not None else rec.index} NaN "
                f"(the whole rows the selection touches; the lab's fill)"), None
    if hit is not None:
        rec = hit[1]
        return (f"remove the whole {rec.role.upper()} layer {rec.il if rec.il is not None else rec.index} record "
                f"({rec.size:,} bytes; the lab's drop)"), None
    return f"remove the {span} (what follows moves up)", None
