"""Rewrite one state file in its own or another layout generation: the library behind ``kvscope rewrite``
and ``kvscope migrate``.

A conversion that changes only framing (version words, the v4 rotation fields, the blob header)
is streamed from the source by :mod:`kvscope.core.convert.to_generation`: memory independent of the file size,
no torch. Anything else goes through the torch memory core (:mod:`kvscope.core.memory`), which
loads the state, checks that the target layout can say everything the source does, and writes
it. ``via_core`` forces the memory core also for framing changes (a self-check of the core).

:func:`rewrite_file` never raises for bad input: it returns a :class:`RewriteOutcome` whose
``code`` is 0 (written), 1 (cannot be exact: ``message`` says what is missing; nothing written)
or 2 (bad input: unreadable, damaged, unusable model, unknown layout). The source is opened
read-only and never modified; the output appears atomically.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvscope.core.findings import NEWER_CODES
from kvscope.core.fsutil import atomic_writer, output_problem, write_atomic
from kvscope.core.model.profile import ModelProfile

OK, INEXACT, BAD_INPUT = 0, 1, 2
TEMP_TAG = "rewrite-"


@dataclass
class RewriteOutcome:
    """What a rewrite did."""

    code: int
    message: str
    method: str = ""  # "framing" (streamed) or "memory core"
    source_layout: str | None = None
    target_layout: str | None = None
    size: int = 0
    notes: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.code == OK


def rewrite_file(
    src: str,
    out: str,
    layout: str | None = None,
    profile: ModelProfile | None = None,
    *,
    rotation: str = "auto",
    seq_id: int | None = None,
    drop_trailing: bool = False,
    via_core: bool = False,
    inputs: Sequence[str | os.PathLike[str]] = (),
) -> RewriteOutcome:
    """Write ``src`` to ``out`` in generation ``layout`` (default: the file's own).

    ``inputs``: the other files the caller read (the model): ``out`` names none of them nor ``src``, by any
    path, and is refused (BAD_INPUT) when it exists and is not a regular file, before ``src`` is read."""
    from kvscope.core.reader.layouts import generation_named
    from kvscope.core.reader.parse import ReadError, read_state

    refused = output_problem(out, [src, *inputs])
    if refused is not None:
        return RewriteOutcome(BAD_INPUT, refused)
    if not os.path.isfile(src):  # a folder, a FIFO or a device says what it is, not "no such file"
        from kvscope.core.errors import path_kind

        return RewriteOutcome(BAD_INPUT, f"{src}: {path_kind(src)}")
    if layout is not None and generation_named(layout) is None:
        from kvscope.core.reader.layouts import GENERATION_BY_NAME

        return RewriteOutcome(BAD_INPUT, f"unknown layout {layout!r}; known: {', '.join(GENERATION_BY_NAME)}")
    if rotation not in ("auto", "on", "off"):
        return RewriteOutcome(BAD_INPUT, f"--rotation must be auto, on or off, not {rotation!r}")
    try:
        res = read_state(src, profile=profile)
    except ReadError as e:
        return RewriteOutcome(BAD_INPUT, str(e))
    if res.kind == "unknown":
        return RewriteOutcome(BAD_INPUT, f"{src}: {res.findings[0].message if res.findings else 'not a state file'}")
    newer = next((f for f in res.findings if f.code in NEWER_CODES), None)
    if newer is not None:  # what the newer layout adds is unknown: rewriting it as a known one could drop it
        return RewriteOutcome(BAD_INPUT, f"{src}: written by a llama.cpp newer than kvscope knows, not rewritten: "
                              f"{newer.message} (offset {newer.offset})", source_layout=res.layout.name)
    errors = [f for f in res.findings if f.severity == "error"]
    if errors:
        return RewriteOutcome(BAD_INPUT, f"{src}: damaged or not from this model: {errors[0].message} "
                              f"(offset {errors[0].offset})", source_layout=res.layout.name)
    target = generation_named(layout).name if layout is not None else res.layout.name  # type: ignore[union-attr]
    if not via_core:
        from kvscope.core.convert.to_generation import plan_migration, write_plan

        plan = plan_migration(res, target, profile, rotation=rotation, seq_id=seq_id, drop_trailing=drop_trailing)
        if plan.supported:
            base = RewriteOutcome(OK, "", "framing", res.layout.name, target, notes=list(plan.notes),
                                  missing=list(plan.missing))
            if not plan.exact:
                base.code = INEXACT
                base.message = (f"cannot write {src} as layout {target} exactly; missing: " + "; ".join(plan.missing))
                return base
            with atomic_writer(out, TEMP_TAG) as fh:
                base.size = write_plan(plan, src, fh)
            how = "byte-identical" if target == res.layout.name else f"converted from {res.layout.name}"
            base.message = f"{out}: {res.kind}, layout {target}, {base.size} bytes ({how}; streamed)"
            return base
    return _through_core(res, src, out, target, profile, seq_id, drop_trailing, rotation)


def _through_core(
    res: object, src: str, out: str, target: str, profile: ModelProfile | None, seq_id: int | None,
    drop_trailing: bool, rotation: str = "auto",
) -> RewriteOutcome:
    from kvscope.core.memory.convert import conversion_problems
    from kvscope.core.memory.infer import InferError, infer_context, load, write
    from kvscope.core.memory.layout import Layout, LayoutError
    from kvscope.core.memory.spec import SpecError
    from kvscope.core.reader.records import ParseResult

    assert isinstance(res, ParseResult)
    with open(src, "rb") as fh:
        data = fh.read()
    trailing = sum(f.length for f in res.findings if f.code == "trailing_bytes")
    if trailing and not drop_trailing:
        return RewriteOutcome(INEXACT, f"{src}: {trailing} bytes follow the state and would be lost (--drop-trailing "
                              "to accept)", "memory core", res.layout.name, target)
    try:
        inf = infer_context(res, profile, seq_id=seq_id, rot_disabled={"on": False, "off": True}.get(rotation))
    except (InferError, SpecError, ValueError) as e:
        return RewriteOutcome(INEXACT, f"{src}: the memory core cannot hold this state: {e}", "memory core",
                              res.layout.name, target)
    loaded = load(inf, data)
    if not loaded.ok and loaded.check != "trailing":
        return RewriteOutcome(BAD_INPUT, f"{src}: restore failed: {loaded}", "memory core", res.layout.name, target)
    lay = Layout.named(target)
    outcome = RewriteOutcome(OK, "", "memory core", inf.layout.name, lay.name, notes=list(inf.notes))
    missing = conversion_problems(inf, res, lay)
    if missing:
        outcome.code, outcome.missing = INEXACT, list(missing)
        outcome.message = f"cannot write {src} as layout {lay.name} exactly; missing: " + "; ".join(missing)
        return outcome
    try:
        blob = write(inf, lay)
    except (LayoutError, ValueError) as e:
        outcome.code, outcome.message = INEXACT, f"cannot write {src} as layout {lay.name}: {e}"
        return outcome
    same = lay.name == inf.layout.name
    if same and bytes(blob) != data[: len(data) - trailing]:
        outcome.code, outcome.message = INEXACT, f"{src}: the rewrite in its own layout is not byte-identical"
        return outcome
    write_atomic(out, blob, TEMP_TAG)
    outcome.size = len(blob)
    how = "byte-identical" if same else f"converted from {inf.layout.name}"
    outcome.message = f"{out}: {res.kind}, layout {lay.name}, {len(blob)} bytes ({how}; memory core)"
    return outcome
