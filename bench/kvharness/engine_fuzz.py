"""The differential fuzz of the memory core against real llama.cpp: one definition for the CI test
(tests/lab/test_fuzz_engine.py, hypothesis) and the long run (bench/fuzz_engine.py, plain random).

**Sources.** Every tiny model of tests/data/llamacpp-2026-10-01 (llama: kv, gemma2: iswa, mamba:
recurrent, lfm2: hybrid, qwen2vl: kv with M-RoPE cells), llama again with a unified cache and flash
attention, and a folder of generated models (``kvscope.core.modelgen``'s model of every memory
class, :func:`write_gen_models`; tests/data/gen-models by default when it exists). Each is a live
two-sequence context decoded by the engine itself (seq 0 and seq 1 prompts, one decode each),
with every input kind: a seq blob, a seq file, a context blob and a session file, written by the
engine from the live context (real fixtures of that build). A source llama.cpp cannot run, or
whose memory the core cannot hold (yet), is skipped with its reason: :class:`Arena` raises
:class:`Unsupported`, per input kind ``Arena.skipped``; new memory classes join when the core
supports them.

**Cases.** :func:`draw_corruption` picks one of the catalog's kinds (truncate, set, fill, drop, swap,
dup-cell, trailer) with random offsets, fields, counts, values and truncation points, addressed
through the input's structure; ``pick(lo, hi)`` is the only source of randomness (hypothesis'
``data.draw`` in CI, ``random.Random`` in the long run). :meth:`Arena.case` restores the corrupted
bytes in the core (policy ``contained``, the API's reader) and in llama.cpp from the same live
context and returns the :func:`~kvscope.core.lab.engine_lab.disagreements`: return value, per-component
outcome, other sequences, the whole state afterwards byte for byte, recovery, crashes.

:data:`KNOWN` lists the explained differences (none so far); regression cases live in
tests/data/engine-regressions/ (one JSON per case).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvharness.fixtures import DATA, MODELS
from kvscope.core.engine.llamacpp import CtxParams, EngineError, EngineSetupError
from kvscope.core.lab.corruptions import Corruption, CorruptionError, spec_of
from kvscope.core.lab.engine_cells import Disagreement, EngineCell, disagreements
from kvscope.core.lab.engine_lab import EngineLabRunner
from kvscope.core.lab.engine_live import EngineLabError, LiveSpec, LlamaLive
from kvscope.core.lab.report import CellResult
from kvscope.core.lab.runner import LabCase
from kvscope.core.memory import ContextParams
from kvscope.core.model.profile import ModelProfile, ModelProfileError, load_model_profile
from kvscope.core.reader.parse import read_state
from kvscope.core.reader.records import ParseResult

GEN_MODELS = DATA / "gen-models"
REGRESSIONS = DATA / "engine-regressions"
KINDS = ("seq_blob", "seq_file", "context_blob", "session_file")
CORRUPTION_KINDS = ("truncate", "set", "fill", "drop", "swap", "dup-cell", "trailer")
SEQS = {0: [1, 298, 303, 308, 311, 316, 320], 1: [1, 332, 337, 47, 298, 324, 327]}
NEXT_TOKEN = 327
TINY = ("llama", "gemma2", "mamba", "lfm2", "qwen2vl")
# (case field) -> why the core and llama.cpp may differ there; empty: every difference is a failure
KNOWN: dict[str, str] = {}

Pick = Callable[[int, int], int]  # an integer in [lo, hi]


class Unsupported(Exception):
    """The source cannot be fuzzed in this build: the reason, for the report."""


@dataclass(frozen=True)
class Source:
    key: str
    model: Path
    ctx: CtxParams
    seqs: dict[int, list[int]] = field(default_factory=lambda: dict(SEQS))


def _ctx(unified: bool = False, flash: bool = False) -> CtxParams:
    return CtxParams(n_ctx=256 if unified else 512, n_batch=256, n_ubatch=256, n_seq_max=2, kv_unified=unified,
                     flash_attn=flash, n_threads=2)


def sources(gen_models: Path | None = None) -> list[Source]:
    """Every source, tiny models first, then the generated models of every memory class (``gen_models``:
    another folder of them, e.g. ``python -m kvscope.core.modelgen --out DIR``)."""
    out = [Source(k, MODELS / f"tiny-{k}.gguf", _ctx()) for k in TINY]
    out.append(Source("llama-unified-fa", MODELS / "tiny-llama.gguf", _ctx(True, True)))
    folder = gen_models or GEN_MODELS
    if folder.is_dir():
        out += [Source(f"gen-{p.stem}", p, _ctx()) for p in sorted(folder.glob("*.gguf"))]
    return out


def write_gen_models(out: Path) -> Path:
    """``kvscope.core.modelgen``'s model of every memory class in ``out`` (deterministic; kept when there)."""
    from kvscope.core.modelgen import load_recipe, model_keys, write_model

    out.mkdir(parents=True, exist_ok=True)
    for key in model_keys():
        if not (out / f"{key}.gguf").is_file():
            write_model(load_recipe(key), out / f"{key}.gguf")
    return out


