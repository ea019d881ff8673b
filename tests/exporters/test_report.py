"""The replay report: the stable JSON document and the text report (on a
graph and a slice of the tests' own; the report of engine runs is tested
with the engine)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs
import pytest

from events import (
    Agreement,
    Column,
    Event,
    FrameInfo,
    JsonValue,
    LogContents,
    Loss,
    Outcome,
    Replay,
    RunOutcome,
    Scope,
    Severity,
    Slice,
    StepKind,
    TornTail,
    merge,
    outcome_of,
    replay,
)
from events.testing import BASE_WALL_NS, EventStream, exception_info

RUN_ID = "run-7f3a"


def _settled(facts: Mapping[str, JsonValue], event: Event) -> Mapping[str, JsonValue] | None:
    """The slice's facts hook: a rank took part in choosing kernels once its
    ``kernels`` step ended, whatever it chose."""
    if event.step == "kernels" and outcome_of(event) is not None:
        return {"kernels_settled": True}
    return None


#: The tests' slice: two columns read from step results, and the kernels
#: every rank that chose some must agree on (none counts).
MINE = Slice(
    name="mine",
    facts={"kernels_settled": False},
    report_facts=("kernels", "cache"),
    columns=[
        Column(title="KERNELS", fact="kernels", step="kernels", key="selected"),
        Column(title="CACHE", fact="cache", step="cache_dir", key="cache_dir"),
    ],
    agreements=[
        Agreement(
            code="mine.divergence",
            fact="kernels",
            what="Ranks chose different kernels",
            advice="pin one kernel library that works on every rank.",
            among="kernels_settled",
            none_text="none",
        ),
    ],
    severities={"mine.divergence": (Severity.ERROR, Scope.GLOBAL)},
    derive_facts=_settled,
)

RANK_KEYS: dict[str, type | tuple[type, ...]] = {
    "rank": int,
    "outcome": str,
    "kernels": (str, type(None)),
    "cache": (str, type(None)),
    "last_step": (str, type(None)),
    "log": str,
    "in_flight": list,
    "process": (dict, type(None)),
}

DENIED = exception_info("PermissionError", "[Errno 13] Permission denied: '/opt/fast'", errno=13)
NO_CAPTURE = exception_info("OSError", "[Errno 95] Operation not supported: 'graph capture'")
CACHE_BROKEN = exception_info(
    "RuntimeError",
    "unknown cache failure",
    frames=(
        FrameInfo(filename="/opt/mine/probe.py", lineno=41, name="probe_cache", line="open()"),
    ),
)
NO_CACHE = exception_info(
    "my_lib.NoCacheError",
    "No usable cache directory. Tried: /cache: RuntimeError: unknown cache failure",
    cause=CACHE_BROKEN,
)


def started_rank(rank: int, *, world_size: int = 8, offset_ns: int = 0) -> EventStream:
    """One rank (four a node), ``run.started`` written; rank ``r`` starts
    ``r`` µs after the first."""
    return EventStream(
        run_id=RUN_ID,
        rank=rank,
        world_size=world_size,
        local_world_size=min(world_size, 4),
        wall_ns=BASE_WALL_NS + offset_ns + rank * 1_000,
    ).run_started()


def kernels(stream: EventStream, selected: str | None = "slow") -> EventStream:
    """``kernels``: ``fast`` unavailable (a DEBUG line), ``slow`` chosen (or
    none with ``selected=None``, ``slow`` invalid too)."""
    stream.started("kernels")
    stream.started("kernels/fast", kind=StepKind.CANDIDATE, attributes={"candidate": "fast"})
    stream.started("kernels/slow", kind=StepKind.CANDIDATE, attributes={"candidate": "slow"})
    stream.unavailable("kernels/fast", cause=DENIED)
    if selected is None:
        stream.unavailable("kernels/slow", Outcome.INVALID, reasons=["head size 7"])
    else:
        stream.succeeded("kernels/slow", {"candidate": "slow"})
    return stream.succeeded("kernels", {"selected": selected})


def ready_rank(rank: int, *, world_size: int = 8) -> list[Event]:
    """The cache at /cache, the slow kernels, and a warmup whose ``graph``
    attempt is unavailable and ``eager`` recovers (a WARNING): ready."""
    stream = started_rank(rank, world_size=world_size)
    stream.started("cache_dir")
    stream.succeeded("cache_dir", {"cache_dir": "/cache"})
    kernels(stream)
    stream.started("warmup")
    stream.started("warmup/graph", kind=StepKind.ATTEMPT, attributes={"fallback_left": True})
    stream.unavailable("warmup/graph", cause=NO_CAPTURE)
    stream.started("warmup/eager", kind=StepKind.ATTEMPT, attributes={"fallback_left": False})
    stream.succeeded("warmup/eager")
    stream.succeeded("warmup")
    return stream.run_finished()


def failed_rank(rank: int) -> list[Event]:
    """The cache directory step fails with NoCacheError, caused by the
    probe's RuntimeError: the run fails there."""
    stream = started_rank(rank)
    stream.started("cache_dir")
    stream.failed("cache_dir", NO_CACHE)
    return stream.run_finished(RunOutcome.FAILED, cause=NO_CACHE, failed_step="cache_dir")


