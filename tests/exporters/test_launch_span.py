"""One launch, one root: the ranks of a run of several ranks hang their root
spans from the launch's own span (``events.launch_span_id``), which
``run_trace`` adds once the run's outcome and root cause are known, named
for them, so Jaeger lists the trace by the launch and what went wrong."""

from __future__ import annotations

import hashlib

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode

from events import (
    Event,
    ExceptionInfo,
    LaunchRecord,
    RunOutcome,
    launch_span_id,
    merge,
    replay,
)
from events.testing import BASE_WALL_NS, EventStream, exception_info
from exporters import Tracing, run_trace
from orchestrator._launch_trace import send_launch_span
from tests.exporters.otlp_receivers import HttpReceiver

RUN_ID = "launch-run"
TRACE_ID = hashlib.sha256(RUN_ID.encode()).hexdigest()[:32]
LAUNCH = launch_span_id(TRACE_ID, RUN_ID)
CALLER = "00f067aa0ba902b7"
BOOM = exception_info("RuntimeError", "boom")
PEER_GONE = exception_info("orchestrator.GroupError", "a peer exited")


def _rank(
    rank: int, *, fails: ExceptionInfo | None = None, parent: str | None = LAUNCH
) -> list[Event]:
    stream = EventStream(
        run_id=RUN_ID, rank=rank, world_size=3, trace_id=TRACE_ID, launcher_span_id=parent,
        wall_ns=BASE_WALL_NS + (0 if rank == 1 else 5_000_000 * (rank + 1)),  # rank 1 first
    )  # fmt: skip
    stream.run_started(simulated="h200x8", injected=("1:platform=RuntimeError:boom",))
    stream.started("platform")
    if fails is None:
        stream.succeeded("platform")
        return stream.run_finished(RunOutcome.READY)
    stream.failed("platform", fails)
    return stream.run_finished(RunOutcome.FAILED, cause=fails, failed_step="platform")


def _failed_run(parent: str | None = LAUNCH) -> list[list[Event]]:
    return [
        _rank(0, fails=PEER_GONE, parent=parent),
        _rank(1, fails=BOOM, parent=parent),
        _rank(2, parent=parent),
    ]


def _trace(streams: list[list[Event]], launch: LaunchRecord | None = None) -> list[ReadableSpan]:
    return run_trace(merge(streams), replay(streams, launch=launch))


def _attributes(span: ReadableSpan) -> dict[str, object]:
    return dict(span.attributes or {})


def test_a_failed_launch_has_one_root_named_for_its_root_cause() -> None:
    spans = _trace(_failed_run())

    launch, *rest = spans
    assert launch.name == "launch 3 ranks: failed \N{EM DASH} rank 1 platform"
    # The root cause's rank's spans come next, then the others'.
    order = [_attributes(span)["startup.rank"] for span in rest]
    assert order == sorted(order, key=lambda rank: rank != 1)
    assert order[0] == 1
    assert (launch.context.trace_id, launch.context.span_id) == (
        int(TRACE_ID, 16),
        int(LAUNCH, 16),
    )
    assert launch.parent is None
    # Every rank's root is its child; no other span is a root.
    roots = [span for span in rest if _attributes(span)["startup.kind"] == "run"]
    assert len(roots) == 3
    assert all(root.parent is not None and root.parent.span_id == int(LAUNCH, 16) for root in roots)
    assert [span for span in spans if span.parent is None] == [launch]
    attributes = _attributes(launch)
    assert attributes["startup.kind"] == "launch"
    assert attributes["startup.outcome"] == "failed"
    assert attributes["startup.world_size"] == 3
    assert attributes["startup.root_cause_rank"] == 1
    assert attributes["startup.root_cause_step"] == "platform"
    assert attributes["startup.root_cause"] == "rank 1, step platform: RuntimeError: boom"
    assert attributes["startup.simulated"] == "h200x8"
    assert attributes["startup.injected"] == ("1:platform=RuntimeError:boom",)
    assert launch.status.status_code is StatusCode.ERROR
    assert launch.status.description == "failed: rank 1, step platform: RuntimeError: boom"
    # It spans its ranks, and links to the root cause's own step.
    assert launch.start_time == min(root.start_time or 0 for root in roots)
    assert launch.end_time == max(root.end_time or 0 for root in roots)
    [failing] = [
        span
        for span in rest
        if _attributes(span).get("startup.rank") == 1
        and _attributes(span).get("startup.step") == "platform"
    ]
    [link] = launch.links
    assert link.context.span_id == failing.context.span_id
    assert launch.resource.attributes["service.instance.id"] == f"{RUN_ID}/launch"
    assert "startup.rank" not in launch.resource.attributes


def test_the_launch_record_gives_its_times_and_the_callers_span() -> None:
    started, finished = BASE_WALL_NS - 2_000_000_000, BASE_WALL_NS + 9_000_000_000
    record = LaunchRecord(
        run_id=RUN_ID, world_size=3, started_wall_ns=started, finished_wall_ns=finished,
        trace_parent=CALLER,
    )  # fmt: skip

    launch = _trace(_failed_run(), record)[0]

    assert (launch.start_time, launch.end_time) == (started, finished)
    assert launch.parent is not None
    assert (launch.parent.span_id, launch.parent.is_remote) == (int(CALLER, 16), True)


def test_a_ready_launch_is_named_ready_and_not_red() -> None:
    streams = [_rank(rank) for rank in range(3)]

    launch = _trace(streams)[0]

    assert launch.name == "launch 3 ranks: ready"
    assert launch.status.status_code is StatusCode.UNSET
    assert "startup.root_cause_rank" not in _attributes(launch)
    assert launch.links == ()


def test_ranks_that_do_not_hang_from_a_launch_get_no_launch_span() -> None:
    # Under a caller's span (a single run's TRACEPARENT), or with no parent.
    for parent in (CALLER, None):
        spans = _trace(_failed_run(parent))
        assert all(_attributes(span)["startup.kind"] != "launch" for span in spans)
        assert len(spans) == len(_trace(_failed_run())) - 1


@pytest.mark.parametrize("ranks_ended", [False, True])
def test_a_dead_ranks_open_spans_are_sent_with_the_launch_span_once_every_rank_has_ended(
    ranks_ended: bool,
) -> None:
    dead = EventStream(
        run_id=RUN_ID, rank=2, world_size=3, trace_id=TRACE_ID, launcher_span_id=LAUNCH,
        wall_ns=BASE_WALL_NS + 15_000_000,
    )  # fmt: skip
    dead.run_started()
    dead.started("platform")  # and the process died
    spans = _trace([*_failed_run()[:2], dead.events])

    with HttpReceiver() as receiver:
        tracing = Tracing(
            otlp_endpoint=receiver.endpoint, otlp_protocol="http/protobuf", environ={}
        )
        assert send_launch_span(tracing, spans, ranks_ended=ranks_ended) is True
        received = [(span.name, span.attributes["startup.outcome"]) for span in receiver.spans()]

    # Until every rank is known to have ended, a rank without run.finished may
    # still be running: its spans are its own to send.
    expected = [("launch 3 ranks: incomplete \N{EM DASH} rank 1 platform", "incomplete")]
    if ranks_ended:
        expected += [("platform", "incomplete"), ("startup rank 2", "incomplete")]
    assert received == expected
