"""Item 5 of issue 12: ``inspect --json`` streams big arrays in bounded memory (its speed: bench/bench_reader.py).

A sparse 128 MB file claiming 16,777,216 cells took more than 120 s and 2.9 GB in ``--json``,
33,554,432 tokens took 31 s: the whole answer was built as one dict and ``json.dump`` wrote it
element by element. Cells, cell extensions and tokens are now :class:`JsonArray` pieces written
by :func:`write_json`, whose text is byte for byte what ``json.dumps`` gives for the same object.
"""

from __future__ import annotations

import io
import json
import os
import struct
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from kvharness.fixtures import DATA, manifest_entries
from kvscope.core.jsonout import JsonArray, materialize, write_json
from kvscope.core.reader.parse import read_state
from kvscope.core.reader.records import CellTable
from kvscope.core.reader.render import result_to_json
from tests.support.bigstate import run_kvscope

MIB = 1 << 20


def _sparse_cells(path: Path, n_cells: int) -> Path:
    """A seq file whose one stream claims ``n_cells`` cells; the records are a hole (pos 0, no seq)."""
    with open(path, "wb") as fh:
        fh.write(struct.pack("<III", 0x67677371, 3, 0) + struct.pack("<II", 1, n_cells))
    os.truncate(path, 20 + 8 * n_cells + 8)
    return path


def _sparse_tokens(path: Path, n_tokens: int) -> Path:
    with open(path, "wb") as fh:
        fh.write(struct.pack("<III", 0x67677371, 3, n_tokens))
    os.truncate(path, 12 + 4 * n_tokens + 8)
    return path


@pytest.mark.slow  # every fixture streamed and dumped
@pytest.mark.parametrize("indent", [None, 1])
def test_streamed_json_equals_json_dumps(indent: int | None) -> None:
    """Every fixture: the streamed text is exactly json.dumps of the plain object (tree included)."""
    seen = 0
    for path, _ in manifest_entries()[::3]:
        res = read_state(path)
        ref = json.dumps(result_to_json(res, tree=True), indent=indent)
        out = io.StringIO()
        write_json(result_to_json(res, tree=True, lazy=True), out, indent)
        assert out.getvalue() == ref, path
        assert json.dumps(materialize(result_to_json(res, lazy=True))) == json.dumps(result_to_json(res))
        seen += 1
    assert seen > 50


@pytest.mark.slow  # every cell shape of every fixture
def test_cell_pieces_cover_every_shape() -> None:
    rng = np.random.default_rng(3)
    for case in range(200):
        n = int(rng.integers(0, 200))
        n_seq = (np.ones(n, np.int32) if case % 3 == 0 else rng.integers(0, 4, n).astype(np.int32))
        ids = rng.integers(-2, 300, int(n_seq.sum())).astype(np.int32)
        if case % 7 == 0 and ids.size:
            ids = ids[: int(rng.integers(0, ids.size))]  # a table cut inside its ids
        ext = rng.integers(-9, 9, (n, 2)).astype(np.int32) if case % 2 else None
        t = CellTable(0, 0, rng.integers(-5, 10**6, n).astype(np.int32), n_seq, ids, ext, 8 if ext is not None else 0)
        for piece in (1, 5, 64):
            for indent in (None, 2):
                arr = JsonArray(lambda t=t, p=piece: t.pair_pieces(p), lambda i, t=t, p=piece: t.pair_text(i, p))
                out = io.StringIO()
                write_json({"cells": arr, "ext": t.json_ext(True) if ext is not None else []}, out, indent)
                plain = {"cells": t.as_pairs(), "ext": ext.tolist() if ext is not None else []}
                assert out.getvalue() == json.dumps(plain, indent=indent)


def _big_object(n: int) -> dict[str, object]:
    t = CellTable(0, 12 * n, np.arange(n, dtype=np.int32), np.ones(n, np.int32), np.zeros(n, np.int32))
    return {"memory": [{"cells": t.json_cells(True)}], "tokens": JsonArray.of_ints(list(range(n)))}


@pytest.mark.slow  # 524,288 cells under tracemalloc
def test_streaming_memory_is_one_piece() -> None:
    """524,288 cells and tokens: write_json holds one piece, never the whole list of pairs."""
    obj = _big_object(1 << 19)
    tracemalloc.start()
    try:
        write_json(obj, _Count())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 24 * MIB, f"peak {peak / MIB:.0f} MiB while streaming"  # the plain list alone is ~70 MiB


class _Count(io.TextIOBase):
    n = 0

    def write(self, s: str) -> int:
        self.n += len(s)
        return len(s)


@pytest.mark.slow  # a 16M-cell file through a subprocess; the speed is bench/bench_reader.py's
def test_sixteen_million_cells(tmp_path: Path) -> None:
    path = _sparse_cells(tmp_path / "cells.seqstate", 1 << 24)
    out = tmp_path / "out.json"
    r = run_kvscope("inspect", "--json", str(path), stdout_to=out, timeout=300)  # more than 120 s before streaming
    assert r.rc == 1, r.err  # n_seq_id 0 in a per-sequence state: an error finding
    size = out.stat().st_size
    assert size > 140 * MIB
    assert r.hwm_mib < 1024, f"peak RSS {r.hwm_mib:.0f} MiB"
    with open(out, "rb") as fh:
        head = fh.read(4096)
        fh.seek(-16384, 2)
        tail = fh.read()
    assert head.startswith(b'{"file": ') and b'"cells": [[0, []], [0, []]' in head
    # the keys after the streamed arrays all made it: the parse's last, then what inspect adds
    assert tail.rstrip().endswith(b"}") and all(k in tail for k in (b'"coverage"', b'"verdict"', b'"consumers"'))


@pytest.mark.slow  # a 33M-token file through a subprocess; the speed is bench/bench_reader.py's
def test_thirty_three_million_tokens(tmp_path: Path) -> None:
    path = _sparse_tokens(tmp_path / "tokens.seqstate", 1 << 25)
    out = tmp_path / "out.json"
    r = run_kvscope("inspect", "--json", str(path), stdout_to=out, timeout=300)
    assert r.rc == 1, r.err
    size = out.stat().st_size
    assert size > 3 * (1 << 25)  # "0, " per token
    assert r.hwm_mib < 1536, f"peak RSS {r.hwm_mib:.0f} MiB"
    with open(out, "rb") as fh:
        assert b'"tokens": [0, 0, 0' in fh.read(4096)


def test_pretty_streamed(tmp_path: Path) -> None:
    path = DATA / "llamacpp-2026-10-01" / "llama-f16-fa0-unified1-seq0.seqstate"
    r = run_kvscope("inspect", "--json", "--pretty", "--tree", str(path))
    assert r.rc in (0, 1)
    doc = json.loads(r.out)
    assert r.out == json.dumps(doc, indent=1) + "\n"  # exactly what json.dump(indent=1) writes
    for key in ("compatibility", "verdict", "reuse_prediction", "consumers", "values_scanned", "stats", "releases"):
        doc.pop(key, None)  # added by the inspection (the value scan is inspect's default), not by result_to_json
    assert doc == json.loads(json.dumps(result_to_json(read_state(path), tree=True)))