def dead_rank(rank: int, *, world_size: int = 8) -> list[Event]:
    """Killed while probing the kernel candidates: no run.finished."""
    stream = started_rank(rank, world_size=world_size)
    stream.started("cache_dir")
    stream.succeeded("cache_dir", {"cache_dir": "/cache"})
    stream.started("kernels")
    stream.started("kernels/fast", kind=StepKind.CANDIDATE)
    stream.started("kernels/slow", kind=StepKind.CANDIDATE)
    stream.succeeded("kernels/fast")
    return stream.events


def failed_run() -> list[Event]:
    """Eight ranks; rank 5 fails on its cache directory."""
    streams = [ready_rank(rank) for rank in range(8) if rank != 5]
    streams.append(failed_rank(5))
    return list(merge(streams))


def test_report_json_fields_and_types() -> None:
    from exporters import report_json

    document = report_json(replay(failed_run(), slices=[MINE]))
    json.dumps(document)  # plain JSON all the way down
    assert document["report_version"] == 1
    assert document["run_id"] == "run-7f3a"
    assert document["world_size"] == 8
    assert document["outcome"] == "failed"
    assert [r["rank"] for r in document["ranks"]] == list(range(8))
    for row in document["ranks"]:
        assert set(row) == set(RANK_KEYS)
        for key, kind in RANK_KEYS.items():
            assert isinstance(row[key], kind), key
    rank5 = document["ranks"][5]
    assert rank5["outcome"] == "failed"
    assert rank5["cache"] is None
    assert document["ranks"][0]["cache"] == "/cache"
    assert document["ranks"][0]["kernels"] == "slow"

    for message in document["messages"]:
        assert set(message) == {"code", "severity", "scope", "ranks", "text"}
        assert message["severity"] in {"debug", "info", "warning", "error"}
        assert message["ranks"] == sorted(message["ranks"])
    attempt = next(m for m in document["messages"] if m["code"] == "fallback.used")
    assert attempt["ranks"] == [0, 1, 2, 3, 4, 6, 7]
    assert attempt["severity"] == "warning"
    assert attempt["scope"] == "local"
    severities = [Severity[m["severity"].upper()] for m in document["messages"]]
    assert severities == sorted(severities, reverse=True)

    cause = document["root_cause"]
    assert cause["rank"] == 5
    assert cause["step"] == "cache_dir"
    assert cause["outcome"] == "failed"
    exception_json = cause["exception"]
    assert exception_json["type"] == "my_lib.NoCacheError"
    assert exception_json["message"].startswith("No usable cache directory")
    assert exception_json["cause"] == {
        "type": "RuntimeError",
        "message": "unknown cache failure",
        "cause": None,
    }
    assert document["divergences"] == []
    assert document["warnings"] == []


