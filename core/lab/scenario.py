"""Lab scenarios: a model, context parameters, a live context, and the state to restore into one sequence.

A :class:`Scenario` is where every corrupt-and-restore experiment starts:

* the model's :class:`~kvscope.core.model.profile.ModelProfile` and the :class:`ContextParams` of the
  context (from a lab ``context.json``: ``context_params_struct``, else its summary fields; without one,
  inferred from the live state);
* the **live** context, built once: a whole-context state restored with ``set_data`` (``context.state.bin``),
  or per-sequence files restored one by one (the README's way around 0.3.35's two-stream bug);
* the clean :class:`RestoreInput` (a per-sequence blob or file, a context blob or a session file) and the
  destination sequence.

``load_scenario(folder)`` loads a lab scenario folder in one call. :class:`LiveCopy` gives the runner a
working context that is put back to the live state with one copy per tensor.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kvscope.core import fileio
from kvscope.core import ggml_types as gt
from kvscope.core.errors import InputError
from kvscope.core.fileio import open_regular, pread_into
from kvscope.core.memory import ContextParams, Layout, MemoryContext, ParamsError, ReadResult, SpecError
from kvscope.core.memory.layout import FLAG_PARTIAL_ONLY
from kvscope.core.model.profile import ModelProfile, load_model_or
from kvscope.core.reader.layouts import GENERATIONS
from kvscope.core.reader.parse import read_state
from kvscope.core.reader.records import ParseResult
from kvscope.core.reader.state_kinds import ALL_KINDS, PER_SEQUENCE_KINDS

INPUT_KINDS = ALL_KINDS  # every kind restores in the lab
API_BY_KIND = {"seq_blob": "seq_set_data", "seq_file": "seq_load_file", "context_blob": "set_data",
               "session_file": "load_file"}
# the reader llama.cpp uses for each API: the buffer APIs defer tensor writes, the file APIs do not
READER_BY_KIND = {"seq_blob": "buffer", "context_blob": "buffer", "seq_file": "file", "session_file": "file"}
KIND_BY_SUFFIX = {".seqdata.bin": "seq_blob", ".seqstate": "seq_file", ".state.bin": "context_blob",
                  ".session": "session_file"}
LIVE_STATE = "context.state.bin"


class ScenarioError(InputError, ValueError):
    """The scenario cannot be built (missing file, unusable model, a live state that does not load)."""


@dataclass(frozen=True)
class RestoreInput:
    """Bytes to restore and the API that takes them (``kind``: seq_blob, seq_file, context_blob, session_file)."""

    data: bytes
    kind: str
    name: str = ""
    flags: int = 0  # llama_state_seq_flags of a per-sequence blob (PARTIAL_ONLY: what the reader says it holds)

    def __post_init__(self) -> None:
        if self.kind not in INPUT_KINDS:
            raise ScenarioError(f"unknown input kind {self.kind!r} ({', '.join(INPUT_KINDS)})")
        if self.flags and self.kind != "seq_blob":
            raise ScenarioError(f"a {self.kind} takes no state flags (only a per-sequence blob does)")

    @property
    def per_seq(self) -> bool:
        return self.kind in PER_SEQUENCE_KINDS

    @property
    def api(self) -> str:
        return API_BY_KIND[self.kind]

    @property
    def reader(self) -> str:
        """The reader kind llama.cpp's API uses for this input."""
        return READER_BY_KIND[self.kind]

    def replace(self, data: bytes, name: str) -> RestoreInput:
        return RestoreInput(data, self.kind, name, self.flags)


def kind_of_path(path: Path) -> str | None:
    """The input kind a lab file name announces (``.seqdata.bin``, ``.seqstate``, ``.state.bin``, ``.session``)."""
    for suffix, kind in KIND_BY_SUFFIX.items():
        if path.name.endswith(suffix):
            return kind
    return None


