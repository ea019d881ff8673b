"""Fuzzed logs and manifests: whatever a copied log or manifest holds, every
view reports, or says what is wrong in one line with exit 1 or 2; never a
traceback. The inputs are a real run's files with fields removed, replaced
by values of other types or sizes, lines duplicated, dropped or cut."""

from __future__ import annotations

import copy
import json
import random
import tempfile
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import StoredRun
from .harness import call_cli, rank_logs

VIEWS = [
    ("replay",),
    ("replay", "--json"),
    ("replay", "--html", "page.html"),
    ("replay", "--export", "jaeger-json=spans.json"),
    ("explain",),
    ("blame",),
    ("critical-path",),
    ("validate",),
]
#: Values a field is replaced with: other types, sizes no run has, hostile text.
ODD_VALUES: list[Any] = [
    None, True, False, 0, -1, 2**31, 10**9, 2**62, 2**63 - 1, -(2**63), 1.5, 1e300,
    "", "x", "0" * 16, "0" * 32, "\x1b[2J", "a/../b", "run.finished", "\u202e",
    [], [1, 2], {}, {"a": 1},
]  # fmt: skip
_REMOVE = object()


def _walk(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a field inside a JSON value."""
    found = [path] if path else []
    if isinstance(value, dict):
        for key, item in value.items():
            found += _walk(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _walk(item, (*path, index))
    return found


def _change_a_field(document: Any, rng: random.Random) -> None:
    paths = _walk(document)
    if not paths:
        return
    path = rng.choice(paths)
    for key in path[:-1]:
        document = document[key]
    new = rng.choice([_REMOVE, *ODD_VALUES])
    if new is not _REMOVE:
        document[path[-1]] = copy.deepcopy(new)
    elif isinstance(document, dict):
        del document[path[-1]]


def _damage(records: list[Any], rng: random.Random) -> list[bytes]:
    """The lines of ``records`` with one to three changes: fields removed
    or replaced, then perhaps a line dropped, repeated, cut or garbled."""
    records = copy.deepcopy(records)
    for _ in range(rng.randint(1, 3)):
        _change_a_field(rng.choice(records), rng)
    lines = [orjson.dumps(record) for record in records]
    if rng.random() < 0.3:
        index = rng.randrange(len(lines))
        action = rng.choice(["drop", "repeat", "cut", "garbage"])
        if action == "drop":
            del lines[index]
        elif action == "repeat":
            lines.insert(index, lines[index])
        elif action == "cut":
            lines[index] = lines[index][: rng.randrange(len(lines[index]) + 1)]
        else:
            lines[index] = rng.randbytes(rng.randrange(12))
    return lines


def _views_hold(run: Path) -> None:
    for view in VIEWS:
        completed = call_cli(*view, str(run), cwd=run.parent)
        assert completed.returncode in (0, 1, 2), (view, completed.describe())
        assert "Traceback" not in completed.stderr, (view, completed.describe())
        if completed.returncode == 2 or (completed.returncode == 1 and not completed.stdout):
            assert len(completed.stderr.splitlines()) == 1, (view, completed.describe())


@pytest.fixture(scope="module")
def source(eight_ranks: StoredRun) -> dict[str, Any]:
    logs = rank_logs(eight_ranks.directory)[:2]
    return {
        "manifest": json.loads((eight_ranks.directory / "manifest.json").read_text()),
        "logs": {
            log.name: [orjson.loads(line) for line in log.read_bytes().splitlines()] for log in logs
        },
    }


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_a_damaged_log_is_reported_or_named_in_one_line(source: dict[str, Any], seed: int) -> None:
    rng = random.Random(seed)
    name = rng.choice(sorted(source["logs"]))
    with tempfile.TemporaryDirectory() as scratch:
        run = Path(scratch) / "run"
        run.mkdir()
        for log, records in source["logs"].items():
            lines = _damage(records, rng) if log == name else map(orjson.dumps, records)
            (run / log).write_bytes(b"".join(line + b"\n" for line in lines))
        _views_hold(run)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_a_damaged_manifest_is_reported_or_named_in_one_line(
    source: dict[str, Any], seed: int
) -> None:
    rng = random.Random(seed)
    manifest = copy.deepcopy(source["manifest"])
    for _ in range(rng.randint(1, 3)):
        _change_a_field(manifest, rng)
    with tempfile.TemporaryDirectory() as scratch:
        run = Path(scratch) / "run"
        run.mkdir()
        for log, records in source["logs"].items():
            (run / log).write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
        (run / "manifest.json").write_text(json.dumps(manifest))
        _views_hold(run)


def test_the_fuzzed_views_see_a_run(source: dict[str, Any], tmp_path: Path) -> None:
    # The undamaged files are a run the views report on (the fuzzing starts
    # from something that works).
    run = tmp_path / "run"
    run.mkdir()
    for log, records in source["logs"].items():
        (run / log).write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))

    completed = call_cli("replay", str(run), cwd=tmp_path)
    assert completed.returncode in (0, 1), completed.describe()
    assert "Ranks:" in completed.stdout
