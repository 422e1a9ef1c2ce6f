"""A new lab scenario folder, written by a real llama.cpp build from a model and prompts (``kvscope lab --prompt``).

The lab's replayable scenarios (``tests/data/lab``) were written by an outside generator for the tiny
random-weight models; this writes the same folder for any model, a trained one included (Gemma 3 270M,
issue #17 item 6). libllama (a pinned build in a child process) creates a context with the given
:class:`~kvscope.core.memory.ContextParams`, decodes each sequence's tokens in one call, in sequence order
(prompts are tokenized by the model's own tokenizer), and the folder gets what
``tests/data/lab/README.md`` describes: ``context.json`` (the model's path relative to the folder with its
size and sha256, the context parameters, the build and the layout it writes, every sequence's tokens, the
next token), ``context.state.bin``, ``seq<N>.clean.seqdata.bin`` for every sequence,
``seq<T>.clean.seqstate`` and ``context.session``, and the baseline next-token logits per sequence.

The folder is written beside its final place and renamed into it when complete: an interrupted run leaves
nothing behind, and an existing folder is never written into.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kvscope.core.engine.builds import BuildError, by_name
from kvscope.core.engine.session import EngineError, EngineSetupError, LlamaSession, SaveRefused
from kvscope.core.lab.engine_live import EngineLabError, ctx_params_from
from kvscope.core.lab.scenario import LIVE_STATE, _sha256_regular
from kvscope.core.memory import ContextParams

GENERATOR = "kvscope lab --prompt (kvscope.core.lab.new_scenario): libllama through llama-cpp-python's ctypes API"


class _process:
    def __init__(self, model: str | Path, params: ContextParams, build: str | None, lib_path: str | None,
                 n_threads: int = 2) -> None:
        try:
            self.p = LlamaSession(str(model), ctx_params_from(params, n_threads), build=build, lib_path=lib_path)
        except (EngineSetupError, EngineError, ValueError) as e:
            raise EngineLabError(f"llama.cpp cannot start on {model}: {e}") from None

    def __enter__(self) -> LlamaSession:
        return self.p

    def __exit__(self, *exc: object) -> None:
        self.p.close()


def write_scenario(folder: str | Path, model: str | Path, params: ContextParams,
                   seqs: Mapping[int, Sequence[int]] | None = None, *, prompts: Mapping[int, str] | None = None,
                   build: str | None = None, lib_path: str | None = None, target: int = 0,
                   next_token: int | None = None, n_threads: int = 2, empty_target: bool = False) -> Path:
    """Decode each sequence's tokens in llama.cpp and write the scenario folder ``folder`` (which must not exist).

    ``seqs``: sequence -> tokens; or ``prompts``: sequence -> text, tokenized by the model (BOS as it adds it).
    ``target``: the sequence whose clean per-sequence file is written (the lab restores into it);
    ``next_token``: the token the probes decode after each sequence (default: the target's last token);
    ``empty_target``: the live context holds the other sequences only, and the target's tokens are decoded
    after it is saved, for its clean inputs (``sequences[T].live`` false: the lab restores into an empty
    sequence, as a fresh context does, and compares with a prefill of its tokens)."""
    dest = Path(folder)
    if dest.exists() or dest.is_symlink():
        raise EngineLabError(f"{dest}: already exists (a new scenario is written into a new folder)")
    wanted = sorted({*(seqs or {}), *(prompts or {})})
    if not wanted:
        raise EngineLabError("a scenario needs at least one sequence (tokens or a prompt)")
    if target not in wanted:
        raise EngineLabError(f"the target sequence {target} has no tokens (sequences: {wanted})")
    for s in wanted:
        if not 0 <= s < params.n_seq_max:
            raise EngineLabError(f"sequence {s} is out of range for n_seq_max = {params.n_seq_max}")
    from kvscope.core.errors import path_kind

    what = path_kind(model)
    if what != "a regular file":  # before resolve(): a symlink loop raised RuntimeError there (an internal error)
        raise EngineLabError(f"{model}: {what} (--model names the GGUF model file)")
    model_path = Path(model).resolve()
    try:
        size, sha = _sha256_regular(model_path)
    except ValueError as e:
        raise EngineLabError(str(e)) from None
    parent = dest.resolve().parent
    if not parent.is_dir():
        raise EngineLabError(f"{parent}: no such folder")
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".partial", dir=parent))
    try:
        with _process(model_path, params, build, lib_path, n_threads) as p:
            toks = {s: [int(t) for t in v] for s, v in (seqs or {}).items()}
            for s, text in (prompts or {}).items():
                toks.setdefault(s, p.tokenize(text))
            empty = [s for s in wanted if not toks.get(s)]
            if empty:
                raise EngineLabError(f"sequence {empty[0]} has no tokens")
            rel = os.path.relpath(model_path, parent / dest.name)
            if empty_target and len(toks) < 2:
                raise EngineLabError("an empty target needs another sequence to be the live context")
            doc = _write(p, tmp, rel, model_path, size, sha, dict(sorted(toks.items())), params, target, next_token,
                         dict(prompts or {}), n_threads, empty_target)
        (tmp / "context.json").write_text(json.dumps(doc, indent=1) + "\n")
        _folder_mode(tmp)  # a scenario folder to share, as any folder the user makes: not 0700
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def decode_refusal(seq: int, n_tokens: int, failure: str | None, rc: Any, params: ContextParams) -> str:
    """Why llama.cpp did not decode a sequence's prompt, in words (``llama_decode``'s return codes: 1 no room
    in the context, 2 aborted, negative an invalid batch or an error), never "ok rc=1"."""
    what = f"llama.cpp could not decode sequence {seq}'s {n_tokens} tokens"
    if failure is not None:
        return f"{what}: {failure}"
    if rc == 1:
        return (f"{what}: they do not fit the context (llama_decode found no free cells; n_ctx {params.n_ctx}, "
                f"n_seq_max {params.n_seq_max}): give a shorter prompt or a larger --ctx-param n_ctx")
    if rc == 2:
        return f"{what}: the decode was aborted"
    return f"{what}: llama_decode returned {rc} (an invalid batch or an error in llama.cpp)"


def _folder_mode(path: Path) -> None:
    """A new folder's mode as ``mkdir`` gives it (0777 less the umask): ``mkdtemp`` made it 0700."""
    from kvscope.core.fsutil import current_umask

    os.chmod(path, 0o777 & ~current_umask())


