"""A run records the slices it was made with, and the views use them only
when asked: ``replay`` of a run made with a slice of its own says which
``--slice`` to pass instead of showing the reference engine's columns, and
loads nothing named in the log unasked."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import orjson
import pytest

from events import RunStarted, read_log
from orchestrator.engine import ENGINE_SLICE

from .conftest import StoredRun
from .harness import call_cli, environment, rank_logs

#: A script that is both an engine developer's launcher (run as ``python
#: FILE``) and the module ``--slice FILE:SLICE`` loads (where it runs
#: nothing). The slice's only rule speaks for a step named ``attention``,
#: as the reference engine's do.
SCRIPT = textwrap.dedent(
    """
    import sys

    from events import Column, MessageRule, Slice
    from orchestrator import Graph, Startup, Step

    SLICE = Slice(
        name="mine",
        steps=("attention",),
        rules=[
            MessageRule(
                code="mine.attention",
                step="attention",
                outcomes="ok",
                text="Attention by {result[backend]}.",
            )
        ],
        columns=[Column(title="MINE", fact="mine", step="attention", key="backend")],
    )


    def attention(context):
        return {"backend": "mine"}


    if __name__ == "__main__":
        startup = Startup(
            graph=Graph("mine", [Step(name="attention", body=attention)]),
            slices=[SLICE],
            run_dir=sys.argv[1],
            tracing=None,
            handle_signals=False,
        )
        sys.exit(0 if startup.run().ready else 1)
    """
)


@pytest.fixture(scope="module")
def own_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A real process's start of a graph of its own with its own slice."""
    import subprocess

    root = tmp_path_factory.mktemp("own-slice")
    script = root / "launcher.py"
    script.write_text(SCRIPT, encoding="utf-8")
    completed = subprocess.run(
        [sys.executable, str(script), str(root / "run")],
        capture_output=True,
        text=True,
        env=environment(),
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    return script, root / "run"


def test_a_run_records_its_slices_by_the_path_slice_takes(own_run: tuple[Path, Path]) -> None:
    script, run = own_run
    (log,) = rank_logs(run)
    started = read_log(log).events[0]
    assert isinstance(started, RunStarted)
    assert started.slices == (f"{script}:SLICE",)


def test_replay_without_slice_names_the_recorded_one_and_shows_no_engine_columns(
    own_run: tuple[Path, Path],
) -> None:
    script, run = own_run
    completed = call_cli("replay", str(run), cwd=run.parent)
    assert completed.returncode == 0, completed.describe()
    assert completed.stderr == (
        f"startup-orchestrator: note: recorded with slice {script}:SLICE; "
        f"pass --slice {script}:SLICE for its columns and messages (shown: the generic ones)\n"
    )
    # Neither the engine's columns and messages nor the slice's (not loaded).
    assert "PLATFORM" not in completed.stdout
    assert "attention backend" not in completed.stdout
    assert "MINE" not in completed.stdout
    assert "Attention by mine." not in completed.stdout


def test_the_slice_the_note_names_gives_the_runs_own_columns(own_run: tuple[Path, Path]) -> None:
    script, run = own_run
    completed = call_cli("replay", "--slice", f"{script}:SLICE", str(run), cwd=run.parent)
    assert completed.returncode == 0, completed.describe()
    assert completed.stderr == ""
    assert "MINE" in completed.stdout
    assert "Attention by mine." in completed.stdout
    assert "PLATFORM" not in completed.stdout


def test_an_engine_run_records_the_engines_slice_and_replays_as_before(
    healthy: StoredRun,
) -> None:
    (log,) = rank_logs(healthy.directory)
    started = read_log(log).events[0]
    assert isinstance(started, RunStarted)
    assert started.slices == (ENGINE_SLICE,)
    completed = call_cli("replay", str(healthy.directory), cwd=healthy.directory.parent)
    assert completed.returncode == 0, completed.describe()
    assert completed.stderr == ""
    assert "PLATFORM" in completed.stdout


def test_a_log_that_predates_recorded_slices_replays_with_the_engine(
    healthy: StoredRun, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    for log in rank_logs(healthy.directory):
        lines = log.read_bytes().splitlines()
        first = orjson.loads(lines[0])
        del first["slices"]
        (run / log.name).write_bytes(b"\n".join([orjson.dumps(first), *lines[1:]]) + b"\n")
    completed = call_cli("replay", "--json", str(run), cwd=tmp_path)
    assert completed.returncode == 0, completed.describe()
    assert completed.stderr == ""
    document = json.loads(completed.stdout)
    assert document["ranks"][0]["platform"] == "cuda", document["ranks"][0]