def test_report_json_of_a_ready_run_and_divergences() -> None:
    from exporters import report_json

    streams = []
    for rank in range(4):
        stream = started_rank(rank, world_size=4)
        kernels(stream, selected=None if rank == 2 else "slow")
        streams.append(stream.run_finished())
    document = report_json(replay(streams, slices=[MINE]))
    assert document["outcome"] == "ready"
    assert document["root_cause"] is None
    (divergence,) = document["divergences"]
    assert divergence["code"] == "mine.divergence"
    assert divergence["severity"] == "error"
    assert divergence["values"] == [
        {"value": "slow", "ranks": [0, 1, 3]},
        {"value": None, "ranks": [2]},
    ]
    assert document["messages"][0]["code"] == "mine.divergence"
    assert any(m["code"] == "mine.divergence" for m in document["messages"])


def test_report_json_is_the_same_for_the_same_logs() -> None:
    from exporters import report_json

    events = failed_run()
    assert report_json(replay(events, slices=[MINE])) == report_json(
        replay(list(events), slices=[MINE])
    )


def test_report_text_starts_with_the_outcome_and_the_root_cause() -> None:
    from exporters import report_text

    text = report_text(replay(failed_run(), slices=[MINE]))
    lines = text.splitlines()
    assert lines[0] == "Startup failed: 1 failed, 7 ready (run run-7f3a, 8 of 8 ranks)"
    assert lines[1] == "Root cause: rank 5, step cache_dir"
    assert lines[2].startswith("  NoCacheError: No usable cache directory")
    assert lines[3] == "  caused by RuntimeError: unknown cache failure"
    assert lines[4] == "      at /opt/mine/probe.py:41 in probe_cache"
    assert "Ranks:" in lines
    assert any(line.startswith("  0-4,6-7 ") and "/cache" in line for line in lines)
    assert any(line.startswith("  5 ") and "failed" in line for line in lines)
    assert "  WARNING [ranks 0-4,6-7] Step warmup/graph unavailable (OSError" in text
    assert "  ERROR [rank 5] Step cache_dir failed: NoCacheError: No usable cache" in text
    assert "DEBUG" not in text


def test_report_text_levels_and_one_rank() -> None:
    from exporters import report_text

    result = replay(failed_run(), slices=[MINE])
    verbose = report_text(result, min_severity=Severity.DEBUG)
    assert "  DEBUG [ranks 0-4,6-7] Candidate kernels/fast is unavailable" in verbose
    errors_only = report_text(result, min_severity=Severity.ERROR)
    assert "WARNING" not in errors_only
    assert "Messages (error and above):" in errors_only
    one = report_text(result, rank=3)
    assert one.splitlines()[0].startswith("Startup failed")
    assert "Rank 3:" in one
    assert "  WARNING [rank 3] Step warmup/graph unavailable" in one
    assert "[rank 5]" not in one


def test_report_text_of_one_rank_without_events_gives_its_row() -> None:
    from exporters import report_text

    # Rank 6 of eight wrote no log.
    result = replay(list(merge(ready_rank(r) for r in range(8) if r != 6)), slices=[MINE])
    one = report_text(result, rank=6).splitlines()
    table = one[one.index("Rank 6:") + 1 :]
    assert table[0].split() == ["RANKS", "OUTCOME", "KERNELS", "CACHE", "LAST", "STEP"]
    assert table[1].split() == ["6", "incomplete", "-", "-", "(no", "events)"]
    assert "  (no log for this rank)" not in one


def _torn_second_log(name: str, events: list[Event]) -> tuple[TornTail, Replay]:
    """Two ranks' logs, rank 0's ready and rank 1's (``events``, in
    ``run/<name>``) with a torn last line, replayed."""
    path = Path("run") / name
    torn = TornTail(path=path, line=9, offset=1000, length=12)
    contents = [
        LogContents(path=Path("run/rank-0.jsonl"), events=tuple(ready_rank(0, world_size=2))),
        LogContents(path=path, events=tuple(events), torn_tail=torn),
    ]
    return torn, replay(contents, slices=[MINE])