def _write(p: LlamaSession, tmp: Path, rel: str, model: Path, size: int, sha: str, seqs: dict[int, list[int]],
           params: ContextParams, target: int, next_token: int | None, prompts: dict[int, str],
           n_threads: int, empty_target: bool) -> dict[str, Any]:
    info = p.info()
    live_seqs = [s for s in seqs if not (empty_target and s == target)]

    room = info.get("n_ctx_seq") or info.get("n_ctx") or params.n_ctx
    for s in seqs:  # a prompt longer than a sequence's cells is refused before llama.cpp is asked to decode it
        if isinstance(room, int) and len(seqs[s]) > room:
            raise EngineLabError(f"sequence {s}'s prompt is {len(seqs[s])} tokens, more than the {room} cells a "
                                 f"sequence has in this context (n_ctx {params.n_ctx}, n_seq_max "
                                 f"{params.n_seq_max}): give a shorter prompt or a larger --ctx-param n_ctx")

    def decode(s: int) -> None:
        o = p.prefill(s, seqs[s]).outcome
        if not o.ok or o.rc != 0:
            raise EngineLabError(decode_refusal(s, len(seqs[s]), o.summary() if not o.ok else None, o.rc,
                                                params))

    for s in live_seqs:
        decode(s)
    live = p.save("context_blob")
    (tmp / LIVE_STATE).write_bytes(live)
    all_tokens = [t for s in live_seqs for t in seqs[s]]
    try:
        (tmp / "context.session").write_bytes(p.save("session_file", tokens=all_tokens))
    except SaveRefused:
        raise EngineLabError("llama.cpp did not write the session file") from None
    if target not in live_seqs:
        decode(target)
    for s in seqs:
        (tmp / f"seq{s}.clean.seqdata.bin").write_bytes(p.save("seq_blob", s))
    try:
        (tmp / f"seq{target}.clean.seqstate").write_bytes(p.save("seq_file", target, tokens=seqs[target]))
    except SaveRefused:
        raise EngineLabError(f"llama.cpp did not write sequence {target}'s state file") from None
    full = p.save("context_blob")
    nt = int(next_token) if next_token is not None else seqs[target][-1]
    for s in seqs:
        o = p.logits(s, nt)
        if o.ok and o.rc == 0 and o.value is not None:
            np.save(tmp / f"baseline.seq{s}.next_logits.npy", np.asarray(o.value, dtype=np.float32))
        back = p.restore("context_blob", 0, data=full)
        if not back.ok or back.value != len(full):
            raise EngineLabError(f"llama.cpp does not restore its own state: {back.summary()}")
    build = info.get("build")
    writes, date = info.get("writes"), None
    if build:
        try:
            b = by_name(str(build))
            writes, date = writes or b.writes, b.date
        except BuildError:
            pass
    return {
        "generated_by": GENERATOR,
        "llama_cpp": {"build": build, "commit": info.get("commit"), "writes": writes,
                      "vendored_llama_cpp_commit_date": date, "lib_dir": info.get("lib_dir")},
        "model": {"file": model.name, "path_from_this_folder": rel, "sha256": sha, "size": size,
                  "architecture": info.get("architecture"), "n_vocab": info.get("n_vocab"),
                  "n_layer": info.get("n_layer")},
        "context_params": {"n_ctx": params.n_ctx, "n_batch": params.n_batch, "n_ubatch": params.n_ubatch,
                           "n_seq_max": params.n_seq_max, "kv_unified": params.kv_unified,
                           "flash_attn": params.flash_attn, "type_k": params.type_k, "type_v": params.type_v,
                           "swa_full": params.swa_full, "n_threads": n_threads,
                           "n_ctx_actual": info.get("n_ctx"), "n_ctx_seq_actual": info.get("n_ctx_seq")},
        "kv_caches": info.get("kv_caches"),
        "sequences": {str(s): {"tokens": toks, "prompt_text": prompts.get(s), "pos_min_max": [0, len(toks) - 1],
                               "live": s in live_seqs}
                      for s, toks in seqs.items()},
        "target": target,
        "next_token": {"token": nt},
        "files": {f.name: f.stat().st_size for f in sorted(tmp.iterdir())},
    }
