"""``--scheduler`` addresses are checked before anything connects; option values in seconds by the parser.

Issue #31 item 15: ``--scheduler tcp://127.0.0.1`` (no port) ended in an internal error after a 60 s
stall and a Dask traceback. Now a malformed address is one line, exit 2, at once. And ``--timeout
nan|inf`` / ``--file-timeout inf`` were internal errors (exit 1): a usage error now (exit 2).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvharness.fixtures import DATA
from kvharness.proc_runs import CHILD
from kvscope.core.cli.fleet_session import check_scheduler
from kvscope.core.errors import UsageError

SLOT = DATA / "llamacpp-2026-10-01/llama-f16-fa0-unified0-seq0.seqstate"

BAD = ["tcp://127.0.0.1", "127.0.0.1", "tcp://", "tcp://:8786", "http://127.0.0.1:8786", "tcp://127.0.0.1:99999",
       "tcp://127.0.0.1:0", "tcp://127.0.0.1:port", "tcp://127.0.0.1:8786/path", "tcp://u:p@127.0.0.1:8786",
       "tcp://host\x1b[31m:8786", "tcp://[::1", "", "://x:1", "tcp://127.0.0.1:-1",
       # a DNS label past 63 characters, a name past 253, an empty label: the resolver's idna codec raised
       # UnicodeError there, an internal error (the jobs_links fuzz, seed 31 input 90)
       "tcp://" + "h" * 64 + ":8786", "tcp://" + ".".join(["a" * 60] * 5) + ":8786", "tcp://a..b:8786"]


def _run(args: list[str]) -> tuple[int, str, float]:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True, timeout=120)
    return r.returncode, r.stderr, time.monotonic() - t0


@pytest.mark.parametrize("address", BAD)
def test_bad_addresses_are_refused(address: str) -> None:
    with pytest.raises(UsageError) as e:
        check_scheduler(address)
    assert "\n" not in e.value.message and "\x1b" not in e.value.message


@pytest.mark.parametrize(("address", "want"), [("tcp://127.0.0.1:8786", "tcp://127.0.0.1:8786"),
                                               ("127.0.0.1:8786", "tcp://127.0.0.1:8786"),
                                               ("tls://sched.example:8786", "tls://sched.example:8786"),
                                               ("tcp://[::1]:8786", "tcp://[::1]:8786"),
                                               ("tcp://" + "h" * 63 + ":8786", "tcp://" + "h" * 63 + ":8786")])
def test_good_addresses_pass(address: str, want: str) -> None:
    assert check_scheduler(address) == want


def test_scan_with_a_scheduler_without_port_is_one_line_at_once(tmp_path: Path) -> None:
    root = tmp_path / "src"
    root.mkdir()
    shutil.copyfile(SLOT, root / "slot.bin")
    rc, err, took = _run(["scan", str(root), "--executor", "dask", "--scheduler", "tcp://127.0.0.1"])
    assert rc == 2 and err.count("\n") == 1 and err.startswith("kvscope: --scheduler tcp://127.0.0.1: no port"), err
    assert took < 20, took  # the import of python and kvscope only; was a 60 s stall


@pytest.mark.parametrize(("command", "option", "value"), [
    ("scan", "--file-timeout", "inf"), ("scan", "--file-timeout", "nan"), ("scan", "--file-timeout", "-1"),
    ("migrate", "--file-timeout", "inf"), ("verify", "--timeout", "nan"), ("verify", "--timeout", "inf"),
    ("verify", "--timeout", "0"), ("repair", "--timeout", "inf"), ("repair", "--timeout", "nan")])
def test_seconds_options_refuse_nan_inf(tmp_path: Path, command: str, option: str, value: str) -> None:
    root = tmp_path / "src"
    root.mkdir()
    shutil.copyfile(SLOT, root / "slot.bin")
    args = {"scan": ["scan", str(root)], "migrate": ["migrate", str(root), "--layout", "v4", "--out",
                                                       str(tmp_path / "out")],
            "verify": ["verify", str(root / "slot.bin"), "--model", str(SLOT)],
            "repair": ["repair", str(root / "slot.bin"), "--model", str(SLOT), "-o", str(tmp_path / "o.bin")]}[command]
    rc, err, _ = _run([*args, f"{option}={value}"])
    assert rc == 2 and err.count("\n") == 1 and err.startswith("kvscope: ") and option in err, err
    assert "internal error" not in err and "Traceback" not in err
    assert not (tmp_path / "out").exists() and not (tmp_path / "o.bin").exists()


def test_a_host_label_too_long_is_one_line_not_an_internal_error(tmp_path: Path) -> None:
    root = tmp_path / "src"
    root.mkdir()
    shutil.copyfile(SLOT, root / "slot.bin")
    rc, err, _ = _run(["scan", str(root), "--executor", "dask", "--scheduler", "tcp://" + "h" * 2000 + ":8786"])
    assert rc == 2 and err.count("\n") == 1 and "not a host name" in err and "internal error" not in err, err