def test_report_text_of_an_incomplete_run_with_a_torn_tail() -> None:
    from exporters import report_text

    torn, replayed = _torn_second_log("rank-1.jsonl", dead_rank(1, world_size=2))
    text = report_text(replayed)
    lines = text.splitlines()
    assert lines[0].startswith("Startup incomplete: 1 incomplete, 1 ready")
    assert lines[1].startswith(
        "Root cause: rank 1, step kernels/slow: the process died before the rank finished"
    )
    assert "Log warnings:" in lines
    assert f"  {torn.describe()}" in lines


def test_report_text_of_a_ready_run() -> None:
    from exporters import report_text

    text = report_text(replay([ready_rank(r, world_size=2) for r in range(2)], slices=[MINE]))
    assert text.splitlines()[:2] == [
        "Startup ready: 2 ready (run run-7f3a, 2 of 2 ranks)",
        "Root cause: none (every rank is ready)",
    ]


def test_report_text_collapses_1024_ranks() -> None:
    from exporters import report_text

    streams = [ready_rank(rank, world_size=1024) for rank in range(1024)]
    boom = exception_info("RuntimeError", "boom")
    stream = started_rank(1024 - 1, world_size=1024, offset_ns=1)
    stream.started("kernels")
    stream.started("kernels/fast", kind=StepKind.CANDIDATE)
    stream.failed("kernels/fast", boom)
    stream.failed("kernels", boom)
    streams[-1] = stream.run_finished(RunOutcome.FAILED, cause=boom, failed_step="kernels/fast")
    text = report_text(replay(streams, slices=[MINE]))
    lines = text.splitlines()
    assert lines[1] == "Root cause: rank 1023, step kernels/fast"
    table = lines[lines.index("Ranks:") + 1 : lines.index("Ranks:") + 4]
    assert table[0].startswith("  RANKS")
    # The rank that differs comes first, the run's common state last.
    assert table[1].startswith("  1023 ")
    assert table[2].startswith("  0-1022 ")
    assert len(lines) < 40


def test_ranks_without_events_stay_a_few_lines_at_scale() -> None:
    from events import LaunchRecord, RankProcess
    from exporters import report_text

    # 1,024 ranks, 24 without events: 12 the launcher saw exit, 12 it never
    # recorded (8 with no log, 4 with an empty one).
    seen = range(100, 112)
    unrecorded = range(500, 512)
    silent = {*seen, *unrecorded}
    streams = [ready_rank(rank, world_size=1024) for rank in range(1024) if rank not in silent]
    launch = LaunchRecord(
        run_id=streams[0][0].run_id,
        world_size=1024,
        processes={rank: RankProcess(rank=rank, pid=1000 + rank, exit_code=1) for rank in seen},
        empty_logs=frozenset(range(508, 512)),
    )
    lines = report_text(replay(streams, launch=launch, slices=[MINE])).splitlines()
    start = lines.index("Ranks without events:") + 1
    listed = lines[start : lines.index("", start)]
    # A node's worth described one by one, the rest as rank ranges by reason.
    assert listed[:8] == [
        f"  rank {r} (pid {1000 + r}) exited with code 1; no log" for r in seen[:8]
    ]
    assert listed[8:] == [
        "  ranks 108-111,500-507: no log (never started, or killed before its first event)",
        "  ranks 508-511: empty log (never started, or killed before its first event)",
    ]