def read_regular(path: Path) -> bytes:
    """The bytes of ``path`` if it is a regular file; ScenarioError otherwise (a FIFO is refused before it is
    opened: reading one would block forever)."""
    try:
        return fileio.read_regular(path)
    except OSError as e:
        raise ScenarioError(f"{path}: {e.strerror or e}") from None
    except ValueError as e:
        raise ScenarioError(f"{path}: {e}") from None


def read_input(source: str | Path | bytes | RestoreInput, profile: ModelProfile | None, name: str = "",
               kind: str | None = None) -> RestoreInput:
    """A :class:`RestoreInput` from a path or bytes; the kind comes from the reader's parse of the bytes."""
    if isinstance(source, RestoreInput):
        return source
    if isinstance(source, (str, Path)):
        path = Path(source)
        data = read_regular(path)
        name = name or path.name
        kind = kind or kind_of_path(path)
    else:
        data = bytes(source)
    flags = 0
    if kind is None or kind == "seq_blob":
        res = read_state(data=data, profile=profile)
        kind = kind or res.kind
        if kind not in INPUT_KINDS:
            raise ScenarioError(f"{name or 'the input'}: not a llama.cpp state the reader recognises")
        flags = FLAG_PARTIAL_ONLY if kind == "seq_blob" and res.kind == "seq_blob" and res.partial else 0
    return RestoreInput(data, kind, name, flags)


def restore_into(ctx: MemoryContext, inp: RestoreInput, dest: int, policy: str = "contained",
                 reader: str | None = None, n_token_capacity: int | None = None) -> ReadResult:
    """Restore ``inp`` with the API of its kind (``dest`` is ignored by the whole-context APIs)."""
    rd = reader or inp.reader
    if inp.kind == "seq_blob":
        return ctx.seq_set_data(inp.data, dest, inp.flags, policy=policy, reader=rd)
    if inp.kind == "seq_file":
        return ctx.seq_load_file(None, dest, n_token_capacity, data=inp.data, policy=policy, reader=rd)
    if inp.kind == "context_blob":
        return ctx.set_data(inp.data, policy=policy, reader=rd)
    return ctx.load_file(None, n_token_capacity, data=inp.data, policy=policy, reader=rd)


# ---------------------------------------------------------------------------------------------
# context parameters and layout


def _type_name(v: Any) -> str:
    return gt.type_name(int(v)) if isinstance(v, int) else str(v)


def _v_trans(res: ParseResult | None) -> bool | None:
    """V transposition recorded in a parsed state (None when no KV section holds data)."""
    for sec in res.sections if res is not None else []:
        for st in sec.streams if sec.kind == "kv" else []:
            if st.k_layers and st.v_trans is not None:
                return bool(st.v_trans)
    return None


def params_from_context_json(cj: Mapping[str, Any], live: ParseResult | None = None) -> ContextParams:
    """``ContextParams`` from a lab ``context.json`` (the full struct first, then the summary fields).

    ``flash_attn_type`` -1 (auto) is resolved from the V transposition of the ``live`` state.
    """
    struct = dict(cj.get("context_params_struct") or {})
    summary = dict(cj.get("context_params") or {})

    def pick(key: str, default: Any) -> Any:
        return struct[key] if struct.get(key) is not None else summary.get(key, default)

    fa = struct.get("flash_attn_type")
    if fa is None:
        fa = {"disabled": 0, "enabled": 1}.get(str(summary.get("flash_attn_type")), -1)
        if fa == -1 and summary.get("flash_attn") is not None:
            fa = int(bool(summary["flash_attn"]))
    if int(fa) == -1:
        vt = _v_trans(live)
        fa = 1 if vt is None else int(not vt)
    try:
        return ContextParams(
            n_ctx=int(pick("n_ctx", 512)), n_seq_max=int(pick("n_seq_max", 1)),
            kv_unified=bool(pick("kv_unified", False)), flash_attn=bool(fa),
            type_k=_type_name(pick("type_k", "f16")), type_v=_type_name(pick("type_v", "f16")),
            swa_full=bool(pick("swa_full", True)), n_batch=int(pick("n_batch", 2048)),
            n_ubatch=int(pick("n_ubatch", 512)),
        )
    except (ParamsError, KeyError, TypeError, ValueError) as e:
        raise ScenarioError(f"context parameters: {e}") from None


