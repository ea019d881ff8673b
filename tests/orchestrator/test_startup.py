"""The embedding API: one rank's startup, set up from the environment, with
every exit path flushed and the original error raised."""

from __future__ import annotations

import inspect
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import anyio
import attrs
import pytest

from events import (
    Column,
    Event,
    JsonValue,
    Message,
    MessageRule,
    Outcome,
    RankIdentity,
    RankState,
    RunFinished,
    RunOutcome,
    RunStarted,
    Scope,
    Severity,
    Slice,
    StepStarted,
    Stop,
    launch_span_id,
    read_log,
    replay,
    validate,
)
from orchestrator import (
    Graph,
    RankEnvironmentError,
    RunDirectoryError,
    Startup,
    StartupInterrupted,
    Step,
    StepContext,
)
from orchestrator.engine import EngineConfig, EngineState


def _startup(tmp_path: Path, **options: object) -> Startup:
    settings: dict[str, object] = {
        "run_dir": tmp_path / "run",
        "profile": "xeon",
        "tracing": None,
        "configure_logging": False,
        "handle_signals": False,
        "environ": {},
    }
    settings.update(options)
    return Startup(EngineConfig(), **settings)  # type: ignore[arg-type]


def _finished(path: Path) -> RunFinished:
    assert [problem for problem in validate(path) if problem.fatal] == []
    events = read_log(path).events
    assert isinstance(events[0], RunStarted)
    assert isinstance(events[-1], RunFinished)
    return events[-1]


def test_a_ready_start_returns_what_it_decided(tmp_path: Path) -> None:
    startup = _startup(tmp_path)
    with startup:
        result = startup.run()

    assert result.ready
    assert isinstance(result.state, EngineState)
    assert (result.state.platform, result.state.platform_class) == ("cpu", "CpuPlatform")
    assert result.state.attention_backend == "CPU_ATTN"
    assert result.log_path == tmp_path / "run" / "rank-0.jsonl"
    assert result.run_dir == tmp_path / "run"
    # Every message derived, in order, printed or not (DEBUG included).
    assert [(message.code, message.severity) for message in result.messages] == [
        *[("platform.plugin_declined", Severity.DEBUG)] * 4,
        ("platform.detected", Severity.INFO),
        ("attention.selected", Severity.INFO),
        ("run.ready", Severity.INFO),
    ]
    assert _finished(result.log_path).outcome is RunOutcome.READY
    started = read_log(result.log_path).events[0]
    assert isinstance(started, RunStarted)
    assert started.simulated == "xeon"


CALLER = "00f067aa0ba902b7"
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.mark.parametrize(
    ("options", "launcher", "launched"),
    [
        ({}, False, True),  # rank 0 collects the run and sends the launch's span
        ({"wait_for_peers": False}, False, False),  # a launcher of the caller's own
        ({"wait_for_peers": False, "launch_span": True}, False, True),  # one that sends it
        ({"wait_for_peers": False}, True, True),  # the command line's launcher sends it
    ],
)
def test_a_ranks_root_hangs_from_the_launch_span_when_someone_sends_it(
    tmp_path: Path, options: dict[str, object], launcher: bool, launched: bool
) -> None:
    identity = RankIdentity(rank=1, world_size=2, local_world_size=2)
    environ = {"TRACEPARENT": f"00-{CALLER_TRACE}-{CALLER}-01"}
    if launcher:
        environ["STARTUP_ORCHESTRATOR_LAUNCHER_PID"] = str(os.getpid())
    startup = _startup(
        tmp_path, identity=identity, group=None, environ=environ, run_id="two", **options
    )
    with startup:
        startup.run()

    assert startup.log_path is not None
    started = read_log(startup.log_path).events[0]
    assert started.trace_id == CALLER_TRACE
    expected = launch_span_id(CALLER_TRACE, started.run_id) if launched else CALLER
    assert started.parent_span_id == expected


def test_a_lone_ranks_root_hangs_from_the_callers_span(tmp_path: Path) -> None:
    # One rank is the whole launch: there is no launch span to hang from.
    environ = {"TRACEPARENT": f"00-{CALLER_TRACE}-{CALLER}-01"}
    with _startup(tmp_path, environ=environ) as startup:
        startup.run()

    assert startup.log_path is not None
    started = read_log(startup.log_path).events[0]
    assert (started.trace_id, started.parent_span_id) == (CALLER_TRACE, CALLER)


def test_run_opens_and_closes_by_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    startup = Startup(profile="xeon", tracing=None, configure_logging=False, environ={})
    result = startup.run()

    # The default run directory, named by a fresh run id.
    assert result.run_dir == Path("startup-runs") / result.run_id
    assert (tmp_path / result.log_path).exists()
    with pytest.raises(RuntimeError, match="runs once"):
        startup.run()


@pytest.mark.parametrize(
    ("fault", "raised", "outcome"),
    [
        ("attention/CPU_ATTN=RuntimeError:no kernel", RuntimeError, RunOutcome.FAILED),
        ("attention/CPU_ATTN=SystemExit", SystemExit, RunOutcome.FAILED),
        ("attention/CPU_ATTN=KeyboardInterrupt", KeyboardInterrupt, RunOutcome.INTERRUPTED),
    ],
)
def test_a_failure_raises_the_original_error_after_everything_is_flushed(
    tmp_path: Path, fault: str, raised: type[BaseException], outcome: RunOutcome
) -> None:
    startup = _startup(tmp_path, faults=[fault])
    with startup, pytest.raises(raised):
        startup.run()

    assert startup.result is not None
    assert startup.result.outcome is outcome
    # What was decided before the failure is still there, typed.
    assert isinstance(startup.result.state, EngineState)
    assert startup.result.state.platform_class == "CpuPlatform"
    assert startup.result.state.attention_backend is None
    finished = _finished(tmp_path / "run" / "rank-0.jsonl")
    assert finished.outcome is outcome
    assert finished.failed_step == "attention/CPU_ATTN"


