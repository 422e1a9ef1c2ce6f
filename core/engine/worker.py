"""The llama.cpp child process behind :class:`kvscope.core.engine.llamacpp.LlamaProcess`.

``python -m kvscope.core.engine.worker FD_IN FD_OUT``: reads request frames (``protocol``) on
FD_IN and answers on FD_OUT. It loads libllama from ``$LLAMA_CPP_LIB_PATH`` through
llama-cpp-python's low-level ctypes API (``llama_cpp.llama_cpp``), checks the ABI (``abi``),
loads one model and one context, then serves state and decode calls until FD_IN closes. llama.cpp
log lines are forwarded as they are emitted, and a ggml abort message is sent before the process
aborts, so the parent can report a crash with its cause. Nothing else imports llama_cpp.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import mmap
import os
import re
import shutil
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvscope.core.engine import protocol
from kvscope.core.engine.abi import BINDING_LABEL, BINDING_VERSION, INSTALL_HINT, REQUIRED_SYMBOLS, default_problems

# enum ggml_log_level at 0c1e5709/b11434: NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5 (llama-cpp-python's
# own _logger.py still assumes the older INFO 1 .. DEBUG 4 order, so it shows DEBUG lines and hides ERROR ones).
LEVEL_DEBUG, LEVEL_CONT = 1, 5
FLASH_ATTN = {None: -1, False: 0, True: 1}  # enum llama_flash_attn_type: AUTO, DISABLED, ENABLED


class SetupFailure(Exception):
    """The engine cannot start: one line for the user."""


class Channel:
    """The reply pipe, shared by the request loop and the log/abort callbacks."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.lock = threading.Lock()
        self.lines: list[str] = []  # complete lines since the last take()
        self._partial = ""
        self._level = 1

    def send(self, kind: bytes, header: dict[str, Any], payload: Any = None) -> None:
        with self.lock:
            protocol.send(self.fd, kind, header, payload)

    def log(self, level: int, text: str) -> None:
        if level == LEVEL_CONT:
            level = self._level
        self._level = level
        if level == LEVEL_DEBUG:
            return
        self._partial += text
        while "\n" in self._partial:
            line, self._partial = self._partial.split("\n", 1)
            line = line.rstrip()
            if line:
                self.lines.append(line)
                with contextlib.suppress(EOFError):  # the parent is gone; the request loop notices
                    self.send(protocol.LOG, {"l": level, "t": line})

    def take(self) -> list[str]:
        out, self.lines = self.lines, []
        return out


class OutBuffer:
    """Where an operation writes a reply payload: a bytearray, or a shared mapping of a scratch file
    when it is large (llama.cpp then writes straight into the file the parent reads)."""

    def __init__(self, size: int, scratch: list[str]) -> None:
        self.size = size
        self.path: str | None = None
        self.map: mmap.mmap | None = None
        if size > protocol.INLINE_MAX:
            self.path = protocol.scratch_file(scratch, size, "out")
            self.map = protocol.map_file(self.path, size, create=True)
            self.buf: bytearray | mmap.mmap = self.map
        else:
            self.buf = bytearray(size)

    def finish(self, n: int) -> tuple[dict[str, Any], Any]:
        """(header fields, inline payload) for the first ``n`` bytes."""
        if self.map is None:
            return {}, memoryview(self.buf)[:n]
        assert self.path is not None
        self.map.close()
        os.truncate(self.path, n)
        return {"file": self.path}, None

    def discard(self) -> None:
        if self.map is not None:
            self.map.close()
        if self.path is not None:
            _unlink(self.path)


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


