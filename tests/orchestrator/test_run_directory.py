"""A run directory checked as one run (``check_run_directories``), and who
may join it: the problems that say which file is wrong, and the manifests
and launches that are refused."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import attrs
import pytest

from events import JsonlLog, LaunchRecord, RankProcess
from events.testing import EventStream
from orchestrator import RunDirectoryError
from orchestrator._run_directory import (
    CLAIM_FILE,
    LauncherProcess,
    Manifest,
    RunDirectory,
    check_run_directories,
    longer_copy,
    read_manifest,
    refuse_foreign_rank,
    run_id_of,
)


def _write_run(run_dir: Path, ranks: range, *, world_size: int, run_id: str = "run-1") -> None:
    """Rank logs of a run whose ranks each ran one step, and its claim."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / CLAIM_FILE).write_text(f"{run_id}\n")
    for rank in ranks:
        stream = EventStream(run_id=run_id, rank=rank, world_size=world_size).run_started()
        stream.started("probe").succeeded("probe")
        with JsonlLog(run_dir / f"rank-{rank}.jsonl", run_id=run_id, rank=rank) as log:
            for event in stream.events:
                log.append(event)


def _messages(run_dirs: list[Path]) -> list[str]:
    return [problem.message for problem in check_run_directories(run_dirs)[1]]


def test_a_rank_log_name_with_a_leading_zero_is_no_rank(tmp_path: Path) -> None:
    _write_run(tmp_path, range(2), world_size=2)
    (tmp_path / "rank-1.jsonl").rename(tmp_path / "rank-01.jsonl")

    files, problems = check_run_directories([tmp_path])

    assert files == [tmp_path / "rank-0.jsonl"]
    assert [(p.path.name, p.message) for p in problems] == [
        ("rank-01.jsonl", "not a rank log name (rank-<N>.jsonl); ignored"),
        (
            tmp_path.name,
            "rank 1 of world size 2 has no log (never started, or killed before its first event)",
        ),
    ]


def test_a_claim_of_another_run_is_a_run_id_that_differs(tmp_path: Path) -> None:
    _write_run(tmp_path, range(1), world_size=1)
    (tmp_path / CLAIM_FILE).write_text("run-2\n")

    (message,) = _messages([tmp_path])

    assert message.startswith("more than one run id: run-1 (rank-0.jsonl); run-2 (")


def test_a_rank_equal_to_the_world_size_is_outside_it(tmp_path: Path) -> None:
    _write_run(tmp_path, range(2), world_size=2)
    # A log of rank 2 that does not begin with its start (its first line
    # lost): nothing in it says the world is larger than 2.
    _write_run(tmp_path / "other", range(2, 3), world_size=3)
    lines = (tmp_path / "other" / "rank-2.jsonl").read_bytes().splitlines(keepends=True)
    (tmp_path / "rank-2.jsonl").write_bytes(b"".join(lines[1:]))

    problems = check_run_directories([tmp_path])[1]

    assert [(p.path.name, p.message) for p in problems] == [
        ("rank-2.jsonl", "rank 2 is outside the world size 2")
    ]


def test_a_copy_cut_short_reads_as_the_longer_whichever_directory_comes_first(
    tmp_path: Path,
) -> None:
    whole, cut = tmp_path / "whole" / "rank-0.jsonl", tmp_path / "cut" / "rank-0.jsonl"
    _write_run(whole.parent, range(1), world_size=1)
    cut.parent.mkdir()
    cut.write_bytes(whole.read_bytes().splitlines(keepends=True)[0])

    assert longer_copy(whole, cut) == whole
    assert longer_copy(cut, whole) == whole
    for order in ([whole.parent, cut.parent], [cut.parent, whole.parent]):
        assert check_run_directories(order) == ([whole], [])


