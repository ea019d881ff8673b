"""The whole run in one place: at the end of the startup every rank posts
its log through its group's mailbox and rank 0 stores those its run
directory lacks, recording in the manifest the ranks that did not deliver.

Each "node" here is a :class:`~orchestrator.Startup` of one rank with a run
directory of its own, its group a fake that shares one mailbox (the real
one, torch's store, is exercised by ``tests/orchestrator/cli/
test_multinode.py``); the ranks run one after the other, so the test knows
what each had posted when rank 0 collects.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.from_thread
import anyio.lowlevel
import attrs
import pytest

from events import (
    Event,
    JsonValue,
    RankIdentity,
    RankProcess,
    RunFinished,
    RunOutcome,
    StepStarted,
    read_log,
    replay,
)
from orchestrator import Graph, Mailbox, RunDirectoryError, Startup, StartupInterrupted, Step
from orchestrator._run_directory import (
    Collected,
    Manifest,
    read_manifest,
    store_collected_log,
)

RUN_ID = "collected"
WORLD = 3


class MailboxGroup:
    """Rank ``rank`` of a world whose ranks all reach the end together (its
    ``all_gather`` hands back this rank's value for every rank), with one
    mailbox shared by every rank. ``take`` never waits: it records the wait
    asked for and answers with what was posted."""

    def __init__(self, rank: int, mailbox: dict[str, bytes], waits: list[float]) -> None:
        self._rank = rank
        self.mailbox = mailbox
        self.waits = waits

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return WORLD

    def all_gather(self, value: JsonValue) -> list[JsonValue]:
        return [value] * WORLD

    def post(self, key: str, data: bytes) -> None:
        self.mailbox[key] = data

    def take(self, key: str, timeout_s: float) -> bytes | None:
        self.waits.append(timeout_s)
        return self.mailbox.pop(key, None)


def _rank(
    tmp_path: Path,
    rank: int,
    mailbox: dict[str, bytes],
    waits: list[float] | None = None,
    *,
    wait_for_peers: bool = True,
    group_timeout_s: float = 0.5,
    faults: list[str] | None = None,
    group: MailboxGroup | None = None,
    body: Callable[[object], JsonValue] = lambda _context: {"ok": True},
    handle_signals: bool = False,
    environ: dict[str, str] | None = None,
) -> Startup:
    """Rank ``rank`` of a tiny graph (one step running ``body``), in run
    directory ``node<rank>``, its group a :class:`MailboxGroup` (or
    ``group``) over ``mailbox``."""
    if group is None:
        group = MailboxGroup(rank, mailbox, [] if waits is None else waits)
    assert isinstance(group, Mailbox)
    return Startup(
        graph=Graph("tiny", [Step(name="probe", body=body)]),
        identity=RankIdentity(
            rank=rank, local_rank=0, world_size=WORLD, local_world_size=1, node_rank=rank
        ),
        run_id=RUN_ID,
        run_dir=tmp_path / f"node{rank}",
        group=group,
        group_timeout_s=group_timeout_s,
        faults=faults,
        tracing=None,
        configure_logging=False,
        handle_signals=handle_signals,
        wait_for_peers=wait_for_peers,
        environ=environ or {},
    )


@pytest.mark.anyio
async def test_rank_0_stores_the_logs_posted_and_names_the_rank_that_did_not(
    tmp_path: Path,
) -> None:
    mailbox: dict[str, bytes] = {}
    with _rank(tmp_path, 1, mailbox) as peer:
        assert (await peer.arun()).undelivered == ()
    # Rank 2 never gets to the end: it posts nothing.
    waits: list[float] = []
    with _rank(tmp_path, 0, mailbox, waits) as collector:
        result = await collector.arun()

    assert result.ready
    assert result.undelivered == (2,)
    node0, node1 = tmp_path / "node0", tmp_path / "node1"
    assert (node0 / "rank-1.jsonl").read_bytes() == (node1 / "rank-1.jsonl").read_bytes()
    assert not (node0 / "rank-2.jsonl").exists()
    # Taken, not left behind in the store.
    assert not [key for key in mailbox if "/log/" in key]
    # Rank 0 waited for rank 2 no longer than the group timeout.
    assert waits
    assert max(waits) <= 0.5
    manifest = read_manifest(node0)
    assert manifest is not None
    assert (manifest.run_id, manifest.world_size, manifest.collected_by) == (RUN_ID, WORLD, 0)
    entries = {entry.rank: entry for entry in manifest.ranks}
    assert sorted(entries) == [0, 1, 2]
    assert (entries[1].pid, entries[1].node_rank) == (os.getpid(), 1)
    assert entries[1].not_delivered is None
    assert (entries[0].collected, entries[1].collected, entries[2].collected) == (
        True,
        True,
        False,
    )
    assert entries[1].describe() == (
        f"rank 1 (pid {os.getpid()}, node 1, host {socket.gethostname()}): "
        "its log is in the run directory"
    )
    assert entries[2].pid is None
    assert entries[2].not_delivered is not None
    assert entries[2].not_delivered.startswith("did not deliver its log to rank 0 within 0.5 s")
    # The directory alone replays the run: rank 2 is the one to look at.
    outcome = replay(
        [read_log(node0 / f"rank-{rank}.jsonl") for rank in (0, 1)],
        launch=manifest.to_launch_record(source=str(node0 / "manifest.json")),
    )
    assert outcome.outcome is RunOutcome.INCOMPLETE
    assert outcome.root_cause is not None
    assert outcome.root_cause.rank == 2
    assert "did not deliver its log to rank 0" in outcome.root_cause.describe()


@pytest.mark.anyio
async def test_a_log_rank_0_already_holds_is_not_rewritten(tmp_path: Path) -> None:
    mailbox: dict[str, bytes] = {}
    for rank in (1, 2):
        with _rank(tmp_path, rank, mailbox) as peer:
            await peer.arun()
    node0 = tmp_path / "node0"
    node0.mkdir()
    (node0 / ".run-id").write_text(f"{RUN_ID}\n")
    # Rank 1's log is already here (a shared filesystem); another rank 2
    # log is here too, which must survive.
    (node0 / "rank-1.jsonl").hardlink_to(tmp_path / "node1" / "rank-1.jsonl")
    foreign = (tmp_path / "node2" / "rank-2.jsonl").read_bytes().replace(b"probe", b"other")
    (node0 / "rank-2.jsonl").write_bytes(foreign)
    with _rank(tmp_path, 0, mailbox) as collector:
        await collector.arun()

    assert (node0 / "rank-1.jsonl").samefile(tmp_path / "node1" / "rank-1.jsonl")
    assert (node0 / "rank-2.jsonl").read_bytes() == foreign
    manifest = json.loads((node0 / "manifest.json").read_text())
    entries = {entry["rank"]: entry for entry in manifest["ranks"]}
    assert "not_delivered" not in entries[1]
    assert entries[2]["not_delivered"] == (
        "delivered a log that differs from the one already in rank-2.jsonl (kept)"
    )


@pytest.mark.anyio
async def test_a_manifest_its_launcher_wrote_is_not_replaced(tmp_path: Path) -> None:
    # The launcher that started this rank (this process, here) wrote the
    # run's manifest first: it knows more than rank 0 does.
    from orchestrator._faults import FaultPlan

    node0 = tmp_path / "node0"
    node0.mkdir()
    (node0 / ".run-id").write_text(f"{RUN_ID}\n")
    Manifest.begin(
        run_id=RUN_ID, world_size=WORLD, faults=FaultPlan(), command=["my-launcher"]
    ).write(node0, exclusive=True)
    written = (node0 / "manifest.json").read_bytes()
    launcher = {"STARTUP_ORCHESTRATOR_LAUNCHER_PID": str(os.getpid())}
    with _rank(tmp_path, 0, {}, environ=launcher) as collector:
        result = await collector.arun()

    assert result.undelivered == (1, 2)
    assert (node0 / "manifest.json").read_bytes() == written


@pytest.mark.anyio
async def test_without_waiting_for_peers_nothing_is_collected(tmp_path: Path) -> None:
    # The command line's own launcher reads every rank's log from one
    # directory and writes the manifest itself.
    mailbox: dict[str, bytes] = {}
    with _rank(tmp_path, 1, mailbox, wait_for_peers=False) as startup:
        await startup.arun()
    assert not [key for key in mailbox if "/log/" in key]


def test_a_collected_log_is_written_once_extended_or_refused(tmp_path: Path) -> None:
    log = b'{"a": 1}\n{"b": 2}\n'
    assert store_collected_log(tmp_path, 3, log[:9]) is Collected.WRITTEN
    assert store_collected_log(tmp_path, 3, log) is Collected.EXTENDED
    assert (tmp_path / "rank-3.jsonl").read_bytes() == log
    assert store_collected_log(tmp_path, 3, log) is Collected.PRESENT
    assert store_collected_log(tmp_path, 3, log[:9]) is Collected.PRESENT
    assert store_collected_log(tmp_path, 3, b'{"c": 3}\n') is Collected.CONFLICT
    assert (tmp_path / "rank-3.jsonl").read_bytes() == log
    # No temporary file is left behind.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank-3.jsonl"]


async def _run_until_stopped(startup: Startup, stop: Callable[[], None] | None = None) -> None:
    """Run ``startup`` (whose probe hangs) and stop it once the probe runs,
    as a launcher that stops its ranks would (with ``stop``, default
    :meth:`Startup.stop`)."""
    probing = anyio.Event()

    def watch(event: Event) -> None:
        if isinstance(event, StepStarted) and event.step == "probe":
            probing.set()

    assert startup.log is not None
    with startup.log.subscribe(watch):
        async with anyio.create_task_group() as group:

            async def stop_when_probing() -> None:
                await probing.wait()
                (startup.stop if stop is None else stop)()

            group.start_soon(stop_when_probing)
            with pytest.raises(StartupInterrupted):
                await startup.arun()


@pytest.mark.anyio
async def test_an_interrupted_run_is_collected_within_a_short_bound(tmp_path: Path) -> None:
    mailbox: dict[str, bytes] = {}
    with _rank(tmp_path, 1, mailbox, group_timeout_s=60.0, faults=["probe=hang"]) as peer:
        await _run_until_stopped(peer)
    waits: list[float] = []
    with _rank(
        tmp_path, 0, mailbox, waits, group_timeout_s=60.0, faults=["probe=hang"]
    ) as collector:
        await _run_until_stopped(collector)

    node0 = tmp_path / "node0"
    # The stopped peer's log, its interruption recorded, reached rank 0.
    collected = read_log(node0 / "rank-1.jsonl").events
    assert isinstance(collected[-1], RunFinished)
    assert collected[-1].outcome is RunOutcome.INTERRUPTED
    # Rank 0 waited for rank 2 a few seconds, not the group timeout.
    assert waits
    assert 0 < max(waits) <= 5.0
    manifest = read_manifest(node0)
    assert manifest is not None
    assert manifest.injected == ("probe=hang",)
    entries = {entry.rank: entry for entry in manifest.ranks}
    assert entries[2].not_delivered is not None
    assert "within 5 s" in entries[2].not_delivered


@pytest.mark.anyio
async def test_a_run_a_signal_interrupted_names_the_ranks_that_did_not_deliver_in_the_short_bound(
    tmp_path: Path,
) -> None:
    # Rank 0 was stopped during the run, as its peers were: it still waits
    # for their logs (a few seconds), and a log that did not come is theirs
    # to explain.
    waits: list[float] = []
    with _rank(
        tmp_path, 0, {}, waits, group_timeout_s=60.0, faults=["probe=hang"], handle_signals=True
    ) as collector:
        await _run_until_stopped(collector, lambda: os.kill(os.getpid(), signal.SIGTERM))

    assert waits
    manifest = read_manifest(tmp_path / "node0")
    assert manifest is not None
    assert [entry.not_delivered for entry in manifest.ranks] == [
        None,
        *[
            "did not deliver its log to rank 0 within 5 s of rank 0's end (dead, partitioned, "
            "or still running)"
        ]
        * 2,
    ]


@pytest.mark.anyio
async def test_without_a_process_group_the_ranks_without_a_log_are_named(tmp_path: Path) -> None:
    # No group could be formed (torch missing, or none asked): nothing can
    # be delivered, and rank 0's record says so for every rank it lacks.
    startup = Startup(
        graph=Graph("tiny", [Step(name="probe", body=lambda _context: {"ok": True})]),
        identity=RankIdentity(rank=0, world_size=2, local_world_size=1),
        run_id=RUN_ID,
        run_dir=tmp_path / "node0",
        group=None,
        tracing=None,
        configure_logging=False,
        handle_signals=False,
        environ={},
    )
    with startup:
        await startup.arun()

    manifest = read_manifest(tmp_path / "node0")
    assert manifest is not None
    assert [(entry.rank, entry.not_delivered) for entry in manifest.ranks] == [
        (0, None),
        (1, "did not deliver its log to rank 0 (no process group was formed)"),
    ]


def test_a_manifest_reads_with_or_without_the_collected_fields() -> None:
    older = {
        "manifest_version": 1,
        "run_id": RUN_ID,
        "command": ["startup-orchestrator", "run"],
        "world_size": 2,
        "simulated": None,
        "injected": [],
        "launcher": {"pid": 10, "host": "a", "started_wall_ns": 1, "finished_wall_ns": 2},
        "ranks": [{"rank": 0, "pid": 11, "exit_code": 0}],
    }
    read = Manifest.from_json(older)
    assert read.collected_by is None
    assert read.ranks == (RankProcess(rank=0, pid=11, exit_code=0),)
    # A launcher's manifest is written as it always was.
    assert "collected_by" not in read.to_json()
    assert set(read.to_json()["ranks"][0]) == {
        "rank",
        "pid",
        "started_wall_ns",
        "ended_wall_ns",
        "exit_code",
        "signal",
        "stopped_by_launcher",
    }
    collected = attrs.evolve(
        read,
        collected_by=0,
        ranks=(
            RankProcess(rank=0, pid=11, host="a", node_rank=0, local_rank=0, collected=True),
            RankProcess(rank=1, not_delivered="did not deliver", collected=False),
        ),
    )
    assert Manifest.from_json(json.loads(json.dumps(collected.to_json()))) == collected
    with pytest.raises(RunDirectoryError, match="not a valid manifest"):
        Manifest.from_json({**older, "ranks": [{"rank": 0, "collected": "yes"}]})


class CountingGroup(MailboxGroup):
    """A :class:`MailboxGroup` that counts its collectives."""

    def __init__(self, rank: int, mailbox: dict[str, bytes], waits: list[float]) -> None:
        super().__init__(rank, mailbox, waits)
        self.collectives = 0

    def all_gather(self, value: JsonValue) -> list[JsonValue]:
        self.collectives += 1
        return super().all_gather(value)


@pytest.mark.anyio
async def test_a_rank_that_failed_in_an_exchange_posts_its_log_without_another(
    tmp_path: Path,
) -> None:
    # Its peers' collectives no longer line up with its own (one left
    # early, or went silent): a last exchange would only wait out the
    # group timeout before the log is posted.
    from orchestrator import GroupError

    def exchange(_context: object) -> JsonValue:
        raise GroupError(1, WORLD, "all_gather", "rank 2 is not in the exchange")

    mailbox: dict[str, bytes] = {}
    group = CountingGroup(1, mailbox, [])
    startup = _rank(tmp_path, 1, mailbox, group=group, body=exchange)
    with startup, pytest.raises(GroupError):
        await startup.arun()

    assert group.collectives == 0
    result = startup.result
    assert result is not None
    assert (result.outcome, result.peers_finished) == (RunOutcome.FAILED, False)
    posted = [key for key in mailbox if key.endswith("/log/1")]
    assert len(posted) == 1
    assert mailbox[posted[0]] == (tmp_path / "node1" / "rank-1.jsonl").read_bytes()


class SlowGroup(MailboxGroup):
    """A :class:`MailboxGroup` whose last exchange takes 0.6 s (longer than
    the group timeout the test gives it); it keeps the waits asked for the
    ranks' logs."""

    def __init__(self) -> None:
        super().__init__(0, {}, [])
        self.log_waits: list[float] = []

    def all_gather(self, value: JsonValue) -> list[JsonValue]:
        time.sleep(0.6)  # the exchange's own duration, not a wait for anything
        return super().all_gather(value)

    def take(self, key: str, timeout_s: float) -> bytes | None:
        if "/log/" in key:
            self.log_waits.append(timeout_s)
        return super().take(key, timeout_s)


@pytest.mark.anyio
async def test_after_a_last_exchange_that_outlasted_the_timeout_rank_0_still_waits_for_the_logs(
    tmp_path: Path,
) -> None:
    # The peers post right after the last exchange: however long it took,
    # rank 0 gives them a moment (at most the group timeout) to do so.
    group = SlowGroup()
    with _rank(tmp_path, 0, group.mailbox, group=group, group_timeout_s=0.5) as collector:
        result = await collector.arun()

    assert result.undelivered == (1, 2)
    assert len(group.log_waits) == WORLD - 1
    assert 0 < group.log_waits[0] <= 0.5, group.log_waits


class SignallingGroup(MailboxGroup):
    """A :class:`MailboxGroup` whose first look for a rank's log brings this
    process a SIGTERM (the launcher stopping every rank once one ended)."""

    sent = False

    def take(self, key: str, timeout_s: float) -> bytes | None:
        if "/log/" in key and not self.sent:
            self.sent = True
            os.kill(os.getpid(), signal.SIGTERM)
        return super().take(key, timeout_s)


@pytest.mark.anyio
async def test_a_stop_while_rank_0_collects_ends_the_wait_and_the_record_is_written(
    tmp_path: Path,
) -> None:
    # The event loop's signal receiver puts the default handlers back when
    # it closes; a SIGTERM after the run used to end the process there, with
    # no manifest. It is now recorded, and it ends the wait.
    group = SignallingGroup(0, {}, [])
    startup = _rank(
        tmp_path, 0, group.mailbox, group=group, group_timeout_s=30.0, handle_signals=True
    )
    with startup:
        result = await startup.arun()

    assert group.sent
    assert result.ready
    assert result.undelivered == (1, 2)
    manifest = read_manifest(tmp_path / "node0")
    assert manifest is not None
    assert [entry.not_delivered is not None for entry in manifest.ranks] == [False, True, True]
    # Rank 2, not yet waited for, is not to blame: its log may be on its way.
    assert manifest.ranks[2].not_delivered == (
        "was not collected: rank 0 was stopped by SIGTERM after its startup ended, before "
        "this rank's log came (its own node's run directory may hold it)"
    )


class StoppingGroup(MailboxGroup):
    """A :class:`MailboxGroup` whose first look for where a peer runs asks
    rank 0 to stop, on its event loop: the stop lands after the run ended,
    before the wait for the peers' logs began."""

    def __init__(self, mailbox: dict[str, bytes], waits: list[float]) -> None:
        super().__init__(0, mailbox, waits)
        self.stop: Callable[[], None] | None = None

    def take(self, key: str, timeout_s: float) -> bytes | None:
        stop, self.stop = self.stop, None
        if stop is not None:
            stop()
        return super().take(key, timeout_s)


@pytest.mark.anyio
async def test_a_stop_just_before_rank_0_waits_for_the_logs_ends_that_wait(
    tmp_path: Path,
) -> None:
    # torchrun stops every worker as soon as one ended: rank 0 got the
    # SIGTERM as its own run ended, before its wait for the logs began, and
    # then waited the whole group timeout for them (until torchrun killed
    # it, with no manifest).
    waits: list[float] = []
    group = StoppingGroup({}, waits)
    startup = _rank(tmp_path, 0, group.mailbox, group=group, group_timeout_s=30.0)
    token = anyio.lowlevel.current_token()
    group.stop = lambda: anyio.from_thread.run_sync(startup.stop, token=token)
    with startup:
        result = await startup.arun()

    assert group.stop is None
    assert result.ready
    assert result.undelivered == (1, 2)
    assert waits  # it looked, without waiting
    assert max(waits) == 0.0
    assert read_manifest(tmp_path / "node0") is not None


@pytest.mark.anyio
async def test_a_log_already_in_rank_0s_directory_is_not_named_undelivered(
    tmp_path: Path,
) -> None:
    # A shared filesystem and no process group: rank 1 wrote its log into
    # the directory rank 0 collects into, so nothing had to be delivered.
    def rank(number: int) -> Startup:
        return Startup(
            graph=Graph("tiny", [Step(name="probe", body=lambda _context: {"ok": True})]),
            identity=RankIdentity(
                rank=number, local_rank=0, world_size=2, local_world_size=1, node_rank=number
            ),
            run_id=RUN_ID,
            run_dir=tmp_path / "run",
            group=None,
            tracing=None,
            configure_logging=False,
            handle_signals=False,
            environ={},
        )

    with rank(1) as peer:
        await peer.arun()
    with rank(0) as collector:
        result = await collector.arun()

    assert result.undelivered == ()
    manifest = read_manifest(tmp_path / "run")
    assert manifest is not None
    assert [(entry.rank, entry.not_delivered, entry.collected) for entry in manifest.ranks] == [
        (0, None, True),
        (1, None, True),
    ]
