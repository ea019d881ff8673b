"""Files are written safely: whole or not at all, through a temporary name
of their own, never through a link someone planted; a refused command
leaves nothing behind."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from .conftest import StoredRun
from .harness import call_cli, run_cli

VICTIM = "keep me\n"


def _plant(directory: Path, name: str) -> tuple[Path, Path]:
    """A link named ``name`` to a file that must not change."""
    victim = directory / "victim.txt"
    victim.write_text(VICTIM)
    link = directory / name
    link.symlink_to(victim)
    return link, victim


@pytest.mark.parametrize(
    "arguments",
    [("--html", "out"), ("--export", "jaeger-json=out")],
    ids=["html", "jaeger-json"],
)
def test_a_link_planted_at_a_views_output_is_replaced_not_followed(
    healthy: StoredRun, tmp_path: Path, arguments: tuple[str, str]
) -> None:
    link, victim = _plant(tmp_path, "out")
    completed = call_cli("replay", str(healthy.directory), *arguments, cwd=tmp_path)
    assert completed.returncode == 0, completed.describe()
    assert victim.read_text() == VICTIM
    assert not link.is_symlink()
    assert link.stat().st_size > 0
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out", "victim.txt"]


def test_a_link_to_the_log_read_at_a_views_output_is_replaced_not_refused(
    healthy: StoredRun, tmp_path: Path
) -> None:
    # Writing the page replaces the link; the log it names is not written.
    shutil.copytree(healthy.directory, tmp_path / "run")
    log = tmp_path / "run" / "rank-0.jsonl"
    before = log.read_bytes()
    (tmp_path / "page.html").symlink_to(log)
    completed = call_cli("replay", "run/rank-0.jsonl", "--html", "page.html", cwd=tmp_path)
    assert completed.returncode == 0, completed.describe()
    assert log.read_bytes() == before
    assert not (tmp_path / "page.html").is_symlink()
    assert (tmp_path / "page.html").read_text().startswith("<!doctype html>")


def test_an_unwritable_output_is_refused_and_nothing_is_left(
    healthy: StoredRun, tmp_path: Path
) -> None:
    output = tmp_path / "missing" / "page.html"
    completed = call_cli("replay", str(healthy.directory), "--html", str(output), cwd=tmp_path)
    assert completed.returncode == 1, completed.describe()
    assert "--html" in completed.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_refused_view_writes_no_empty_output(healthy: StoredRun, tmp_path: Path) -> None:
    # --rank outside the run is refused after the output was checked.
    completed = call_cli(
        "replay", str(healthy.directory), "--html", "page.html", "--rank", "7", cwd=tmp_path
    )
    assert completed.returncode == 2, completed.describe()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("given", "option"),
    [
        ("run", "--html=run/rank-0.jsonl"),
        ("run", "--html=run/manifest.json"),
        ("run", "--export=jaeger-json=./run/../run/rank-0.jsonl"),
        ("run/rank-0.jsonl", "--html=run/rank-0.jsonl"),
    ],
)
def test_an_output_that_is_an_input_is_refused_and_the_input_kept(
    healthy: StoredRun, tmp_path: Path, given: str, option: str
) -> None:
    # The report was written over the log it was made from.
    shutil.copytree(healthy.directory, tmp_path / "run")
    before = {path.name: path.read_bytes() for path in (tmp_path / "run").iterdir()}
    completed = call_cli("replay", given, option, cwd=tmp_path)
    assert completed.returncode == 2, completed.describe()
    assert completed.stdout == ""
    assert "one of the run's logs or its manifest; name another file" in completed.stderr
    assert {path.name: path.read_bytes() for path in (tmp_path / "run").iterdir()} == before


@pytest.mark.parametrize(
    "arguments",
    [
        ("--run-dir", "r", "--trace-file", "r/rank-0.jsonl"),
        ("--run-dir", "r", "--nproc", "2", "--trace-file", "./r/manifest.json"),
        ("--run-id", "r", "--trace-file", "startup-runs/r/rank-1.jsonl"),
    ],
    ids=["rank", "launch", "run-id"],
)
def test_a_trace_file_in_the_place_of_the_runs_record_is_refused(
    tmp_path: Path, arguments: tuple[str, ...]
) -> None:
    # The trace was written over the log of the run it traced.
    completed = call_cli("run", "--simulate", "h200x8", *arguments, cwd=tmp_path)
    assert completed.returncode == 2, completed.describe()
    assert "one of the run's logs or its manifest; name another file" in completed.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_page_and_the_trace_in_one_file_are_refused(healthy: StoredRun, tmp_path: Path) -> None:
    # The page was written over the trace just said to be exported.
    completed = call_cli(
        "replay", str(healthy.directory), "--export=jaeger-json=out", "--html=./out", cwd=tmp_path
    )
    assert completed.returncode == 2, completed.describe()
    assert completed.stdout == ""
    assert "--html out: --export writes that file; name another" in completed.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_output_beside_the_logs_is_written(healthy: StoredRun, tmp_path: Path) -> None:
    shutil.copytree(healthy.directory, tmp_path / "run")
    (tmp_path / "run" / "page.html").write_text("an earlier page")
    completed = call_cli("replay", "run", "--html", "run/page.html", cwd=tmp_path)
    assert completed.returncode == 0, completed.describe()
    assert (tmp_path / "run" / "page.html").read_text().startswith("<!doctype html>")


@pytest.mark.slow
def test_a_link_planted_at_the_trace_file_is_replaced_not_followed(tmp_path: Path) -> None:
    link, victim = _plant(tmp_path, "trace.json")
    completed = run_cli(
        "run", "--simulate", "xeon", "--run-dir", "run", "--trace-file", "trace.json", cwd=tmp_path
    )
    assert completed.returncode == 0, completed.describe()
    assert victim.read_text() == VICTIM
    assert not link.is_symlink()
    assert link.read_text().startswith('{"data":')
    assert not [path for path in tmp_path.iterdir() if path.name.startswith(".")]
