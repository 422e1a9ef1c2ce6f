"""``kvscope corrupt`` on a big state: memory about what the mutations touch, not 3x the file (issue #31 item 16).

Before, the input was read whole, each mutation copied it into a NumPy array and back to bytes, and the result
was written from memory: about 3x the input at the peak (3.1 GB for a 1 GiB file). Now the input is copied to
the output's temporary file by the kernel and each mutation is made there in place, piece by piece.
"""

from __future__ import annotations

from pathlib import Path

from kvscope.core.fsutil import sha256_file
from kvscope.core.reader.parse import read_state
from tests.support.bigstate import run_kvscope, write_seq_state

MIB = 1 << 20


def test_a_256_mib_state_is_corrupted_in_well_under_its_size_of_memory(tmp_path: Path) -> None:
    src = tmp_path / "big.seqstate"
    size = write_seq_state(src, cells=8192, n_layer=8, n_embd=1024, sparse=True)  # 16 records of 16 MiB
    assert size > 256 * MIB
    before = sha256_file(src)
    res = read_state(src)
    k = [r for _, r in res.layer_records() if r.role == "k"]
    v = [r for _, r in res.layer_records() if r.role == "v"]
    out = tmp_path / "out.seqstate"
    # every payload byte filled (the most a mutation touches), two records swapped, one dropped, a trailer
    specs = ["nan_rows_valid", "fill:value=zeros,role=k,index=1,cells=10-19", "swap_k_layers_0_1",
             "drop:role=v,index=-1", "trailer:bytes=1048576,byte=7"]
    run = run_kvscope("corrupt", str(src), "-o", str(out), *[a for s in specs for a in ("--corrupt", s)])
    assert run.rc == 0, run.err
    assert run.hwm_mib * MIB < size / 2 + 150 * MIB, f"peak RSS {run.hwm_mib:,.0f} MiB, input {size / MIB:,.0f} MiB"
    assert sha256_file(src) == before
    dropped = v[-1].size
    assert out.stat().st_size == size - dropped + MIB
    with open(out, "rb") as fh:
        def at(off: int, n: int) -> bytes:
            fh.seek(off)
            return fh.read(n)

        assert at(k[0].data_offset, 4) == b"\xff" * 4 and at(v[0].data_offset + v[0].data_size - 4, 4) == b"\xff" * 4
        k1 = k[1].data_offset + 10 * k[1].row_bytes  # cells 10-19 of K record 1, zeroed, then swapped into record 0
        assert at(k[0].data_offset + 10 * k[0].row_bytes, 10 * k[0].row_bytes) == bytes(10 * k[0].row_bytes)
        assert at(k1, 4) == b"\xff" * 4
        assert v[-1].header_offset == size - dropped  # the last record went: the trailer follows the one before
        assert at(size - dropped - 4, 4) == b"\xff" * 4 and at(size - dropped, MIB + 1) == b"\x07" * MIB
