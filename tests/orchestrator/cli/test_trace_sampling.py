"""Live export follows the SDK's sampler (``OTEL_TRACES_SAMPLER`` and its
argument, parent-based by default): a launch is exported whole or not at
all, the event log is complete either way, and replay export, an explicit
request, sends the trace of a launch that was not sampled."""

from __future__ import annotations

from pathlib import Path

import pytest

from events import RunFinished, RunOutcome
from tests.exporters.otlp_receivers import GrpcReceiver
from tests.exporters.tracing_harness import (
    cli_environment,
    expected_span_ids,
    run_cli,
    run_events,
)

pytestmark = pytest.mark.slow

PARENT_SPAN = "00f067aa0ba902b7"
#: TraceIdRatioBased keeps a trace when the id's low 64 bits are below
#: ratio * 2**64: at ratio 0.5 the first is kept, the second dropped.
KEPT_AT_HALF = "4bf92f3577b34da60000000000000001"
DROPPED_AT_HALF = "4bf92f3577b34da6fffffffffffffff0"


def _traced_run(tmp_path: Path, *extra: str, **variables: str) -> tuple[int, set[str], Path]:
    """Run the simulated engine against a receiver; the span ids it got."""
    run_dir = tmp_path / "run"
    with GrpcReceiver() as receiver:
        done = run_cli(
            "run", "--simulate", "h200x8", "--run-dir", str(run_dir), *extra,
            env=cli_environment(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint, **variables),
            cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        # The run flushed before it exited: what the receiver has is all.
        received = {span.span_id for span in receiver.spans()}
    assert "tracing:" not in done.stderr
    assert "could not export" not in done.stderr
    events = run_events(run_dir)
    assert isinstance(events[-1], RunFinished)
    assert events[-1].outcome is RunOutcome.READY
    return len(expected_span_ids(events)), received, run_dir


@pytest.mark.parametrize(
    ("variables", "sampled"),
    [
        ({"TRACEPARENT": f"00-{KEPT_AT_HALF}-{PARENT_SPAN}-01"}, True),
        ({"TRACEPARENT": f"00-{KEPT_AT_HALF}-{PARENT_SPAN}-00"}, False),
        ({}, True),
        ({"OTEL_TRACES_SAMPLER": "always_off"}, False),
        (
            {
                "OTEL_TRACES_SAMPLER": "always_on",
                "TRACEPARENT": f"00-{KEPT_AT_HALF}-{PARENT_SPAN}-00",
            },
            True,
        ),
        (
            {
                "OTEL_TRACES_SAMPLER": "parentbased_always_off",
                "TRACEPARENT": f"00-{KEPT_AT_HALF}-{PARENT_SPAN}-01",
            },
            True,
        ),
        ({"OTEL_TRACES_SAMPLER": "parentbased_always_off"}, False),
        (
            {
                "OTEL_TRACES_SAMPLER": "traceidratio",
                "OTEL_TRACES_SAMPLER_ARG": "0.5",
                "TRACEPARENT": f"00-{KEPT_AT_HALF}-{PARENT_SPAN}-00",
            },
            True,
        ),
        (
            {
                "OTEL_TRACES_SAMPLER": "traceidratio",
                "OTEL_TRACES_SAMPLER_ARG": "0.5",
                "TRACEPARENT": f"00-{DROPPED_AT_HALF}-{PARENT_SPAN}-01",
            },
            False,
        ),
        (
            {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0"},
            False,
        ),
        ({"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "1"}, True),
    ],
    ids=[
        "parent-sampled",
        "parent-not-sampled",
        "default-root",
        "always_off",
        "always_on-ignores-parent",
        "parentbased_always_off-follows-parent",
        "parentbased_always_off-root",
        "traceidratio-kept",
        "traceidratio-dropped",
        "parentbased_traceidratio-0",
        "parentbased_traceidratio-1",
    ],
)
def test_live_export_follows_the_sampler(
    variables: dict[str, str], sampled: bool, tmp_path: Path
) -> None:
    expected, received, _ = _traced_run(tmp_path, **variables)
    assert len(received) == (expected if sampled else 0)


def test_a_ratio_keeps_or_drops_a_multi_rank_launch_whole(tmp_path: Path) -> None:
    for trace_id, kept in ((KEPT_AT_HALF, True), (DROPPED_AT_HALF, False)):
        case = tmp_path / trace_id
        case.mkdir()
        expected, received, _ = _traced_run(
            case,
            "--nproc",
            "2",
            OTEL_TRACES_SAMPLER="traceidratio",
            OTEL_TRACES_SAMPLER_ARG="0.5",
            TRACEPARENT=f"00-{trace_id}-{PARENT_SPAN}-01",
        )
        # The ranks' spans and the launch's own, or none at all.
        assert len(received) == (expected + 1 if kept else 0)


def test_replay_export_sends_a_launch_that_was_not_sampled(tmp_path: Path) -> None:
    expected, received, run_dir = _traced_run(
        tmp_path, TRACEPARENT=f"00-{KEPT_AT_HALF}-{PARENT_SPAN}-00"
    )
    assert received == set()
    with GrpcReceiver() as receiver:
        replayed = run_cli(
            "replay", str(run_dir), "--export", "otlp",
            env=cli_environment(
                OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
                TRACEPARENT=f"00-{KEPT_AT_HALF}-{PARENT_SPAN}-00",
                OTEL_TRACES_SAMPLER="always_off",
            ),
            cwd=tmp_path,
        )  # fmt: skip
        assert replayed.returncode == 0, replayed.stderr
        spans = receiver.wait_for_spans(expected)
    assert len(spans) == expected
    assert {span.trace_id for span in spans} == {KEPT_AT_HALF}