def choose_layout(parses: list[ParseResult], build_date: str | None = None) -> Layout:
    """The layout generation every parsed file is consistent with: the newest not after ``build_date``
    (``YYYY-MM-DD``), else the newest. The same bytes often fit several generations."""
    order = [g.name for g in GENERATIONS]
    pool: list[str] | None = None
    for res in parses:
        if res.kind == "unknown":
            continue
        names = {res.layout.name, *(str(n) for n in res.layout.features.get("byte_identical_layouts", []))}
        pool = [n for n in (pool if pool is not None else order) if n in names]
    if not pool:
        pool = [parses[0].layout.name] if parses and parses[0].kind != "unknown" else order
    if build_date:
        earlier = [n for n in pool if n <= build_date[:7]]
        if earlier:
            return Layout.named(earlier[-1])
    return Layout.named(pool[-1])


# ---------------------------------------------------------------------------------------------
# scenario


def live_sequences(ctx: MemoryContext) -> tuple[int, ...]:
    """Sequence ids holding at least one cell in any part of the memory."""
    mem = ctx.memory
    out = []
    for s in range(mem.params.n_seq_max):
        if any(p.mem.seq_pos_max(s) >= 0 for p in mem.parts):
            out.append(s)
    return tuple(out)


def blank_like(ctx: MemoryContext) -> MemoryContext:
    """An empty context with the same model, parameters, layout and arch."""
    mem = ctx.memory
    out = MemoryContext.create(mem.spec, mem.params, ctx.layout, device=mem.store.device)
    out.arch = ctx.arch
    return out


def _tensors(ctx: MemoryContext) -> list[torch.Tensor]:
    return [t for p in ctx.memory.parts for t in p.mem.tensors()]


class LiveCopy:
    """A working context that :meth:`reset` puts back to the live state (cells, outputs, every tensor byte)."""

    def __init__(self, live: MemoryContext) -> None:
        self.live = live
        self.ctx = blank_like(live)
        self._snap = live.memory.snapshot()
        self._bytes = [t.clone() for t in _tensors(live)]
        self.reset()

    def reset(self) -> MemoryContext:
        ctx = self.ctx
        ctx.memory.store.commit()  # drop a journal an interrupted transactional restore may have left
        ctx.memory.restore(self._snap)
        for dst, src in zip(_tensors(ctx), self._bytes, strict=True):
            dst.copy_(src)
        ctx.outputs, ctx.layout, ctx.arch = self.live.outputs, self.live.layout, self.live.arch
        return ctx


@dataclass
class Scenario:
    """Model + context + live sequences + the clean state to restore into ``target``."""

    profile: ModelProfile
    live: MemoryContext
    restore: RestoreInput
    target: int = 0
    name: str = ""
    folder: Path | None = None
    n_token_capacity: int | None = None  # for the file APIs (default: n_ctx, what a caller's buffer holds)
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = self.live.memory.params.n_seq_max
        if not 0 <= self.target < n:
            raise ScenarioError(f"target sequence {self.target} out of range [0, {n})")
        if self.n_token_capacity is None:
            self.n_token_capacity = self.live.memory.params.n_ctx_actual

    @property
    def params(self) -> ContextParams:
        return self.live.memory.params

    @property
    def layout(self) -> Layout:
        return self.live.layout

    @property
    def sequences(self) -> tuple[int, ...]:
        """The live sequences (holding cells before any restore)."""
        return live_sequences(self.live)

    @property
    def others(self) -> tuple[int, ...]:
        return tuple(s for s in self.sequences if s != self.target)

    def with_restore(self, restore: RestoreInput, target: int | None = None) -> Scenario:
        """The same live context with another input (and destination)."""
        return dataclasses.replace(self, restore=restore, target=self.target if target is None else target,
                                   notes=list(self.notes))

    def summary(self) -> dict[str, Any]:
        p, mem = self.params, self.live.memory
        return {
            "name": self.name, "arch": mem.spec.arch, "memory_class": mem.memory_class,
            "components": [pt.role for pt in mem.parts], "layout": self.layout.name, "n_stream": p.n_stream,
            "flash_attn": p.flash_attn, "n_ctx": p.n_ctx, "n_seq_max": p.n_seq_max, "target": self.target,
            "restore": {"name": self.restore.name, "kind": self.restore.kind, "api": self.restore.api,
                        "size": len(self.restore.data), "flags": self.restore.flags},
            "live_sequences": list(self.sequences), "notes": list(self.notes),
        }


