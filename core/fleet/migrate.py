"""``kvscope migrate``: every state file of SOURCE into DEST in another layout generation, restartably.

:func:`migrate_entry` is the per-file function the executors run. For one file it:

- skips it when the manifest says it was done before: the source's size and mtime match the
  record, and so do the sha256 of the source and of the output in DEST (``already``);
- copies it, byte for byte, when a build of the target generation already loads it as it is
  (``copied``), so DEST is a whole slot store for the new build;
- rewrites it with :func:`kvscope.core.convert.rewrite.rewrite_file` when that can be exact
  (``migrated``: framing-only changes such as 2026-10 -> 2026-10-v4 are streamed without torch,
  others go through the memory core);
- otherwise writes nothing and says why: ``cannot`` (the target layout cannot say everything the
  file holds, or the model is needed to tell), ``damaged``, ``skipped`` (not a state file),
  ``unreadable`` or ``error``.

Outputs keep their path relative to SOURCE and appear atomically, staged in a temporary folder
of DEST and renamed into place by descriptor without following a symbolic link
(:mod:`kvscope.core.fleet.destdir`): a folder of DEST that is a link (into SOURCE, or anywhere)
gets no output (``error``, naming it), and nothing is ever written outside DEST. SOURCE is only
ever opened read-only; a folder of SOURCE that leads into DEST is not walked (``skipped``). A
file that changes while it is migrated is reported, and its output removed. The client appends
one JSON line per file written to the manifest ``DEST/.kvscope-migrate.jsonl``
(:data:`~kvscope.core.fleet.source.MANIFEST_NAME`): relative path, layout, source size, mtime,
sha256, output size and sha256, and whether the tensor values were scanned (``--stats``: a file whose
values hold NaN/Inf or zero rows is then ``damaged`` and not written; a later run with ``--stats`` scans
what an earlier run without it wrote). DEST must be a local folder (on a cluster: one every worker
mounts at the same path).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

from kvscope.core.errors import UsageError
from kvscope.core.fleet import destdir
from kvscope.core.fleet.source import MANIFEST_NAME, Entry, local_copy
from kvscope.core.fsutil import sha256_file, temp_name, temporary_folder

CHUNK = 8 << 20
TEMP_TAG = "migrate"  # DEST/.kvscope-tmp-migrate-*: a run's staging folders (swept by the next run)
# errors of writing an output, whatever call raised them: reported against the output's path
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}
ACTIONS = ("migrated", "copied", "already", "cannot", "damaged", "skipped", "unreadable", "error")
DONE_ACTIONS = ("migrated", "copied", "already")  # the file is in DEST, loading in the target
PROBLEM_ACTIONS = ("cannot", "damaged", "unreadable", "error")  # a state file that did not get there


@dataclass(frozen=True)
class MigrateItem:
    """One file to migrate, with its manifest record from an earlier run (if any)."""

    entry: Entry
    prior: dict[str, Any] | None = None


@dataclass(frozen=True)
class MigrateOptions:
    """What every file of one run is migrated with (picklable: it travels to the workers)."""

    dest: str
    layout: str  # a generation name (canonical)
    model: str | None = None
    rotation: str = "auto"
    drop_trailing: bool = False
    stats: bool = False  # scan the tensor values: a file with NaN/Inf values or zero rows is damaged, not migrated


def _identity(path: str, entry: Entry) -> tuple[int, int]:
    """(size, mtime in ns) of the source: the file's own, or the listing's for a remote one."""
    if not entry.local:
        return entry.size, round(entry.mtime * 1e9) if entry.mtime is not None else -1
    st = os.stat(path)
    return int(st.st_size), int(st.st_mtime_ns)


def output_path(dest: str, rel: str) -> str:
    """Where ``rel`` goes under ``dest`` (for messages: outputs are written by descriptor, :mod:`.destdir`)."""
    return destdir.output_path(dest, rel)


def migrate_entry(item: MigrateItem, opts: MigrateOptions) -> dict[str, Any]:
    """Migrate one file (see the module docstring); never raises."""
    entry = item.entry
    out: dict[str, Any] = {"path": entry.ref, "rel": entry.rel, "target": opts.layout}
    if entry.status != "file":  # a folder the walk did not enter
        return out | {"action": entry.status, "reason": entry.reason}
    try:
        with local_copy(entry) as path:
            try:
                ident = _identity(path, entry)
            except OSError as e:
                return out | {"action": "unreadable", "reason": e.strerror or str(e)}
            return out | _migrate(path, ident, item, opts)
    except OSError as e:  # writing DEST, or fetching a remote source
        return out | {"action": "error", "reason": f"{e.filename or entry.ref}: {e.strerror or e}"}
    except Exception as e:  # a reader or rewrite bug: report, never stop the run
        return out | {"action": "error", "reason": f"{type(e).__name__}: {e}"}


def _already(path: str, size: int, mtime_ns: int, prior: dict[str, Any] | None, opts: MigrateOptions,
             rel: str) -> bool:
    if not prior or prior.get("layout") != opts.layout:
        return False
    if opts.stats and not prior.get("values_scanned"):  # done without the value scan that this run asks for
        return False
    if (prior.get("source_size"), prior.get("source_mtime_ns")) != (size, mtime_ns):
        return False
    st = destdir.output_stat(opts.dest, rel)  # a link, or an output on a path through one, is not done
    if st is None or not stat.S_ISREG(st.st_mode) or st.st_size != prior.get("output_size"):
        return False
    try:
        if sha256_file(path) != prior.get("source_sha256"):
            return False
    except OSError:
        return False
    return destdir.output_sha256(opts.dest, rel) == prior.get("output_sha256")


def _migrate(path: str, ident: tuple[int, int], item: MigrateItem, opts: MigrateOptions) -> dict[str, Any]:
    from kvscope.core.analysis.inspection import inspect_source
    from kvscope.core.fleet.scanfile import _profile, target_check
    from kvscope.core.reader.source import ByteSource, FileChangedError

    rel = item.entry.rel
    dst = output_path(opts.dest, rel)
    size, mtime_ns = ident
    if _already(path, size, mtime_ns, item.prior, opts, rel):
        return {"action": "already", "reason": "migrated by an earlier run (same hashes)",
                **{k: item.prior[k] for k in _RECORD_KEYS if item.prior and k in item.prior}}
    profile = _profile(opts.model) if opts.model else None
    try:
        with ByteSource.open(path) as src:
            # the one pipeline (the target's table below); one scan thread: the executor runs a worker per core
            found = inspect_source(src, profile, compat=False, stats=opts.stats, threads=1)
            res = found.result
            if not found.is_state:
                return {"action": "skipped", "reason": found.not_state_reason()}
            v = found.verdict
            tgt = target_check(res, profile, src, opts.layout, v.reason)
            src.check()
    except OSError as e:
        return {"action": "unreadable", "reason": e.strerror or str(e)}
    except (ValueError, FileChangedError) as e:  # not a regular file; changed while it was read
        return {"action": "unreadable", "reason": str(e)}
    facts = {"layout_from": res.layout.name, "kind": res.kind}
    if v.state == "model_mismatch":  # the bytes are sound: the model given is another one
        return facts | {"action": "cannot", "reason": f"not with the model given: {v.reason}"}
    if res.n_errors:
        kept = "; DEST still holds what an earlier run wrote of it" if item.prior else ""  # (not removed here)
        return facts | {"action": "damaged", "reason": v.reason + kept}
    if tgt["status"] == "loads":
        with temporary_folder(opts.dest, TEMP_TAG) as tmp:
            staged = os.path.join(tmp, os.path.basename(dst))
            with _writing(dst, staged):
                sha = _copy(path, staged)
                out_size = destdir.place(opts.dest, rel, staged)
            shutil.rmtree(tmp, ignore_errors=True)
        return facts | _finish(path, item.entry, ident, opts, "copied", sha, out_size, "copy")
    if tgt["status"] == "not migratable":
        return facts | {"action": "cannot", "reason": tgt["reason"]}
    if tgt["loads"] is None:
        return facts | {"action": "cannot", "reason": f"whether a {opts.layout} build loads it: {tgt['reason']}"}
    from kvscope.core.convert.rewrite import RewriteOutcome, rewrite_file

    out_size, out_sha = 0, ""
    with temporary_folder(opts.dest, TEMP_TAG) as tmp:  # no folder appears in DEST for a file not written
        staged = os.path.join(tmp, os.path.basename(dst))
        with _writing(dst, staged):
            try:
                outcome = rewrite_file(path, staged, opts.layout, profile, rotation=opts.rotation,
                                       drop_trailing=opts.drop_trailing)
            except ImportError as e:
                outcome = RewriteOutcome(1, f"this conversion needs the memory core and torch "
                                         f"(pip install 'kvscope[memory]'): {e}")
            if outcome.code == 0:
                out_sha = sha256_file(staged)
                out_size = destdir.place(opts.dest, rel, staged)
        shutil.rmtree(tmp, ignore_errors=True)
    if outcome.code == 1:
        why = "missing: " + "; ".join(outcome.missing) if outcome.missing else outcome.message
        return facts | {"action": "cannot", "reason": why, "missing": list(outcome.missing)}
    if outcome.code != 0:
        return facts | {"action": "damaged" if "damaged" in outcome.message else "error", "reason": outcome.message}
    return facts | _finish(path, item.entry, ident, opts, "migrated", out_sha, out_size, outcome.method)


_RECORD_KEYS = ("layout", "source_size", "source_mtime_ns", "source_sha256", "output_size", "output_sha256",
                "values_scanned")


@contextlib.contextmanager
def _writing(dst: str, staged: str) -> Iterator[None]:
    """Errors of writing the staged output (a full disk) name the output ``dst``, not the source."""
    try:
        yield
    except OSError as e:
        if e.filename == staged or (e.filename is None and e.errno in _WRITE_ERRNOS):
            raise OSError(e.errno, e.strerror or str(e), dst) from None
        raise


def _copy(src: str, staged: str) -> str:
    """Copy ``src`` to the new file ``staged`` (flushed to disk); the sha256 of the bytes copied."""
    h = hashlib.sha256()
    with open(src, "rb") as fh, open(staged, "xb") as out:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())
    return h.hexdigest()


def _finish(path: str, entry: Entry, ident: tuple[int, int], opts: MigrateOptions, action: str,
            out_sha: str, out_size: int, method: str) -> dict[str, Any]:
    """The record of a file written to DEST, unless the source changed meanwhile (then the output goes)."""
    src_sha = out_sha if action == "copied" else sha256_file(path)
    if _identity(path, entry) != ident:
        destdir.remove_output(opts.dest, entry.rel)
        return {"action": "unreadable", "reason": "the file changed while it was read"}
    return {"action": action, "method": method, "layout": opts.layout, "source_size": ident[0],
            "source_mtime_ns": ident[1], "source_sha256": src_sha, "output_size": out_size,
            "output_sha256": out_sha, "values_scanned": opts.stats}


# -- the manifest (client side) --------------------------------------------------------------------
class DestBusy(UsageError):
    """Another ``kvscope migrate`` holds DEST's manifest (one line for the user)."""


