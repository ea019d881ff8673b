"""A log cannot take the machine down: a world size no run has (a flipped
digit in a manifest or a ``run.started``) is named in one line, exit 1,
before any view's cost can follow the number instead of the logs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import orjson
import pytest

from events import MAX_WORLD_SIZE

from .conftest import StoredRun
from .harness import call_cli, rank_logs

PROG = "startup-orchestrator: error: "
VIEWS = [
    ("replay",),
    ("replay", "--json"),
    ("replay", "--html", "page.html"),
    ("explain",),
    ("blame",),
    ("critical-path",),
]


def _copy(stored: StoredRun, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(stored.directory, run)
    return run


def _one_line(view: tuple[str, ...], run: Path, *fragments: str) -> None:
    completed = call_cli(*view, str(run), cwd=run.parent)
    assert completed.returncode == 1, completed.describe()
    assert completed.stdout == "", completed.describe()
    lines = completed.stderr.splitlines()
    assert len(lines) == 1, completed.describe()
    assert lines[0].startswith(PROG), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


@pytest.mark.parametrize("view", VIEWS, ids=" ".join)
def test_a_manifest_claiming_a_billion_ranks_is_named(
    eight_ranks: StoredRun, tmp_path: Path, view: tuple[str, ...]
) -> None:
    run = _copy(eight_ranks, tmp_path)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["world_size"] = 1_000_000_000
    (run / "manifest.json").write_text(json.dumps(manifest))
    _one_line(view, run, "manifest.json claims 1,000,000,000 ranks; 8 logs are present")
    assert not (run.parent / "page.html").exists()


@pytest.mark.parametrize("view", VIEWS, ids=" ".join)
def test_a_run_started_claiming_two_billion_ranks_is_named(
    healthy: StoredRun, tmp_path: Path, view: tuple[str, ...]
) -> None:
    run = _copy(healthy, tmp_path)
    (run / "manifest.json").unlink(missing_ok=True)
    (log,) = rank_logs(run)
    lines = log.read_bytes().splitlines()
    started = orjson.loads(lines[0])
    started["identity"]["world_size"] = 2_000_000_000
    log.write_bytes(b"\n".join([orjson.dumps(started), *lines[1:]]) + b"\n")
    _one_line(view, run, f"{log} claims 2,000,000,000 ranks; 1 log is present")


def test_validate_names_the_claim_and_lists_no_missing_rank(
    eight_ranks: StoredRun, tmp_path: Path
) -> None:
    run = _copy(eight_ranks, tmp_path)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["world_size"] = 1_000_000_000
    (run / "manifest.json").write_text(json.dumps(manifest))
    completed = call_cli("validate", str(run), cwd=tmp_path)
    assert completed.returncode == 1, completed.describe()
    assert "manifest.json claims 1,000,000,000 ranks; 8 logs are present" in completed.stdout
    assert "no log" not in completed.stdout, completed.stdout


def test_the_largest_world_read_is_still_a_run(eight_ranks: StoredRun, tmp_path: Path) -> None:
    run = _copy(eight_ranks, tmp_path)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["world_size"] = MAX_WORLD_SIZE
    (run / "manifest.json").write_text(json.dumps(manifest))
    completed = call_cli("replay", str(run), cwd=tmp_path)
    assert completed.returncode == 1, completed.describe()
    assert f"ranks 8-{MAX_WORLD_SIZE - 1}" in completed.stdout, completed.stdout
