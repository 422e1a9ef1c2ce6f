"""Where a fleet's state files are: a local folder or any fsspec URL, walked as a stream.

:func:`open_source` resolves ``SOURCE`` (a path, ``file://...``, ``s3://bucket/prefix``,
``gcs://...``: any protocol whose fsspec implementation is installed) to a :class:`Source`;
:meth:`Source.walk` yields one :class:`Entry` per candidate file, one folder listing at a time,
folders in name order, depth first, so memory stays bounded by the depth and the largest folder,
never by the number of files.

What is walked: regular files. A folder that cannot be listed (no permission, an I/O error) is
an ``unreadable`` entry of its own, so ``scan`` and ``migrate`` report it and exit 1. Hidden
folders (``.name``), kvscope's temporary files (:func:`kvscope.core.fsutil.is_temp_name`), the
migration manifest, symlinked files, FIFOs and other special files are left out. A symlinked
folder inside SOURCE is followed once: every folder is walked under the first path that reaches its
real path, so a link back to an ancestor (or to itself) cannot loop and two links to one folder do
not scan it twice. A link to a folder outside SOURCE (``/``, ``/proc/self``, an ancestor of SOURCE,
another tree) is not followed: it is a ``skipped`` entry, ``link leaves SOURCE (-> TARGET)``, so a
scan reads SOURCE's files and no others, and the walk is bounded by SOURCE itself (once a scan of a
tree holding a link to ``/`` walked the whole machine, ``/proc`` included, and never ended). Folders
more than :data:`MAX_DEPTH` deep are reported ``skipped`` too. A folder excluded with
:meth:`Source.exclude` (migrate's DEST) is never entered, however it is reached. Object stores have no
links; there a depth limit guards against pathological listings.

An :class:`Entry` is small and picklable; workers (local processes or Dask workers) open it with
:func:`open_entry` (local files by path, read-only; others through fsspec).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kvscope.core.errors import InputError
from kvscope.core.fsutil import is_temp_name

MANIFEST_NAME = ".kvscope-migrate.jsonl"  # kvscope migrate's record in its destination
MAX_DEPTH = 512
COPY_CHUNK = 8 << 20


class SourceError(InputError):
    """SOURCE cannot be walked (no such folder, an unknown protocol, a missing fsspec driver)."""


@dataclass(frozen=True)
class Entry:
    """One candidate file: ``ref`` is a local path (as reached from SOURCE) or a full URL.

    ``status`` is ``"file"``, or, for a folder the walk did not enter, ``"unreadable"`` (it could
    not be listed) or ``"skipped"`` (it leads into an excluded folder, e.g. migrate's DEST), with
    ``reason``: reported as one line like a file, so no file goes unmentioned in silence.
    """

    ref: str
    rel: str  # path relative to SOURCE, with "/" separators
    size: int
    mtime: float | None
    local: bool
    status: str = "file"
    reason: str = ""


def _fsspec() -> Any:
    try:
        import fsspec
    except ImportError as e:  # the fleet extra is not installed
        raise SourceError("fsspec is not installed: pip install 'kvscope[fleet]'") from e
    return fsspec


def is_url(spec: str) -> bool:
    return "://" in spec


class Source:
    """A folder to walk: local (``os``) or remote (an fsspec file system)."""

    def __init__(self, spec: str, fs: Any, root: str, local: bool) -> None:
        self.spec = spec  # as given
        self.fs = fs
        self.root = root  # local: the path as given (file:// stripped); remote: the fs path
        self.local = local
        self._excluded: list[tuple[str, tuple[int, int], str]] = []  # (real path, (dev, ino), why)

    def exclude(self, folder: str, why: str) -> None:
        """Never walk into the local ``folder`` (by its real path, or reached through any link):
        the walk yields a ``skipped`` entry with ``why`` where it would have entered it."""
        st = os.stat(folder)
        self._excluded.append((os.path.realpath(folder), (st.st_dev, st.st_ino), why))

    def _exclusion(self, path: str, key: tuple[int, int], link: bool) -> str | None:
        for real, k, why in self._excluded:
            if key == k:
                return why
            if link:
                r = os.path.realpath(path)
                if r == real or r.startswith(real.rstrip("/") + "/"):
                    return why
        return None

    def __repr__(self) -> str:
        return f"Source({self.spec!r})"

    @property
    def chain(self) -> str:
        """The rest of a chained URL (``zip://::file:///x.zip``: ``::file:///x.zip``), or ``""``."""
        return "::" + self.spec.split("::", 1)[1] if not self.local and "::" in self.spec else ""

    def url(self, path: str) -> str:
        """The full URL of a path of the file system, its chain kept (a worker opens it with fsspec.open)."""
        return str(self.fs.unstrip_protocol(path)) + self.chain

    def relative(self, ref: str) -> str:
        """An entry's ``ref`` (or any path or URL under SOURCE) relative to SOURCE, for a text line."""
        root = self.root if self.local else self.fs.unstrip_protocol(self.root)
        if self.chain and ref.endswith(self.chain):  # zip://sub/a.bin::file:///x.zip (root: zip://)
            ref = ref[: -len(self.chain)]
            if ref.startswith(root):
                return ref[len(root):].lstrip("/")
        root = root.rstrip("/")
        if ref.startswith(root + "/"):
            return ref[len(root) + 1:]
        return os.path.relpath(ref, self.root) if self.local else ref

    def walk(self) -> Iterator[Entry]:
        """Every candidate file under the root, folder by folder (see the module docstring)."""
        return self._walk_local() if self.local else self._walk_remote()

    def count(self) -> int:
        """The number of entries :meth:`walk` yields (a second, storage-free walk)."""
        return sum(1 for _ in self.walk())

    # -- local ---------------------------------------------------------------------------------
    @staticmethod
    def _inside(path: str, real_root: str) -> bool:
        """Whether ``path`` (a link) leads to SOURCE itself or a folder inside it, by real paths."""
        real = os.path.realpath(path)
        return real == real_root or real.startswith(real_root.rstrip("/") + "/")

    def _walk_local(self) -> Iterator[Entry]:
        seen: set[tuple[int, int]] = set()  # (device, inode) of every folder walked
        try:
            st = os.stat(self.root)
        except OSError as e:
            yield _unreadable(self.root, "", e)
            return
        real_root = os.path.realpath(self.root)
        seen.add((st.st_dev, st.st_ino))
        stack: list[Iterator[tuple[str, str]]] = [iter([(self.root, "")])]
        depth_first: list[tuple[str, str]] = []
        while stack:
            item = next(stack[-1], None)
            if item is None:
                stack.pop()
                continue
            folder, rel = item
            try:
                with os.scandir(folder) as it:
                    names = sorted(it, key=lambda d: d.name)
            except OSError as e:  # its files cannot be listed: said once, as one line
                yield _unreadable(folder, rel, e)
                continue
            depth_first.clear()
            for d in names:
                if is_temp_name(d.name) or (d.name == MANIFEST_NAME and not rel):  # migrate's, at DEST's top
                    continue
                child_rel = f"{rel}/{d.name}" if rel else d.name
                try:
                    link = d.is_symlink()
                    if d.is_dir(follow_symlinks=True):
                        if d.name.startswith("."):
                            continue
                        dst = d.stat(follow_symlinks=True)
                        key = (dst.st_dev, dst.st_ino)
                        if link and not self._inside(d.path, real_root):  # to /, /proc/self, an ancestor...
                            why = self._exclusion(d.path, key, link) if self._excluded else None
                            yield Entry(d.path, child_rel, 0, None, True, "skipped", why or _leaves(d.path))
                            continue
                        if key in seen:
                            continue  # a loop, or a folder already reached by another path
                        seen.add(key)
                        why = self._exclusion(d.path, key, link) if self._excluded else None
                        if why is not None:
                            yield Entry(d.path, child_rel, 0, None, True, "skipped", why)
                            continue
                        depth_first.append((d.path, child_rel))
                        continue
                    if link:
                        continue  # symlinked files are scanned where they live, if inside
                    fst = d.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # vanished meanwhile
                except OSError as e:  # listed, but its kind cannot be told (a folder without x)
                    yield _unreadable(d.path, child_rel, e)
                    continue
                if stat.S_ISREG(fst.st_mode):
                    yield Entry(d.path, child_rel, int(fst.st_size), fst.st_mtime, True)
            if depth_first and len(stack) >= MAX_DEPTH:  # said, not dropped in silence
                for path, child_rel in depth_first:
                    yield Entry(path, child_rel, 0, None, True, "skipped", _too_deep())
            elif depth_first:
                stack.append(iter(list(depth_first)))

    # -- fsspec ------------------------------------------------------------------------------
    def _walk_remote(self) -> Iterator[Entry]:
        stack: list[Iterator[tuple[str, str]]] = [iter([(self.root, "")])]
        while stack:
            item = next(stack[-1], None)
            if item is None:
                stack.pop()
                continue
            folder, rel = item
            try:
                infos = self.fs.ls(folder, detail=True)
            except (OSError, ValueError) as e:
                yield _unreadable(self.url(folder), rel, e, local=False)
                continue
            subfolders: list[tuple[str, str]] = []
            for info in sorted(infos, key=lambda i: str(i.get("name", ""))):
                name = str(info.get("name", "")).rstrip("/")
                base = name.rsplit("/", 1)[-1]
                if not base or name == folder.rstrip("/") or is_temp_name(base) or (base == MANIFEST_NAME and not rel):
                    continue
                child_rel = f"{rel}/{base}" if rel else base
                if info.get("islink"):
                    continue
                if info.get("type") == "directory":
                    if not base.startswith("."):
                        subfolders.append((name, child_rel))
                elif info.get("type") == "file":
                    mtime = info.get("mtime") or info.get("LastModified") or info.get("updated")
                    yield Entry(self.url(name), child_rel, int(info.get("size") or 0), _as_timestamp(mtime), False)
            if subfolders and len(stack) >= MAX_DEPTH:
                for name, child_rel in subfolders:
                    yield Entry(self.url(name), child_rel, 0, None, False, "skipped", _too_deep())
            elif subfolders:
                stack.append(iter(subfolders))


def _leaves(path: str) -> str:
    """The reason of a link to a folder outside SOURCE, which the walk does not follow."""
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return f"link leaves SOURCE (-> {target}): not followed"


def _too_deep() -> str:
    return f"folder not walked: more than {MAX_DEPTH} folders deep"


def _unreadable(ref: str, rel: str, e: Exception, local: bool = True) -> Entry:
    """The entry saying a folder (or a name in one) could not be listed: never skipped in silence."""
    why = (e.strerror if isinstance(e, OSError) else None) or f"{type(e).__name__}: {e}"
    return Entry(ref, rel or ".", 0, None, local, "unreadable", f"folder not listed: {why}")


def _as_timestamp(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    ts = getattr(value, "timestamp", None)
    if callable(ts):
        with contextlib.suppress(Exception):
            return float(ts())
    return None


def open_source(spec: str) -> Source:
    """The :class:`Source` for a path or URL; :class:`SourceError` when it is not a folder."""
    if not is_url(spec) or spec.startswith("file://"):
        path = spec[len("file://"):] if spec.startswith("file://") else spec
        if not os.path.isdir(path):
            raise SourceError(f"{spec}: not a directory")
        return Source(spec, None, path, True)
    fsspec = _fsspec()
    try:
        fs, root = fsspec.core.url_to_fs(spec)
    except (ImportError, ValueError) as e:
        raise SourceError(f"{spec}: {e}") from None
    try:
        is_dir = fs.isdir(root)
    except Exception as e:  # a driver's own error (credentials, network)
        raise SourceError(f"{spec}: {type(e).__name__}: {e}") from None
    if not is_dir:
        raise SourceError(f"{spec}: not a directory")
    return Source(spec, fs, root, False)


@contextlib.contextmanager
def local_copy(entry: Entry) -> Iterator[str]:
    """A local path holding the entry's bytes: the file itself, or a temporary copy of a remote one."""
    if entry.local:
        yield entry.ref
        return
    fsspec = _fsspec()
    fd, tmp = tempfile.mkstemp(prefix="kvscope-fleet-", suffix=".bin")
    try:
        with os.fdopen(fd, "wb") as out, fsspec.open(entry.ref, "rb") as src:
            shutil.copyfileobj(src, out, COPY_CHUNK)
        yield tmp
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
