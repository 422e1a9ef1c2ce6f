"""Write GGUF files with gguf-py's ``GGUFWriter`` from plain metadata triples.

Metadata is a list of ``(key, type, value)`` with ``type`` one of ``u32 i32 u64 f32 bool str``
or ``arr_`` + one of those; the order is kept, so the same inputs give the same bytes. Files
are written to a temporary name beside the target and renamed into place.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Sequence
from typing import Any

import gguf
import numpy as np
import numpy.typing as npt

_TYPES = {
    "u32": gguf.GGUFValueType.UINT32,
    "i32": gguf.GGUFValueType.INT32,
    "u64": gguf.GGUFValueType.UINT64,
    "f32": gguf.GGUFValueType.FLOAT32,
    "bool": gguf.GGUFValueType.BOOL,
    "str": gguf.GGUFValueType.STRING,
}

MetaItem = tuple[str, str, Any]


def _add(writer: gguf.GGUFWriter, key: str, vtype: str, value: Any) -> None:
    if vtype.startswith("arr_"):
        sub = _TYPES[vtype[4:]]
        writer.add_key_value(key, list(value), gguf.GGUFValueType.ARRAY, sub_type=sub)
    else:
        writer.add_key_value(key, value, _TYPES[vtype])


def write_gguf(
    path: str | os.PathLike[str],
    arch: str,
    metadata: Iterable[MetaItem],
    tensors: Sequence[tuple[str, npt.NDArray[Any]]] = (),
) -> None:
    """Write a GGUF of architecture ``arch`` with ``metadata`` and ``tensors`` (NumPy order shapes;
    float32 and float16 arrays are stored as F32 and F16)."""
    target = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(target))
    fd, tmp = tempfile.mkstemp(prefix=".kvscope-gguf-", dir=folder)
    os.close(fd)
    try:
        writer = gguf.GGUFWriter(tmp, arch)
        for key, vtype, value in metadata:
            if key != "general.architecture":
                _add(writer, key, vtype, value)
        for name, arr in tensors:
            if arr.dtype not in (np.float32, np.float16):
                raise ValueError(f"tensor {name}: unsupported dtype {arr.dtype}")
            writer.add_tensor(name, np.ascontiguousarray(arr))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp made it private; a model file is not
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_metadata_only(path: str | os.PathLike[str], arch: str, metadata: Iterable[MetaItem]) -> None:
    """A GGUF with metadata and no tensors (what ``llama_model_init_from_user`` takes)."""
    write_gguf(path, arch, metadata, ())
