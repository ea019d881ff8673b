"""Multi-rank starts: the local launcher (``run --nproc N``) and torchrun."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from events import launch_span_id
from tests.exporters.otlp_receivers import GrpcReceiver

from .conftest import StoredRun
from .harness import (
    LAUNCH_TIMEOUT_S,
    environment,
    free_port,
    message,
    only_run_directory,
    rank_logs,
    read_events,
    run_cli,
)

pytestmark = pytest.mark.slow

TORCH_MISSING = importlib.util.find_spec("torch") is None


def _agreed(log: Path) -> list[object]:
    return [
        event["value"]
        for event in read_events(log)
        if event["type"] == "decision.made" and event["name"] == "allreduce.agreed"
    ]


def test_eight_simulated_ranks_replay_ready(eight_ranks: StoredRun, tmp_path: Path) -> None:
    logs = rank_logs(eight_ranks.directory)
    assert [p.name for p in logs] == [f"rank-{r}.jsonl" for r in range(8)]
    assert f"starting 8 ranks in startup-runs/{eight_ranks.directory.name}" in (
        eight_ranks.completed.stderr
    )

    replayed = run_cli("replay", str(eight_ranks.directory), cwd=tmp_path)

    assert replayed.returncode == 0, replayed.describe()
    lines = replayed.lines()
    assert lines[0].startswith("Startup ready: 8 ready (run "), lines[0]
    assert lines[0].endswith(", 8 of 8 ranks)")
    assert lines[1] == "Not a real start: simulated host h200x8"
    assert lines[2] == "Root cause: none (every rank is ready)"
    table = next(line for line in lines if line.lstrip().startswith("0-7 "))
    assert table.split() == [
        "0-7",
        "ready",
        "cuda",
        "CudaPlatform",
        "FLASH_ATTN",
        "trtllm",
        "on",
        "allreduce_workspace",
    ]
    assert any(
        line.strip().startswith(
            "WARNING [ranks 0-7] FlashInfer allreduce workspace with backend=mnnvl unavailable"
        )
        for line in lines
    ), replayed.stdout
    ready = "INFO [ranks 0-7] Initialized FlashInfer allreduce fusion workspace with backend=trtllm"
    assert ready in replayed.stdout
    # Live, every rank prints its messages (honouring scope): the local-scope
    # WARNING once, on local rank 0.
    live = eight_ranks.completed.stderr.splitlines()
    assert sum("backend=mnnvl unavailable" in line for line in live) == 1
    document = eight_ranks.completed.json()
    assert [r["allreduce_backend"] for r in document["ranks"]] == ["trtllm"] * 8
    if not TORCH_MISSING:
        # The ranks agreed through gloo, each recording the same choice.
        assert [_agreed(log) for log in logs] == [["trtllm"]] * 8


def test_run_json_equals_replay_json(eight_ranks: StoredRun, tmp_path: Path) -> None:
    replayed = run_cli("replay", "--json", str(eight_ranks.directory), cwd=tmp_path)

    assert replayed.returncode == 0, replayed.describe()
    assert replayed.json() == eight_ranks.completed.json()
    document = replayed.json()
    assert document["run_id"] == eight_ranks.directory.name
    assert document["world_size"] == 8
    assert document["outcome"] == "ready"
    assert [r["rank"] for r in document["ranks"]] == list(range(8))
    assert document["root_cause"] is None
    assert document["divergences"] == []
    warning = message(document, "allreduce.attempt_failed")
    assert (warning["severity"], warning["ranks"]) == ("warning", list(range(8)))


def test_explicit_mnnvl_without_multicast_disables_fusion(tmp_path: Path) -> None:
    ran = run_cli(
        "run",
        "--simulate",
        "h200x8",
        "--nproc",
        "2",
        "--allreduce-backend",
        "mnnvl",
        "--json",
        "--run-dir",
        "run",
        cwd=tmp_path,
        timeout=LAUNCH_TIMEOUT_S,
    )

    # An explicit backend has no fallback; fusion is off, the start goes on.
    assert ran.returncode == 0, ran.describe()
    document = ran.json()
    assert document["outcome"] == "ready"
    assert [r["fusion_enabled"] for r in document["ranks"]] == [False, False]
    assert [r["allreduce_backend"] for r in document["ranks"]] == [None, None]
    failed = message(document, "allreduce.workspace_failed")
    assert (failed["severity"], failed["ranks"]) == ("error", [0, 1])
    assert failed["text"].startswith(
        "Failed to initialize FlashInfer allreduce fusion workspace with backend=mnnvl"
    )
    text = run_cli("replay", "run", cwd=tmp_path)
    assert "ERROR [ranks 0-1] Failed to initialize FlashInfer allreduce fusion workspace" in (
        text.stdout
    )


@pytest.mark.skipif(TORCH_MISSING, reason="torch is not importable: torchrun is not available")
def test_torchruns_own_summary_names_the_rank_that_failed_first(tmp_path: Path) -> None:
    # Rank 2 fails; ranks 0 and 1 then fail in the exchange that follows.
    # torchrun takes its "Root Cause" from its workers' error files.
    torchrun = Path(sys.executable).with_name("torchrun")
    process = subprocess.run(
        [
            str(torchrun),
            "--standalone",
            "--nproc-per-node",
            "3",
            "-m",
            "orchestrator",
            "run",
            "--simulate",
            "h200x8",
            "--inject",
            "2:attention/FLASH_ATTN=RuntimeError:boom",
        ],
        cwd=tmp_path,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=LAUNCH_TIMEOUT_S,
        check=False,
    )

    assert process.returncode == 1, process.stderr
    summary = process.stderr.partition("Root Cause (first observed failure):")[2]
    root, _, _ = summary.partition("=" * 60)
    failures = process.stderr.partition("Failures:")[2].partition("Root Cause")[0]
    # torchrun lists the workers that had exited when it saw the first
    # failure. Rank 2 waits for its peers in the end-of-run exchange and
    # usually ends with them; when it has, it is the root cause, with its
    # exception and traceback, and the consequences are later failures.
    if "rank      : 2 (local_rank: 2)" in failures:
        pytest.fail(f"rank 2 is listed, but not as the root cause:\n{process.stderr}")
    if "rank      : 2 (local_rank: 2)" in root:
        assert "RuntimeError: boom" in root, root
        assert 'File "' in root, root  # the traceback, not "To enable traceback"
        assert failures.count("orchestrator.GroupError") == 2, failures
    else:
        # It had not ended yet: its peers still do not claim to be first
        # with a time before its failure, and each names what it saw.
        assert "orchestrator.GroupError" in root, process.stderr
    # Rank 0, which holds the merged record, says it in one line, once.
    verdicts = [line for line in process.stderr.splitlines() if "startup failed:" in line]
    assert len(verdicts) == 1, process.stderr
    assert verdicts[0].startswith(
        "startup-orchestrator: startup failed: rank 2, step attention/FLASH_ATTN: "
        "RuntimeError: boom"
    ), verdicts


def _alone_on_node_0(tmp_path: Path, **torchrun: str) -> Path:
    """Run rank 0, node 0 of a two-node torchrun group (its variables and
    ``torchrun``'s) whose other node never comes, with a 1 s group timeout;
    the run directory it failed into."""
    env = environment(
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="2",
        LOCAL_WORLD_SIZE="1",
        GROUP_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        **torchrun,
    )
    run = run_cli("run", "--simulate", "h200x8", "--group-timeout", "1", cwd=tmp_path, env=env)
    assert run.returncode == 1, run.describe()
    return only_run_directory(tmp_path / "startup-runs")


@pytest.mark.skipif(TORCH_MISSING, reason="torch is not importable: gloo is not available")
def test_a_restartable_node_whose_peers_never_join_leaves_a_log_naming_it(
    tmp_path: Path,
) -> None:
    # A group that may restart: no attempt number can be agreed on.
    run_dir = _alone_on_node_0(
        tmp_path,
        TORCHELASTIC_RUN_ID="job-7",
        TORCHELASTIC_MAX_RESTARTS="3",
        TORCHELASTIC_RESTART_COUNT="2",
    )
    assert run_dir.name == "job-7-node-0-unjoined-2"
    document = run_cli("replay", str(run_dir), "--json", cwd=tmp_path).json()
    assert [(r["rank"], r["outcome"]) for r in document["ranks"]] == [
        (0, "failed"),
        (1, "incomplete"),  # the peer that never came is named, not left out
    ]
    assert document["ranks"][0]["last_step"] == "process_group"
    failed = message(document, "run.failed")
    assert failed["ranks"] == [0]
    assert failed["text"].startswith(
        "Startup failed: GroupError: init_process_group across the process group failed: "
    ), failed


@pytest.mark.skipif(TORCH_MISSING, reason="torch is not importable: gloo is not available")
def test_a_peer_that_never_joins_fails_the_process_group_with_the_groups_own_timeout(
    tmp_path: Path,
) -> None:
    # A named launch that does not restart forms its group in the run's
    # process_group step. The step's own timeout leaves the group's time to
    # say what went wrong first: failed with its error, not timed out.
    run_dir = _alone_on_node_0(tmp_path, TORCHELASTIC_RUN_ID="job-8")
    assert run_dir.name == "job-8"
    (ended,) = [
        event
        for event in read_events(run_dir / "rank-0.jsonl")
        if event.get("step") == "process_group" and event["type"] != "step.started"
    ]
    assert ended["type"] == "step.failed", ended
    assert ended["cause"]["type"] == "orchestrator.GroupError", ended


@pytest.mark.skipif(TORCH_MISSING, reason="torch is not importable: torchrun is not available")
def test_torchrun_four_ranks_share_one_run_and_one_trace(tmp_path: Path) -> None:
    torchrun = Path(sys.executable).with_name("torchrun")
    assert torchrun.exists(), f"torch is installed but {torchrun} is missing"
    with GrpcReceiver() as receiver:
        process = _torchrun_four(torchrun, tmp_path, receiver.endpoint)
        spans = receiver.spans()

    assert process.returncode == 0, process.stdout + process.stderr
    assert "Traceback" not in process.stderr, process.stderr
    run_dir = only_run_directory(tmp_path / "startup-runs")
    logs = rank_logs(run_dir)
    assert [p.name for p in logs] == [f"rank-{r}.jsonl" for r in range(4)]
    events = [read_events(log) for log in logs]
    trace_id = events[0][0]["trace_id"]
    assert {e["trace_id"] for rank_events in events for e in rank_events} == {trace_id}
    assert {e["run_id"] for rank_events in events for e in rank_events} == {run_dir.name}
    assert [rank_events[-1]["outcome"] for rank_events in events] == ["ready"] * 4
    agreed = [
        [e for e in rank_events if e["type"] == "decision.made" and e["name"] == "allreduce.agreed"]
        for rank_events in events
    ]
    assert [[e["value"] for e in found] for found in agreed] == [["trtllm"]] * 4
    assert [found[0]["inputs"]["ranks"] for found in agreed] == [4] * 4
    # Rank 0 prints the report of the whole run once every rank is done.
    document = json.loads(process.stdout)
    assert (document["outcome"], document["world_size"]) == ("ready", 4)
    assert [r["allreduce_backend"] for r in document["ranks"]] == ["trtllm"] * 4
    # One trace, one root: rank 0, which holds the whole record, sent the
    # launch's own span, which every rank's root hangs from.
    [own] = [span for span in spans if "startup.rank" not in span.resource]
    assert own.span_id == launch_span_id(trace_id, run_dir.name)
    assert own.name == "launch 4 ranks: ready"
    assert own.parent_span_id is None
    roots = [span for span in spans if span.name.startswith("startup rank ")]
    assert sorted(span.name for span in roots) == [f"startup rank {rank}" for rank in range(4)]
    assert {root.parent_span_id for root in roots} == {own.span_id}
    promised = {e["span_id"] for rank_events in events for e in rank_events if e["type"] in (
        "run.started", "step.started"
    )}  # fmt: skip
    assert sorted(span.span_id for span in spans) == sorted(promised | {own.span_id})


def _torchrun_four(
    torchrun: Path, tmp_path: Path, endpoint: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(torchrun),
            "--standalone",
            "--nproc-per-node",
            "4",
            "-m",
            "orchestrator",
            "run",
            "--simulate",
            "h200x8",
            "--tp",
            "4",
            "--json",
        ],
        cwd=tmp_path,
        env=environment(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_EXPORTER_OTLP_PROTOCOL="grpc"),
        capture_output=True,
        text=True,
        timeout=LAUNCH_TIMEOUT_S,
        check=False,
    )
