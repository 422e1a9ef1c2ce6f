"""Which libllama kvscope may drive through llama-cpp-python 0.3.36, and how that is checked.

The binding declares ctypes prototypes for the llama.cpp 0c1e5709 ``llama.h``; a library built
from another header may load and then corrupt memory. Three checks, stdlib only:

* identity (parent side, nothing loaded): a folder from kvscope's build cache carries a
  ``BUILD.json``; its ``llama.h`` sha256 must be one of the pinned headers (0c1e5709 and b11434,
  identical apart from the two state-format version numbers). A foreign folder cannot be
  identified: :func:`identify` says so in a warning and what the other checks cover. The
  folder's files must still have the sha256 its ``BUILD.json`` recorded at build time
  (``builds.check_files``): a changed one is refused before anything is loaded, and a cache made
  before the record existed is identified but not verified (a warning saying how to rebuild it).
* symbols (child side): the library exports every function in :data:`REQUIRED_SYMBOLS`.
* defaults (child side): ``llama_context_default_params()`` and ``llama_model_default_params()``,
  read through the binding's struct layouts, give the 0c1e5709 values (:func:`default_problems`):
  a shifted or resized struct shows up as wrong values.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvscope.core.engine.builds import BUILDS, LlamaBuild, check_files, rebuild_hint
from kvscope.core.errors import SetupError

BINDING_PACKAGE = "llama_cpp_python"  # distribution name of llama-cpp-python
BINDING_VERSION = "0.3.36"
BINDING_ABI = "0c1e5709"  # the llama.cpp tree llama-cpp-python 0.3.36 vendors and binds
BINDING_LABEL = f"llama-cpp-python {BINDING_VERSION} (llama.cpp {BINDING_ABI} ABI)"
INSTALL_HINT = ("CMAKE_ARGS='-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF' pip install 'kvscope[engine]' "
                "(kvscope supplies libllama from its pinned builds: kvscope llama-build)")

# Every libllama/ggml function the worker calls (directly or through the binding).
REQUIRED_SYMBOLS: tuple[str, ...] = (
    "llama_backend_init", "llama_log_set", "llama_print_system_info",
    "llama_model_default_params", "llama_context_default_params",
    "llama_model_load_from_file", "llama_model_free", "llama_init_from_model", "llama_free",
    "llama_model_get_vocab", "llama_vocab_n_tokens", "llama_model_n_layer", "llama_model_n_embd",
    "llama_model_n_params", "llama_model_size", "llama_model_desc", "llama_model_meta_val_str",
    "llama_n_ctx", "llama_n_ctx_seq", "llama_n_batch", "llama_n_ubatch", "llama_n_seq_max",
    "llama_get_memory", "llama_memory_clear", "llama_memory_seq_rm",
    "llama_memory_seq_pos_min", "llama_memory_seq_pos_max",
    "llama_batch_init", "llama_batch_free", "llama_decode", "llama_get_logits_ith",
    "llama_state_get_size", "llama_state_get_data", "llama_state_set_data",
    "llama_state_save_file", "llama_state_load_file",
    "llama_state_seq_get_size_ext", "llama_state_seq_get_data_ext", "llama_state_seq_set_data_ext",
    "llama_state_seq_save_file", "llama_state_seq_load_file",
    "ggml_set_abort_callback",
)

# llama_context_default_params() / llama_model_default_params() at 0c1e5709 (and b11434).
CONTEXT_DEFAULTS: dict[str, Any] = {
    "n_ctx": 512, "n_batch": 2048, "n_ubatch": 512, "n_seq_max": 1, "n_rs_seq": 0,
    "n_outputs_max": 0, "n_outputs_max_per_seq": 1, "ctx_type": 0, "rope_scaling_type": -1,
    "pooling_type": -1, "attention_type": -1, "flash_attn_type": -1, "rope_freq_base": 0.0,
    "rope_freq_scale": 0.0, "yarn_ext_factor": -1.0, "yarn_attn_factor": -1.0, "yarn_beta_fast": -1.0,
    "yarn_beta_slow": -1.0, "yarn_orig_ctx": 0, "defrag_thold": -1.0, "type_k": 1, "type_v": 1,
    "embeddings": False, "offload_kqv": True, "no_perf": True, "op_offload": True, "swa_full": True,
    "kv_unified": False, "n_samplers": 0,
}
MODEL_DEFAULTS: dict[str, Any] = {
    "n_gpu_layers": -1, "split_mode": 1, "load_mode": -1, "lazy_mode": 1, "main_gpu": 0,
    "vocab_only": False, "check_tensors": False, "use_extra_bufts": True, "no_host": False,
    "no_alloc": False, "load_mtp": False,
}

KNOWN_HEADERS: dict[str, LlamaBuild] = {b.llama_h_sha256: b for b in BUILDS}


class ABIMismatch(SetupError):
    """The library is not the ABI the binding was written for: one line saying what differs."""


@dataclass(frozen=True)
class LibIdentity:
    """What kvscope knows about a libllama folder before loading it."""

    lib_dir: Path
    build: LlamaBuild | None  # the pinned build the folder is, when it is one
    llama_h_sha256: str | None
    verified: bool  # the header is one of the known ones
    warning: str | None  # for a foreign build: that the ABI cannot be verified, and what is checked

    def to_json(self) -> dict[str, Any]:
        return {"lib_dir": str(self.lib_dir), "build": self.build.name if self.build else None,
                "llama_h_sha256": self.llama_h_sha256, "verified": self.verified, "warning": self.warning,
                "binding": BINDING_LABEL}


def _build_json(lib_dir: Path) -> tuple[Path, dict[str, Any]] | None:
    for cand in (lib_dir / "BUILD.json", lib_dir.parent / "BUILD.json"):
        try:
            info = json.loads(cand.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(info, dict):
            return cand, info
    return None


def identify(lib_dir: Path) -> LibIdentity:
    """Identify ``lib_dir`` (a folder holding libllama.so); raises :class:`ABIMismatch`."""
    found = _build_json(lib_dir)
    if found is None:
        warning = (f"the ABI of {lib_dir} cannot be verified (no kvscope BUILD.json beside it): kvscope checks only "
                   f"that it exports the {len(REQUIRED_SYMBOLS)} functions it calls and that its default "
                   f"context and model parameters read back as {BINDING_LABEL} expects")
        return LibIdentity(lib_dir, None, None, False, warning)
    path, info = found
    sha = info.get("llama_h_sha256")
    if not isinstance(sha, str):  # BUILD.json written before the header hash was recorded
        by_sdist = next((b for b in BUILDS if b.sha256 == info.get("sha256")), None)
        if by_sdist is None:
            raise ABIMismatch(f"{path} names neither a llama.h sha256 nor a pinned sdist: cannot tell whether "
                              f"{lib_dir} matches {BINDING_LABEL}")
        sha = by_sdist.llama_h_sha256
    build = KNOWN_HEADERS.get(sha)
    if build is None:
        raise ABIMismatch(f"{lib_dir} was built from a llama.h (sha256 {sha[:16]}...) that is not the llama.cpp "
                          f"{BINDING_ABI} header {BINDING_LABEL} binds")
    files = check_files(path.parent, info)  # the built files, before anything loads them
    if files.problems:
        more = f" (and {len(files.problems) - 1} more)" if len(files.problems) > 1 else ""
        raise ABIMismatch(f"{path.parent} was changed after it was built: {files.problems[0]}{more}; "
                          f"{rebuild_hint(build)}")
    if not files.recorded:
        return LibIdentity(lib_dir, build, sha, False,
                           f"llama.cpp build {build.name} in {path.parent} was cached before kvscope recorded the "
                           f"sha256 of its files, so they cannot be checked: {rebuild_hint(build)}")
    return LibIdentity(lib_dir, build, sha, True, None)


def default_problems(ctx_params: Any, model_params: Any) -> list[str]:
    """Fields of the two default-parameter structs that do not read back as at 0c1e5709."""
    out = []
    for label, obj, want in (("llama_context_default_params", ctx_params, CONTEXT_DEFAULTS),
                             ("llama_model_default_params", model_params, MODEL_DEFAULTS)):
        for field, value in want.items():
            got = getattr(obj, field, None)
            if got != value:
                out.append(f"{label}().{field} = {got!r}, expected {value!r}")
    return out