def build_live(profile: ModelProfile, params: ContextParams, layout: Layout, state: RestoreInput | None = None,
               seqs: Mapping[int, RestoreInput] | None = None, device: str | None = None) -> MemoryContext:
    """The live context: ``state`` restored whole, or each of ``seqs`` into its sequence (clean restores)."""
    try:
        ctx = MemoryContext.create(profile, params, layout, device=device)
    except (SpecError, ParamsError, ValueError) as e:
        raise ScenarioError(f"cannot build a context for {profile.arch}: {e}") from None
    loads: list[tuple[int, RestoreInput]] = [(-1, state)] if state is not None else sorted((seqs or {}).items())
    if not loads:
        raise ScenarioError("no live state given (a whole-context state or per-sequence files)")
    for seq, inp in loads:
        if inp.per_seq != (state is None) or (state is None and seq < 0):
            raise ScenarioError(f"{inp.name or inp.kind}: a {inp.kind} cannot be the live "
                                f"{'context' if state is not None else f'sequence {seq}'}")
        res = restore_into(ctx, inp, seq, "contained", n_token_capacity=None)
        if not res.ok and res.check != "trailing":
            raise ScenarioError(f"the live state {inp.name or inp.kind} does not load: {res}")
    return ctx


def create_scenario(profile: ModelProfile, params: ContextParams | None, restore: RestoreInput, target: int = 0, *,
                    live_state: RestoreInput | None = None, live_seqs: Mapping[int, RestoreInput] | None = None,
                    layout: str | Layout | None = None, build_date: str | None = None, name: str = "",
                    folder: Path | None = None, overrides: Mapping[str, Any] | None = None,
                    device: str | None = None) -> Scenario:
    """A scenario from parts; ``params`` None infers them from the live state (notes say so);
    ``overrides`` replaces single :class:`ContextParams` fields; ``device`` holds the cache (default CPU)."""
    notes: list[str] = []
    lives = [live_state] if live_state is not None else list((live_seqs or {}).values())
    parses = [read_state(data=x.data, profile=profile) for x in (*lives, restore)]
    lay = layout if isinstance(layout, Layout) else (Layout.named(layout) if layout else
                                                    choose_layout(parses, build_date))
    if params is None:
        params = _inferred_params(parses[0], profile)
        notes.append("context parameters inferred from the live state (cells per stream rounded up to 256); "
                     "a context.json gives the exact ones")
    if overrides:
        try:
            params = dataclasses.replace(params, **dict(overrides))
        except (ParamsError, TypeError) as e:
            raise ScenarioError(f"context parameters: {e}") from None
    live = build_live(profile, params, lay, live_state, live_seqs, device)
    return Scenario(profile, live, restore, target, name, folder, notes=notes)


def _inferred_params(res: ParseResult, profile: ModelProfile) -> ContextParams:
    from kvscope.core.memory.infer import InferError, infer_context

    try:
        return infer_context(res, profile).ctx.memory.params
    except (InferError, SpecError, ParamsError, ValueError) as e:
        raise ScenarioError(f"cannot infer the context parameters: {e}") from None


def _profile(model: str | Path | ModelProfile | None, cj: Mapping[str, Any] | None, folder: Path) -> ModelProfile:
    if isinstance(model, ModelProfile):
        return model
    path: Path | None = Path(model) if model is not None else None
    if path is None and cj is not None:
        path = _recorded_model(cj, folder)
    if path is None:
        raise ScenarioError("no model: give the GGUF the state was written with")
    return load_model_or(path, ScenarioError)