def source_named(key: str, gen_models: Path | None = None) -> Source:
    for s in sources(gen_models):
        if s.key == key:
            return s
    raise KeyError(f"no fuzz source {key!r}")


def _params(ctx: CtxParams, flash: bool) -> ContextParams:
    return ContextParams(n_ctx=ctx.n_ctx, n_seq_max=ctx.n_seq_max, kv_unified=ctx.kv_unified, flash_attn=flash,
                         type_k=ctx.type_k, type_v=ctx.type_v, swa_full=ctx.swa_full, n_batch=ctx.n_batch,
                         n_ubatch=ctx.n_ubatch)


@dataclass
class CaseResult:
    source: str
    build: str
    kind: str
    spec: str
    description: str
    data: bytes
    core: CellResult
    engine: EngineCell
    disagreements: list[Disagreement]

    def unexplained(self) -> list[Disagreement]:
        return [d for d in self.disagreements if d.field not in KNOWN]

    def to_json(self) -> dict[str, Any]:
        e, c = self.engine.result, self.core
        return {"source": self.source, "build": self.build, "kind": self.kind, "spec": self.spec,
                "description": self.description, "size": len(self.data),
                "sha256": hashlib.sha256(self.data).hexdigest(),
                "core": {"returned": c.restore.returned, "check": c.restore.failed_check, "target": c.target.state},
                "engine": {"returned": e.restore.returned, "message": e.restore.message, "aborted": self.engine.aborted,
                           "target": e.target.state},
                "disagreements": [d.to_json() for d in self.disagreements]}


