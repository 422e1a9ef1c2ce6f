"""The corruption catalog: named, parameterised mutations of a state, addressed by its structure.

Every mutation parses the input with the reader and finds its target through the structure
(sections, streams, cells, layer records), never through hand-computed offsets. A mutation is
planned as a few :class:`Edit` s of the input (:meth:`Corruption.plan`: write these bytes here, fill
that range with a pattern, swap two ranges, delete ranges, cut, append), so it can be made in memory
(:meth:`Corruption.apply` returns new bytes and a one-line description; the input bytes are never
modified) or in place in a copy on disk (:func:`apply_edits_fd`, ``kvscope corrupt``: memory about
what the edits touch, not the file's size).

Spec syntax (``kvscope lab --corrupt SPEC``, ``kvscope corrupt --corrupt SPEC``): a catalog name
(``truncated_half``) or ``KIND:key=value,...``, e.g. ``truncate:at=half``, ``set:field=cell_count,value=+1``,
``fill:value=nan,role=k,index=0,cells=0-3``, ``drop:role=k,il=1``, ``swap:role=k,a=0,b=1``,
``dup-cell:cell=2``, ``trailer:bytes=16``. The parse is strict (:data:`KEYS`): a key the kind does not
take, a key given twice, an empty or malformed value, a value out of range (``byte=0x1ff``), a selector
that selects nothing in the file (``index=9`` of 3 records, ``kv_layer=`` past the model's KV layers)
is refused in one line naming the key, never ignored: the copy is the damage asked for or none.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvscope.core.lab.corruption_plans import PLAN
from kvscope.core.lab.corruption_specs import (
    KEYS,
    KINDS,
    MAX_TRAILER,
    CorruptionError,
    _int,
    _show,
    cells_text,
    check_params,
)
from kvscope.core.lab.state_edits import Damage, Edit, apply_edits, apply_edits_fd
from kvscope.core.model.profile import ModelProfile
from kvscope.core.reader.parse import read_state
from kvscope.core.reader.source import ByteSource

# the catalog's vocabulary, planning and edits live in corruption_specs, corruption_plans and state_edits;
# this module is what the rest of kvscope imports
__all__ = ["CATALOG", "KEYS", "KINDS", "MAX_TRAILER", "Corruption", "CorruptionError", "Damage", "Edit", "Mutation",
           "apply_edits", "apply_edits_fd", "cells_text", "check_params", "parse_spec", "spec_of"]


@dataclass(frozen=True)
class Mutation:
    """The mutated bytes, what was done, and the byte ranges touched in the *input*."""

    data: bytes
    description: str
    ranges: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Corruption:
    """One parameterised mutation; ``name`` is its catalog name or its spec. The parameters are checked when
    it is made (:class:`CorruptionError`: a key the kind does not take, a malformed or out-of-range value)."""

    kind: str
    params: dict[str, str] = field(default_factory=dict)
    name: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise CorruptionError(f"unknown corruption kind {_show(self.kind)} (known: {', '.join(KINDS)})")
        check_params(self.kind, self.params)

    @property
    def label(self) -> str:
        return self.name or spec_of(self)

    @property
    def appends(self) -> int:
        """Bytes this mutation adds at the end (a trailer's), known before any file is read."""
        return _int("bytes", self.params.get("bytes", "16")) if self.kind == "trailer" else 0

    def plan(self, src: ByteSource, profile: ModelProfile | None = None) -> Damage:
        """The edits that make this mutation of ``src`` (read, never written)."""
        res = read_state(src, profile=profile)
        if res.kind == "unknown":
            raise CorruptionError("the input is not a state file the reader understands")
        return PLAN[self.kind](src, res, self.params, profile)

    def apply(self, data: bytes, profile: ModelProfile | None = None) -> Mutation:
        """The mutated copy of ``data`` in memory (``data`` itself is never modified)."""
        d = self.plan(ByteSource(data, "<bytes>"), profile)
        return Mutation(apply_edits(data, d.edits), d.description, d.ranges)


def spec_of(c: Corruption) -> str:
    return c.kind + (":" + ",".join(f"{k}={v}" for k, v in c.params.items()) if c.params else "")


def parse_spec(spec: str) -> Corruption:
    """A :class:`Corruption` from a catalog name or ``KIND:key=value,...`` (strict: :func:`check_params`)."""
    spec = spec.strip()
    if spec in CATALOG:
        return CATALOG[spec]
    kind, _, rest = spec.partition(":")
    if not kind.strip():
        raise CorruptionError("no corruption kind (a catalog name or KIND:key=value,...)")
    params: dict[str, str] = {}
    for item in rest.split(",") if rest.strip() else []:
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise CorruptionError(f"bad corruption parameter {_show(item)} (expected key=value)")
        if key in params:
            raise CorruptionError(f"{_show(key)} given twice")
        params[key] = value.strip()
    return Corruption(kind.strip(), params)


# ---------------------------------------------------------------------------------------------
# the standard catalog (names as in the real llama.cpp failed-restore fixtures, plus more)


def _c(name: str, kind: str, **params: Any) -> Corruption:
    return Corruption(kind, {k: str(v) for k, v in params.items()}, name)


CATALOG: dict[str, Corruption] = {c.name: c for c in (
    _c("truncated_after_seq_header", "truncate", node="/memory", at="start"),
    _c("truncated_half", "truncate", at="half"),
    _c("truncated_last_byte", "truncate", at="-1"),
    _c("cell_count_huge", "set", field="cell_count", value="0x7fffffff"),
    _c("cell_count_plus1", "set", field="cell_count", value="+1"),
    _c("cell_count_minus1", "set", field="cell_count", value="-1"),
    _c("cell_count_zero", "set", field="cell_count", value="0"),
    _c("nan_rows_valid", "fill", value="0xff"),
    _c("nan_rows_late_fail", "fill", value="0xff", then_fail="v"),
    _c("drop_k_layer_1", "drop", role="k", kv_layer="1"),
    _c("swa_cell_count_huge", "set", field="cell_count", section="kv_swa", value="0x7fffffff"),
    _c("swa_truncated_in_data", "truncate", section="kv_swa", at="middle"),
    _c("recr_cell_count_huge", "set", field="cell_count", section="recurrent", value="0x7fffffff"),
    _c("recr_truncated_in_data", "truncate", section="recurrent", at="middle"),
    _c("nan_rows_late_fail_recr", "fill", value="0xff", then_fail="s"),
    _c("trailer_16", "trailer", bytes="16"),
    _c("n_stream_plus1", "set", field="n_stream", value="+1"),
    _c("v_trans_flipped", "set", field="v_trans", value="other"),
    _c("n_layer_minus1", "set", field="n_layer", value="-1"),
    _c("k_type_layer0_other", "set", field="type", role="k", index="0", value="other"),
    _c("nan_rows_k_layer0", "fill", value="nan", role="k", index="0"),
    _c("inf_rows_v_last", "fill", value="inf", role="v", index="-1"),
    _c("zero_rows_all", "fill", value="zeros"),
    _c("swap_k_layers_0_1", "swap", role="k", a="0", b="1"),
    _c("dup_cell_0", "dup-cell", cell="0"),
)}
