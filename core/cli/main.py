"""``kvscope`` command line: inspect and diff state files (more commands register themselves).

Commands from other layers (``gui``, ``report``) are found through the ``kvscope.commands``
entry-point group, so this module never imports the Qt layer. Exit codes: 0 clean, 1 error
findings, 2 unreadable input or usage error, always with a one-line reason and no traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from kvscope.core.textsafe import safe_text

EXIT_OK, EXIT_FINDINGS, EXIT_BAD_INPUT = 0, 1, 2


class CliError(Exception):
    """A user-facing failure: printed as one line, exit code 2."""


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kvscope")
    except PackageNotFoundError:
        return "unknown"


def _load_profile(path: str | None) -> Any:
    if path is None:
        return None
    from kvscope.core.model.profile import ModelProfileError, load_model_profile

    try:
        return load_model_profile(path)
    except ModelProfileError as e:
        raise CliError(f"cannot use model {path}: {e}") from None


def _open(path: str) -> Any:
    """The input file as a ByteSource (read with pread; CliError when it cannot be opened)."""
    from kvscope.core.reader.source import ByteSource

    if not os.path.exists(path):
        raise CliError(f"{path}: no such file")
    if os.path.isdir(path):
        raise CliError(f"{path}: is a directory")
    try:
        return ByteSource.open(path)
    except OSError as e:
        raise CliError(f"cannot open {path}: {e.strerror or e}") from None
    except ValueError as e:  # not a regular file (a FIFO, a device)
        raise CliError(f"{path}: {e}") from None


def _read(path: str, profile: Any, kind: str | None = None, layout: str | None = None) -> tuple[Any, Any]:
    """Parse ``path``: ``(result, source)``; the source is checked for a change after the parse."""
    from kvscope.core.reader.parse import read_source

    src = _open(path)
    try:
        res = read_source(src, profile=profile, kind=kind, layout=layout)
    except ValueError as e:
        raise CliError(str(e)) from None
    src.check()
    return res, src


@contextmanager
def _changed_means_exit(*paths: str) -> Iterator[None]:
    """A FileChangedError while reading one of ``paths`` (as given) becomes ``PATH: the file changed...``."""
    from pathlib import Path

    from kvscope.core.reader.source import FileChangedError

    try:
        yield
    except FileChangedError as e:
        arg = next((p for p in paths if str(Path(p)) == e.path), e.path)
        raise CliError(f"{arg}: {e}") from None


def cmd_inspect(args: argparse.Namespace) -> int:
    from kvscope.core.reader.render import result_to_json, result_to_text

    profile = _load_profile(args.model)
    with _changed_means_exit(args.file):
        res, src = _read(args.file, profile, args.kind, args.layout)
        stats = None
        if args.stats and res.kind != "unknown":
            from kvscope.core.analysis.stats import scan_stats

            stats = scan_stats(res, data=src)
        compat = None
        if res.kind != "unknown":
            from kvscope.core.analysis.compat import compatibility

            compat = compatibility(res, profile, data=src)
            src.check()
    src.close()
    from kvscope.core.analysis.verdict import verdict

    judged = verdict(res, profile)
    if args.json:
        from kvscope.core.jsonout import write_json

        out = result_to_json(res, profile, tree=args.tree, lazy=True)
        out["verdict"] = judged.to_json()
        if compat is not None:
            out["compatibility"] = [c.to_json() for c in compat]
        if stats is not None:
            out["stats"] = stats.to_json()
            out["findings"] = [f.to_json() for f in res.findings]
        write_json(out, sys.stdout, indent=1 if args.pretty else None)
        sys.stdout.write("\n")
    else:
        text = result_to_text(res, profile, markdown=args.markdown)
        head, _, rest = text.partition("\n")
        text = f"{head}\n\n{'**verdict**' if args.markdown else 'verdict:'} {safe_text(judged.line())}\n{rest}"
        if compat:
            from kvscope.core.analysis.compat import compat_text

            text += "\n" + ("## " if args.markdown else "") + "compatibility (which llama.cpp layouts load it)\n"
            text += "\n".join(compat_text(compat)) + "\n"
        if stats is not None:
            text += "\n" + stats.to_text(markdown=args.markdown)
        sys.stdout.write(text)
    if res.kind == "unknown":
        first = res.findings[0].message if res.findings else "not a llama.cpp state file"
        print(f"kvscope: {safe_text(args.file)}: {safe_text(first)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_FINDINGS if res.n_errors else EXIT_OK


def cmd_diff(args: argparse.Namespace) -> int:
    from kvscope.core.analysis.diff import diff_states

    profile = _load_profile(args.model)
    with _changed_means_exit(args.a, args.b):
        a, sa = _read(args.a, profile)
        b, sb = _read(args.b, profile)
        for r, p in ((a, args.a), (b, args.b)):
            if r.kind == "unknown":
                raise CliError(f"{p}: {r.findings[0].message if r.findings else 'not a state file'}")
        d = diff_states(a, b, sa, sb)
    sa.close()
    sb.close()
    if args.json:
        json.dump(d.to_json(), sys.stdout)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(d.to_text())
    return EXIT_OK if d.identical else EXIT_FINDINGS


Registrar = Callable[[Any], None]  # adds a subcommand to argparse's subparsers object


def build_parser(extra: dict[str, Registrar] | None = None) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="kvscope", description="Inspect llama.cpp saved state (slot, sequence, "
                                 "session files and state blobs).")
    ap.add_argument("--version", action="version", version=f"kvscope {_version()}")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("inspect", help="parse a state file and report its structure and findings")
    p.add_argument("file")
    p.add_argument("--model", metavar="GGUF", help="the model that wrote the state (enables model checks)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true",
                     help="one JSON object (big arrays such as cells and tokens are streamed as written)")
    fmt.add_argument("--markdown", action="store_true", help="Markdown summary")
    p.add_argument("--stats", action="store_true", help="scan tensor payloads: NaN/Inf, zero rows, min/max/mean/RMS")
    p.add_argument("--kind", choices=["seq_file", "session_file", "seq_blob", "context_blob"],
                   help="override kind detection")
    p.add_argument("--layout", metavar="GEN", help="force a layout generation (e.g. 2026-10, 2025-05)")
    p.add_argument("--tree", action="store_true", help="with --json: include the full structure tree")
    p.add_argument("--pretty", action="store_true", help="with --json: indent")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("diff", help="structural diff of two states")
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--model", metavar="GGUF")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_diff)

    from kvscope.core.fleet.cli import register as register_fleet  # stdlib-only import: scan, migrate

    register_fleet(sub)

    from kvscope.core.convert.cli import register as register_rewrite  # stdlib-only import: no torch here

    register_rewrite(sub)
    from kvscope.core.lab.lab_cli import register as register_lab  # stdlib-only import: no torch here

    register_lab(sub)
    from kvscope.core.verify.cli import register as register_verify  # stdlib-only import: no engine here

    register_verify(sub)
    from kvscope.core.engine import builds  # stdlib only

    p = sub.add_parser("llama-build", help="build the pinned llama.cpp libllama + llama-server (CPU) into the cache",
                       description=builds.__doc__.split("\n\n")[0] if builds.__doc__ else None)
    builds.add_arguments(p)
    p.set_defaults(func=builds.run)

    for name, register in (extra or {}).items():
        try:
            register(sub)
        except Exception as e:  # a broken plugin must not take the core commands down
            print(f"kvscope: command {name!r} unavailable: {e}", file=sys.stderr)
    return ap


def _plugin_commands(wanted: str | None) -> dict[str, Registrar]:
    """Commands registered by other kvscope layers (entry-point group ``kvscope.commands``)."""
    if wanted in ("inspect", "diff", "scan", "migrate", "rewrite", "lab", "llama-build"):
        return {}
    from importlib.metadata import entry_points

    out: dict[str, Registrar] = {}
    eps = list(entry_points(group="kvscope.commands"))
    if any(ep.name == wanted for ep in eps):  # load only the command asked for (the others may import Qt)
        eps = [ep for ep in eps if ep.name == wanted]
    for ep in eps:
        try:
            out[ep.name] = ep.load()
        except Exception as e:
            print(f"kvscope: command {ep.name!r} unavailable: {e}", file=sys.stderr)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    wanted = next((a for a in argv if not a.startswith("-")), None)
    ap = build_parser(_plugin_commands(wanted))
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:
        return int(e.code) if isinstance(e.code, int) else EXIT_BAD_INPUT
    if not getattr(args, "func", None):
        ap.print_help(sys.stderr)
        return EXIT_BAD_INPUT
    try:
        return int(args.func(args))
    except CliError as e:
        print(f"kvscope: {safe_text(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        return EXIT_OK
    except KeyboardInterrupt:
        return 130
    except MemoryError:
        print("kvscope: out of memory", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
