"""Once every rank's log is read, the ranks' root spans say which rank
caused the failure (``run_trace``); live, a rank knows only itself."""

from __future__ import annotations

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode

from events import Event, RunOutcome, merge, root_cause
from events import replay as replay_run
from events.testing import EventStream, exception_info
from exporters import run_trace, spans_from_events

CAUSE = exception_info("RuntimeError", "unknown zentorch failure")
PEER_GONE = exception_info("GroupError", "all_gather failed: a peer exited")


def launch() -> list[list[Event]]:
    ready = EventStream(rank=0, world_size=3).run_started()
    ready.started("platform")
    ready.succeeded("platform")
    cause = EventStream(rank=1, world_size=3).run_started()
    cause.started("platform")
    cause.failed("platform", CAUSE)
    consequence = EventStream(rank=2, world_size=3).run_started()
    consequence.started("agree")
    consequence.failed("agree", PEER_GONE)
    return [
        ready.run_finished(RunOutcome.READY),
        cause.run_finished(RunOutcome.FAILED, cause=CAUSE, failed_step="platform"),
        consequence.run_finished(RunOutcome.FAILED, cause=PEER_GONE, failed_step="agree"),
    ]


def roots(spans: list[ReadableSpan]) -> dict[str, ReadableSpan]:
    return {span.name: span for span in spans if span.name.startswith("startup rank ")}


def test_the_root_cause_rank_and_its_consequences_are_marked() -> None:
    streams = launch()
    events = list(merge(streams))
    replayed = replay_run(streams)
    found = replayed.root_cause
    assert found is not None
    assert found.rank == 1

    marked = roots(run_trace(events, replayed))

    ready, cause, consequence = (marked[f"startup rank {rank}"] for rank in range(3))
    assert "startup.root_cause" not in (ready.attributes or {})
    assert ready.status.status_code is StatusCode.UNSET
    assert (cause.attributes or {})["startup.root_cause"] is True
    assert cause.status.status_code is StatusCode.ERROR
    assert cause.status.description == (
        "root cause: step platform: RuntimeError: unknown zentorch failure"
    )
    attributes = consequence.attributes or {}
    assert attributes["startup.root_cause"] is False
    assert attributes["startup.root_cause_rank"] == 1
    assert consequence.status.description == (
        "consequence of rank 1: GroupError: all_gather failed: a peer exited"
    )


def test_without_a_root_cause_nothing_changes() -> None:
    ready = EventStream(rank=0, world_size=1).run_started()
    ready.started("platform")
    ready.succeeded("platform")
    streams = [ready.run_finished(RunOutcome.READY)]
    replayed = replay_run(streams)
    assert replayed.root_cause is None
    traced = run_trace(merge(streams), replayed)
    assert [span.to_json() for span in traced] == [
        span.to_json() for span in spans_from_events(merge(streams))
    ]
    assert root_cause({}) is None


def test_a_consequence_links_to_the_root_causes_own_step() -> None:
    streams = launch()
    spans = run_trace(merge(streams), replay_run(streams))

    [failing] = [
        span
        for span in spans
        if (span.attributes or {}).get("startup.rank") == 1
        and (span.attributes or {}).get("startup.step") == "platform"
    ]
    marked = roots(spans)
    [link] = marked["startup rank 2"].links
    assert (link.context.trace_id, link.context.span_id) == (
        failing.context.trace_id,
        failing.context.span_id,
    )
    assert (link.attributes or {})["startup.link"] == "root cause"
    # Neither the root cause nor a ready rank points anywhere.
    assert marked["startup rank 1"].links == ()
    assert marked["startup rank 0"].links == ()
