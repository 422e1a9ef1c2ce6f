"""Which llama.cpp releases write a parsed state file, which load it, and what one release does with it.

Everything comes from the release table (:mod:`kvscope.core.reader.releases`) and the per-generation
compatibility answers (:mod:`kvscope.core.analysis.compat`):

* :func:`written_by`: the release ranges whose writers produce these bytes: the epochs whose generation is the
  file's layout (or a layout the reader found byte-identical for it), after the table's class exceptions;
* :func:`loads_in` / :func:`unknown_in`: the ranges whose readers accept the file (the compat answer of each
  epoch's generation), and those kvscope cannot answer for (an epoch with no kvscope generation, or a compat
  answer that needs the model);
* :func:`target_answer`: ``inspect --target``'s answer for one release: loads, refuses (llama.cpp's message),
  crashes (a sequence file cut inside its last loop of records: ``GGML_ASSERT``) or unknown, what a refused
  restore leaves behind in that release (failure containment from b11200), and the ``kvscope rewrite``
  command that migrates the file exactly where the compat table says one does;
* :func:`release_generation`: the one generation a release reads a file as (``scan --target RELEASE``).

Class exceptions applied from the parse: the file's kind; its memory class (from ``--model``, else from its
sections: kv, iSWA, recurrent, hybrid, hybrid-iSWA, hybrid-idx, DeepSeek-V4); PARTIAL_ONLY (certain only with
``--model``); whether its cells carry an extension; MLA (``--model`` only). Not applied (the table marks them
``decided=False``): G's unrotated quantized K/V (values only), MiniMax-M3's ``k_idx`` section in b10142–b10240 and
Qwen4exp's 2x indexer rows in b11334–b11401 (both need the architecture, and kvscope reads neither layout), H's
early rotation rule (values only). The recurrent ``n_layer`` of an MTP model (with ``--model``: the whole block
count before b9544, the trunk from b9544) splits epoch J: b9479-b9543 are unknown for such a file, b9544 on read it
as 2026-08. Without ``--model`` an iSWA PARTIAL_ONLY blob reads as a plain KV blob, so epoch I's SWA exception is
not applied to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvscope.core.reader.releases import (
    CLASS_EXCEPTIONS,
    CONTAINMENT_FROM,
    EPOCHS,
    RELEASE_DATES,
    ClassException,
    Epoch,
    Release,
)

if TYPE_CHECKING:
    from kvscope.core.analysis.compat import GenCompat
    from kvscope.core.model.profile import ModelProfile
    from kvscope.core.reader.records import ParseResult


@dataclass(frozen=True)
class FileFacts:
    """What the class exceptions ask of a file."""

    kind: str
    classes: frozenset[str]
    partial: bool | None  # None: not known without the model
    cell_ext: bool


def file_facts(res: ParseResult, profile: ModelProfile | None = None) -> FileFacts:
    """The file's kind, memory class(es), PARTIAL_ONLY and cell extension, as far as the parse tells."""
    roles = {s.role for s in res.sections}
    kinds = {s.kind for s in res.sections}
    classes: set[str] = set()
    if profile is not None:
        classes.add(profile.memory_class)
        if profile.is_mla:
            classes.add("mla")
        if profile.n_layer_nextn and any(s.kind == "recurrent" for s in res.sections):
            classes.add("mtp")  # its recurrent n_layer changed meaning at b9544
    if any(k.startswith("dsv4") for k in kinds):
        classes.add("dsv4")
    elif profile is None:
        rec = "recurrent" in kinds
        if rec and "kv_swa" in roles:
            classes.add("hybrid_iswa")
        elif rec and "kv_idx" in roles:
            classes.add("hybrid_idx")
        elif rec and "kv" in kinds:
            classes.add("hybrid")
        elif rec:
            classes.add("recurrent")
        elif "kv_swa" in roles:
            classes.add("iswa")
        elif roles <= {"kv"}:
            classes.add("kv")
    ext = any(st.cells is not None and st.cells.ext_bytes for s in res.sections if s.kind == "kv"
              for st in s.streams)
    partial = res.partial if (profile is not None or res.partial_certain or res.partial) else None
    return FileFacts(res.kind, frozenset(classes), partial, bool(ext))


def _matches(ex: ClassException, facts: FileFacts) -> bool:
    if not ex.decided:
        return False
    if ex.kinds and facts.kind not in ex.kinds:
        return False
    if ex.classes and not facts.classes & set(ex.classes):
        return False
    if ex.partial is not None and facts.partial is not ex.partial:
        return False
    return ex.cell_ext is None or ex.cell_ext == facts.cell_ext


