"""Ray, as an engine uses it: four actors on a real local Ray cluster, one
orchestrator each, a real gloo group between them, their logs gathered into
the driver's run directory and replayed from there by the command line.

One Ray cluster for the module (starting one takes seconds and about a
gigabyte), and three launches the tests read, never change:

- a healthy start under the caller's ``TRACEPARENT``;
- ``RuntimeError`` injected into rank 2's FLASH_ATTN probe;
- rank 1's process killed by SIGSEGV in that probe (the actor dies);
- rank 1's probe hanging until the launch's timeout.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from events import RankIdentity, RunOutcome, RunStarted, StepSucceeded, read_log
from orchestrator._runner import derive_trace_id
from tests.orchestrator.cli.harness import Completed, call_cli, environment

ray = pytest.importorskip(
    "ray", reason="needs Ray: pip install -e '.[test,torch,ray]' (CI installs it)"
)
pytest.importorskip("torch", reason="needs torch: pip install -e '.[test,torch,ray]'")

from orchestrator.ray import RayLaunch, launch_on_ray  # noqa: E402

pytestmark = pytest.mark.slow

RANKS = 4
PROFILE = "h200x8"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
LAUNCHER_SPAN_ID = "00f067aa0ba902b7"
#: Forming the group waits for the slowest rank's torch import (seconds; far
#: more on loaded cores).
GROUP_TIMEOUT_S = 30.0
#: A launch ends in well under a minute; this bounds a broken one.
LAUNCH_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    """A local Ray cluster of two CPUs, started with an environment free of
    launcher and collector variables (its workers inherit it), and shut
    down, with every actor, after the module."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(environment(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0"))
    os.environ.pop("RAY_ADDRESS", None)
    try:
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            object_store_memory=80 * 2**20,
            logging_level="WARNING",
            log_to_driver=False,  # the ranks' messages are in their logs
        )
        try:
            yield
        finally:
            ray.shutdown()
    finally:
        os.environ.clear()
        os.environ.update(saved)


def launch(tmp_path: Path, **options: Any) -> RayLaunch:
    return launch_on_ray(
        RANKS,
        profile=PROFILE,
        run_dir=tmp_path / "run",
        group_timeout_s=GROUP_TIMEOUT_S,
        timeout_s=LAUNCH_TIMEOUT_S,
        **options,
    )


def replay_json(launched: RayLaunch, *options: str) -> tuple[Completed, dict[str, Any]]:
    """``startup-orchestrator replay RUN_DIR --json``, run as the user runs it."""
    done = call_cli("replay", str(launched.run_dir), "--json", *options, cwd=launched.run_dir)
    return done, done.json()


@pytest.fixture(scope="module")
def healthy(ray_cluster: None, tmp_path_factory: pytest.TempPathFactory) -> RayLaunch:
    return launch(
        tmp_path_factory.mktemp("healthy"),
        environ={"TRACEPARENT": f"00-{TRACE_ID}-{LAUNCHER_SPAN_ID}-01"},
    )


@pytest.fixture(scope="module")
def faulty(ray_cluster: None, tmp_path_factory: pytest.TempPathFactory) -> RayLaunch:
    return launch(
        tmp_path_factory.mktemp("faulty"),
        faults=["2:attention/FLASH_ATTN=RuntimeError:broken build"],
        environ={},
    )


@pytest.fixture(scope="module")
def crashed(ray_cluster: None, tmp_path_factory: pytest.TempPathFactory) -> RayLaunch:
    return launch(
        tmp_path_factory.mktemp("crashed"),
        faults=["1:attention/FLASH_ATTN=crash"],
        environ={},
    )


#: Well beyond a healthy start of four actors on two cores (10-20 s; 30 s seen
#: under a load average of 17).
HANG_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def hung(ray_cluster: None, tmp_path_factory: pytest.TempPathFactory) -> RayLaunch:
    return launch_on_ray(
        RANKS,
        profile=PROFILE,
        run_dir=tmp_path_factory.mktemp("hung") / "run",
        faults=["1:attention/FLASH_ATTN=hang"],
        group_timeout_s=GROUP_TIMEOUT_S,
        timeout_s=HANG_TIMEOUT_S,
        environ={},
    )


def test_a_healthy_start_is_one_ready_run_in_the_driver_run_directory(
    healthy: RayLaunch,
) -> None:
    assert healthy.ready
    assert [rank.rank for rank in healthy.ranks] == list(range(RANKS))
    assert sorted(path.name for path in healthy.run_dir.glob("rank-*.jsonl")) == [
        f"rank-{rank}.jsonl" for rank in range(RANKS)
    ]
    done, document = replay_json(healthy)

    assert done.returncode == 0, done.describe()
    assert document["outcome"] == "ready"
    assert document["run_id"] == healthy.run_id
    assert [(r["rank"], r["outcome"]) for r in document["ranks"]] == [
        (rank, "ready") for rank in range(RANKS)
    ]
    # The ranks agreed over a real gloo group of four.
    assert {r["allreduce_backend"] for r in document["ranks"]} == {"trtllm"}


def test_every_rank_formed_the_gloo_group_with_its_identity_from_ray(healthy: RayLaunch) -> None:
    for rank in range(RANKS):
        events = read_log(healthy.run_dir / f"rank-{rank}.jsonl").events
        started = events[0]
        assert isinstance(started, RunStarted)
        # One node: local ranks are the ranks, the node is 0.
        assert started.identity == RankIdentity(
            rank=rank, local_rank=rank, world_size=RANKS, local_world_size=RANKS, node_rank=0
        )
        [group] = [e for e in events if isinstance(e, StepSucceeded) and e.step == "process_group"]
        assert group.result == {"backend": "gloo", "world_size": RANKS}


