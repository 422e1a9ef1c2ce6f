"""Raw ggml bytes in torch ``uint8`` tensors: byte-range writes with an undo journal, and
float conversion through gguf-py's (de)quantizers.

Every cache tensor holds exactly the bytes llama.cpp's backend tensor holds, so quantized types
round-trip bit for bit. All mutations that a restore performs go through :class:`TensorStore`
(``write``, ``zero``, ``zero_all``): with the journal on, each records the bytes it replaces so a
``transactional`` restore can put them back (:meth:`TensorStore.rollback`).
"""

from __future__ import annotations

import warnings

import numpy as np
import numpy.typing as npt
import torch
from gguf import GGMLQuantizationType
from gguf import quants as gq

from kvscope.core import ggml_types as gt
from kvscope.core.errors import InputError

U8 = npt.NDArray[np.uint8]


class ConversionError(InputError, ValueError):
    """A float conversion gguf-py cannot do (e.g. quantizing to iq4_nl)."""


def resolve_device(device: torch.device | str | None) -> torch.device:
    """CPU by default; a CUDA device when asked for and available (else a clear error)."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {dev} requested but CUDA is not available")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device {dev}: only cpu and cuda are supported")
    return dev


def host_array(t: torch.Tensor) -> U8:
    """The bytes of ``t`` as a numpy array (a view on CPU, a copy from a CUDA device)."""
    if t.device.type != "cpu":
        t = t.cpu()
    return t.numpy()


def tensor_from_host(a: npt.NDArray[np.uint8], device: torch.device) -> torch.Tensor:
    """A uint8 tensor on ``device`` holding the bytes of ``a`` (read-only buffers allowed)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch warns about non-writable numpy arrays
        t = torch.from_numpy(np.ascontiguousarray(a))
    return t.to(device)


def strided(flat: torch.Tensor, offset: int, stride: int, count: int, size: int) -> torch.Tensor:
    """``count`` byte ranges of ``size`` bytes, ``stride`` apart from ``offset``, as a 2-D view."""
    return flat.as_strided((count, size), (stride, 1), flat.storage_offset() + offset)


class TensorStore:
    """Allocates the tensors of one memory on one device and performs journaled byte writes."""

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.device = resolve_device(device)
        self._journal: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    def alloc(self, *shape: int) -> torch.Tensor:
        """A zeroed uint8 tensor (llama.cpp clears its KV buffers at creation)."""
        if self.device.type == "cpu":  # calloc'd pages: no fill pass, no thread-pool round trip
            return torch.from_numpy(np.zeros(shape, dtype=np.uint8))
        return torch.zeros(shape, dtype=torch.uint8, device=self.device)

    # -- journal -----------------------------------------------------------------------------
    @property
    def journaling(self) -> bool:
        """True while the undo journal records writes."""
        return self._journal is not None

    def begin_journal(self) -> None:
        """Start recording the bytes every write replaces."""
        self._journal = []

    def commit(self) -> None:
        """Stop recording and forget the journal."""
        self._journal = None

    def rollback(self) -> None:
        """Put back, newest first, every byte range replaced since :meth:`begin_journal`."""
        journal, self._journal = self._journal or [], None
        for view, old in reversed(journal):
            view.copy_(old)

    def _record(self, view: torch.Tensor) -> None:
        if self._journal is not None:
            old = torch.from_numpy(view.numpy().copy()) if view.device.type == "cpu" else view.clone()
            self._journal.append((view, old))

    @staticmethod
    def _fill0(view: torch.Tensor) -> None:
        # numpy's memset on CPU: torch's parallel fill costs a thread-pool round trip per call
        if view.device.type == "cpu":
            view.numpy()[...] = 0
        else:
            view.zero_()

    # -- writes ------------------------------------------------------------------------------
    def write(self, flat: torch.Tensor, offset: int, src: npt.NDArray[np.uint8], stride: int = 0,
              count: int = 1) -> None:
        """Write ``count`` ranges of ``len(src) // count`` bytes at ``offset + i * stride``."""
        size = int(src.size) // count if count else 0
        if size == 0 or count == 0:
            return
        view = strided(flat, offset, stride or size, count, size)
        self._record(view)
        src2 = src.reshape(count, size)
        if view.device.type == "cpu":
            view.numpy()[...] = src2
        else:
            view.copy_(tensor_from_host(src2, view.device))

    def zero(self, flat: torch.Tensor, offset: int, size: int, stride: int = 0, count: int = 1) -> None:
        """Zero ``count`` ranges of ``size`` bytes (``llama_clear_tensor_data``)."""
        if size == 0 or count == 0:
            return
        view = strided(flat, offset, stride or size, count, size)
        self._record(view)
        self._fill0(view)

    def zero_all(self, t: torch.Tensor) -> None:
        """Zero a whole tensor (``ggml_backend_buffer_clear``)."""
        self._record(t)
        self._fill0(t)


# -- float views ------------------------------------------------------------------------------


def dequantize_rows(raw: torch.Tensor, type_id: int) -> torch.Tensor:
    """float32 ``[n, n_elements]`` from ``n`` raw rows of ggml type ``type_id`` (uint8 ``[n, row]``)."""
    arr = np.ascontiguousarray(host_array(raw))
    out = gq.dequantize(arr, GGMLQuantizationType(type_id))
    return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32))


def quantize_rows(values: torch.Tensor | npt.NDArray[np.float32], type_id: int) -> U8:
    """Raw rows (uint8 ``[n, row]``) of ``values`` (float ``[n, n_elements]``) in type ``type_id``."""
    x = values.detach().cpu().numpy() if isinstance(values, torch.Tensor) else np.asarray(values)
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ConversionError(f"expected [rows, elements] values, got shape {x.shape}")
    bs = gt.block_size(type_id)
    if x.shape[1] % bs:
        raise ConversionError(f"{x.shape[1]} elements are not whole {gt.type_name(type_id)} blocks of {bs}")
    try:
        q = gq.quantize(x, GGMLQuantizationType(type_id))
    except NotImplementedError:
        raise ConversionError(f"gguf-py cannot quantize to {gt.type_name(type_id)}") from None
    raw = np.ascontiguousarray(q).view(np.uint8).reshape(x.shape[0], -1)
    want = gt.row_size(type_id, x.shape[1])
    if raw.shape[1] != want:
        raise ConversionError(f"quantized row is {raw.shape[1]} bytes, expected {want}")
    return raw