@dataclass(frozen=True)
class Segment:
    """Releases ``lo``..``hi`` of one epoch (None: the epoch's own bounds) and the generation they write."""

    epoch: Epoch
    lo: int | None
    hi: int | None
    generation: str | None
    why: str = ""

    def contains(self, n: int | None) -> bool:
        if n is None or self.lo is None or self.hi is None:
            return True
        return self.lo <= n <= self.hi

    @property
    def first(self) -> str:
        return f"b{self.lo}" if self.lo is not None else self.epoch.first

    @property
    def last(self) -> str:
        return f"b{self.hi}" if self.hi is not None else self.epoch.last

    @property
    def first_date(self) -> str | None:
        return RELEASE_DATES.get(self.lo, None) if self.lo is not None else self.epoch.first_date

    @property
    def last_date(self) -> str | None:
        return RELEASE_DATES.get(self.hi, None) if self.hi is not None else self.epoch.last_date


def segments(epoch: Epoch, facts: FileFacts) -> list[Segment]:
    """The epoch cut where a class exception that fits the file covers only some of its releases."""
    segs = [Segment(epoch, epoch.first_b, epoch.last_b, epoch.generation)]
    done = [False]
    for ex in CLASS_EXCEPTIONS:
        if ex.epoch != epoch.id or not _matches(ex, facts):
            continue
        new: list[Segment] = []
        flags: list[bool] = []
        for seg, fixed in zip(segs, done, strict=True):
            if fixed:
                new.append(seg)
                flags.append(True)
                continue
            lo = ex.first_b if ex.first_b is not None else seg.lo
            hi = ex.last_b if ex.last_b is not None else seg.hi
            if seg.lo is not None and seg.hi is not None and lo is not None and hi is not None:
                lo, hi = max(lo, seg.lo), min(hi, seg.hi)
                if lo > hi:
                    new.append(seg)
                    flags.append(False)
                    continue
                if lo > seg.lo:
                    new.append(Segment(epoch, seg.lo, lo - 1, seg.generation))
                    flags.append(False)
                new.append(Segment(epoch, lo, hi, ex.generation, ex.why))
                flags.append(True)
                if hi < seg.hi:
                    new.append(Segment(epoch, hi + 1, seg.hi, seg.generation))
                    flags.append(False)
            else:
                new.append(Segment(epoch, seg.lo, seg.hi, ex.generation, ex.why))
                flags.append(True)
        segs, done = new, flags
    return segs


def all_segments(facts: FileFacts) -> list[Segment]:
    return [s for ep in EPOCHS for s in segments(ep, facts)]


def _range(group: list[Segment]) -> dict[str, Any]:
    a, b = group[0], group[-1]
    return {"first": a.first, "last": b.last, "first_date": a.first_date, "last_date": b.last_date,
            "epochs": list(dict.fromkeys(s.epoch.id for s in group)),
            "verified": all(s.epoch.verified for s in group)}


def _merge(flags: list[tuple[Segment, bool]]) -> list[dict[str, Any]]:
    """Runs of consecutive segments whose flag is set, each as one range."""
    out: list[dict[str, Any]] = []
    run: list[Segment] = []
    for seg, on in flags:
        if on:
            run.append(seg)
        elif run:
            out.append(_range(run))
            run = []
    if run:
        out.append(_range(run))
    return out


def file_generations(res: ParseResult) -> set[str]:
    """The file's layout generation and those the reader found byte-identical for it."""
    return {res.layout.name, *res.layout.features.get("byte_identical_layouts", ())}


def written_by(res: ParseResult, profile: ModelProfile | None = None) -> list[dict[str, Any]]:
    """The release ranges whose writers produce these bytes (empty for a file that is not a state)."""
    if res.kind == "unknown":
        return []
    gens = file_generations(res)
    return _merge([(s, s.generation in gens) for s in all_segments(file_facts(res, profile))])


def _segment_answer(seg: Segment, compat: list[GenCompat]) -> str:
    """``loads`` | ``refuses`` | ``unknown`` for a build of the segment reading the file."""
    if seg.generation is None:
        return "unknown"
    entry = next((c for c in compat if c.generation == seg.generation), None)
    if entry is None or entry.loads is None:
        return "unknown"
    return "loads" if entry.loads else "refuses"