def test_the_launch_is_one_trace_under_the_callers_span(healthy: RayLaunch, tmp_path: Path) -> None:
    trace_file = tmp_path / "trace.json"
    done, _document = replay_json(healthy, "--export", f"jaeger-json={trace_file}")
    assert done.returncode == 0, done.describe()

    [trace] = json.loads(trace_file.read_text())["data"]
    assert trace["traceID"] == TRACE_ID

    def children_of(span_id: str) -> list[dict[str, Any]]:
        return [
            span
            for span in trace["spans"]
            if any(ref["spanID"] == span_id for ref in span["references"])
        ]

    # The launch's span is the caller's child; each rank's root span its.
    [launch] = children_of(LAUNCHER_SPAN_ID)
    assert launch["operationName"] == f"launch {RANKS} ranks: ready"
    roots = children_of(launch["spanID"])
    assert sorted(span["operationName"] for span in roots) == [
        f"startup rank {rank}" for rank in range(RANKS)
    ]
    assert {span["traceID"] for span in trace["spans"]} == {TRACE_ID}


def test_the_manifest_records_every_actor(healthy: RayLaunch) -> None:
    manifest = json.loads((healthy.run_dir / "manifest.json").read_text())
    assert manifest["run_id"] == healthy.run_id
    assert manifest["world_size"] == RANKS
    assert manifest["simulated"] == PROFILE
    assert [entry["rank"] for entry in manifest["ranks"]] == list(range(RANKS))
    assert [entry["pid"] for entry in manifest["ranks"]] == [r.pid for r in healthy.ranks]
    assert all(entry["ended_wall_ns"] and entry.get("lost") is None for entry in manifest["ranks"])
    assert manifest["launcher"]["finished_wall_ns"]
    # The directory passes every integrity check, as a local launch's does.
    done = call_cli("validate", str(healthy.run_dir), cwd=healthy.run_dir)
    assert done.returncode == 0, done.describe()


def test_a_fault_on_one_actor_is_the_root_cause(faulty: RayLaunch) -> None:
    assert not faulty.ready
    assert faulty.ranks[2].error == "RuntimeError: broken build"
    done, document = replay_json(faulty)

    assert done.returncode == 1, done.describe()
    assert document["outcome"] == "failed"
    cause = document["root_cause"]
    assert (cause["rank"], cause["step"]) == (2, "attention/FLASH_ATTN")
    assert (cause["exception"]["type"], cause["exception"]["message"]) == (
        "RuntimeError",
        "broken build",
    )
    assert document["injected"] == ["2:attention/FLASH_ATTN=RuntimeError:broken build"]
    # Each peer is ready, or failed waiting for it: the attention probe and the
    # all-reduce agreement run side by side, and rank 2 may have agreed first.
    outcomes = [r["outcome"] for r in document["ranks"]]
    assert outcomes[2] == "failed"
    assert set(outcomes) <= {"ready", "failed"}


def test_without_a_callers_trace_the_run_id_names_the_one_trace(faulty: RayLaunch) -> None:
    trace_ids = {
        event.trace_id
        for rank in range(RANKS)
        for event in read_log(faulty.run_dir / f"rank-{rank}.jsonl").events
    }
    assert trace_ids == {derive_trace_id(faulty.run_id)}


def test_an_actor_that_died_is_the_root_cause_with_what_ray_said(crashed: RayLaunch) -> None:
    lost = crashed.ranks[1]
    assert lost.lost
    assert lost.error is not None
    assert lost.error.startswith(
        f"Ray actor {lost.actor_id} on node {lost.node_id}: ActorDiedError"
    )
    # It ran on the driver's node: what it logged until it died was read back.
    assert lost.log_path == crashed.run_dir / "rank-1.jsonl"
    done, document = replay_json(crashed)

    assert done.returncode == 1, done.describe()
    assert document["outcome"] == "incomplete"
    cause = document["root_cause"]
    assert (cause["rank"], cause["outcome"]) == (1, "incomplete")
    assert "attention/FLASH_ATTN" in cause["in_flight"]  # where it died
    assert cause["process"]["lost"] == lost.error
    assert cause["process"]["description"].startswith(f"rank 1 (pid {lost.pid}) was lost at +")
    # The survivors' logs came back (ready, or failed waiting for it).
    outcomes = [r["outcome"] for r in document["ranks"]]
    assert outcomes[1] == "incomplete"
    assert set(outcomes[:1] + outcomes[2:]) <= {"ready", "failed"}


def test_the_text_report_says_what_the_driver_saw_of_the_lost_actor(crashed: RayLaunch) -> None:
    done = call_cli("replay", str(crashed.run_dir), cwd=crashed.run_dir)

    lines = done.lines()
    assert lines[2].startswith("Root cause: rank 1")
    assert any(
        line.strip().startswith("its launcher saw: rank 1 (pid ") and "ActorDiedError" in line
        for line in lines
    ), done.describe()


def test_a_rank_that_hangs_is_stopped_at_the_timeout_and_its_log_comes_back(
    hung: RayLaunch,
) -> None:
    stuck = hung.ranks[1]
    assert stuck.outcome is RunOutcome.INTERRUPTED
    reason = f"not ended within the Ray launch's {HANG_TIMEOUT_S:g} s"
    assert stuck.error == f"StartupInterrupted: stopped: {reason}"
    done, document = replay_json(hung)

    assert done.returncode == 1, done.describe()
    cause = document["root_cause"]
    assert (cause["rank"], cause["step"]) == (1, "attention/FLASH_ATTN")
    assert cause["exception"]["type"] == "orchestrator.StartupInterrupted"
    assert reason in cause["exception"]["message"]