def _sha256_regular(path: Path) -> tuple[int, str]:
    """``(size, sha256)`` of a regular file, read with pread (a FIFO or a device is refused unopened)."""
    import hashlib

    try:
        fd, st = open_regular(path)
    except OSError as e:
        raise ScenarioError(f"{path}: {e.strerror or e}") from None
    except ValueError as e:
        raise ScenarioError(f"{path}: {e}") from None
    h, buf, off = hashlib.sha256(), bytearray(8 << 20), 0
    try:
        while (n := pread_into(fd, memoryview(buf), off)) > 0:
            h.update(memoryview(buf)[:n])
            off += n
    except OSError as e:
        raise ScenarioError(f"{path}: {e.strerror or e}") from None
    finally:
        os.close(fd)
    return off, h.hexdigest()


def _recorded_model(cj: Mapping[str, Any], folder: Path) -> Path | None:
    """The model ``context.json`` names (``model.path_from_this_folder``), used only if it is the file recorded.

    A scenario folder is input like any other: its path may lead anywhere (``..``, absolute), so the model
    it names is opened only when its size and ``sha256`` match the ones recorded beside the path; with no
    sha256 recorded, only a path inside the scenario folder is followed. Otherwise ScenarioError (give
    ``--model``).
    """
    model = cj.get("model")
    entry: Mapping[str, Any] = model if isinstance(model, Mapping) else {}
    rel = entry.get("path_from_this_folder")
    if not rel:
        return None
    if not isinstance(rel, str):
        raise ScenarioError("context.json: model.path_from_this_folder is not a path")
    path = (folder / rel).resolve()
    want = entry.get("sha256")
    if not isinstance(want, str) or len(want) != 64:
        inside = path.is_relative_to(folder.resolve())
        if not inside:
            raise ScenarioError(f"context.json names the model {rel}, outside the scenario folder, with no sha256 "
                                "to check it against: give --model")
        return path
    recorded_size = entry.get("size")
    try:
        if isinstance(recorded_size, int) and os.stat(path).st_size != recorded_size:  # no hashing a wrong file
            raise ScenarioError(f"{path}: not the model context.json records ({os.stat(path).st_size} bytes, "
                                f"recorded {recorded_size}): give --model")
    except OSError as e:
        raise ScenarioError(f"{path}: {e.strerror or e}") from None
    size, got = _sha256_regular(path)
    if (isinstance(recorded_size, int) and size != recorded_size) or got != want.lower():
        raise ScenarioError(f"{path}: not the model context.json records (sha256 {got[:16]}..., recorded "
                            f"{want[:16]}...): give --model")
    return path