def loads_in(res: ParseResult, compat: list[GenCompat], profile: ModelProfile | None = None,
             answer: str = "loads") -> list[dict[str, Any]]:
    """The release ranges whose readers give ``answer`` (``loads``, ``refuses`` or ``unknown``) for the file."""
    if res.kind == "unknown":
        return []
    segs = all_segments(file_facts(res, profile))
    return _merge([(s, _segment_answer(s, compat) == answer) for s in segs])


def releases_json(res: ParseResult, compat: list[GenCompat] | None,
                  profile: ModelProfile | None = None) -> dict[str, Any]:
    """Every inspection's ``releases`` key: ``written_by``, ``loads_in`` and ``unknown_in`` (None: the
    compatibility was not worked out)."""
    return {"written_by": written_by(res, profile),
            "loads_in": loads_in(res, compat, profile) if compat is not None else None,
            "unknown_in": loads_in(res, compat, profile, "unknown") if compat is not None else None}


def _short(first: str | None, last: str | None) -> str:
    if first is None and last is None:
        return ""
    if first is None:
        return f" (→ {last})"
    if last is None or last == first:
        return f" ({first})"
    same_year = last[:4] == first[:4]
    return f" ({first} → {last[5:] if same_year else last})"


def range_text(r: dict[str, Any]) -> str:
    """``b10644–b11401 (2026-08-27 → 10-05)``; ``b11434 (2026-10-06)``."""
    eps = r["epochs"]
    first = r["first"] if r["first"].startswith("b") else f"epoch {eps[0]}"
    last = r["last"] if r["last"].startswith("b") else f"epoch {eps[-1]}"
    if first.startswith("epoch") and last.startswith("epoch"):
        last = last.removeprefix("epoch ")
    span = first if first in (last, f"epoch {last}") else f"{first}–{last}"
    return span + _short(r["first_date"], r["last_date"]) + ("" if r["verified"] else " (unverified)")


def releases_line(rel: dict[str, Any]) -> str:
    """The one line: ``written by b10644–b11401 (2026-08-27 → 10-05); loads in …``."""
    def ranges(rs: list[dict[str, Any]] | None) -> str:
        return ", ".join(range_text(r) for r in rs or []) or "no release this kvscope knows"

    line = f"written by {ranges(rel['written_by'])}"
    if rel.get("loads_in") is not None:
        line += f"; loads in {ranges(rel['loads_in'])}"
        if rel.get("unknown_in"):
            line += f"; unknown in {ranges(rel['unknown_in'])}"
    return line


# ---- one release: inspect --target

AFTER_HEADER = "nothing changed (refused at the header)"
AFTER_CONTAINED = f"the target sequence is removed (failure containment, PR #27530, from b{CONTAINMENT_FROM})"
AFTER_UNCONTAINED = ("the target sequence is removed, but bytes already read may stay in free cells (this release "
                     f"predates failure containment, b{CONTAINMENT_FROM})")
AFTER_UNKNOWN = f"whether a refused restore is contained (from b{CONTAINMENT_FROM}) is not known for this release"


def _after(entry: GenCompat | None, release: Release) -> str | None:
    if entry is None or entry.loads is not False:
        return None
    if entry.stage == "header":
        return AFTER_HEADER
    contained = release.contained()
    return {True: AFTER_CONTAINED, False: AFTER_UNCONTAINED}.get(contained, AFTER_UNKNOWN)  # type: ignore[arg-type]


def _one(seg: Segment, res: ParseResult, profile: ModelProfile | None, compat: list[GenCompat],
         release: Release) -> tuple[str, str, GenCompat | None]:
    from kvscope.core.analysis.consumers import cut_file_answer
    from kvscope.core.pinned_builds import build_writing

    if seg.generation is None:
        why = f": {seg.why}" if seg.why else ""
        return "unknown", (f"epoch {seg.epoch.id} ({seg.first}–{seg.last}) writes and reads a layout kvscope does "
                           f"not model for this file{why}"), None
    entry = next((c for c in compat if c.generation == seg.generation), None)
    if entry is None:
        return "unknown", f"no compatibility answer for layout {seg.generation}", None
    if entry.loads is not False and build_writing(seg.generation) is not None:
        cut = cut_file_answer(res, profile)
        if cut is not None:
            return cut.answer, cut.message, entry
    if entry.loads is None:
        return "unknown", entry.answer, entry
    if entry.loads:
        msg = "" if entry.answer == "loads" else entry.answer  # a silent misread says how
        if entry.launch_env and entry.launch_answer != "loads":
            msg = f"on a default launch; launched with {entry.launch_env} it refuses: {entry.launch_answer}"
        return "loads", msg, entry
    return "refuses", entry.answer, entry