def test_the_headline_counts_the_worst_outcomes_first() -> None:
    from exporters import report_json, report_text

    # Of eight ranks: rank 5 failed, rank 1 died, rank 2 was stopped, rank 7 wrote no log.
    stopped = started_rank(2)
    stopped.started("cache_dir").cancelled("cache_dir")
    ranks = [ready_rank(0), dead_rank(1), stopped.run_finished(RunOutcome.INTERRUPTED)]
    ranks += [ready_rank(3), ready_rank(4), failed_rank(5), ready_rank(6)]
    result = replay(list(merge(ranks)), slices=[MINE])
    assert report_text(result).splitlines()[:2] == [
        "Startup incomplete: 1 failed, 1 incomplete, 1 interrupted, 4 ready, 1 without events "
        "(run run-7f3a, 7 of 8 ranks)",
        "Root cause: rank 7 wrote no events (no log): never started, or killed before its "
        "first event",
    ]
    assert report_json(result)["root_cause"]["no_events"] == "no log"


def test_report_json_says_how_each_ranks_log_ended() -> None:
    from events import LaunchRecord
    from exporters import report_json

    # Of four ranks: 0 ready, 1 killed while probing, 2 an empty log, 3 no log.
    launch = LaunchRecord(run_id=RUN_ID, world_size=4, empty_logs=frozenset({2}))
    streams = merge([ready_rank(0, world_size=4), dead_rank(1, world_size=4)])
    document = report_json(replay(list(streams), launch=launch, slices=[MINE]))
    logs = [row["log"] for row in document["ranks"]]
    assert logs == ["complete", "unfinished", "empty", "missing"]


def test_report_header_says_the_host_was_simulated_and_which_faults_were_injected() -> None:
    from exporters import report_text

    # A spec may itself hold commas (a rank set): the specs are told apart by "; ".
    injected = ("0,1:cache_dir=RuntimeError:a, b", "2:kernels=hang")
    stream = EventStream(run_id=RUN_ID, rank=0).run_started(simulated="h200x8", injected=injected)
    stream.started("cache_dir").succeeded("cache_dir", {"cache_dir": "/cache"})
    text = report_text(replay(stream.run_finished(), slices=[MINE]))
    assert text.splitlines()[1] == (
        "Not a real start: simulated host h200x8; injected faults: "
        "0,1:cache_dir=RuntimeError:a, b; 2:kernels=hang"
    )


def test_a_report_cut_at_a_seq_says_so_and_names_no_root_cause() -> None:
    from exporters import report_json, report_text

    result = replay([ready_rank(r, world_size=2) for r in range(2)], slices=[MINE], until=3)
    assert report_text(result).splitlines()[:2] == [
        "Startup running at the cutoff seq 3 (the state then, not how the run ended): "
        "2 running (run run-7f3a, 2 of 2 ranks)",
        "Root cause: none so far (no rank had failed by the cutoff)",
    ]
    document = report_json(result)
    assert (document["outcome"], document["until"]) == ("running", 3)
    # Past every rank's end the cutoff leaves out nothing: how the run ended.
    past = replay([ready_rank(r, world_size=2) for r in range(2)], slices=[MINE], until=10**6)
    assert report_text(past).splitlines()[0] == (
        "Startup ready at the cutoff seq 1000000: 2 ready (run run-7f3a, 2 of 2 ranks)"
    )


def degraded_run(*, timed_out: Sequence[str] = ()) -> list[list[Event]]:
    """Four ready ranks; rank 2 chose kernels with a name no other chose (an
    escape sequence in it) and rank 1 timed out in each of ``timed_out``."""
    streams = []
    for rank in range(4):
        stream = started_rank(rank, world_size=4)
        kernels(stream, selected="slow\x1b[2J" if rank == 2 else "slow")
        if rank == 1:
            for probe in timed_out:
                stream.started(probe).timed_out(probe, 5.0)
        streams.append(stream.run_finished())
    return streams