class Engine:
    """One model and one context in this process."""

    def __init__(self, setup: dict[str, Any], chan: Channel) -> None:
        self.chan = chan
        self.scratch: list[str] = list(setup.get("scratch") or [])
        lib_dir = Path(os.environ.get("LLAMA_CPP_LIB_PATH", ""))
        self.so = lib_dir / "libllama.so"
        self.L = self._load_binding(self.so)
        L = self.L
        self._log_cb = L.llama_log_callback(lambda level, text, _ud: chan.log(level, (text or b"").decode(
            "utf-8", "replace")))
        L.llama_log_set(self._log_cb, ctypes.c_void_p(0))
        abort_type = ctypes.CFUNCTYPE(None, ctypes.c_char_p)
        self._abort_cb = abort_type(self._on_abort)
        set_abort = L._lib.ggml_set_abort_callback
        set_abort.argtypes, set_abort.restype = [abort_type], ctypes.c_void_p
        set_abort(self._abort_cb)

        problems = default_problems(L.llama_context_default_params(), L.llama_model_default_params())
        if problems:
            raise SetupFailure(f"{self.so} does not match {BINDING_LABEL}: {problems[0]}"
                               + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
        self.cparams = cp = self._context_params(setup["ctx"])  # a bad type name fails before the model loads
        L.llama_backend_init()
        chan.take()
        model_path = setup["model"]
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = 0
        self.model = L.llama_model_load_from_file(model_path.encode(), mp)
        self.load_log = chan.take()
        if not self.model:
            raise SetupFailure(f"llama.cpp cannot load the model {model_path}: {_last_error(self.load_log)}")
        self.ctx = L.llama_init_from_model(self.model, cp)
        self.context_log = chan.take()
        if not self.ctx:
            raise SetupFailure(f"llama.cpp cannot create the context: {_last_error(self.context_log)}")
        self.mem = L.llama_get_memory(self.ctx)
        self.n_vocab = int(L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model)))
        self.n_batch = int(L.llama_n_batch(self.ctx))
        self.batch = L.llama_batch_init(self.n_batch, 0, 1)
        self.ops: dict[str, Callable[[dict[str, Any], Any], tuple[Any, Any]]] = {
            name[3:]: getattr(self, name) for name in dir(self) if name.startswith("op_")}

    # --- setup -------------------------------------------------------------------------------
    @staticmethod
    def _load_binding(so: Path) -> Any:
        if not so.is_file():
            raise SetupFailure(f"no libllama.so in {so.parent}")
        try:
            lib = ctypes.CDLL(str(so))
        except OSError as e:
            raise SetupFailure(f"cannot load {so}: {e}") from None
        missing = [s for s in REQUIRED_SYMBOLS if not hasattr(lib, s)]
        if missing:
            raise SetupFailure(f"{so} lacks {len(missing)} function(s) kvscope calls ({', '.join(missing[:4])}"
                               f"{', ...' if len(missing) > 4 else ''}): it is not the ABI of {BINDING_LABEL}")
        try:
            import llama_cpp
            import llama_cpp.llama_cpp as L
        except AttributeError as e:  # the binding binds every symbol it declares at import
            sym = str(e).rsplit(":", 1)[-1].strip()
            raise SetupFailure(f"{so} lacks {sym}, which {BINDING_LABEL} binds: the library is another "
                               "llama.cpp ABI") from None
        except ImportError as e:
            raise SetupFailure(f"llama-cpp-python is not usable here ({e}): {INSTALL_HINT}") from None
        except (OSError, RuntimeError) as e:
            raise SetupFailure(f"llama-cpp-python cannot load {so}: {e}") from None
        version = getattr(llama_cpp, "__version__", "?")
        if version != BINDING_VERSION:
            raise SetupFailure(f"llama-cpp-python {version} is installed; kvscope needs {BINDING_VERSION}: "
                               f"{INSTALL_HINT}")
        return L

    def _context_params(self, c: dict[str, Any]) -> Any:
        from gguf import GGMLQuantizationType

        cp = self.L.llama_context_default_params()
        for field in ("n_ctx", "n_batch", "n_ubatch", "n_seq_max", "kv_unified", "swa_full"):
            setattr(cp, field, c[field])
        cp.n_threads = cp.n_threads_batch = c["n_threads"]
        cp.flash_attn_type = FLASH_ATTN[c["flash_attn"]]
        for side in ("type_k", "type_v"):
            try:
                setattr(cp, side, int(GGMLQuantizationType[str(c[side]).upper()]))
            except KeyError:
                raise SetupFailure(f"{side} {c[side]!r} is not a ggml type name (e.g. f16, q8_0, q4_0)") from None
        return cp

    def _on_abort(self, message: bytes | None) -> None:
        text = (message or b"").decode("utf-8", "replace")
        try:
            self.chan.send(protocol.ABORT, {"t": text})
        finally:
            print(text, file=sys.stderr, flush=True)

    def info(self) -> dict[str, Any]:
        L, ctx, model = self.L, self.ctx, self.model
        buf = ctypes.create_string_buffer(256)
        L.llama_model_desc(model, buf, len(buf))
        desc = buf.value.decode("utf-8", "replace")
        arch = None
        if L.llama_model_meta_val_str(model, b"general.architecture", buf, len(buf)) >= 0:
            arch = buf.value.decode("utf-8", "replace")
        import llama_cpp

        return {
            "binding_version": llama_cpp.__version__, "libllama": os.path.realpath(self.so),
            "loaded_libraries": _loaded_libraries(), "system_info": L.llama_print_system_info().decode(),
            "architecture": arch, "model_desc": desc, "n_vocab": self.n_vocab,
            "n_layer": int(L.llama_model_n_layer(model)), "n_embd": int(L.llama_model_n_embd(model)),
            "n_params": int(L.llama_model_n_params(model)), "model_size": int(L.llama_model_size(model)),
            "n_ctx": int(L.llama_n_ctx(ctx)), "n_ctx_seq": int(L.llama_n_ctx_seq(ctx)),
            "n_batch": self.n_batch, "n_ubatch": int(L.llama_n_ubatch(ctx)), "n_seq_max": int(L.llama_n_seq_max(ctx)),
            "type_k_id": int(self.cparams.type_k), "type_v_id": int(self.cparams.type_v),
            "flash_attn_type": int(self.cparams.flash_attn_type),
            "state_size_empty": int(L.llama_state_get_size(ctx)),
            "kv_caches": parse_kv_lines(self.context_log), "rotation": parse_rotation(self.context_log),
            "flash_attn": parse_flash_attn(self.context_log),
            "context_log": self.context_log, "load_log": self.load_log, "pid": os.getpid(),
        }

    # --- operations: (args, payload) -> (value, reply payload) -------------------------------
    def op_decode(self, a: dict[str, Any], _p: Any) -> tuple[Any, Any]:
        import numpy as np

        L, b = self.L, self.batch
        seq, toks = int(a["seq_id"]), [int(t) for t in a["tokens"]]
        pos0 = a.get("pos0")
        if pos0 is None:
            pos0 = int(L.llama_memory_seq_pos_max(self.mem, seq)) + 1
        token = np.ctypeslib.as_array(b.token, shape=(self.n_batch,))
        pos = np.ctypeslib.as_array(b.pos, shape=(self.n_batch,))
        n_seq = np.ctypeslib.as_array(b.n_seq_id, shape=(self.n_batch,))
        out = np.ctypeslib.as_array(b.logits, shape=(self.n_batch,))
        for start in range(0, len(toks), self.n_batch):
            chunk = toks[start:start + self.n_batch]
            n = len(chunk)
            token[:n] = chunk
            pos[:n] = np.arange(pos0 + start, pos0 + start + n, dtype=np.int32)
            n_seq[:n] = 1
            out[:n] = 0
            if start + n == len(toks):
                out[n - 1] = 1
            for i in range(n):
                b.seq_id[i][0] = seq
            b.n_tokens = n
            rc = int(L.llama_decode(self.ctx, b))
            if rc != 0:
                return {"rc": rc, "n_decoded": start}, None
        ptr = L.llama_get_logits_ith(self.ctx, -1)
        if not ptr:
            raise RuntimeError("llama_get_logits_ith(-1) returned NULL")
        return {"rc": 0, "n_decoded": len(toks)}, ctypes.string_at(ptr, self.n_vocab * 4)

    def op_state_get_size(self, a: dict[str, Any], _p: Any) -> tuple[Any, Any]:
        return int(self.L.llama_state_get_size(self.ctx)), None

    def op_state_get_data(self, a: dict[str, Any], _p: Any) -> tuple[Any, Any]:
        size = int(self.L.llama_state_get_size(self.ctx))
        out = OutBuffer(size, self.scratch)
        return int(self.L.llama_state_get_data(self.ctx, _u8(out.buf), size)), out

    def op_state_set_data(self, a: dict[str, Any], p: Any) -> tuple[Any, Any]:
        return int(self.L.llama_state_set_data(self.ctx, _u8(p), len(p))), None

    def op_state_seq_get_size(self, a: dict[str, Any], _p: Any) -> tuple[Any, Any]:
        return int(self.L.llama_state_seq_get_size_ext(self.ctx, a["seq_id"], a["flags"])), None

    def op_state_seq_get_data(self, a: dict[str, Any], _p: Any) -> tuple[Any, Any]:
        L, seq, flags = self.L, a["seq_id"], a["flags"]
        size = int(L.llama_state_seq_get_size_ext(self.ctx, seq, flags))
        out = OutBuffer(size, self.scratch)
        return int(L.llama_state_seq_get_data_ext(self.ctx, _u8(out.buf), size, seq, flags)), out

    def op_state_seq_set_data(self, a: dict[str, Any], p: Any) -> tuple[Any, Any]:
        return int(self.L.llama_state_seq_set_data_ext(self.ctx, _u8(p), len(p), a["dest_seq_id"],
                                                       a["flags"])), None

    def op_state_save_file(self, a: dict[str, Any], _p: Any) -> tuple[Any, Any]:
        toks = _tokens(a["tokens"])
        return bool(self.L.llama_state_save_file(self.ctx, a["path"].encode(), toks, len(a["tokens"]))), None

    def op_state_load_file(self, a: dict[str, Any], _p: Any) -> tuple[Any, Any]:
        cap = _token_capacity(a["path"], int(a["n_token_capacity"]))
        toks = (ctypes.c_int32 * max(cap, 1))()
        count = ctypes.c_size_t(0)
        ok = bool(self.L.llama_state_load_file(self.ctx, a["path"].encode(), toks, cap, ctypes.byref(count)))
        return {"rc": ok, "tokens": list(toks[:count.value]) if ok else None}, None

    def op_state_seq_save_file(self, a: dict[str, Any], _p: Any) -> tuple[Any, Any]:
        toks = _tokens(a["tokens"])
        return int(self.L.llama_state_seq_save_file(self.ctx, a["path"].encode(), a["seq_id"], toks,
                                                    len(a["tokens"]))), None

    def op_state_seq_load_file(self, a: dict[str, Any], _p: Any) -> tuple[Any, Any]:
        cap = _token_capacity(a["path"], int(a["n_token_capacity"]))
        toks = (ctypes.c_int32 * max(cap, 1))()
        count = ctypes.c_size_t(0)
        n = int(self.L.llama_state_seq_load_file(self.ctx, a["path"].encode(), a["dest_seq_id"], toks, cap,
                                                 ctypes.byref(count)))
        return {"rc": n, "tokens": list(toks[:count.value]) if n else None}, None

    def op_seq_pos_min(self, a: dict[str, Any], _p: Any) -> tuple[Any, Any]:
        return int(self.L.llama_memory_seq_pos_min(self.mem, a["seq_id"])), None

    def op_seq_pos_max(self, a: dict[str, Any], _p: Any) -> tuple[Any, Any]:
        return int(self.L.llama_memory_seq_pos_max(self.mem, a["seq_id"])), None

    def op_seq_rm(self, a: dict[str, Any], _p: Any) -> tuple[Any, Any]:
        return bool(self.L.llama_memory_seq_rm(self.mem, a["seq_id"], a["p0"], a["p1"])), None

    def op_memory_clear(self, a: dict[str, Any], _p: Any) -> tuple[Any, Any]:
        self.L.llama_memory_clear(self.mem, True)
        return None, None

    def op_tokenize(self, a: dict[str, Any], _p: Any) -> tuple[Any, Any]:
        L, text = self.L, str(a["text"]).encode("utf-8")
        vocab = L.llama_model_get_vocab(self.model)
        n_max = len(text) + 8  # a token covers at least one byte, plus BOS/EOS
        toks = (ctypes.c_int32 * n_max)()
        n = int(L.llama_tokenize(vocab, text, len(text), toks, n_max, bool(a["add_special"]), False))
        if n < 0:
            raise RuntimeError(f"llama_tokenize needs {-n} tokens, more than {n_max}")
        return list(toks[:n]), None

    def op_echo(self, a: dict[str, Any], p: Any) -> tuple[Any, Any]:
        out = OutBuffer(len(p), self.scratch)
        out.buf[:] = p
        return len(p), out


