"""A run across two nodes without a shared filesystem (SPEC §5): two
torchrun launchers, one per "node", rendezvous over c10d on this machine and
start two ranks each, every node writing its own run directory. At the end
of the startup rank 0's directory holds the whole run; a node that died is
named missing there, bounded by the group timeout; and the nodes'
directories, copied side by side, read as one run.

Both nodes run on this machine, so both would take the rendezvous endpoint
for their own address: ``is_host`` says which one hosts the rendezvous store
(as a real second node, whose address differs, would find by itself).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from .harness import (
    Background,
    environment,
    free_port,
    pid_of,
    poll_file,
    read_events,
    run_cli,
    step_started,
    wait_for_event,
)

pytestmark = pytest.mark.slow

TORCHRUN = Path(sys.executable).with_name("torchrun")

#: Upper bound for one two-node launch: about 20 s when healthy on two
#: loaded cores (six processes import torch); past it the launch is hung.
NODE_TIMEOUT_S = 120.0

#: The group timeout of a launch whose node dies: how long a rank waits for
#: a peer that never comes, and rank 0 for the logs of ranks that do not
#: deliver. Forming the group must fit in it (the ranks of the two nodes
#: import torch at about the same time); the other launches keep a wide one.
GROUP_TIMEOUT_S = 12.0


def _start_nodes(
    tmp_path: Path, *options: str, group_timeout_s: float = 60.0, max_restarts: int = 0
) -> tuple[Background, Background]:
    """Node 0 and node 1 of one launch (two ranks each), with run
    directories ``node0`` and ``node1``; torchrun restarts a failed worker
    group ``max_restarts`` times."""
    if not TORCHRUN.exists():
        pytest.skip("torch (and its torchrun) is not installed")
    port = free_port()
    # torchrun's agent keeps the store it shares with its workers from one
    # attempt to the next, and a restarted group reads the last attempt's
    # addresses there (pytorch/pytorch#135712): a store of each attempt's own.
    env = environment(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1") if max_restarts else environment()
    nodes = []
    for node in (0, 1):
        command = [
            str(TORCHRUN),
            "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "2",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-id", "two-nodes", "--rdzv-conf", f"is_host={int(node == 0)}",
            "--max-restarts", str(max_restarts),
            "-m", "orchestrator", "run", "--run-dir", f"node{node}",
            "--group-timeout", str(group_timeout_s), *options,
        ]  # fmt: skip
        nodes.append(
            Background(command, cwd=tmp_path, env=env, name=f"node{node}", new_session=True)
        )
    return nodes[0], nodes[1]


def _kill_ranks(run_dir: Path) -> None:
    """SIGKILL the ranks whose logs are in ``run_dir`` (torchrun starts its
    workers in sessions of their own: killing its group leaves them)."""
    for log in run_dir.glob("rank-*.jsonl"):
        with contextlib.suppress(IndexError, KeyError, ProcessLookupError):
            pid = int(read_events(log)[0]["pid"])
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"orchestrator" in cmdline:
                os.kill(pid, signal.SIGKILL)


def _kill_node(node: Background, run_dir: Path) -> None:
    """The node goes down: every rank on it and its launcher, at once (the
    ranks first: a rank outliving its agent a moment would be told to stop
    and would deliver its log, as a node that died cannot)."""
    with contextlib.suppress(OSError):
        _kill_ranks(run_dir)
    node.kill_group()


def _replay(tmp_path: Path, *paths: str) -> dict[str, object]:
    replayed = run_cli("replay", "--json", *paths, cwd=tmp_path)
    document: dict[str, object] = replayed.json()
    return document


def _manifest_ranks(run_dir: Path) -> dict[int, dict[str, object]]:
    manifest = json.loads((run_dir / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["collected_by"] == 0
    return {entry["rank"]: entry for entry in manifest["ranks"]}


def test_rank_0s_directory_holds_the_whole_run(tmp_path: Path) -> None:
    node0, node1 = _start_nodes(tmp_path, "--simulate", "h200x8")
    try:
        done0, done1 = node0.finish(NODE_TIMEOUT_S), node1.finish(NODE_TIMEOUT_S)
    finally:
        node0.kill_group()
        node1.kill_group()

    assert done0.returncode == 0, done0.describe()
    assert done1.returncode == 0, done1.describe()
    # Each node wrote its own ranks' logs; rank 0 collected the others.
    assert sorted(p.name for p in (tmp_path / "node1").glob("rank-*.jsonl")) == [
        "rank-2.jsonl",
        "rank-3.jsonl",
    ]
    node0_dir = tmp_path / "node0"
    assert sorted(p.name for p in node0_dir.glob("rank-*.jsonl")) == [
        f"rank-{rank}.jsonl" for rank in range(4)
    ]
    for rank in (2, 3):
        copied = (node0_dir / f"rank-{rank}.jsonl").read_bytes()
        assert copied == (tmp_path / "node1" / f"rank-{rank}.jsonl").read_bytes()
    # Rank 0's own report (torchrun's output) is of the whole run.
    assert "Startup ready: 4 ready (run two-nodes, 4 of 4 ranks)" in done0.stdout, done0.describe()
    document = _replay(tmp_path, "node0")
    assert (document["outcome"], document["world_size"]) == ("ready", 4)
    ranks = _manifest_ranks(node0_dir)
    assert [(ranks[r]["node_rank"], ranks[r]["local_rank"]) for r in range(4)] == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
    ]
    assert not any("not_delivered" in entry for entry in ranks.values())
    # The nodes' directories side by side are one run: the ranks both hold
    # are read once.
    together = _replay(tmp_path, "node1", "node0")
    assert (together["outcome"], together["world_size"]) == ("ready", 4)
    assert [r["rank"] for r in together["ranks"]] == [0, 1, 2, 3]  # type: ignore[index]
    validated = run_cli("validate", "node0", "node1", cwd=tmp_path)
    assert validated.returncode == 0, validated.describe()


def test_a_failure_on_the_other_node_is_the_root_cause_in_rank_0s_report(tmp_path: Path) -> None:
    fault = "3:zentorch=RuntimeError:unknown zentorch failure"
    node0, node1 = _start_nodes(tmp_path, "--simulate", "zen4", "--inject", fault)
    try:
        done0, done1 = node0.finish(NODE_TIMEOUT_S), node1.finish(NODE_TIMEOUT_S)
    finally:
        node0.kill_group()
        node1.kill_group()

    assert done0.returncode != 0, done0.describe()
    assert done1.returncode != 0, done1.describe()
    # One report for the launch, rank 0's: node 1's directory holds half a
    # run, and its ranks print none of it.
    assert "Startup failed" not in done1.stdout, done1.describe()
    # Node 0's report: its run directory, replayed (rank 0's own printout
    # may be cut short when torchrun's agents stop every rank once one has
    # failed).
    document = _replay(tmp_path, "node0")
    assert document["outcome"] == "failed"
    assert document["world_size"] == 4
    root = document["root_cause"]
    assert isinstance(root, dict)
    assert (root["rank"], root["step"]) == (3, "platform")
    assert "unknown zentorch failure" in json.dumps(root["exception"])


def test_every_attempt_of_a_restarted_worker_group_leaves_its_own_run(tmp_path: Path) -> None:
    # Rank 3 dies mid-start and torchrun restarts the worker group. Each
    # agent counts only its own node's failures (TORCHELASTIC_RESTART_COUNT):
    # node 1's counts one; node 0's counts one when its ranks fail in an
    # exchange with rank 3 first, and none when it restarts them healthy for
    # node 1. A restart that named its run after its own node's count found
    # its directory claimed by the first attempt, or its ranks' logs there:
    # it left no log. The nodes now agree on the count, 1 or 2.
    node0, node1 = _start_nodes(
        tmp_path, "--simulate", "h200x8", "--inject", "3:attention/FLASH_ATTN=hang",
        max_restarts=1,
    )  # fmt: skip

    def alive() -> bool:
        return node0.running() and node1.running()

    def rank_3_hanging(attempt: str) -> Path:
        (log,) = poll_file(
            lambda: list(tmp_path.glob(f"node[01]{attempt}/rank-3.jsonl")),
            bool,
            alive=alive,
            deadline_s=NODE_TIMEOUT_S,
            what=f"rank 3's log in node0{attempt} or node1{attempt}",
        )
        wait_for_event(
            log, step_started("attention/FLASH_ATTN"), alive=alive, deadline_s=NODE_TIMEOUT_S
        )
        return log

    try:
        first = rank_3_hanging("")
        os.kill(pid_of(first), signal.SIGKILL)
        restarted = rank_3_hanging("-restart-[12]")
        # The restart has started: the launch is stopped.
        node0.send(signal.SIGTERM)
        node1.send(signal.SIGTERM)
        node0.finish(NODE_TIMEOUT_S)
        node1.finish(NODE_TIMEOUT_S)
    finally:
        for run_dir in tmp_path.glob("node[01]-restart-*"):
            with contextlib.suppress(OSError):
                _kill_ranks(run_dir)
        node0.kill_group()
        node1.kill_group()

    suffix = restarted.parent.name[len("node0") :]  # -restart-K
    assert suffix in ("-restart-1", "-restart-2"), restarted
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == [
        "node0",
        f"node0{suffix}",
        "node1",
        f"node1{suffix}",
    ]
    assert pid_of(restarted) != pid_of(first)
    for attempt in ("", suffix):
        run_id = f"two-nodes{attempt}"
        for node in (0, 1):
            assert (tmp_path / f"node{node}{attempt}" / ".run-id").read_text() == f"{run_id}\n"
        # Each attempt's directories, side by side, are that attempt's run.
        document = _replay(tmp_path, f"node0{attempt}", f"node1{attempt}")
        assert (document["run_id"], document["world_size"]) == (run_id, 4), document
        assert [r["rank"] for r in document["ranks"]] == [0, 1, 2, 3]  # type: ignore[index]
    # The first attempt's record says what failed; the restart's, its start.
    root = _replay(tmp_path, "node0", "node1")["root_cause"]
    assert isinstance(root, dict)
    assert root["rank"] == 3, root
    assert "attention/FLASH_ATTN" in str(root["description"]), root
    restart = _replay(tmp_path, f"node0{suffix}", f"node1{suffix}")
    assert restart["outcome"] == "interrupted", restart


def test_a_probe_that_hangs_on_the_other_node_ends_in_time_and_is_named(tmp_path: Path) -> None:
    # A real hang (never released) on rank 3: its probe is abandoned at the
    # timeout, every process ends, and rank 0's report says where it hung.
    node0, node1 = _start_nodes(
        tmp_path, "--simulate", "h200x8", "--inject", "3:attention/FLASH_ATTN=hang",
        "--timeout", "2", "--stall", "0.5",
    )  # fmt: skip
    try:
        done0, done1 = node0.finish(NODE_TIMEOUT_S), node1.finish(NODE_TIMEOUT_S)
    finally:
        node0.kill_group()
        node1.kill_group()

    assert done0.returncode == 0, done0.describe()
    assert done1.returncode == 0, done1.describe()
    document = _replay(tmp_path, "node0")
    assert document["outcome"] == "ready"
    (timed_out,) = [m for m in document["messages"] if m["code"] == "step.timed_out"]
    assert timed_out["ranks"] == [3]
    assert timed_out["text"].startswith(
        "Step attention/FLASH_ATTN timed out after 2 s, waiting in fire (_faults.py:"
    )
    explained = run_cli("explain", "node0", "--rank", "3", cwd=tmp_path).stdout
    assert "waiting in fire (_faults.py:" in explained
    assert ", at its timeout" in explained


def test_a_node_killed_mid_start_is_named_missing_in_rank_0s_report(tmp_path: Path) -> None:
    # Node 1's ranks hang in a probe (past forming the process group), so
    # the machine goes down while they are mid-start, whatever the timing.
    node0, node1 = _start_nodes(
        tmp_path,
        "--simulate",
        "h200x8",
        "--inject",
        "2-3:attention/FLASH_ATTN=hang",
        group_timeout_s=GROUP_TIMEOUT_S,
    )
    try:
        for rank in (2, 3):
            wait_for_event(
                tmp_path / "node1" / f"rank-{rank}.jsonl",
                step_started("attention/FLASH_ATTN"),
                alive=node1.running,
                deadline_s=NODE_TIMEOUT_S,
            )
        _kill_node(node1, tmp_path / "node1")
        done0 = node0.finish(NODE_TIMEOUT_S)
    finally:
        _kill_node(node0, tmp_path / "node0")
        _kill_node(node1, tmp_path / "node1")

    assert done0.returncode != 0, done0.describe()
    node0_dir = tmp_path / "node0"
    assert sorted(p.name for p in node0_dir.glob("rank-*.jsonl")) == [
        "rank-0.jsonl",
        "rank-1.jsonl",
    ]
    ranks = _manifest_ranks(node0_dir)
    for rank in (2, 3):
        # Rank 0 waited the group timeout for it, or was stopped first (its
        # agent stops every rank once rank 1 has failed): either way named.
        reason = str(ranks[rank]["not_delivered"])
        assert reason.startswith("was not collected: rank 0 was stopped by SIGTERM ") or (
            reason
            == f"did not deliver its log to rank 0 within {GROUP_TIMEOUT_S:g} s of rank 0's end "
            "(dead, partitioned, or still running)"
        ), reason
        # What rank 0 knows of it: it announced itself once the group formed.
        assert (ranks[rank]["node_rank"], ranks[rank]["local_rank"]) == (1, rank - 2)
        assert (
            ranks[rank]["pid"] == read_events(tmp_path / "node1" / f"rank-{rank}.jsonl")[0]["pid"]
        )
    document = _replay(tmp_path, "node0")
    assert document["outcome"] == "incomplete"
    assert document["world_size"] == 4
    root = document["root_cause"]
    assert isinstance(root, dict)
    assert root["rank"] == 2
    text = run_cli("replay", "node0", cwd=tmp_path).lines()
    assert text[2].startswith("Root cause: rank 2 (pid "), text
    assert "its log is missing" in text[2], text
    assert ranks[2]["not_delivered"] in text[2], text
    validated = run_cli("validate", "node0", cwd=tmp_path)
    assert validated.returncode == 1, validated.describe()
    assert "rank 2 of world size 4 has no log" in validated.stdout, validated.describe()
    assert str(ranks[2]["not_delivered"]) in validated.stdout, validated.describe()
    # With node 1's own directory, its ranks are there: they died mid-start.
    together = _replay(tmp_path, "node0", "node1")
    assert together["outcome"] == "incomplete"
    assert [r["rank"] for r in together["ranks"]] == [0, 1, 2, 3]  # type: ignore[index]


def test_a_stop_of_rank_0_after_its_end_is_named_not_blamed_on_a_peer(tmp_path: Path) -> None:
    # Rank 3 is slow but healthy (an optional probe hangs to its timeout),
    # so rank 0 ends first and waits for it in the last exchange; there it
    # is stopped. Rank 0's manifest said the healthy peers "did not deliver
    # their log (dead, partitioned, or still running)", and the stop was
    # recorded nowhere.
    node0, node1 = _start_nodes(
        tmp_path, "--simulate", "h200x8", "--tp", "1", "--inject", "3:flashinfer.comm=hang",
        "--timeout", "10",
    )  # fmt: skip

    def alive() -> bool:
        return node0.running() and node1.running()

    try:
        (log0,) = poll_file(
            lambda: list(tmp_path.glob("node*/rank-0.jsonl")),
            bool,
            alive=alive,
            deadline_s=NODE_TIMEOUT_S,
            what="rank 0's log",
        )
        wait_for_event(
            log0, lambda event: event["type"] == "run.finished", alive=alive,
            deadline_s=NODE_TIMEOUT_S,
        )  # fmt: skip
        os.kill(pid_of(log0), signal.SIGTERM)
        node0.finish(NODE_TIMEOUT_S)
        node1.finish(NODE_TIMEOUT_S)
    finally:
        node0.kill_group()
        node1.kill_group()

    home = log0.parent
    ranks = _manifest_ranks(home)
    for rank in (2, 3):
        assert str(ranks[rank]["not_delivered"]).startswith(
            "was not collected: rank 0 was stopped by SIGTERM after its startup ended"
        ), ranks[rank]
    text = run_cli("replay", home.name, cwd=tmp_path).lines()
    assert text[0].startswith("Startup incomplete"), text
    assert "rank 0 was stopped by SIGTERM after its startup ended" in text[2], text
    assert "did not deliver" not in "\n".join(text)
    # With their node's directory the peers are there: none failed (torchrun
    # stops them once rank 0 has exited).
    (other,) = {tmp_path / "node0", tmp_path / "node1"} - {home}
    together = _replay(tmp_path, home.name, other.name)
    outcomes = {r["rank"]: r["outcome"] for r in together["ranks"]}  # type: ignore[attr-defined]
    assert sorted(outcomes) == [0, 1, 2, 3], together
    assert set(outcomes.values()) <= {"ready", "interrupted"}, together


def test_ranks_do_not_outlive_a_torchrun_agent_killed_outright(tmp_path: Path) -> None:
    # torchrun starts its workers in sessions of their own; an agent killed
    # with SIGKILL (the OOM killer) cannot stop them. Each rank asked the
    # kernel for SIGTERM when its agent dies: it records the stop and ends
    # instead of hanging on.
    if not TORCHRUN.exists():
        pytest.skip("torch (and its torchrun) is not installed")
    command = [
        str(TORCHRUN), "--nproc-per-node", "2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", "agent-killed",
        "-m", "orchestrator", "run", "--run-dir", "run", "--simulate", "h200x8",
        "--group-timeout", "60", "--inject", "attention/FLASH_ATTN=hang",
    ]  # fmt: skip
    agent = Background(command, cwd=tmp_path, env=environment(), name="torchrun", new_session=True)
    logs = [tmp_path / "run" / f"rank-{rank}.jsonl" for rank in (0, 1)]
    try:
        for log in logs:
            wait_for_event(
                log,
                step_started("attention/FLASH_ATTN"),
                alive=agent.running,
                deadline_s=NODE_TIMEOUT_S,
            )
        agent.send(signal.SIGKILL)
        for log in logs:
            finished = wait_for_event(
                log,
                lambda event: event["type"] == "run.finished",
                alive=lambda: True,
                deadline_s=NODE_TIMEOUT_S,
            )
            assert finished["outcome"] == "interrupted", finished
            assert "SIGTERM" in json.dumps(finished["cause"]), finished
    finally:
        _kill_node(agent, tmp_path / "run")


def test_a_stop_of_rank_0_while_collecting_keeps_every_rank_in_its_manifest(
    tmp_path: Path,
) -> None:
    # One node of three ranks, one run directory. Rank 1 dies mid-start, so
    # rank 0, its run ended, waits for a log that will not come, with rank
    # 2's already beside its own; there it is stopped. The manifest left out
    # every rank from the one it waited for on whose log was on disk.
    if not TORCHRUN.exists():
        pytest.skip("torch (and its torchrun) is not installed")
    node = Background(
        [
            str(TORCHRUN), "--nnodes", "1", "--nproc-per-node", "3",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
            "-m", "orchestrator", "run", "--run-dir", "run", "--simulate", "h200x8",
            "--tp", "1", "--inject", "1:flashinfer.comm=hang",
            "--group-timeout", str(GROUP_TIMEOUT_S),
        ],
        cwd=tmp_path, env=environment(), name="node", new_session=True,
    )  # fmt: skip
    run = tmp_path / "run"
    try:
        wait_for_event(
            run / "rank-1.jsonl", step_started("flashinfer_comm"), alive=node.running,
            deadline_s=NODE_TIMEOUT_S,
        )  # fmt: skip
        os.kill(pid_of(run / "rank-1.jsonl"), signal.SIGKILL)
        for rank in (0, 2):
            wait_for_event(
                run / f"rank-{rank}.jsonl",
                lambda event: event["type"] == "run.finished",
                alive=node.running,
                deadline_s=NODE_TIMEOUT_S,
            )
        os.kill(pid_of(run / "rank-0.jsonl"), signal.SIGTERM)
        node.finish(NODE_TIMEOUT_S)
    finally:
        _kill_node(node, run)

    ranks = _manifest_ranks(run)
    assert sorted(ranks) == [0, 1, 2], ranks
    for rank in (1, 2):  # both logs are in rank 0's own directory
        assert ranks[rank]["collected"] is True, ranks[rank]