def test_a_ready_run_that_lost_something_says_what_first() -> None:
    from exporters import report_json, report_text

    # A timed-out probe degrades the start whatever severity its slice gives it.
    mine = attrs.evolve(
        MINE,
        severities={
            "mine.divergence": (Severity.ERROR, Scope.GLOBAL),
            "step.timed_out": (Severity.WARNING, Scope.PROCESS),
        },
    )
    result = replay(degraded_run(timed_out=["probe/a", "probe/b", "probe/c"]), slices=[mine])
    text = report_text(result)
    header = text.split("\n\n")[0].splitlines()
    timed_out = (
        "timed out after 5 s; raise its timeout if the probe is only slow, or find what it "
        "waits for."
    )
    differ = (
        "Ranks chose different kernels: slow on ranks 0-1,3; slow\\x1b[2J on rank 2. Pin one "
        "kernel library that works on every rank."
    )
    assert header == [
        "Startup ready, degraded: 4 ready (run run-7f3a, 4 of 4 ranks)",
        "Degraded: mine.divergence on ranks 0-3",
        f"  {differ}",
        "Degraded: step.timed_out on rank 1",
        f"  Step probe/a {timed_out}",
        "Degraded: step.timed_out on rank 1",
        f"  Step probe/b {timed_out}",
        "Degraded: and 1 more (step.timed_out); see the messages below",
        "Ranks differ: mine.divergence on ranks 0-3",
        f"  {differ}",
    ]
    # The divergence is listed under its own heading, not among the messages.
    messages = text.partition("Messages (info and above):\n")[2].partition("\n\n")[0]
    assert "Ranks chose different kernels" not in messages
    assert [entry["code"] for entry in report_json(result)["degraded"]] == [
        "mine.divergence",
        *["step.timed_out"] * 3,
    ]


def _slow_kernels(facts: Mapping[str, JsonValue], event: Event) -> Mapping[str, JsonValue] | None:
    """A second facts hook: the rank settled for the slow kernels."""
    settled = _settled(facts, event)
    if settled and getattr(event, "result", None) == {"selected": "slow"}:
        return {**settled, "slow_kernels": True}
    return settled


#: The tests' slice with a capability a rank can lose: the fast kernels.
LOSING = attrs.evolve(
    MINE,
    facts={"kernels_settled": False, "slow_kernels": False},
    derive_facts=_slow_kernels,
    losses=[Loss(fact="slow_kernels", what="the fast kernels")],
)


def test_a_degraded_run_names_what_its_ready_ranks_lost_and_a_whole_one_does_not() -> None:
    from exporters import report_text

    # Rank 2 chose other kernels (an ERROR divergence degrades the start):
    # the ranks whose fact says the loss are named, not rank 2.
    degraded = report_text(replay(degraded_run(), slices=[LOSING])).splitlines()
    assert degraded[1] == "Lost: the fast kernels on ranks 0-1,3"
    # A start that is not degraded lost nothing worth a first line.
    whole = [ready_rank(rank, world_size=2) for rank in range(2)]
    assert not [
        line
        for line in report_text(replay(whole, slices=[LOSING])).splitlines()
        if line.startswith("Lost:")
    ]


def test_as_many_degradations_as_are_shown_leave_none_to_count() -> None:
    from exporters import report_text

    result = replay(degraded_run(timed_out=["probe/a", "probe/b"]), slices=[MINE])
    header = report_text(result).split("\n\n")[0]
    assert header.count("Degraded: ") == 3
    assert "more" not in header


def test_rows_of_as_many_ranks_come_in_order_of_their_lowest_rank() -> None:
    from exporters import report_text

    streams = []
    for rank in range(4):
        stream = started_rank(rank, world_size=4)
        kernels(stream, selected="x" if rank in (0, 3) else "y")
        streams.append(stream.run_finished())
    table = report_text(replay(streams, slices=[MINE])).partition("Ranks:\n")[2]
    rows = [line.split()[0] for line in table.splitlines()[1:3]]
    assert rows == ["0,3", "1-2"]


def test_a_divergence_that_is_no_error_leaves_a_ready_run_whole() -> None:
    from exporters import report_text

    mine = attrs.evolve(MINE, severities={"mine.divergence": (Severity.WARNING, Scope.GLOBAL)})
    text = report_text(replay(degraded_run(), slices=[mine]))
    assert text.splitlines()[:2] == [
        "Startup ready: 4 ready (run run-7f3a, 4 of 4 ranks)",
        "Root cause: none (every rank is ready)",
    ]


