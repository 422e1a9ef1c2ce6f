"""Item 4 of issue 12: a hostile ``--model`` GGUF (and a hostile state's strings) is untrusted input.

Arrays nested 5,000 deep (a RecursionError traceback before), a FIFO as ``--model`` (a blocking
``open`` that never returned), a million empty inner arrays (4.4 s), huge counts, and an
architecture name with a newline and U+202E (a two-line error that reversed the terminal line)
each give one escaped line and exit 2, fast. Strings from state files (a context blob's arch, a
token's text) are escaped in text output too.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import gguf
import numpy as np
import pytest

from kvharness.fixtures import DATA, model_path
from kvharness.fuzz_mutations import T_ARR, T_STR, T_U8, T_U32, gguf_header, gguf_str
from kvscope.core.model.gguf_metadata import MAX_ARRAY_BYTES, MAX_STRINGS, SKIPPED, read_gguf_metadata
from kvscope.core.model.profile import ModelProfileError, load_model_profile
from kvscope.core.textsafe import safe_text
from tests.support.bigstate import run_kvscope

pytestmark = pytest.mark.slow  # corrupted GGUF models

SEQ = DATA / "llamacpp-2026-10-01" / "llama-f16-fa0-unified0-seq0.seqstate"
CTX = DATA / "llamacpp-2026-10-01" / "llama-f16-fa0-unified0-ctx.state.bin"
ARCH = ("general.architecture", T_STR, gguf_str("llama"))
LAYERS = ("llama.block_count", T_U32, struct.pack("<I", 2))
EMBD = ("llama.embedding_length", T_U32, struct.pack("<I", 64))
BAD = "\n\u202e\x1b"  # characters that must never reach a terminal raw


def _u32(v: int) -> bytes:
    return struct.pack("<I", v)


def _u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _clean_error(path: Path, backends: tuple[str, ...] = ("fast", "gguf")) -> str:
    msg = ""
    for backend in backends:
        with pytest.raises(ModelProfileError) as info:
            load_model_profile(path, backend=backend)  # type: ignore[arg-type]
        msg = str(info.value)
        assert msg and not any(c in msg for c in BAD), repr(msg)
    return msg


def _cli_one_line(model: Path, timeout: float = 60) -> str:
    r = run_kvscope("inspect", "--model", str(model), str(SEQ), timeout=timeout)
    assert r.rc == 2, (r.rc, r.err)
    assert "Traceback" not in r.err and len(r.err.strip().splitlines()) == 1, r.err
    assert not any(c in r.err for c in BAD), repr(r.err)
    return r.err.strip()


def _nested(depth: int) -> bytes:
    """``depth`` arrays each holding one array, the innermost an empty u32 array."""
    return (_u32(T_ARR) + _u64(1)) * (depth - 1) + _u32(T_U32) + _u64(0)


def test_deeply_nested_arrays(tmp_path: Path) -> None:
    path = _write(tmp_path / "deep.gguf", gguf_header([ARCH, ("general.deep", T_ARR, _nested(5000)), LAYERS, EMBD]))
    assert "array of arrays" in _clean_error(path, ("fast",))
    _clean_error(path, ("gguf",))  # the reference reader's RecursionError, as one line
    assert "array of arrays" in _cli_one_line(path)


def test_a_million_empty_inner_arrays_is_fast(tmp_path: Path) -> None:
    inner = (_u32(T_U32) + _u64(0)) * 1_000_000
    path = _write(tmp_path / "wide.gguf",
                  gguf_header([ARCH, ("general.wide", T_ARR, _u32(T_ARR) + _u64(1_000_000) + inner), LAYERS, EMBD]))
    t0 = time.perf_counter()
    assert "array of arrays" in _clean_error(path, ("fast",))
    assert time.perf_counter() - t0 < 0.5


def test_fifo_as_model_does_not_hang(tmp_path: Path) -> None:
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    assert "not a regular file" in _cli_one_line(fifo, timeout=60)
    code = ("import sys\nfrom kvscope.core.model.profile import ModelProfileError, load_model_profile\n"
            "for b in ('fast', 'gguf'):\n"
            "    try:\n        load_model_profile(sys.argv[1], backend=b)\n"
            "    except ModelProfileError as e:\n        print(e)\n")
    p = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True, text=True, timeout=60,
                       check=False)
    assert p.returncode == 0 and p.stdout.count("not a regular file") == 2, p.stderr


def test_huge_counts(tmp_path: Path) -> None:
    cases = {
        "keys": gguf_header([ARCH, LAYERS, EMBD], kv_count=1 << 62),
        "key_len": gguf_header([ARCH, LAYERS, EMBD], kv_count=4) + _u64(1 << 63),
        "string": gguf_header([ARCH, ("general.name", T_STR, _u64((1 << 64) - 1) + b"x"), LAYERS, EMBD]),
        "u32_array": gguf_header([ARCH, ("general.a", T_ARR, _u32(T_U32) + _u64(1 << 62)), LAYERS, EMBD]),
        "str_array": gguf_header([ARCH, ("tokenizer.ggml.tokens", T_ARR, _u32(T_STR) + _u64(1 << 61)), LAYERS, EMBD]),
        "elem_type": gguf_header([ARCH, ("general.a", T_ARR, _u32(77) + _u64(3)), LAYERS, EMBD]),
    }
    for name, blob in cases.items():
        t0 = time.perf_counter()
        _clean_error(_write(tmp_path / f"{name}.gguf", blob))
        assert time.perf_counter() - t0 < 1.0, name


def test_oversized_values_are_walked_over(tmp_path: Path) -> None:
    """A numeric array over MAX_ARRAY_BYTES (a hole of zeros) is skipped, not read; the keys after it count."""
    count = MAX_ARRAY_BYTES // 4 + 1
    head = gguf_header([ARCH, ("general.big", T_ARR, _u32(T_U32) + _u64(count))])
    tail = gguf_header([LAYERS, EMBD])[24:]
    path = tmp_path / "big.gguf"
    with open(path, "wb") as fh:
        fh.write(head[:16] + _u64(4) + head[24:])
        fh.seek(4 * count, 1)
        fh.write(tail)
    tracemalloc.start()
    try:
        meta = read_gguf_metadata(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert meta["general.big"] is SKIPPED and meta["llama.block_count"] == 2
    assert peak < 8 << 20, f"peak {peak >> 20} MiB"
    assert load_model_profile(path).n_layer == 2


def test_too_many_strings_is_refused_fast(tmp_path: Path) -> None:
    path = tmp_path / "vocab.gguf"
    with open(path, "wb") as fh:
        fh.write(gguf_header([ARCH, ("tokenizer.ggml.merges", T_ARR, _u32(T_STR) + _u64(MAX_STRINGS + 1))]))
    os.truncate(path, path.stat().st_size + 8 * (MAX_STRINGS + 1))  # that many empty strings, as a hole
    t0 = time.perf_counter()
    assert "strings" in _clean_error(path, ("fast",))
    assert time.perf_counter() - t0 < 1.0


def test_architecture_with_newline_and_bidi(tmp_path: Path) -> None:
    evil = "lla\nma\u202etxt.exe"
    path = _write(tmp_path / "evil.gguf", gguf_header([("general.architecture", T_STR, gguf_str(evil)), EMBD]))
    msg = _clean_error(path)
    assert "lla\\nma\\u202etxt.exe" in msg
    line = _cli_one_line(path)
    assert "lla\\nma\\u202etxt.exe" in line
    # a key name is file text too
    dup = (b"bad\x1bkey", T_U8, b"\x01")
    assert "bad\\x1bkey" in _clean_error(_write(tmp_path / "dup.gguf", gguf_header([ARCH, dup, dup, LAYERS, EMBD])))


def test_unknown_architecture_note_is_escaped(tmp_path: Path) -> None:
    arch = "x\u202ey"
    path = _write(tmp_path / "u.gguf", gguf_header([
        ("general.architecture", T_STR, gguf_str(arch)), (f"{arch}.block_count", T_U32, _u32(2)),
        (f"{arch}.embedding_length", T_U32, _u32(64)), (f"{arch}.ssm.conv_kernel", T_U32, _u32(4))]))
    prof = load_model_profile(path)
    assert prof.arch == arch  # the data keeps the real name
    assert prof.notes and all("\u202e" not in n for n in prof.notes) and "x\\u202ey" in prof.notes[0]


def test_state_arch_string_is_escaped(tmp_path: Path) -> None:
    blob = bytearray(CTX.read_bytes())
    assert blob[4:9] == b"llama"
    blob[4:9] = b"l\x1b[2J"  # an ANSI "clear screen" as the architecture name
    path = _write(tmp_path / "ctx.state.bin", bytes(blob))
    r = run_kvscope("inspect", "--kind", "context_blob", str(path))
    assert "\x1b" not in r.out and "\x1b" not in r.err
    assert "arch=l\\x1b[2J" in r.out
    r = run_kvscope("inspect", "--kind", "context_blob", "--model", str(model_path("llama")), str(path))
    assert "\x1b" not in r.out and "\x1b" not in r.err


def test_token_text_is_escaped(tmp_path: Path) -> None:
    w = gguf.GGUFWriter(str(tmp_path / "tok.gguf"), "llama")
    w.add_block_count(2)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["<unk>", "<s>", "\u202eevil\nline"])
    w.add_tensor("token_embd.weight", np.zeros((2, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    state = _write(tmp_path / "t.seqstate", struct.pack("<III", 0x67677371, 3, 2) + struct.pack("<ii", 2, 1))
    r = run_kvscope("inspect", "--model", str(tmp_path / "tok.gguf"), str(state))
    assert "text:" in r.out and "\u202e" not in r.out and "\u202e" not in r.err
    for line in r.out.splitlines():
        assert line.isprintable(), repr(line)


def test_safe_text() -> None:
    assert safe_text("plain ascii and ünïcode") == "plain ascii and ünïcode"
    assert safe_text("a\nb\tc\r\x00\x7f\x9b") == "a\\nb\\tc\\r\\x00\\x7f\\x9b"
    assert safe_text("\u202e\u2066\u200f\u2028\U000e0001") == "\\u202e\\u2066\\u200f\\u2028\\U000e0001"
    assert safe_text("x" * 50, 10) == "xxxxxxxxxx... (50 characters)"
    assert safe_text(Path("/a\nb")) == "/a\\nb"


def test_copy_of_real_model_still_loads(tmp_path: Path) -> None:
    """The bounds leave real models alone (the fast and reference backends agree)."""
    dst = tmp_path / "m.gguf"
    shutil.copyfile(model_path("lfm2"), dst)
    assert load_model_profile(dst) == load_model_profile(dst, backend="gguf")