def sweep_temporaries(dest: str) -> int:
    """Remove what killed runs left in ``dest`` (``.kvscope-tmp-migrate-*`` folders and files, which
    only migrate creates; links are not followed); how many. Call with the manifest locked."""
    prefix = temp_name(TEMP_TAG)
    removed = 0
    for folder, dirs, files in os.walk(dest):
        for name in [d for d in dirs if d.startswith(prefix)] + [f for f in files if f.startswith(prefix)]:
            path = os.path.join(folder, name)
            if name in dirs:
                dirs.remove(name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(path)
            removed += 1
    return removed


class Manifest:
    """``DEST/.kvscope-migrate.jsonl``: what earlier runs wrote (rel -> record) and this run's appends.

    :meth:`lock` holds it (``flock``) for the run, so two runs never write into one DEST at once."""

    def __init__(self, dest: str) -> None:
        self.path = os.path.join(dest, MANIFEST_NAME)
        self.records: dict[str, dict[str, Any]] = {}
        self._fh: IO[str] | None = None
        self._unsynced = 0

    def load(self) -> Manifest:
        try:
            with open(self.path, encoding="utf-8") as fh:
                for line in fh:
                    try:
                        rec = json.loads(line)
                    except (ValueError, RecursionError):
                        continue  # a line cut by a crash (or nested too deeply to be one of ours)
                    if isinstance(rec, dict) and isinstance(rec.get("rel"), str):
                        self.records[rec["rel"]] = {k: rec[k] for k in _RECORD_KEYS if k in rec}
        except FileNotFoundError:
            pass
        return self

    def lock(self) -> Manifest:
        """Open the manifest for the run and hold an exclusive lock on it; :class:`DestBusy` if held."""
        fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (open for the run)
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.close()
            raise DestBusy(f"--out {os.path.dirname(self.path)}: another kvscope migrate is writing into it") from None
        self._fh = fh
        return self

    def prior(self, rel: str) -> dict[str, Any] | None:
        return self.records.get(rel)

    def record(self, result: dict[str, Any]) -> None:
        """Append the record of a file written by this run (``migrated`` or ``copied``)."""
        if result.get("action") not in ("migrated", "copied"):
            return
        if self._fh is None:
            self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (open for the run)
        rec = {"rel": result["rel"], "path": result["path"], "action": result["action"],
               **{k: result[k] for k in _RECORD_KEYS}}
        self._fh.write(json.dumps(rec) + "\n")
        self._fh.flush()
        self._unsynced += 1
        if self._unsynced >= 256:
            self.sync()

    def sync(self) -> None:
        if self._fh is not None and self._unsynced:
            os.fsync(self._fh.fileno())
            self._unsynced = 0

    def close(self) -> None:
        self.sync()
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def items(entries: Iterator[Entry], manifest: Manifest) -> Iterator[MigrateItem]:
    """The walk's entries with their manifest records."""
    for e in entries:
        yield MigrateItem(e, manifest.prior(e.rel))