#: Raised in the load step of an engine's worker, two frames deep.
LOAD_FAILED = exception_info(
    "RuntimeError",
    "boom",
    frames=(
        FrameInfo(filename="/opt/engine/main.py", lineno=3, name="main", line="load()"),
        FrameInfo(filename="/opt/engine/load.py", lineno=9, name="load", line="raise"),
    ),
)


def engine_process(rank: int, role: str, *, died: bool) -> list[Event]:
    """A process of an engine's own start (its log names its role) that
    loads; rank 1 fails there, or dies there."""
    stream = EventStream(run_id="engine", rank=rank, world_size=2)
    stream.identity = attrs.evolve(stream.identity, role=role)
    stream.run_started()
    stream.started("load")
    if rank == 0:
        return stream.succeeded("load").run_finished()
    if died:
        return stream.events
    stream.failed("load", LOAD_FAILED)
    return stream.run_finished(RunOutcome.FAILED, cause=LOAD_FAILED, failed_step="load")


@pytest.mark.parametrize(
    ("died", "cause"),
    [
        (
            False,
            [
                "Root cause: rank 1 (worker TP1, pid 4001), step load",
                "  RuntimeError: boom",
                # Where it was raised: the innermost frame.
                "      at /opt/engine/load.py:9 in load",
                "  seen by rank 0, engine core: rank 1 (pid 4001) exited with code 1",
            ],
        ),
        (
            True,
            [
                "Root cause: rank 1 (worker TP1, pid 4001), step load: was killed by SIGKILL "
                "(seen by rank 0, engine core)",
            ],
        ),
    ],
    ids=["failed", "died"],
)
def test_a_process_watched_by_another_says_who_saw_it_end(died: bool, cause: list[str]) -> None:
    from events import LaunchRecord, RankProcess
    from exporters import report_json, report_text

    # The engine core (rank 0) saw its worker's process end, not a launcher.
    process = RankProcess(
        rank=1,
        pid=4001,
        exit_code=None if died else 1,
        signal="SIGKILL" if died else None,
        observer="rank 0, engine core",
    )
    launch = LaunchRecord(run_id="engine", world_size=2, processes={1: process})
    streams = [
        engine_process(0, "engine core", died=died),
        engine_process(1, "worker TP1", died=died),
    ]
    result = replay(list(merge(streams)), launch=launch)
    lines = report_text(result).splitlines()
    assert lines[1 : lines.index("")] == cause
    table = lines[lines.index("Ranks:") + 1 : lines.index("Ranks:") + 4]
    outcome = "incomplete" if died else "failed"
    width = max(len("OUTCOME"), len(outcome))
    # The processes are not alike: each row says what it is.
    assert table == [
        f"  RANKS  ROLE         {'OUTCOME'.ljust(width)}  LAST STEP",
        f"  0      engine core  {'ready'.ljust(width)}  load",
        f"  1      worker TP1   {outcome.ljust(width)}  load",
    ]
    rank1 = report_json(result)["ranks"][1]
    assert rank1["role"] == "worker TP1"
    assert rank1["process"]["observer"] == "rank 0, engine core"