class Arena:
    """One source in one build: llama.cpp's live context and a core runner per input kind."""

    def __init__(self, source: Source, build: str) -> None:
        self.source, self.build = source, build
        try:
            self.profile: ModelProfile = load_model_profile(source.model)
        except ModelProfileError as e:
            raise Unsupported(f"kvscope cannot read the model: {e}") from None
        n_vocab = self.profile.n_vocab
        seqs = {s: [t % n_vocab for t in toks] for s, toks in source.seqs.items()}
        spec = LiveSpec(str(source.model), source.ctx, seqs, 0, "seq_blob", NEXT_TOKEN % n_vocab, source.key)
        try:
            self.live = LlamaLive(spec, build=build, baseline=False)
        except (EngineSetupError, EngineLabError, EngineError) as e:
            raise Unsupported(f"llama.cpp {build} cannot run it: {e}") from None
        flash = self.live.info.get("flash_attn") == "enabled" if source.ctx.flash_attn is None else bool(
            source.ctx.flash_attn)
        params = _params(source.ctx, flash)
        self.runners: dict[str, EngineLabRunner] = {}
        self.skipped: dict[str, str] = {}
        for kind in KINDS:
            try:
                self.runners[kind] = EngineLabRunner.from_live(self.profile, params, self.live, kind, "both", [])
            except (EngineLabError, ValueError) as e:
                self.skipped[kind] = str(e)
        if not self.runners:
            reasons = sorted(set(self.skipped.values()))
            self.live.close()
            raise Unsupported("; ".join(reasons))
        self._parsed: dict[str, ParseResult] = {}
        self._n = 0

    def clean(self, kind: str) -> bytes:
        return self.runners[kind].scenario.restore.data

    def parsed(self, kind: str) -> ParseResult:
        if kind not in self._parsed:
            self._parsed[kind] = read_state(data=self.clean(kind), profile=self.profile)
        return self._parsed[kind]

    def mutate(self, kind: str, c: Corruption) -> tuple[bytes, str]:
        """The corrupted input (CorruptionError when the corruption does not apply)."""
        m = c.apply(self.clean(kind), self.profile)
        return m.data, m.description

    def case(self, kind: str, c: Corruption | None, data: bytes | None = None, description: str = "") -> CaseResult:
        """Restore one corrupted input in the core and in llama.cpp; ``data`` gives the bytes directly."""
        r = self.runners[kind]
        if data is None:
            assert c is not None
            data, description = self.mutate(kind, c)
        self._n += 1
        name = f"fuzz-{self._n}"
        lc = LabCase(name, data=data, description=description)
        engine = r.run_case(lc)
        core = r.runner.run_cell(lc, "contained", r.reader)
        r.runner.forget(name)
        spec = spec_of(c) if c is not None else "bytes"
        return CaseResult(self.source.key, self.build, kind, spec, description, data, core, engine,
                          disagreements(core, engine))

    @property
    def restarts(self) -> int:
        return self.live.restarts

    def close(self) -> None:
        self.live.close()


_ARENAS: dict[tuple[str, str, Path | None], Arena | str] = {}


def arena(key: str, build: str, gen_models: Path | None = None) -> Arena | str:
    """The arena of a source in a build (kept until :func:`close_arenas`), or why there is none."""
    if (key, build, gen_models) not in _ARENAS:
        try:
            _ARENAS[key, build, gen_models] = Arena(source_named(key, gen_models), build)
        except Unsupported as e:
            _ARENAS[key, build, gen_models] = str(e)
    return _ARENAS[key, build, gen_models]


def close_arenas() -> None:
    """Close every arena :func:`arena` kept (their engine children exit) and forget them."""
    while _ARENAS:
        _, a = _ARENAS.popitem()
        if isinstance(a, Arena):
            a.close()


# ---------------------------------------------------------------------------------------------
# drawing corruptions


def _choice(pick: Pick, items: list[Any]) -> Any:
    return items[pick(0, len(items) - 1)]


def _values(pick: Pick, width: int = 4) -> str:
    return str(_choice(pick, [f"+{pick(1, 3)}", f"-{pick(1, 3)}", "0", "other",
                              str(pick(0, 2 ** (8 * width - 1) - 1)), "0x7fffffff", str(pick(1, 1024))]))


def _units(res: ParseResult) -> list[tuple[int, int | None, Any]]:
    """(section index, stream index or None, the stream or section) for every part holding a cell table."""
    out: list[tuple[int, int | None, Any]] = []
    for i, sec in enumerate(res.sections):
        if sec.kind == "kv":
            out += [(i, st.index, st) for st in sec.streams]
        else:
            out.append((i, None, sec))
    return out


def _record_params(pick: Pick, res: ParseResult) -> tuple[dict[str, str], int] | None:
    """Parameters addressing one random tensor record, and its row count."""
    recs = [(i, st, r) for i, sec in enumerate(res.sections) for st, lst in (
        [(s.index, [*s.k_layers, *s.v_layers]) for s in sec.streams] if sec.kind == "kv" else
        [(None, [*sec.r_layers, *sec.s_layers])]) for r in lst]
    if not recs:
        return None
    i, st, r = _choice(pick, recs)
    p = {"section": str(i), "role": r.role, "index": str(r.index)}
    if st is not None:
        p["stream"] = str(st)
    return p, int(r.n_rows)