def load_scenario(path: str | Path, *, model: str | Path | ModelProfile | None = None,
                  restore: str | Path | bytes | RestoreInput | None = None, into: int = 0, live: str = "state",
                  live_seqs: Mapping[int, str | Path | bytes] | None = None, layout: str | None = None,
                  params: ContextParams | None = None, overrides: Mapping[str, Any] | None = None,
                  device: str | None = None) -> Scenario:
    """A scenario from a lab scenario folder, its ``context.json``, or a live state file.

    ``live``: ``state`` restores the live whole-context state; ``seqs`` restores the folder's
    ``seq{N}.clean.seqdata.bin`` files (or ``live_seqs``) one sequence at a time. ``restore`` defaults
    to the folder's ``seq{into}.clean.seqdata.bin``. ``model`` defaults to the GGUF that ``context.json``
    names. ``params`` replaces the parameters of ``context.json``, ``overrides`` single fields of them.
    """
    p = Path(path)
    if p.is_dir():
        folder, cj_path, state_path = p, p / "context.json", p / LIVE_STATE
    elif p.suffix == ".json":
        folder, cj_path, state_path = p.parent, p, p.parent / LIVE_STATE
    elif p.exists():
        folder, cj_path, state_path = p.parent, p.parent / "context.json", p
    else:
        raise ScenarioError(f"{p}: no such file or folder")
    cj: dict[str, Any] | None = None
    if cj_path.exists():
        try:
            cj = json.loads(read_regular(cj_path).decode("utf-8"))
        except ValueError as e:  # UnicodeDecodeError and JSONDecodeError alike
            raise ScenarioError(f"{cj_path}: {e}") from None
        except RecursionError:  # lists in lists 100,000 deep: not a context.json (was an internal error)
            raise ScenarioError(f"{cj_path}: not a lab scenario's context.json (nested too deeply)") from None
    elif p.is_dir() or p.suffix == ".json":
        raise ScenarioError(f"{cj_path}: no such file (a lab scenario folder has a context.json)")
    if cj is None and model is None:
        _no_model_why(p)
    prof = _profile(model, cj, folder)
    state: RestoreInput | None = None
    seqs: dict[int, RestoreInput] | None = None
    if live_seqs:
        seqs = {int(s): read_input(src, prof, kind=None) for s, src in live_seqs.items()}
    elif live == "seqs":
        files = sorted(folder.glob("seq*.clean.seqdata.bin"))
        if not files:
            raise ScenarioError(f"{folder}: no seq*.clean.seqdata.bin files to build the live context from")
        seqs = {int(f.name[3 : f.name.index(".")]): read_input(f, prof) for f in files}
    elif live == "state":
        if not state_path.exists():
            raise ScenarioError(f"{state_path}: no such file")
        state = read_input(state_path, prof)
        if state.per_seq:
            raise ScenarioError(f"{state_path}: a per-sequence {state.kind} cannot be the live context")
    else:
        raise ScenarioError(f"unknown live source {live!r} (state, seqs)")
    if restore is None:
        default = folder / f"seq{into}.clean.seqdata.bin"
        if not default.exists():
            raise ScenarioError(f"no state to restore: give one (there is no {default.name} next to the context)")
        restore = default
    inp = read_input(restore, prof)
    live_parse = read_state(data=state.data, profile=prof) if state is not None else None
    if params is None and cj is not None:
        params = params_from_context_json(cj, live_parse)
    date = ((cj or {}).get("llama_cpp") or {}).get("vendored_llama_cpp_commit_date")
    writes = ((cj or {}).get("llama_cpp") or {}).get("writes")  # recorded by kvscope's own scenario writer
    if layout is None and isinstance(writes, str) and writes in {g.name for g in GENERATIONS}:
        layout = writes
    name = _scenario_name(folder)
    return create_scenario(prof, params, inp, into, live_state=state, live_seqs=seqs, layout=layout,
                           build_date=str(date) if date else None, name=name, folder=folder, overrides=overrides,
                           device=device)


def _no_model_why(p: Path) -> None:
    """``--context FILE`` with no context.json beside it and no ``--model``: ScenarioError saying what FILE is
    (a FIFO, a device, not a state file) before asking for the model, which only a state file needs."""
    from kvscope.core.errors import path_kind

    what = path_kind(p)
    if what != "a regular file":
        raise ScenarioError(f"{p}: {what}")
    try:
        res = read_state(str(p))
    except (ValueError, OSError) as e:
        raise ScenarioError(f"{p}: {e}") from None
    if res.kind == "unknown":
        why = res.findings[0].message if res.findings else "not a llama.cpp state file"
        raise ScenarioError(f"{p}: {why}; --context takes a whole-context state, a lab scenario folder or its "
                            "context.json")
    raise ScenarioError(f"{p}: no model: no context.json beside it names one; give --model (the GGUF the state was "
                        "written with)")


def _scenario_name(folder: Path) -> str:
    """``llamacpp-2026-10-01/llama/fa0-unified1``: the folder below (and with) its build folder, if any."""
    folder = folder.resolve()
    for up in (folder, *folder.parents):
        if up.name.startswith("llamacpp-"):
            return str(folder.relative_to(up.parent))
    return folder.name