def test_a_launch_with_the_same_launcher_pid_on_another_host_refuses_the_rank(
    tmp_path: Path,
) -> None:
    # One run directory on a shared filesystem, two launchers of one pid on
    # two hosts: a rank of one is no rank of the other's launch.
    host = platform.node()
    mine = Manifest(
        run_id="run-1", world_size=2, launcher=LauncherProcess(pid=os.getppid(), host=host)
    )
    mine.write(tmp_path)
    refuse_foreign_rank(tmp_path, os.getppid())

    elsewhere = Manifest(
        run_id="run-1",
        world_size=2,
        launcher=LauncherProcess(pid=os.getppid(), host=host + "-other"),
    )
    elsewhere.write(tmp_path)
    with pytest.raises(RunDirectoryError, match="which did not start this process"):
        refuse_foreign_rank(tmp_path, os.getppid())


@pytest.mark.parametrize("span", ["0" * 16, "0" * 15 + "g", "0" * 15 + "A", "0" * 15])
def test_a_manifest_whose_trace_parent_is_no_span_id_is_invalid(tmp_path: Path, span: str) -> None:
    document = Manifest(run_id="run-1", world_size=1, launcher=LauncherProcess()).to_json()
    document["launcher"]["trace_parent"] = span
    (tmp_path / "manifest.json").write_text(json.dumps(document))

    with pytest.raises(RunDirectoryError, match="not a valid manifest"):
        read_manifest(tmp_path)