def target_answer(res: ParseResult, profile: ModelProfile | None, compat: list[GenCompat], release: Release,
                  file: str = "FILE") -> dict[str, Any]:
    """``inspect --target``'s ``target`` object: ``release``, ``answer`` (loads | refuses | crashes | unknown),
    ``message`` (llama.cpp's refusal, or why the answer is unknown), ``migrate`` (the ``kvscope rewrite``
    command that migrates the file exactly for this release, else None), and ``epochs``, ``generation``,
    ``exact_message``, ``after_refusal`` (what a refused restore leaves behind), ``validation`` (the release's
    read-path changes), ``migrate_note`` and ``notes``."""
    out: dict[str, Any] = {"release": release.name, "answer": "unknown", "message": "", "migrate": None,
                           "epochs": [e.id for e in release.epochs], "generation": None, "exact_message": False,
                           "after_refusal": None, "validation": [v.what for v in release.validation()],
                           "migrate_note": None, "verified": release.verified, "notes": list(release.notes)}
    if release.newer:
        out["message"] = (f"{release.name} is newer than this kvscope knows: what it does with the file is unknown"
                          f" ({release.notes[0]})" if release.notes else "")
        return out
    facts = file_facts(res, profile)
    found: list[tuple[Segment, str, str, GenCompat | None]] = []
    for ep in release.epochs:
        for seg in segments(ep, facts):
            if seg.contains(release.number):
                found.append((seg, *_one(seg, res, profile, compat, release)))
    answers = {(a, m) for _, a, m, _ in found}
    gens = {s.generation for s, _, _, _ in found}
    if len(answers) != 1:
        out["message"] = "; ".join(f"{s.epoch.id} {s.first}–{s.last}: {a}" + (f" ({m})" if m else "")
                                   for s, a, m, _ in found)
        out["notes"].append(f"{release.name} falls in more than one epoch or sub-range; they answer differently")
        return out
    seg, answer, message, entry = found[0]
    out["answer"], out["message"] = answer, message
    out["generation"] = seg.generation if len(gens) == 1 else None
    out["exact_message"] = bool(entry is not None and entry.exact_message and answer == "refuses")
    if entry is not None and entry.notes:
        out["notes"].extend(entry.notes)
    if answer == "refuses":
        out["after_refusal"] = _after(entry, release)
    if answer != "loads" and entry is not None and len(gens) == 1:
        from kvscope.core.analysis.compat import migration_text

        if entry.migratable:
            out["migrate"] = f"kvscope rewrite {file} -o OUT --layout {seg.generation}"
        out["migrate_note"] = migration_text(entry) or None
    return out


def target_text(t: dict[str, Any]) -> str:
    """The text line of ``inspect --target``."""
    gen = f", layout {t['generation']}" if t.get("generation") else ""
    eps = "/".join(t.get("epochs") or []) or "none known"
    line = f"target {t['release']} (epoch {eps}{gen}): {t['answer']}"
    if t["message"]:
        line += f": {t['message']}"
    if t.get("after_refusal"):
        line += f"; afterwards: {t['after_refusal']}"
    if t.get("migrate"):
        line += f"; migrate: {t['migrate']}"
    elif t.get("migrate_note"):
        line += f"; {t['migrate_note']}"
    return line


def release_generation(res: ParseResult, profile: ModelProfile | None, release: Release) -> tuple[str | None, str]:
    """The one generation ``release`` reads this file as (``scan --target RELEASE``), or None and why not."""
    if release.newer:
        return None, f"{release.name} is newer than this kvscope knows"
    facts = file_facts(res, profile)
    segs = [s for ep in release.epochs for s in segments(ep, facts) if s.contains(release.number)]
    gens = {s.generation for s in segs}
    if len(gens) == 1 and None not in gens:
        return segs[0].generation, ""
    if None in gens:
        s = next(s for s in segs if s.generation is None)
        return None, f"epoch {s.epoch.id} reads a layout kvscope does not model for this file"
    names = ", ".join(sorted(str(g) for g in gens))
    return None, f"{release.name} falls in epochs that read this file as different layouts ({names})"


def release_ranges(res: ParseResult, compat: list[GenCompat] | None,
                   profile: ModelProfile | None) -> dict[str, Any] | None:
    """:func:`releases_json` of a state file (None for bytes that are not one): the Overview's ``releases``,
    worked out again when the compatibility table comes in."""
    return releases_json(res, compat, profile) if res.kind != "unknown" else None
