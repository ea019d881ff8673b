"""What a run leaves behind, judged as a whole: the run directory's claim,
the launcher's manifest, ranks without events, a process that died with
several steps in flight, a BaseException from a probe, and what was
simulated or injected — through the real command line, in real processes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import StoredRun
from .harness import (
    LAUNCH_TIMEOUT_S,
    command,
    environment,
    read_events,
    run_cli,
)

pytestmark = pytest.mark.slow


def _copy_run(run: StoredRun, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run.directory, copy)
    return copy


# --- §1 a run is judged against its expected ranks ------------------------------------------


def test_a_deleted_and_an_emptied_log_make_the_run_incomplete(
    eight_ranks: StoredRun, tmp_path: Path
) -> None:
    run = _copy_run(eight_ranks, tmp_path)
    (run / "rank-1.jsonl").unlink()
    (run / "rank-2.jsonl").write_bytes(b"")
    (run / "manifest.json").unlink()  # the logs alone must tell

    replayed = run_cli("replay", "run", cwd=tmp_path)
    assert replayed.returncode == 1, replayed.describe()
    lines = replayed.lines()
    assert lines[0].startswith("Startup incomplete: 6 ready, 2 without events (")
    assert lines[0].endswith("6 of 8 ranks)")
    assert lines[2] == (
        "Root cause: rank 1 wrote no events (no log): never started, "
        "or killed before its first event"
    )
    assert "  rank 2: empty log (never started, or killed before its first event)" in lines
    document = run_cli("replay", "--json", "run", cwd=tmp_path).json()
    assert document["outcome"] == "incomplete"
    assert [r["log"] for r in document["ranks"][:3]] == ["complete", "missing", "empty"]

    validated = run_cli("validate", "run", cwd=tmp_path)
    assert validated.returncode == 1, validated.describe()
    assert "rank 1 of world size 8 has no log" in validated.stdout
    assert "rank 2 wrote no events (empty log)" in validated.stdout
    assert validated.lines()[-1].startswith("1 path(s), 7 file(s), ")


def test_the_manifest_says_what_happened_to_a_rank_without_events(
    eight_ranks: StoredRun, tmp_path: Path
) -> None:
    run = _copy_run(eight_ranks, tmp_path)
    manifest = json.loads((run / "manifest.json").read_text())
    pid = manifest["ranks"][3]["pid"]
    (run / "rank-3.jsonl").write_bytes(b"")

    lines = run_cli("replay", "run", cwd=tmp_path).lines()
    assert lines[2].startswith(f"Root cause: rank 3 (pid {pid}) exited with code 0 at +")
    assert lines[2].endswith("s; its log is empty")


def test_validate_checks_a_run_directory_as_a_whole(
    eight_ranks: StoredRun, healthy: StoredRun, tmp_path: Path
) -> None:
    run = _copy_run(eight_ranks, tmp_path)
    # rank 4's log renamed over rank 5's: a foreign rank and a missing one.
    (run / "rank-4.jsonl").replace(run / "rank-5.jsonl")
    other = tmp_path / "empty-dir"
    other.mkdir()

    # A run other than the broken one (directories of one run are checked
    # together, as the nodes of one run).
    validated = run_cli("validate", "run", "empty-dir", str(healthy.directory), cwd=tmp_path)
    assert validated.returncode == 1, validated.describe()
    out = validated.stdout
    assert "rank-5.jsonl: holds the events of rank 4, not of rank 5" in out
    assert "rank 4 of world size 8 has no log" in out
    assert "empty-dir: no rank-*.jsonl logs in this directory" in out
    # It went on to the healthy run after the broken ones and summarised.
    assert f"{healthy.directory / 'rank-0.jsonl'}: ok" in out
    assert validated.lines()[-1].startswith("3 path(s), 8 file(s), ")


def test_a_fifo_named_like_a_log_is_refused_at_once(eight_ranks: StoredRun, tmp_path: Path) -> None:
    run = _copy_run(eight_ranks, tmp_path)
    (run / "rank-6.jsonl").unlink()
    os.mkfifo(run / "rank-6.jsonl")

    # A read would block forever on a FIFO with no writer: the timeout of
    # run_cli turns that into a failure.
    validated = run_cli("validate", "run", cwd=tmp_path, timeout=30)
    assert validated.returncode == 1
    assert "rank-6.jsonl: is not a regular file; it was not read" in validated.stdout
    replayed = run_cli("replay", "run", cwd=tmp_path, timeout=30)
    assert replayed.returncode == 1
    assert "is a FIFO, not a regular file" in replayed.stderr


# --- §2 the launcher leaves a manifest --------------------------------------------------------


def test_the_launcher_writes_a_manifest(eight_ranks: StoredRun) -> None:
    manifest = json.loads((eight_ranks.directory / "manifest.json").read_text())
    assert manifest["manifest_version"] == 1
    assert manifest["run_id"] == eight_ranks.directory.name
    assert manifest["world_size"] == 8
    assert manifest["simulated"] == "h200x8"
    assert manifest["command"][:2] == ["startup-orchestrator", "run"]
    assert [r["rank"] for r in manifest["ranks"]] == list(range(8))
    for entry in manifest["ranks"]:
        assert entry["exit_code"] == 0
        assert entry["signal"] is None
        assert entry["ended_wall_ns"] >= entry["started_wall_ns"]
        log = eight_ranks.directory / f"rank-{entry['rank']}.jsonl"
        assert read_events(log)[0]["pid"] == entry["pid"]
    assert manifest["launcher"]["finished_wall_ns"] is not None
    claim = (eight_ranks.directory / ".run-id").read_text().strip()
    assert claim == manifest["run_id"]


def test_nproc_1_starts_one_rank_process_and_names_how_it_died(tmp_path: Path) -> None:
    # `--nproc 1` used to run the rank in the launcher's own process: a
    # crash then ended the command itself, with no manifest and no report.
    launched = run_cli(
        "run",
        "--simulate",
        "h200x8",
        "--nproc",
        "1",
        "--run-dir",
        "run",
        "--inject",
        "flashinfer.comm=crash",
        cwd=tmp_path,
        timeout=LAUNCH_TIMEOUT_S,
    )
    assert launched.returncode == 1, launched.describe()
    assert launched.lines()[0].startswith("Startup incomplete: 1 incomplete (run ")
    assert "  its launcher saw: rank 0 (pid " in launched.stdout
    assert ": starting 1 rank in run\n" in launched.stderr
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["world_size"] == 1
    (entry,) = manifest["ranks"]
    assert entry["signal"] == "SIGSEGV"
    assert read_events(tmp_path / "run" / "rank-0.jsonl")[0]["pid"] == entry["pid"]


# --- §4 a process that dies while several steps are in flight ----------------------------


def test_a_crash_with_several_steps_in_flight_names_them_and_the_signal(tmp_path: Path) -> None:
    launched = run_cli(
        "run",
        "--simulate",
        "b200x8",
        "--nproc",
        "2",
        "--grace",
        "1",
        "--run-dir",
        "run",
        "--inject",
        "allreduce_workspace/mnnvl=crash",
        # Held mid-probe, so the attention step is surely in flight when
        # mnnvl crashes (without it, a fast machine may finish it first).
        "--inject",
        "attention/FLASH_ATTN=hang",
        cwd=tmp_path,
        timeout=LAUNCH_TIMEOUT_S,
    )
    assert launched.returncode == 1, launched.describe()
    lines = launched.lines()
    assert lines[0].startswith("Startup incomplete: 2 incomplete")
    assert lines[1] == (
        "Not a real start: simulated host b200x8; injected faults: "
        "allreduce_workspace/mnnvl=crash; attention/FLASH_ATTN=hang"
    )
    assert lines[2].startswith("Root cause: rank ")
    assert lines[2].endswith(
        ": the process died before the rank finished "
        "(no run.finished in its log: it crashed or was killed)"
    )
    assert lines[3].startswith("  ")
    assert "steps were in flight:" in lines[3]
    assert "allreduce_workspace/mnnvl" in lines[3]
    # attention starts before allreduce_workspace (which waits for
    # flashinfer_comm, started with it) and cannot end while FLASH_ATTN hangs.
    assert "attention" in lines[3]
    assert "was killed by SIGSEGV at +" in lines[4]
    document = run_cli("replay", "--json", "run", cwd=tmp_path).json()
    cause = document["root_cause"]
    assert cause["step"] is None
    assert "allreduce_workspace/mnnvl" in cause["in_flight"]
    assert cause["process"]["signal"] == "SIGSEGV"


# --- §5 BaseExceptions from probes end in a report ------------------------------------------


@pytest.mark.parametrize(
    ("exception", "outcome"),
    [("KeyboardInterrupt", "interrupted"), ("SystemExit", "failed")],
)
def test_a_base_exception_from_a_probe_ends_in_the_report(
    tmp_path: Path, exception: str, outcome: str
) -> None:
    as_json = run_cli(
        "run",
        "--simulate",
        "zen4",
        "--json",
        "--run-dir",
        "json",
        "--inject",
        f"zentorch={exception}",
        cwd=tmp_path,
    )
    assert as_json.returncode == 1, as_json.describe()
    document = as_json.json()
    assert document["outcome"] == outcome
    assert document["root_cause"]["exception"]["type"] == exception
    as_text = run_cli(
        "run",
        "--simulate",
        "zen4",
        "--run-dir",
        "text",
        "--inject",
        f"zentorch={exception}",
        cwd=tmp_path,
    )
    assert as_text.returncode == 1, as_text.describe()
    assert as_text.lines()[0].startswith(f"Startup {outcome}: 1 {outcome}")


# --- §6 one run directory, one run ------------------------------------------------------------


def _start(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        command(*args),
        cwd=tmp_path,
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_two_runs_started_into_one_directory_never_share_it(tmp_path: Path) -> None:
    for attempt in range(6):
        run_dir = f"run-{attempt}"
        both = [
            _start(tmp_path, "run", "--simulate", "xeon", "--run-dir", run_dir) for _ in range(2)
        ]
        results = [(p.wait(timeout=120), *p.communicate()) for p in both]
        codes = sorted(code for code, _out, _err in results)
        assert codes == [0, 2], results
        loser = next(r for r in results if r[0] == 2)
        winner = next(r for r in results if r[0] == 0)
        assert loser[1] == ""  # never reports a run, its own or the other's
        assert "one run directory holds one run" in loser[2] or "already exists" in loser[2]
        assert winner[1].startswith("Startup ready: 1 ready")
        validated = run_cli("validate", run_dir, cwd=tmp_path)
        assert validated.returncode == 0, validated.describe()


def test_a_second_launch_into_a_directory_in_use_exits_before_writing(tmp_path: Path) -> None:
    both = [
        _start(tmp_path, "run", "--simulate", "h200x8", "--nproc", "2", "--run-dir", "shared")
        for _ in range(2)
    ]
    results = [(p.wait(timeout=LAUNCH_TIMEOUT_S), *p.communicate()) for p in both]
    assert sorted(code for code, _o, _e in results) == [0, 2], results
    loser = next(r for r in results if r[0] == 2)
    assert loser[1] == ""
    assert "Traceback" not in loser[2]
    document = run_cli("replay", "--json", "shared", cwd=tmp_path).json()
    assert document["outcome"] == "ready"
    assert len(document["ranks"]) == 2
    assert run_cli("validate", "shared", cwd=tmp_path).returncode == 0


# --- §9 a log says what was real -------------------------------------------------------------


def test_reports_say_first_what_was_simulated_and_injected(
    attention_failure: StoredRun, tmp_path: Path
) -> None:
    expected = (
        "Not a real start: simulated host h200x8; injected faults: "
        "attention/FLASH_ATTN=RuntimeError:CUDA error: no kernel image is available"
    )
    assert attention_failure.completed.lines()[1] == expected
    cwd = attention_failure.directory.parent
    assert run_cli("replay", "run", cwd=cwd).lines()[1] == expected
    assert run_cli("explain", "run", cwd=cwd).lines()[1] == expected
    document = run_cli("replay", "--json", "run", cwd=cwd).json()
    assert document["simulated"] == "h200x8"
    assert document["injected"] == [
        "attention/FLASH_ATTN=RuntimeError:CUDA error: no kernel image is available"
    ]


def test_a_cutoff_is_said_and_unfinished_ranks_are_running(eight_ranks: StoredRun) -> None:
    cwd = eight_ranks.directory.parent.parent
    name = f"startup-runs/{eight_ranks.directory.name}"
    replayed = run_cli("replay", "--until", "3", name, cwd=cwd)
    assert replayed.returncode == 1
    lines = replayed.lines()
    assert lines[0].startswith("Startup running at the cutoff seq 3")
    assert "died" not in replayed.stdout
    assert "Root cause: none so far (no rank had failed by the cutoff)" in lines