def draw_corruption(pick: Pick, res: ParseResult, size: int) -> Corruption:
    """One corruption of the catalog's kinds with random parameters, addressed through ``res``'s structure."""
    kind = _choice(pick, list(CORRUPTION_KINDS))
    if kind == "truncate":
        return Corruption("truncate", {"at": str(pick(0, max(0, size - 1)))})
    if kind == "trailer":
        return Corruption("trailer", {"bytes": str(pick(1, 64)), "byte": str(pick(0, 255))})
    if kind == "set":
        return _draw_set(pick, res)
    rec = _record_params(pick, res)
    p, rows = rec if rec is not None else ({"role": "k"}, 1)
    if kind == "fill":
        a = pick(0, max(0, rows - 1))
        b = pick(a, max(a, rows - 1))
        p.update(value=_choice(pick, ["nan", "inf", "0xff", "zeros"]), cells=f"{a}-{b}")
        if pick(0, 3) == 0:
            p["then_fail"] = _choice(pick, ["v", "s"])
        return Corruption("fill", p)
    if kind == "drop":
        return Corruption("drop", p)
    if kind == "swap":
        p.pop("index", None)
        p.update(a=str(pick(0, 7)), b=str(pick(0, 7)))
        return Corruption("swap", p)
    units = _units(res)
    i, st, _ = _choice(pick, units) if units else (0, None, None)
    p = {"section": str(i), "cell": str(pick(0, 15)), "into": str(pick(0, 15))}
    if st is not None:
        p["stream"] = str(st)
    return Corruption("dup-cell", p)


def _draw_set(pick: Pick, res: ParseResult) -> Corruption:
    header = [f for f in ("magic", "version", "n_token_count", "io_magic", "seq_id_header")
              if res.root.find("/" + ("seq_id" if f == "seq_id_header" else f)) is not None]
    choices: list[dict[str, str]] = [{"field": f} for f in header]
    for i, st, unit in _units(res):
        base = {"section": str(i)} | ({"stream": str(st)} if st is not None else {})
        choices.append(base | {"field": "cell_count"})
        table = unit.cells
        if table is not None and table.count:
            cell = str(pick(0, table.count - 1))
            choices += [base | {"field": f, "cell": cell} for f in ("pos", "n_seq_id", "seq_id")]
        if st is not None and unit.k_layers:
            choices += [base | {"field": f} for f in ("v_trans", "n_layer")]
        elif st is None and unit.kind == "recurrent":
            choices += [base | {"field": f} for f in ("s_trans", "n_layer")]
        if st is not None and st == 0:
            choices.append({"section": str(i), "field": "n_stream"})
    rec = _record_params(pick, res)
    if rec is not None:
        choices += [rec[0] | {"field": f} for f in ("type", "row_size", "el_size", "n_embd_v_gqa")]
    p = dict(_choice(pick, choices)) if choices else {"field": "magic"}
    p["value"] = _values(pick, 8 if p["field"] == "row_size" else 4)
    return Corruption("set", p)


def draw_case(pick: Pick, ar: Arena) -> tuple[str, Corruption]:
    kind = _choice(pick, sorted(ar.runners))
    res = ar.parsed(kind)
    return kind, draw_corruption(pick, res, len(ar.clean(kind)))


# ---------------------------------------------------------------------------------------------
# regressions


def regression_cases() -> Iterator[tuple[Path, dict[str, Any]]]:
    for p in sorted(REGRESSIONS.glob("*.json")):
        yield p, json.loads(p.read_text())


def parse_corruption(spec: str) -> Corruption:
    from kvscope.core.lab.corruptions import parse_spec

    return parse_spec(spec)


__all__ = ["KINDS", "KNOWN", "Arena", "CaseResult", "CorruptionError", "Source", "Unsupported", "arena",
           "draw_case", "draw_corruption", "parse_corruption", "regression_cases", "source_named", "sources"]