def test_a_rank_that_went_on_without_the_group_is_named_with_what_it_left_out() -> None:
    from events import Collective
    from exporters import report_json, report_text

    # Rank 0 had no torch and went on without the process group; rank 1
    # waited for it at the rendezvous and failed there.
    group = Slice(name="group", collectives=(Collective(step="group", what="the process group"),))
    no_torch = exception_info("ImportError", "No module named 'torch'")
    timed_out = exception_info("orchestrator.GroupError", "the rendezvous timed out")
    went_on = EventStream(rank=0, world_size=2).run_started()
    went_on.started("group").unavailable("group", cause=no_torch)
    waited = EventStream(rank=1, world_size=2).run_started()
    waited.started("group").advance(120_000_000_000).failed("group", timed_out)
    streams = [
        went_on.run_finished(),
        waited.run_finished(RunOutcome.FAILED, cause=timed_out, failed_step="group"),
    ]
    result = replay(streams, slices=[group])
    assert report_text(result).splitlines()[1:4] == [
        "Root cause: rank 0, step group",
        "  ImportError: No module named 'torch'",
        "  rank 0 went on without the process group, and the ranks that waited for it there failed",
    ]
    cause = report_json(result)["root_cause"]
    assert (cause["rank"], cause["outcome"], cause["left_out"]) == (0, "ready", "the process group")


def test_messages_printed_above_are_counted_and_none_are_said_to_be_none() -> None:
    from exporters import report_text

    result = replay([ready_rank(r, world_size=2) for r in range(2)], slices=[MINE])
    again = "replay run lists them"
    shown = report_text(result, printed_above=again)
    assert shown.endswith(
        "\n\nMessages (info and above): 2, printed above; replay run lists them\n"
    )
    errors = report_text(result, min_severity=Severity.ERROR, printed_above=again)
    assert errors.endswith("\n\nMessages (error and above):\n  (none)\n")


def test_warnings_about_the_logs_are_escaped() -> None:
    from exporters import report_text

    torn, replayed = _torn_second_log("\x1b[2Jrank-1.jsonl", ready_rank(1, world_size=2))
    text = report_text(replayed)
    assert "\x1b" not in text
    assert f"  {torn.describe()}".replace("\x1b", "\\x1b") in text.splitlines()


def test_a_rank_still_running_is_named_in_the_step_where_it_waits() -> None:
    from events import LaunchRecord
    from exporters import report_text

    # It waits in "load", and has since started a watcher beside it.
    stream = started_rank(0, world_size=1)
    stream.started("load").stalled("load").started("watch")
    launch = LaunchRecord(run_id=RUN_ID, world_size=1, running=frozenset({0}))
    result = replay(stream.events, launch=launch, slices=[MINE])
    assert report_text(result).splitlines()[2:4] == [
        "  rank 0 is still running, in load",
        "    waiting in wait_for_fabric (fabric.py:42) after 10.0 s",
    ]


def test_the_running_ranks_that_others_wait_for_come_first() -> None:
    from events import FrameInfo, LaunchRecord
    from exporters import report_text

    # Rank 0 waits at a rendezvous for rank 1, stuck in code of its own.
    rendezvous = FrameInfo(filename="/venv/torch/distributed/c10d.py", lineno=9, name="barrier")
    waiting = started_rank(0, world_size=2)
    waiting.started("init").stalled("init", waiting_in=rendezvous)
    stuck = started_rank(1, world_size=2)
    stuck.started("init").stalled("init")
    launch = LaunchRecord(run_id=RUN_ID, world_size=2, running=frozenset({0, 1}))
    peers = attrs.evolve(MINE, peer_waits=("*/torch/distributed/*",))
    result = replay([waiting.events, stuck.events], launch=launch, slices=[peers])
    running = [line for line in report_text(result).splitlines() if line.startswith("  rank ")]
    assert running == [
        "  rank 1 is still running, in init",
        "  rank 0 is still running, in init, waiting for another process",
    ]


def test_a_rank_still_running_is_named_with_its_step_escaped() -> None:
    from events import LaunchRecord
    from exporters import report_text

    # The reader saw the process that writes rank 0's log alive.
    stream = started_rank(0, world_size=1)
    stream.started("load\x1b[2J")
    launch = LaunchRecord(run_id=RUN_ID, world_size=1, running=frozenset({0}))
    result = replay(stream.events, launch=launch, slices=[MINE])
    assert report_text(result).splitlines()[1:3] == [
        "Root cause: none so far (no rank has failed)",
        "  rank 0 is still running, in load\\x1b[2J",
    ]
