"""The one error hierarchy (issue #30 item 3): every exception kvscope defines is a ``KvscopeError``.

Every module of ``kvscope.core`` (and ``kvscope.app`` where PySide6 is installed) is imported and every
exception class it defines is listed. A class that can reach a command or the app must derive from
:class:`kvscope.core.errors.KvscopeError` (so that ``except KvscopeError`` catches every failure kvscope means to
report, with its exit code and its one line). The few that never leave the module that raises them are
listed in :data:`INTERNAL` with where they are turned into a ``KvscopeError`` or a result, and each is
checked to still exist: a new exception class outside the hierarchy fails this test until it is either
put under ``KvscopeError`` or added here with its reason. There is one ``InputError`` and one ``Cancelled``.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pkgutil

import kvscope.core
from kvscope.core import errors
from kvscope.core.stopsignals import Stopped

# exception classes that never leave the code that raises them, and where they end
INTERNAL = {
    "kvscope.core.stopsignals.Stopped": "SIGTERM/SIGHUP: a BaseException like KeyboardInterrupt, turned into "
                                        "exit 128+N by the command line",
    "kvscope.core.model.gguf_metadata._Truncated": "the GGUF reader's own control flow: becomes GGUFMetadataError",
    "kvscope.core.model.gguf_metadata._Changed": "the GGUF reader's own control flow: becomes GGUFMetadataError",
    "kvscope.core.model.rotation_rule.EndlessRotationLoop": "caught by memory.rot_rule, which says why",
    "kvscope.core.engine.worker.SetupFailure": "inside the engine worker process: sent to kvscope as a reply "
                                               "and raised there as EngineSetupError",
    "kvscope.core.engine.http_bounded.HTTPFailure": "an OSError of the HTTP exchange: the server client turns it "
                                                    "into a ServerError",
    "kvscope.core.engine.http_bounded.Timeout": "an HTTPFailure (see there)",
    "kvscope.core.engine.http_bounded.TooLarge": "an HTTPFailure (see there)",
    "kvscope.core.reader.context.Stop": "the reader's own control flow: ends a walk early (already a finding)",
    "kvscope.core.reader.context.HeaderStop": "a Stop (see there) at a rejected record header",
    "kvscope.core.fleet.daskpool._NoWorkers": "ends a dask run with what was done (ExecutorError)",
    "kvscope.app.views.bytes.byte_text.TooLarge": "a selection too large to render as text: the view says so",
}


def _modules(package: object) -> list[str]:
    names = [package.__name__]  # type: ignore[attr-defined]
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):  # type: ignore[attr-defined]
        if not info.name.endswith("__main__"):
            names.append(info.name)
    return names


def _exception_classes() -> dict[str, type[BaseException]]:
    packages: list[object] = [kvscope.core]
    if importlib.util.find_spec("PySide6") is not None and importlib.util.find_spec("pyqtgraph") is not None:
        packages.append(importlib.import_module("kvscope.app"))
    found: dict[str, type[BaseException]] = {}
    for package in packages:
        for name in _modules(package):
            module = importlib.import_module(name)
            for _, obj in inspect.getmembers(module, inspect.isclass):
                if issubclass(obj, BaseException) and not issubclass(obj, Warning) and obj.__module__ == name:
                    found[f"{name}.{obj.__qualname__}"] = obj
    return found


def test_every_exception_kvscope_defines_is_a_kvscope_error_or_internal() -> None:
    found = _exception_classes()
    outside = sorted(name for name, cls in found.items()
                     if not issubclass(cls, errors.KvscopeError) and name not in INTERNAL)
    assert outside == [], f"exception classes outside KvscopeError and not listed as internal: {outside}"
    app_looked_at = any(name.startswith("kvscope.app.") for name in found)
    gone = sorted(name for name in INTERNAL
                  if name not in found and (app_looked_at or not name.startswith("kvscope.app.")))
    assert gone == [], f"INTERNAL lists classes that no longer exist: {gone}"


def test_one_input_error_and_one_cancelled() -> None:
    found = _exception_classes()
    for short, the_one in (("InputError", errors.InputError), ("Cancelled", errors.Cancelled)):
        others = sorted(name for name, cls in found.items() if cls.__name__ == short and cls is not the_one)
        assert others == [], f"more than one {short}: {others}"
    assert issubclass(Stopped, BaseException) and not issubclass(Stopped, Exception)


def test_the_classes_that_were_outside_are_inside() -> None:
    """The ones issue #30 named (and their siblings found since), each with the exit code it now has."""
    from kvscope.core.engine.trained_model import ModelError
    from kvscope.core.fleet.destdir import DestError
    from kvscope.core.fleet.migrate import DestBusy
    from kvscope.core.verify.comparison import Cancelled
    from kvscope.core.verify.repair import RepairError

    assert issubclass(RepairError, errors.InputError) and RepairError("x").exit_code == errors.EXIT_BAD_INPUT
    assert issubclass(ModelError, errors.SetupError)
    assert issubclass(DestBusy, errors.UsageError)
    assert Cancelled is errors.Cancelled and Cancelled().exit_code == errors.EXIT_INTERRUPTED
    e = DestError(22, "not a file path", "a/b")
    assert isinstance(e, OSError) and isinstance(e, errors.InputError)
    assert (e.errno, e.strerror, e.filename) == (22, "not a file path", "a/b")
    assert e.message == "a/b: not a file path"
