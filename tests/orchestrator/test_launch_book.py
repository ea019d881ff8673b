"""A launch's record (``LaunchBook``): claimed with its run directory before
any rank starts, written whole as ranks start and end, and never the reason
a launch stops (a write that fails is kept for the end)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import attrs
import pytest

from events import RankProcess
from orchestrator import FaultPlan, RunDirectoryError
from orchestrator._run_directory import (
    CLAIM_FILE,
    MANIFEST_FILE,
    LaunchBook,
    LauncherProcess,
    Manifest,
    read_manifest,
)


def _manifest(world_size: int = 3) -> Manifest:
    return Manifest(run_id="run-1", world_size=world_size, launcher=LauncherProcess())


def test_a_claim_creates_the_manifest_before_any_rank_starts(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    LaunchBook.claim(run_dir, _manifest())

    assert (run_dir / CLAIM_FILE).read_text().strip() == "run-1"
    written = read_manifest(run_dir)
    assert written is not None
    assert (written.run_id, written.world_size, written.ranks) == ("run-1", 3, ())


def test_a_directory_holding_logs_started_without_the_launch_is_refused(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / CLAIM_FILE).write_text("run-1\n")
    (run_dir / "rank-0.jsonl").write_bytes(b"")

    with pytest.raises(RunDirectoryError, match=r"rank-0\.jsonl of run run-1 started without"):
        LaunchBook.claim(run_dir, _manifest())
    # Refused, it leaves no manifest to make the logs look launched.
    assert not (run_dir / MANIFEST_FILE).exists()


@pytest.mark.parametrize(
    ("logs", "shown"),
    [
        (3, "rank-0.jsonl, rank-1.jsonl, rank-2.jsonl of run"),
        (4, "rank-0.jsonl, rank-1.jsonl, rank-2.jsonl, ... of run"),
    ],
)
def test_a_refused_directory_names_its_first_three_logs(
    tmp_path: Path, logs: int, shown: str
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / CLAIM_FILE).write_text("run-1\n")
    for rank in range(logs):
        (run_dir / f"rank-{rank}.jsonl").write_bytes(b"")

    with pytest.raises(RunDirectoryError) as refused:
        LaunchBook.claim(run_dir, _manifest())
    assert f"already holds {shown} run-1 started without this launch" in str(refused.value)


def test_a_second_launch_into_the_directory_is_refused(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    LaunchBook.claim(run_dir, _manifest())

    with pytest.raises(RunDirectoryError, match="another launch"):
        LaunchBook.claim(run_dir, _manifest())


def test_starts_and_ends_are_written_as_they_come(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    book = LaunchBook.claim(run_dir, _manifest())
    book.record(RankProcess(rank=1, pid=11, started_wall_ns=5))
    book.record(RankProcess(rank=0, pid=10, started_wall_ns=4))
    book.ended(1, exit_code=1, stopped_by_launcher=None)

    written = read_manifest(run_dir)
    assert written is not None
    assert [entry.rank for entry in written.ranks] == [0, 1]
    ended = written.rank(1)
    assert ended is not None
    assert (ended.pid, ended.started_wall_ns, ended.exit_code) == (11, 5, 1)
    assert ended.ended_wall_ns is not None
    assert written.launcher.finished_wall_ns is None

    book.finish(not_started="never started: the launch was stopped")
    finished = read_manifest(run_dir)
    assert finished is not None
    assert finished.launcher.finished_wall_ns is not None
    # The rank never started is in the record, with why; the others as they were.
    never = finished.rank(2)
    assert never is not None
    assert never.stopped_by_launcher == "never started: the launch was stopped"
    assert finished.rank(1) == ended


def test_a_finish_without_a_reason_adds_no_rank(tmp_path: Path) -> None:
    book = LaunchBook.claim(tmp_path / "run", _manifest())
    book.record(RankProcess(rank=0, pid=10))
    book.finish()
    assert [entry.rank for entry in book.manifest.ranks] == [0]


def test_a_write_that_fails_is_kept_for_the_end_and_the_record_goes_on(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    book = LaunchBook.claim(run_dir, _manifest())
    shutil.rmtree(run_dir)  # as a full disk would, every write now fails

    book.record(RankProcess(rank=0, pid=10))
    first = book.unwritten
    assert first is not None
    assert "cannot write the manifest" in str(first)
    book.ended(0, exit_code=0)
    assert book.unwritten is first  # the first failure is the one kept

    # Once a write works again, it holds everything recorded meanwhile.
    run_dir.mkdir()
    book.finish()
    written = read_manifest(run_dir)
    assert written is not None
    entry = written.rank(0)
    assert entry is not None
    assert (entry.pid, entry.exit_code) == (10, 0)
    assert written.launcher.finished_wall_ns is not None


@pytest.mark.parametrize(
    ("simulating", "recorded"),
    [
        (None, None),
        ("h200x8", "h200x8"),
        ("profiles/custom.json", "profiles/custom.json"),
        # A Path has a ``name`` of its own, its last part: the whole path is
        # what names the profile file.
        (Path("profiles/custom.json"), "profiles/custom.json"),
    ],
)
def test_the_manifest_names_a_simulated_host_by_its_profile_or_its_file(
    simulating: object, recorded: str | None
) -> None:
    manifest = Manifest.begin(
        run_id="run-1", world_size=2, faults=FaultPlan(), simulating=simulating
    )

    assert manifest.simulated == recorded


def test_a_launch_stopped_before_any_rank_started_records_every_rank(tmp_path: Path) -> None:
    book = LaunchBook.claim(tmp_path / "run", _manifest(world_size=2))
    book.finish(not_started="never started: the launch was stopped")

    written = read_manifest(tmp_path / "run")
    assert written is not None
    assert [(entry.rank, entry.stopped_by_launcher) for entry in written.ranks] == [
        (0, "never started: the launch was stopped"),
        (1, "never started: the launch was stopped"),
    ]


def test_the_manifest_is_written_with_its_command_line_and_faults_redacted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_plantedsecret")
    manifest = attrs.evolve(
        _manifest(),
        command=("startup-orchestrator", "run", "--hf-token", "hf_plantedsecret"),
        injected=("flashinfer=OSError:hf_plantedsecret",),
    )
    manifest.write(tmp_path)

    assert "hf_plantedsecret" not in (tmp_path / MANIFEST_FILE).read_text()
    written = read_manifest(tmp_path)
    assert written is not None
    assert written.command == ("startup-orchestrator", "run", "--hf-token", "[REDACTED]")
    assert written.injected == ("flashinfer=OSError:[REDACTED]",)


@pytest.mark.parametrize(
    ("field", "value"), [("run_id", ""), ("world_size", 0), ("world_size", -1)]
)
def test_a_manifest_without_a_run_id_or_a_world_is_not_valid(field: str, value: object) -> None:
    document = json.loads(json.dumps(_manifest().to_json()))
    assert Manifest.from_json(document) == _manifest()

    with pytest.raises(RunDirectoryError, match=f"not a valid manifest .*{field}"):
        Manifest.from_json({**document, field: value})