def test_a_rank_that_claims_and_writes_between_two_looks_is_joined(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Under load, another rank of the same run claimed the directory and
    # wrote its first event after this rank found no claim and before it
    # looked for logs: the directory was refused as holding another run's.
    from orchestrator import _run_directory

    run_dir = tmp_path / "run"
    looked = _run_directory._stored_logs

    def after_a_peer_claimed_and_wrote(directory: Path) -> list[str]:
        _write_run(directory, range(1, 2), world_size=2)
        return looked(directory)

    monkeypatch.setattr(_run_directory, "_stored_logs", after_a_peer_claimed_and_wrote)
    _run_directory.claim_run_directory(run_dir, "run-1")
    assert (run_dir / CLAIM_FILE).read_text() == "run-1\n"
    # Logs with no claim at all are still another run's.
    (run_dir / CLAIM_FILE).unlink()
    monkeypatch.setattr(_run_directory, "_stored_logs", looked)
    with pytest.raises(RunDirectoryError, match=r"already holds the logs of another run"):
        _run_directory.claim_run_directory(run_dir, "run-1")


def test_a_run_directorys_launch_record_is_its_manifests_with_the_empty_logs(
    tmp_path: Path,
) -> None:
    manifest = Manifest(run_id="run-1", world_size=4, launcher=LauncherProcess(pid=7))
    with_manifest = RunDirectory(path=tmp_path, logs={}, manifest=manifest)
    claimed = RunDirectory(path=tmp_path, logs={}, claim="run-1")

    record = with_manifest.launch_record()
    assert record is not None
    assert (record.run_id, record.world_size, record.empty_logs) == ("run-1", 4, frozenset())
    assert record.source == str(tmp_path / "manifest.json")
    assert with_manifest.launch_record([2]) == attrs.evolve(record, empty_logs=frozenset({2}))
    # Without a manifest there is a record only of the empty logs, under the claim.
    assert claimed.launch_record() is None
    assert claimed.launch_record([1, 3]) == LaunchRecord(
        run_id="run-1", empty_logs=frozenset({1, 3})
    )


def _with_role(log: Path, role: str) -> None:
    """Rewrite ``log``'s ``run.started`` as a process of a recorded engine
    start writes it (its identity names its role)."""
    first, rest = log.read_bytes().split(b"\n", 1)
    record = json.loads(first)
    record["identity"]["role"] = role
    log.write_bytes(json.dumps(record).encode() + b"\n" + rest)


@pytest.mark.parametrize("roles", [False, True])
def test_world_sizes_that_differ_are_a_problem_unless_processes_joined(
    tmp_path: Path, roles: bool
) -> None:
    _write_run(tmp_path, range(1), world_size=1)
    _write_run(tmp_path, range(1, 2), world_size=2)
    if roles:  # an engine's processes join as they start, each knowing the world so far
        _with_role(tmp_path / "rank-0.jsonl", "engine core")
        _with_role(tmp_path / "rank-1.jsonl", "worker TP0")

    problems = check_run_directories([tmp_path])[1]

    if roles:  # the run's world is the largest, which both ranks are in
        assert problems == []
    else:
        assert [(p.message, p.fatal) for p in problems] == [
            ("the world sizes differ: 1 (rank-0.jsonl); 2 (rank-1.jsonl)", True)
        ]


def test_joined_processes_still_disagree_with_a_manifest(tmp_path: Path) -> None:
    _write_run(tmp_path, range(1), world_size=1)
    _with_role(tmp_path / "rank-0.jsonl", "engine core")
    Manifest(run_id="run-1", world_size=2, launcher=LauncherProcess()).write(tmp_path)

    assert _messages([tmp_path]) == [
        "the world sizes differ: 1 (rank-0.jsonl); 2 (manifest.json)",
        "rank 1 of world size 2 has no log (never started, or killed before its first event)",
    ]


def test_missing_ranks_and_empty_logs_are_not_fatal_and_the_launcher_says_why(
    tmp_path: Path,
) -> None:
    run_a, run_b = tmp_path / "a", tmp_path / "b"
    _write_run(run_a, range(1), world_size=5)
    _write_run(run_b, range(1, 2), world_size=5)
    (run_b / "rank-1.jsonl").write_bytes(b"")
    ranks = (
        RankProcess(rank=2, pid=9, not_delivered="did not deliver its log"),
        RankProcess(rank=3, pid=10),
    )
    Manifest(run_id="run-1", world_size=5, launcher=LauncherProcess(), ranks=ranks).write(run_a)

    problems = check_run_directories([run_a, run_b])[1]

    assert [(p.path, p.message, p.fatal) for p in problems] == [
        (
            run_b / "rank-1.jsonl",
            "rank 1 wrote no events (empty log): never started, or killed before its first event",
            False,
        ),
        (
            Path(f"{run_a}, {run_b}"),
            "rank 2 of world size 5 has no log (never started, or killed before its first "
            "event); rank 2 (pid 9) did not deliver its log",
            False,
        ),
        (
            Path(f"{run_a}, {run_b}"),
            "ranks 3-4 of world size 5 have no log (never started, or killed before its "
            "first event)",
            False,
        ),
    ]


def test_an_implausible_world_is_named_by_the_manifest_that_claims_it(tmp_path: Path) -> None:
    _write_run(tmp_path, range(1), world_size=1)
    Manifest(run_id="run-1", world_size=70_000, launcher=LauncherProcess()).write(tmp_path)

    assert _messages([tmp_path])[-1] == (
        "manifest.json claims 70,000 ranks; 1 log is present, and a run of at most 65,536 "
        "ranks is read (is the file damaged?)"
    )


def test_a_directory_with_nothing_in_it_is_said_to_have_no_logs(tmp_path: Path) -> None:
    assert _messages([tmp_path]) == ["no rank-*.jsonl logs in this directory"]


def test_a_directorys_run_is_its_claims_else_its_manifests_else_its_first_logs(
    tmp_path: Path,
) -> None:
    assert run_id_of(tmp_path) is None
    _write_run(tmp_path, range(1), world_size=1, run_id="from-the-log")
    (tmp_path / CLAIM_FILE).unlink()
    assert run_id_of(tmp_path) == "from-the-log"
    Manifest(run_id="from-the-manifest", world_size=1, launcher=LauncherProcess()).write(tmp_path)
    assert run_id_of(tmp_path) == "from-the-manifest"
    (tmp_path / CLAIM_FILE).write_text("from-the-claim\n")
    assert run_id_of(tmp_path) == "from-the-claim"