def _u8(buf: bytearray | mmap.mmap) -> Any:
    """A ``uint8_t *`` into the writable ``buf`` without copying it."""
    return (ctypes.c_uint8 * len(buf)).from_buffer(buf) if len(buf) else (ctypes.c_uint8 * 1)()


def _token_capacity(path: str, cap: int) -> int:
    """The token buffer for loading ``path``: at most the tokens the file can hold after its 12-byte header
    (magic, version, n_token_count), so a capacity taken from a header's count cannot size it; llama.cpp
    refuses a larger count with its own capacity check."""
    try:
        fits = max(0, (os.stat(path).st_size - 12) // 4)
    except OSError:
        return max(0, min(cap, 1))  # llama.cpp reports the open failure
    return max(0, min(cap, fits))


def _tokens(tokens: list[int]) -> Any:
    return (ctypes.c_int32 * max(len(tokens), 1))(*tokens)


def _last_error(lines: list[str]) -> str:
    picked = [ln for ln in lines if "error" in ln.lower() or "failed" in ln.lower()] or lines
    return picked[-1] if picked else "no log output"


def _loaded_libraries() -> list[str]:
    try:
        with open("/proc/self/maps") as fh:
            paths = {ln.split(None, 5)[-1].strip() for ln in fh if "/lib" in ln}
    except OSError:
        return []
    return sorted(p for p in paths if re.search(r"/lib(llama|ggml)[^/]*\.so", p))


_KV_RE = re.compile(r"(?P<who>\w+): size = +(?P<mib>[\d.]+) MiB \( *(?P<cells>\d+) cells, +(?P<layers>\d+) layers, +"
                    r"(?P<seqs>\d+)/(?P<streams>\d+) seqs\), K \((?P<tk>\w+)\): +(?P<kmib>[\d.]+) MiB, "
                    r"V \((?P<tv>\w+)\): +(?P<vmib>[\d.]+) MiB")
_ROT_RE = re.compile(r"(?P<who>\w+): (?P<key>n_rot_[kv]|attn_rot_[kv]) = (?P<val>\d+)")


def parse_kv_lines(lines: list[str]) -> list[dict[str, Any]]:
    """The KV caches llama.cpp reported creating (one per ``llama_kv_cache: size = ...`` line)."""
    out = []
    for ln in lines:
        m = _KV_RE.search(ln)
        if m:
            out.append({"cells": int(m["cells"]), "layers": int(m["layers"]), "n_seq_max": int(m["seqs"]),
                        "n_stream": int(m["streams"]), "type_k": m["tk"], "type_v": m["tv"],
                        "size_mib": float(m["mib"]), "k_mib": float(m["kmib"]), "v_mib": float(m["vmib"])})
    return out


def parse_rotation(lines: list[str]) -> list[dict[str, int]]:
    """Per KV cache, the rotation it was created with: b11434 logs ``n_rot_k = N`` (0 = none);
    0c1e5709 logs ``attn_rot_k = 0|1``."""
    out: list[dict[str, int]] = []
    for ln in lines:
        m = _ROT_RE.search(ln)
        if not m:
            continue
        key, val = m["key"], int(m["val"])
        if not out or key in out[-1]:
            out.append({})
        out[-1][key] = val
    return out


def parse_flash_attn(lines: list[str]) -> str | None:
    """What flash attention resolved to (``enabled``/``disabled``), from the context-creation log:
    the requested type, then llama.cpp's own overrides and the ``auto`` probe."""
    state = None
    for ln in lines:
        m = re.search(r"flash_attn += (\w+)", ln)
        if m:
            state = m[1]
        elif "Flash Attention enabled" in ln or "enabling flash_attn" in ln:
            state = "enabled"
        elif "Flash Attention not supported" in ln or "disabling flash attention" in ln or "forcing off" in ln:
            state = "disabled"
    return state


def _request_payload(header: dict[str, Any], inline: bytes | None) -> tuple[bytearray | mmap.mmap, str | None]:
    """The request's payload as a writable buffer for llama.cpp: a copy of a small inline one, or a
    private mapping of the parent's scratch file (not copied)."""
    path = header.get("file")
    if path is None:
        return bytearray(inline or b""), None
    size = os.path.getsize(path)
    if size == 0:
        return bytearray(), path
    return protocol.map_file(path, size, create=False), path


def serve(reader: protocol.Reader, chan: Channel, engine: Engine) -> None:
    """Answer requests until the parent closes its end."""
    try:
        while True:
            kind, header, inline = reader.read()
            op = engine.ops.get(str(header.get("op")))
            if kind != protocol.REQUEST or op is None:
                chan.send(protocol.REPLY, {"ok": False, "error": f"unknown request {header.get('op')!r}"})
                continue
            payload, in_path = _request_payload(header, inline)
            out: Any = None
            try:
                value, out = op(header, payload)
                extra, body = out.finish(int(value)) if isinstance(out, OutBuffer) else ({}, out)
            except Exception as e:  # a bad argument or a bug here: the process stays usable
                if isinstance(out, OutBuffer):
                    out.discard()
                chan.take()
                chan.send(protocol.REPLY, {"ok": False, "error": f"{type(e).__name__}: {e}"})
                continue
            finally:
                if isinstance(payload, mmap.mmap):
                    payload.close()
                if in_path is not None:
                    _unlink(in_path)
            chan.take()  # the lines went out as they came
            chan.send(protocol.REPLY, {"ok": True, "v": value, **extra}, body)
    except EOFError:
        return


def main(argv: list[str]) -> int:
    fd_in, fd_out = int(argv[0]), int(argv[1])
    faulthandler.enable()  # a segfault leaves a Python traceback in the stderr tail
    reader, chan = protocol.Reader(fd_in), Channel(fd_out)
    try:
        _kind, setup, _ = reader.read()
    except EOFError:
        return 0
    try:
        engine = Engine(setup, chan)
        info = engine.info()
    except SetupFailure as e:
        chan.send(protocol.REPLY, {"ok": False, "setup_error": str(e), "log": chan.take()})
        return 0
    chan.send(protocol.REPLY, {"ok": True, "info": info})
    serve(reader, chan, engine)  # returns when the parent closes the pipe (or dies)
    for d in engine.scratch:  # the parent removes them too; this covers a parent that was killed
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip llama.cpp's static destructors: the parent is done with us