def test_a_failed_rank_says_why_in_torchelastics_error_file(tmp_path: Path) -> None:
    error_file = tmp_path / "error.json"
    startup = _startup(
        tmp_path,
        faults=["attention/CPU_ATTN=RuntimeError:boom"],
        environ={"TORCHELASTIC_ERROR_FILE": str(error_file)},
    )
    with startup, pytest.raises(RuntimeError):
        startup.run()

    finished = _finished(tmp_path / "run" / "rank-0.jsonl")
    document = json.loads(error_file.read_text(encoding="utf-8"))
    assert document["message"]["message"] == "RuntimeError: boom (step attention/CPU_ATTN)"
    extra = document["message"]["extraInfo"]
    assert 'File "' in extra["py_callstack"]
    assert extra["py_callstack"].rstrip().endswith("RuntimeError: boom")
    # Its own failure: the second it happened in.
    assert extra["timestamp"] == str(finished.wall_ns // 1_000_000_000)


def test_a_stopped_rank_is_stamped_after_the_failure_it_follows(tmp_path: Path) -> None:
    error_file = tmp_path / "error.json"
    startup = _startup(tmp_path, environ={"TORCHELASTIC_ERROR_FILE": str(error_file)}).open()
    startup.stop()
    with pytest.raises(StartupInterrupted):
        startup.run()

    finished = _finished(tmp_path / "run" / "rank-0.jsonl")
    extra = json.loads(error_file.read_text(encoding="utf-8"))["message"]["extraInfo"]
    assert extra["timestamp"] == str(finished.wall_ns // 1_000_000_000 + 1)


def test_a_ready_rank_writes_no_error_file(tmp_path: Path) -> None:
    error_file = tmp_path / "error.json"
    with _startup(tmp_path, environ={"TORCHELASTIC_ERROR_FILE": str(error_file)}) as startup:
        assert startup.run().ready
    assert not error_file.exists()


def test_a_directory_of_another_run_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    with _startup(tmp_path, run_id="first") as first:
        first.run()
    before = sorted(p.name for p in (tmp_path / "run").iterdir())

    with pytest.raises(RunDirectoryError) as refused:
        _startup(tmp_path, run_id="second").open()

    assert refused.value.held_by == "first"
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == before


@pytest.mark.parametrize("emptied", [False, True])
@pytest.mark.parametrize("stored_as", ["rank-0.jsonl", "rank-1.jsonl"])
def test_a_directory_with_another_runs_logs_and_no_claim_is_refused(
    tmp_path: Path, stored_as: str, emptied: bool
) -> None:
    # A run from before claims existed, or one whose .run-id was removed:
    # its logs are there (this rank's, or another rank's; an empty one was
    # taken as none, and this rank then refused as its log "already exists"),
    # nothing says whose they are.
    with _own_startup(tmp_path, run_id="first") as first:
        first.run()
    run_dir = tmp_path / "run"
    (run_dir / ".run-id").unlink()
    (run_dir / "rank-0.jsonl").rename(run_dir / stored_as)
    if emptied:
        (run_dir / stored_as).write_bytes(b"")
    before = {path.name: path.read_bytes() for path in run_dir.iterdir()}

    with pytest.raises(
        RunDirectoryError, match=f"already holds the logs of another run \\({stored_as}\\)"
    ):
        _own_startup(tmp_path, run_id="second").open()

    assert {path.name: path.read_bytes() for path in run_dir.iterdir()} == before


def test_an_inconsistent_environment_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(RankEnvironmentError, match="SLURM_PROCID"):
        _startup(tmp_path, environ={"SLURM_PROCID": "4", "SLURM_NTASKS": "4"}).open()
    assert not (tmp_path / "run").exists()


def test_a_malformed_traceparent_is_named_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^TRACEPARENT='00-abc': ") as refused:
        _startup(tmp_path, environ={"TRACEPARENT": "00-abc"}).open()
    assert str(refused.value) == (
        "TRACEPARENT='00-abc': invalid traceparent '00-abc': too short (6 characters, at least "
        "55); expected 00-<32 hex trace id>-<16 hex span id>-<2 hex flags>"
    )
    assert not (tmp_path / "run").exists()


def test_ranks_without_a_shared_run_id_or_group_are_refused(tmp_path: Path) -> None:
    environ = {"RANK": "1", "WORLD_SIZE": "2"}
    with pytest.raises(RankEnvironmentError, match="share no run id"):
        _startup(tmp_path, environ=environ, run_dir=None).open()


def test_a_restarted_torchrun_worker_group_starts_a_run_of_its_own(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    elastic = {"TORCHELASTIC_RUN_ID": "job-7", "TORCHELASTIC_RESTART_COUNT": "0"}
    with _own_startup(tmp_path, run_dir=None, runs_root=runs, environ=elastic) as first:
        first.run()
    kept = (runs / "job-7" / "rank-0.jsonl").read_bytes()

    # torchrun restarts the worker group under the same TORCHELASTIC_RUN_ID:
    # the restart is a new run, in a directory of its own.
    restarted = {**elastic, "TORCHELASTIC_RESTART_COUNT": "1"}
    with _own_startup(tmp_path, run_dir=None, runs_root=runs, environ=restarted) as second:
        second.run()

    assert (first.run_id, second.run_id) == ("job-7", "job-7-restart-1")
    assert sorted(path.name for path in runs.iterdir()) == ["job-7", "job-7-restart-1"]
    assert (runs / "job-7" / "rank-0.jsonl").read_bytes() == kept
    assert (runs / "job-7-restart-1" / ".run-id").read_text() == "job-7-restart-1\n"
    assert _finished(runs / "job-7-restart-1" / "rank-0.jsonl").outcome is RunOutcome.READY


def test_a_restarted_torchrun_worker_group_names_a_run_directory_of_its_own(
    tmp_path: Path,
) -> None:
    # The same command starts the restart: the directory it names holds the
    # first attempt, and the restart takes it with its restart.
    elastic = {"TORCHELASTIC_RUN_ID": "job-7", "TORCHELASTIC_RESTART_COUNT": "0"}
    with _own_startup(tmp_path, run_dir=tmp_path / "node0", environ=elastic) as first:
        first.run()
    restarted = {**elastic, "TORCHELASTIC_RESTART_COUNT": "1"}
    with _own_startup(tmp_path, run_dir=tmp_path / "node0", environ=restarted) as second:
        second.run()

    assert second.run_dir == tmp_path / "node0-restart-1"
    assert (tmp_path / "node0" / ".run-id").read_text() == "job-7\n"
    assert (tmp_path / "node0-restart-1" / ".run-id").read_text() == "job-7-restart-1\n"
    assert _finished(tmp_path / "node0-restart-1" / "rank-0.jsonl").outcome is RunOutcome.READY


def test_a_run_id_passed_in_names_each_attempt_of_a_restarted_group(tmp_path: Path) -> None:
    # The same command (the same run id) starts the restart: the first
    # attempt's directory is not taken again.
    runs = tmp_path / "runs"
    elastic = {"TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_RESTART_COUNT": "0"}
    options = {"run_dir": None, "runs_root": runs, "run_id": "mine"}
    with _own_startup(tmp_path, environ=elastic, **options) as first:
        first.run()
    restarted = {**elastic, "TORCHELASTIC_RESTART_COUNT": "1"}
    with _own_startup(tmp_path, environ=restarted, **options) as second:
        second.run()

    assert (first.run_id, second.run_id) == ("mine", "mine-restart-1")
    assert (runs / "mine-restart-1" / ".run-id").read_text() == "mine-restart-1\n"
    assert _finished(runs / "mine-restart-1" / "rank-0.jsonl").outcome is RunOutcome.READY


class _Ranks:
    """``size`` ranks in threads of this process; ``all_gather`` meets at a
    barrier. Every rank's value is kept, in the order they were given."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.barrier = threading.Barrier(size, timeout=30)
        self.slots: list[JsonValue] = [None] * size
        self.given: list[list[JsonValue]] = [[] for _ in range(size)]

    def member(self, rank: int) -> _Member:
        return _Member(self, rank)


class _Member:
    def __init__(self, ranks: _Ranks, rank: int) -> None:
        self._ranks = ranks
        self._rank = rank

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._ranks.size

    def all_gather(self, value: JsonValue) -> list[JsonValue]:
        ranks = self._ranks
        ranks.given[self._rank].append(value)
        ranks.slots[self._rank] = value
        ranks.barrier.wait()  # every rank has written
        gathered = list(ranks.slots)
        ranks.barrier.wait()  # every rank has read
        return gathered


def _open_together(ranks: _Ranks, startups: list[Startup]) -> None:
    """Open every rank's startup, each in a thread of its own."""
    errors: list[BaseException] = []

    def open_rank(startup: Startup) -> None:
        try:
            startup.open()
        except BaseException as exc:
            errors.append(exc)
            ranks.barrier.abort()  # never leave the other rank waiting

    threads = [threading.Thread(target=open_rank, args=(startup,)) for startup in startups]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def test_the_nodes_of_a_restarted_worker_group_agree_on_its_restart(tmp_path: Path) -> None:
    # torchrun restarted the group for node 1's failure: its agent counts
    # the restart, node 0's (whose workers were healthy) does not. Each
    # node's count is counted once, by its local rank 0.
    ranks = _Ranks(4)
    elastic = {"TORCHELASTIC_RUN_ID": "job-7", "TORCHELASTIC_MAX_RESTARTS": "3"}
    startups = [
        _own_startup(
            tmp_path,
            run_dir=tmp_path / f"node{rank // 2}",
            group=ranks.member(rank),
            wait_for_peers=False,
            environ={
                **elastic,
                "TORCHELASTIC_RESTART_COUNT": str(rank // 2),
                "RANK": str(rank),
                "LOCAL_RANK": str(rank % 2),
                "WORLD_SIZE": "4",
                "LOCAL_WORLD_SIZE": "2",
                "GROUP_RANK": str(rank // 2),
            },
        )
        for rank in range(4)
    ]
    try:
        _open_together(ranks, startups)
        assert ranks.given == [[0], [0], [1], [0]]
        assert [startup.run_id for startup in startups] == ["job-7-restart-1"] * 4
        assert [startup.run_dir for startup in startups] == [
            tmp_path / "node0-restart-1",
            tmp_path / "node0-restart-1",
            tmp_path / "node1-restart-1",
            tmp_path / "node1-restart-1",
        ]
    finally:
        for startup in startups:
            startup.close()


class _Unjoined:
    """A process group whose peers never came: every exchange fails."""

    rank, world_size = 0, 4

    def all_gather(self, value: JsonValue) -> list[JsonValue]:
        from orchestrator import GroupError

        raise GroupError(0, 4, "all_gather", "RuntimeError: Connection closed by peer")


def test_a_restarted_group_whose_peers_never_meet_records_it_under_a_name_of_its_own(
    tmp_path: Path,
) -> None:
    # Without its peers, node 1 cannot learn which attempt this is; a name
    # from its own count could be an agreed attempt's, so it takes one
    # that no agreed attempt does, and records why there.
    from orchestrator import GroupError

    startup = _own_startup(
        tmp_path,
        run_dir=tmp_path / "node1",
        group=_Unjoined(),
        wait_for_peers=False,
        environ={
            "TORCHELASTIC_RUN_ID": "job-7",
            "TORCHELASTIC_MAX_RESTARTS": "3",
            "TORCHELASTIC_RESTART_COUNT": "2",
            "RANK": "2",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "4",
            "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": "1",
        },
    )
    with pytest.raises(GroupError, match="all_gather"):
        startup.run()

    assert startup.run_id == "job-7-node-1-unjoined-2"
    assert startup.run_dir == tmp_path / "node1-node-1-unjoined-2"
    rank = replay(read_log(startup.run_dir / "rank-2.jsonl").events).states[2]
    assert rank.outcome is RunOutcome.FAILED
    cause = rank.root_cause
    assert cause is not None
    assert cause.step == "process_group"
    assert cause.exception is not None
    assert cause.exception.type == "orchestrator.GroupError"
    assert list(startup.run_dir.parent.iterdir()) == [startup.run_dir]


def test_a_rank_that_cannot_agree_on_a_run_id_records_it_under_one_of_its_own(
    tmp_path: Path,
) -> None:
    from orchestrator import GroupError

    startup = _own_startup(
        tmp_path,
        group=_Unjoined(),
        wait_for_peers=False,
        environ={"RANK": "2", "WORLD_SIZE": "4"},
    )
    with pytest.raises(GroupError, match="all_gather"):
        startup.run()

    assert startup.run_id is not None
    assert startup.run_id.endswith("-rank-2-unjoined")
    assert startup.run_dir == tmp_path / "run-rank-2-unjoined"
    log = read_log(startup.run_dir / "rank-2.jsonl")
    assert log.events[0].run_id == startup.run_id
    cause = replay(log.events).states[2].root_cause
    assert cause is not None
    assert cause.step == "process_group"


def test_the_ranks_of_a_launch_adopt_rank_0s_run_id(tmp_path: Path) -> None:
    # No launcher variable names the run: the ranks agree on one over their
    # group, each proposing its own.
    ranks = _Ranks(2)
    runs = tmp_path / "runs"
    startups = [
        _own_startup(
            tmp_path,
            run_dir=None,
            runs_root=runs,
            group=ranks.member(rank),
            wait_for_peers=False,
            environ={"RANK": str(rank), "WORLD_SIZE": "2"},
        )
        for rank in range(2)
    ]
    try:
        _open_together(ranks, startups)
        proposals = [given[0] for given in ranks.given]
        assert proposals[0] != proposals[1]
        assert [startup.run_id for startup in startups] == [proposals[0]] * 2
        assert [path.name for path in runs.iterdir()] == [proposals[0]]
        assert sorted(path.name for path in (runs / str(proposals[0])).glob("*.jsonl")) == [
            "rank-0.jsonl",
            "rank-1.jsonl",
        ]
    finally:
        for startup in startups:
            startup.close()


def test_logging_is_configured_only_when_nobody_did(tmp_path: Path) -> None:
    logger = logging.getLogger("orchestrator")
    before = list(logger.handlers)
    root = logging.getLogger()
    caller = logging.NullHandler()
    root.addHandler(caller)
    try:
        with _startup(tmp_path, configure_logging=None) as startup:
            startup.run()
        assert logger.handlers == before
    finally:
        root.removeHandler(caller)


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_configured_logging_prints_the_messages_on_stderr_and_nowhere_else(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logger = logging.getLogger("orchestrator")
    before = (list(logger.handlers), logger.level, logger.propagate)
    root = logging.getLogger()
    caller = _Kept()
    root.addHandler(caller)
    try:
        _own_startup(tmp_path, slices=[OWN_SLICE], configure_logging=True).run()
    finally:
        root.removeHandler(caller)
        for handler in logger.handlers[len(before[0]) :]:
            logger.removeHandler(handler)
        logger.setLevel(before[1])
        logger.propagate = before[2]

    lines = capsys.readouterr().err.splitlines()
    assert [line for line in lines if not line.startswith(" ")] == [
        "INFO    [rank 0] Attention by mine.",
        "WARNING [rank 0] No cache: PermissionError: [Errno 13] Permission denied: '/cache'",
        "INFO    [rank 0] Startup ready.",
    ]
    # Not passed on to the caller's own handlers.
    assert caller.records == []


@pytest.mark.anyio
async def test_a_launcher_that_owns_its_signals_stops_the_run(tmp_path: Path) -> None:
    startup = _startup(tmp_path, faults=["attention/CPU_ATTN=hang"])
    probing = anyio.Event()

    def watch(event: Event) -> None:
        # Steps start on the event loop's thread.
        if isinstance(event, StepStarted) and event.step == "attention/CPU_ATTN":
            probing.set()

    with startup:
        assert startup.log is not None
        log_subscription = startup.log.subscribe(watch)
        async with anyio.create_task_group() as group:

            async def stop_when_probing() -> None:
                await probing.wait()
                startup.stop()

            group.start_soon(stop_when_probing)
            with pytest.raises(StartupInterrupted) as raised:
                await startup.arun()
        log_subscription.close()

    assert raised.value.signal is None
    finished = _finished(tmp_path / "run" / "rank-0.jsonl")
    assert finished.outcome is RunOutcome.INTERRUPTED
    assert finished.cause is not None
    assert finished.cause.message == "stopped: asked by its launcher"


# --- a graph of your own ---------------------------------------------------------------


def _own_graph() -> Graph:
    def attention(context: StepContext) -> JsonValue:
        return {"backend": "mine"}

    def cache(context: StepContext) -> JsonValue:
        raise PermissionError(13, "Permission denied", "/cache")

    return Graph(
        "mine",
        [
            Step(name="attention", body=attention),
            Step(name="cache", body=cache, depends_on=("attention",)),
        ],
    )


OWN_SLICE = Slice(
    name="mine",
    steps=("attention", "cache"),
    rules=[
        MessageRule(
            code="mine.attention",
            step="attention",
            outcomes="ok",
            text="Attention by {result[backend]}.",
        ),
        MessageRule(
            code="mine.cache_denied",
            step="cache",
            outcomes="unavailable",
            severity=Severity.WARNING,
            text="No cache: {error}",
        ),
    ],
    columns=[Column(title="ATTENTION", fact="attention", step="attention", key="backend")],
)


def _own_startup(tmp_path: Path, **options: object) -> Startup:
    settings: dict[str, object] = {
        "graph": _own_graph(),
        "run_dir": tmp_path / "run",
        "tracing": None,
        "configure_logging": False,
        "handle_signals": False,
        "environ": {},
    }
    settings.update(options)
    return Startup(**settings)  # type: ignore[arg-type]


def test_a_graph_of_your_own_speaks_with_its_own_slice_only(tmp_path: Path) -> None:
    result = _own_startup(tmp_path, slices=[OWN_SLICE]).run()

    texts = [message.text for message in result.messages]
    # A step named attention is the caller's, not the reference engine's.
    assert "Attention by mine." in texts
    assert not any("attention backend" in text for text in texts), texts
    assert any(text.startswith("No cache: PermissionError") for text in texts), texts
    assert result.state.facts["attention"] == "mine"
    assert result.steps["attention"].outcome is Outcome.OK
    assert result.steps["attention"].value == {"backend": "mine"}
    assert result.steps["cache"].outcome is Outcome.UNAVAILABLE
    assert result.steps["cache"].reasons == (
        "PermissionError: [Errno 13] Permission denied: '/cache'",
    )
    assert result.steps["cache"].exception is not None
    assert result.steps["cache"].exception.name == "PermissionError"
    # No engine field, nor the engine's state type, for a graph of your own.
    assert type(result.state) is RankState
    assert set(result.state.facts) == {"attention"}


def test_the_result_says_why_a_step_timed_out_or_was_cancelled(tmp_path: Path) -> None:
    async def hangs(context: StepContext) -> JsonValue:
        await anyio.sleep_forever()

    def fails(context: StepContext) -> JsonValue:
        raise RuntimeError("boom")

    graph = Graph(
        "mine",
        [
            Step(name="slow", body=hangs, timeout=0.01),
            Step(name="fails", body=fails, depends_on=("slow",)),
            Step(name="waits", body=hangs),
        ],
    )
    startup = _own_startup(tmp_path, graph=graph)
    with pytest.raises(RuntimeError, match="boom"):
        startup.run()
    assert startup.result is not None
    steps = startup.result.steps
    # As the run's own results say it: the "why" is never dropped.
    assert steps["slow"].outcome is Outcome.TIMED_OUT
    assert steps["slow"].reasons == ("timed out after 0.01 s",)
    assert steps["waits"].outcome is Outcome.CANCELLED
    assert steps["waits"].reasons == ("cancelled because step 'fails' failed: RuntimeError: boom",)
    assert steps["fails"].reasons == ("RuntimeError: boom",)


@attrs.frozen(kw_only=True)
class _MineState(RankState):
    @property
    def attention(self) -> str | None:
        value = self.facts.get("attention")
        return value if isinstance(value, str) else None


def test_the_result_state_is_of_the_type_the_slice_declares(tmp_path: Path) -> None:
    typed = attrs.evolve(OWN_SLICE, state_type=_MineState)
    result = _own_startup(tmp_path, slices=[typed]).run()

    assert isinstance(result.state, _MineState)
    assert result.state.attention == "mine"
    assert result.state.outcome is RunOutcome.READY


def test_without_slices_a_graph_of_your_own_gets_the_kernels_messages(tmp_path: Path) -> None:
    result = _own_startup(tmp_path).run()
    codes = {message.code for message in result.messages}
    assert codes <= {"run.ready", "step.unavailable"}, codes
    assert type(result.state) is RankState
    assert result.state.facts == {}


def test_a_fault_on_any_module_is_taken_for_a_graph_of_your_own(tmp_path: Path) -> None:
    # Its probes' imports are not known in advance: a module is a target.
    startup = _own_startup(tmp_path, faults=["mine_extension=ImportError"])
    assert startup.run().ready
    assert startup.log_path is not None
    started = read_log(startup.log_path).events[0]
    assert isinstance(started, RunStarted)
    assert started.injected == ("mine_extension=ImportError",)


def test_slices_without_a_graph_of_your_own_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="slices describe a graph of your own"):
        _startup(tmp_path, slices=[OWN_SLICE])


def test_a_graph_or_slice_of_the_wrong_type_is_named_before_anything_is_written(
    tmp_path: Path,
) -> None:
    with pytest.raises(TypeError, match=r"graph is 'my-graph', not an orchestrator\.Graph"):
        _startup(tmp_path, graph="my-graph")
    with pytest.raises(TypeError, match=r"slices\[0\] is 'mine:SLICE', not an events.Slice"):
        _own_startup(tmp_path, slices=["mine:SLICE"])
    # One slice where a list of them goes: named as such, not iterated.
    with pytest.raises(TypeError, match=r"slices is the slice 'mine', not a list of events\.Slice"):
        _own_startup(tmp_path, slices=OWN_SLICE)
    with pytest.raises(TypeError, match=r"slices is 'mine:SLICE', not a list of events\.Slice"):
        _own_startup(tmp_path, slices="mine:SLICE")
    with pytest.raises(TypeError, match=r"tracing is 'on', not an exporters\.Tracing"):
        _own_startup(tmp_path, tracing="on")
    with pytest.raises(TypeError, match=r"group is 'gloo', not an orchestrator\.Group"):
        _own_startup(tmp_path, group="gloo")
    assert not (tmp_path / "run").exists()


# --- the lifecycle ---------------------------------------------------------------------


def test_a_set_up_that_fails_after_the_log_opened_raises_its_own_error(tmp_path: Path) -> None:
    from exporters import Tracing

    startup = _startup(tmp_path, tracing=Tracing(otlp_endpoint="http://[::1"))
    with pytest.raises(ValueError, match="Invalid IPv6 URL"):
        startup.open()
    assert startup.log_path is not None
    finished = _finished(startup.log_path)
    assert finished.outcome is RunOutcome.FAILED
    assert finished.cause is not None
    assert finished.cause.name == "ValueError"
    startup.close()  # closing again is harmless


@pytest.mark.parametrize(
    ("options", "error"),
    [({"stall_s": -1}, ValueError), ({"max_threads": 0}, ValueError), ({"bogus": 1}, TypeError)],
)
def test_an_option_the_run_refuses_leaves_no_empty_log(
    tmp_path: Path, options: dict[str, object], error: type[Exception]
) -> None:
    startup = _own_startup(tmp_path, **options)
    with pytest.raises(error):
        startup.run()
    # Refused before run.started: no log that reads as a rank killed early.
    assert not (tmp_path / "run" / "rank-0.jsonl").exists()


def test_opened_and_closed_without_running_the_log_says_so(tmp_path: Path) -> None:
    startup = _startup(tmp_path)
    startup.open()
    startup.close()
    assert startup.log_path is not None
    finished = _finished(startup.log_path)
    assert finished.outcome is RunOutcome.INTERRUPTED
    assert finished.cause is not None
    assert finished.cause.message == "stopped: closed before it ran"
    assert replay(read_log(startup.log_path).events).outcome is RunOutcome.INTERRUPTED


@pytest.mark.parametrize("opened", [True, False], ids=["opened", "not-yet-opened"])
def test_a_stop_before_the_run_ends_it_interrupted(tmp_path: Path, opened: bool) -> None:
    # A launcher that owns its signals may be asked to stop before it calls
    # run(), which opens the startup itself if it is not open yet.
    startup = _startup(tmp_path)
    if opened:
        startup.open()
    startup.stop()
    with pytest.raises(StartupInterrupted, match="asked by its launcher"):
        startup.run()
    assert startup.log_path is not None
    finished = _finished(startup.log_path)
    assert finished.outcome is RunOutcome.INTERRUPTED
    assert startup.result is not None
    assert startup.result.outcome is RunOutcome.INTERRUPTED


def test_a_stop_is_recorded_as_its_first_signal_and_names_a_launcher_gone() -> None:
    from orchestrator._signals import StopRequests

    # Launched by our parent, which is alive: two stops, the first is the cause.
    stops = StopRequests(launcher_pid=os.getppid())
    stops.record(signal.SIGTERM)
    stops.record(signal.SIGINT)
    assert stops.cause().stop == Stop(signal="SIGTERM", reason=None)

    # A launcher that is not our parent (any more) has exited.
    orphaned = StopRequests(launcher_pid=os.getpid())
    orphaned.record(signal.SIGHUP)
    assert orphaned.cause().stop == Stop(
        signal="SIGHUP", reason=f"its launcher (pid {os.getpid()}) exited"
    )


def test_chained_stops_watch_only_python_handlers_and_leave_later_ones_in_place() -> None:
    from orchestrator._signals import StopRequests

    seen: list[int] = []
    engines = signal.signal(signal.SIGTERM, lambda signum, _frame: seen.append(signum))
    hangup = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        stops = StopRequests()
        stops.install(chain=True)
        # The system's disposition (end the process) is left to it.
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL
        signal.raise_signal(signal.SIGTERM)
        assert (stops.received, seen) == ([signal.SIGTERM], [signal.SIGTERM])
        # The process's own code set another handler since: it stays.
        later = signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stops.restore()
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
        assert callable(later)
    finally:
        signal.signal(signal.SIGTERM, engines)
        signal.signal(signal.SIGHUP, hangup)


def test_an_implausible_world_size_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    startup = _startup(tmp_path, run_id="big", environ={"WORLD_SIZE": "1" + "0" * 30})
    with pytest.raises(RankEnvironmentError, match="must be at most 65,536"):
        startup.run()
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("value", ["junk", "\u00b2", "-1"])
def test_a_launcher_pid_that_is_no_number_is_ignored(tmp_path: Path, value: str) -> None:
    # "²" passes str.isdigit() and fails int().
    environ = {"STARTUP_ORCHESTRATOR_LAUNCHER_PID": value}
    assert _startup(tmp_path, environ=environ).run().ready


def test_a_startup_opens_once_and_runs_once(tmp_path: Path) -> None:
    startup = _startup(tmp_path)
    assert startup.run().ready
    with pytest.raises(RuntimeError, match="runs once"):
        startup.run()
    with pytest.raises(RuntimeError, match="opens once"):
        startup.open()
    startup.close()  # closed already: harmless
    with pytest.raises(RuntimeError, match="runs once"):
        startup.run()


def test_entering_an_open_startup_keeps_it_open_until_the_block_ends(tmp_path: Path) -> None:
    startup = _startup(tmp_path).open()
    with startup as entered:
        assert entered is startup
        assert entered.run().ready
    assert startup.log_path is not None
    assert _finished(startup.log_path).outcome is RunOutcome.READY
    with pytest.raises(RuntimeError, match="opens once"):
        startup.open()


# --- a stop once the run is over -------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("stop", ["SIGTERM", "SIGINT"])
def test_a_stop_after_the_event_loop_closed_is_caught_not_the_ranks_end(
    tmp_path: Path, backend: str, stop: str
) -> None:
    # The event loop's signal receiver puts the default handlers back when
    # it closes; the startup's own handler is back in its place until the
    # startup closes, so the stop is taken, not the process's end.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.orchestrator.late_stop_worker",
            str(tmp_path / "run"),
            backend,
            stop,
        ],
        cwd=ROOT,
        env={"PATH": "", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"alive": True, "outcome": "ready"}
    assert _finished(tmp_path / "run" / "rank-0.jsonl").outcome is RunOutcome.READY


def test_a_failure_that_follows_a_peers_is_stamped_after_it(tmp_path: Path) -> None:
    from events.testing import EventStream, exception_info
    from orchestrator._group import follows_a_peer
    from orchestrator._startup import _write_elastic_error

    lost = exception_info("orchestrator.GroupError", "all_gather across the process group failed")
    finished = (
        EventStream()
        .run_started()
        .run_finished(RunOutcome.FAILED, cause=lost, failed_step="agree")[-1]
    )
    assert isinstance(finished, RunFinished)
    seconds = finished.wall_ns // 1_000_000_000
    for consequence, stamp in ((False, seconds), (True, seconds + 1)):
        error_file = tmp_path / f"error-{consequence}.json"
        _write_elastic_error(
            {"TORCHELASTIC_ERROR_FILE": str(error_file)}, finished, consequence=consequence
        )
        extra = json.loads(error_file.read_text(encoding="utf-8"))["message"]["extraInfo"]
        assert extra["timestamp"] == str(stamp)
    # A recorded GroupError is recognised by its qualified type name.
    message = Message(
        code="step.failed", severity=Severity.ERROR, scope=Scope.GLOBAL, rank=0, text="",
        exception=lost,
    )  # fmt: skip
    assert follows_a_peer(message)
    assert not follows_a_peer(attrs.evolve(message, exception=exception_info("RuntimeError")))


class _LowerRanks:
    """Rank 3 of four on two nodes (ranks 0-1 on node 0, 2-3 on node 1),
    whose lower ranks reached the end of their startup, those in
    ``derived_by`` having derived the same WARNINGs as rank 3."""

    rank = 3
    world_size = 4

    def __init__(self, derived_by: tuple[int, ...]) -> None:
        self.derived_by = derived_by

    def all_gather(self, value: JsonValue) -> list[JsonValue]:
        assert isinstance(value, dict)
        lower: list[JsonValue] = [
            {
                **value,
                "node_rank": rank // 2,
                "warnings": value["warnings"] if rank in self.derived_by else [],
            }
            for rank in range(3)
        ]
        return [*lower, value]


class _UnreachablePeers:
    """Rank 3 of four, whose last exchange fails: no peer answers."""

    rank = 3
    world_size = 4

    def all_gather(self, value: JsonValue) -> list[JsonValue]:
        from orchestrator import GroupError

        raise GroupError(3, 4, "all_gather", "RuntimeError: Connection closed by peer")


@pytest.mark.parametrize(
    ("scope", "group", "peers_finished", "printed"),
    [
        ("global", _LowerRanks(()), True, 1),
        ("global", _LowerRanks((0,)), True, 0),
        ("global", _LowerRanks((2,)), True, 0),
        ("local", _LowerRanks((2,)), True, 0),
        ("local", _LowerRanks((0, 1)), True, 1),
        ("global", _UnreachablePeers(), False, 1),
        ("global", None, None, 1),
    ],
    ids=[
        "global-no-lower-rank",
        "global-rank-0",
        "global-rank-2",
        "local-local-rank-0",
        "local-only-another-node",
        "no-peer-answered",
        "no-group",
    ],
)
def test_a_held_warning_is_printed_once_unless_a_lower_rank_of_its_scope_derived_it(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    scope: str,
    group: object,
    peers_finished: bool | None,
    printed: int,
) -> None:
    # Rank 3 (local rank 1 of node 1) holds a WARNING its scope does not
    # print: a lower rank of the node (of the world, for global) that
    # derived it printed it or releases it; otherwise, or when no peer is
    # known to have answered, rank 3 prints it.
    denied = MessageRule(
        code="mine.cache_denied",
        step="cache",
        outcomes="unavailable",
        severity=Severity.WARNING,
        scope=scope,
        text="No cache: {error}",
    )
    startup = _own_startup(
        tmp_path,
        slices=[attrs.evolve(OWN_SLICE, rules=[denied])],
        identity=RankIdentity(rank=3, local_rank=1, world_size=4, local_world_size=2, node_rank=1),
        run_id="run-1",
        group=group,
    )
    with caplog.at_level(logging.DEBUG, logger="orchestrator"):
        result = startup.run()

    assert result.peers_finished is peers_finished
    # Each printed with its traceback below its first line.
    warnings = [
        r.getMessage().splitlines()[0] for r in caplog.records if r.levelno == logging.WARNING
    ]
    assert (
        warnings
        == ["[rank 3] No cache: PermissionError: [Errno 13] Permission denied: '/cache'"] * printed
    )


def _fails_in_an_exchange(context: StepContext) -> JsonValue:
    from orchestrator import GroupError

    raise GroupError(1, 2, "all_gather", "RuntimeError: Connection closed by peer")


@pytest.mark.parametrize(
    ("wait_for_peers", "launcher", "printed"),
    [(True, False, 1), (False, True, 0), (False, False, 0)],
    ids=["rank-prints", "command-line-launcher-prints", "scope-only-under-another-launcher"],
)
def test_a_rank_that_failed_in_an_exchange_prints_its_held_warnings_when_it_waits_for_peers(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    wait_for_peers: bool,
    launcher: bool,
    printed: int,
) -> None:
    # No last exchange with peers whose collectives no longer line up: the
    # rank releases what it held. Without waiting for peers it does not:
    # the command line's launcher, which reads every log, prints it once
    # for all ranks; under any other launcher scope decides alone, as in a
    # run that reached ready.
    graph = Graph(
        "mine",
        [
            *_own_graph().steps.values(),
            Step(name="agree", body=_fails_in_an_exchange, depends_on=("cache",)),
        ],
    )
    denied = MessageRule(
        code="mine.cache_denied",
        step="cache",
        outcomes="unavailable",
        severity=Severity.WARNING,
        scope="global",
        text="No cache: {error}",
    )
    environ = {"STARTUP_ORCHESTRATOR_LAUNCHER_PID": str(os.getpid())} if launcher else {}
    startup = _own_startup(
        tmp_path,
        graph=graph,
        slices=[attrs.evolve(OWN_SLICE, rules=[denied])],
        identity=RankIdentity(rank=1, local_rank=1, world_size=2, local_world_size=2),
        run_id="run-1",
        group=None,
        wait_for_peers=wait_for_peers,
        environ=environ,
    )
    from orchestrator import GroupError

    with caplog.at_level(logging.DEBUG, logger="orchestrator"), pytest.raises(GroupError):
        startup.run()

    warnings = [
        r.getMessage().splitlines()[0] for r in caplog.records if r.levelno == logging.WARNING
    ]
    assert (
        warnings
        == ["[rank 1] No cache: PermissionError: [Errno 13] Permission denied: '/cache'"] * printed
    )


def test_a_failure_whose_cause_chain_holds_a_group_error_follows_a_peers() -> None:
    from events.testing import exception_info
    from orchestrator._group import follows_a_peer

    lost = exception_info("orchestrator.GroupError", "all_gather across the process group failed")
    wrapped = exception_info("RuntimeError", "the ranks did not agree on a backend", cause=lost)
    message = Message(
        code="step.failed", severity=Severity.ERROR, scope=Scope.PROCESS, rank=1, text="",
        exception=wrapped,
    )  # fmt: skip
    assert follows_a_peer(message)
    # A WARNING of one is this rank's to say, not a failure to hold.
    assert not follows_a_peer(attrs.evolve(message, severity=Severity.WARNING))


def test_importing_startup_loads_no_runtime_until_one_is_made() -> None:
    # A launcher imports Startup at its top: that must not load the event
    # model, the runner or the run directory: they load when a startup is
    # made.
    code = (
        "import sys\n"
        "from orchestrator import Startup\n"
        "print(sorted(m for m in sys.modules if m.startswith(('events.', 'orchestrator.'))))\n"
        "Startup(environ={}, handle_signals=False)\n"
        "print('events._model' in sys.modules)\n"
    )
    lines = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert lines == [
        "['events._errors', 'events._severity', 'events._surface', 'orchestrator._startup']",
        "True",
    ]


def test_the_signatures_defaults_are_the_runtimes() -> None:
    # Written as values in the signature, so that it needs no import.
    from events import Durability
    from orchestrator._watchdog import DEFAULT_STALL_S

    defaults = inspect.signature(Startup).parameters
    assert defaults["stall_s"].default == DEFAULT_STALL_S
    assert Durability(defaults["durability"].default) is Durability.INTERVAL
