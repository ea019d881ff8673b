"""Hand-built event streams with fixed ids and timestamps for the span tests.

Import as ``tests.exporters.event_streams``.

The reference scenario, per rank (8 ranks, one trace, roots under the
launcher's span)::

    startup                                   root span (run.started → run.finished ready)
    ├── platform
    │   └── platform/cpu                      candidate "cpu", priority 4
    │       └── platform/cpu/zentorch         attempt; unavailable, OSError cause chain
    └── allreduce/workspace                   backend auto
        ├── allreduce/workspace/mnnvl         attempt; unavailable (WARNING by the hook)
        └── allreduce/workspace/trtllm        attempt; ok
"""

from __future__ import annotations

from events import (
    Event,
    ExceptionInfo,
    FrameInfo,
    Outcome,
    Severity,
    StepKind,
    merge,
    outcome_of,
)
from events.testing import BASE_WALL_NS, EventStream
from exporters import default_severity

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
LAUNCHER_SPAN_ID = "00f067aa0ba902b7"
RUN_ID = "run-7f3a"
WORLD_SIZE = 8
#: Every timestamp is a whole number of microseconds, so Jaeger's µs
#: resolution round-trips exactly.
BASE_NS = BASE_WALL_NS

ZENTORCH_CAUSE = ExceptionInfo(
    type="OSError",
    message="libzentorch.so: undefined symbol: _ZN3c104impl8GPUTrace",
    reason="OSError: libzentorch.so: undefined symbol: _ZN3c104impl8GPUTrace",
    frames=(
        FrameInfo(
            filename="/opt/engine/platforms/cpu.py",
            lineno=41,
            name="probe_zentorch",
            line="import zentorch",
        ),
    ),
    context=ExceptionInfo(
        type="FileNotFoundError",
        message="[Errno 2] No such file or directory: '/opt/zentorch/lib/libzentorch.so'",
        reason=(
            "FileNotFoundError: [Errno 2] No such file or directory: "
            "'/opt/zentorch/lib/libzentorch.so'"
        ),
        errno=2,
        strerror="No such file or directory",
        filename="/opt/zentorch/lib/libzentorch.so",
    ),
)
MNNVL_CAUSE = ExceptionInfo(
    type="OSError",
    message="[Errno 95] Operation not supported: 'NVSwitch multicast'",
    reason="OSError: [Errno 95] Operation not supported: 'NVSwitch multicast'",
    errno=95,
)


def started_rank(rank: int, *, world_size: int = WORLD_SIZE) -> EventStream:
    """One rank of the reference run (four ranks a node, roots under the
    launcher's span), ``run.started`` written. Each event comes 10 ms after
    the one before; rank ``r`` starts ``r`` ms after ``BASE_NS``, at
    monotonic ``r`` ms."""
    return EventStream(
        run_id=RUN_ID,
        rank=rank,
        world_size=world_size,
        local_world_size=4,
        trace_id=TRACE_ID,
        launcher_span_id=LAUNCHER_SPAN_ID,
        wall_ns=BASE_NS + rank * 1_000_000,
        mono_ns=rank * 1_000_000,
        tick_ns=10_000_000,
    ).run_started(versions={"torch": "2.6.0"}, graph="engine")


def reference_rank(rank: int, *, world_size: int = WORLD_SIZE) -> EventStream:
    """The reference scenario of the module docstring for one rank."""
    builder = started_rank(rank, world_size=world_size)
    builder.started("platform")
    builder.started(
        "platform/cpu",
        kind=StepKind.CANDIDATE,
        attributes={"candidate": "cpu", "priority": 4},
    )
    builder.started(
        "platform/cpu/zentorch",
        kind=StepKind.ATTEMPT,
        attributes={"module": "zentorch"},
    )
    builder.unavailable("platform/cpu/zentorch", cause=ZENTORCH_CAUSE)
    builder.succeeded("platform/cpu", {"activated": True, "class": "CpuPlatform"})
    builder.succeeded("platform", "cpu")
    builder.started("allreduce/workspace", attributes={"backend": "auto"}, depends_on=("platform",))
    builder.started(
        "allreduce/workspace/mnnvl",
        kind=StepKind.ATTEMPT,
        attributes={"backend": "mnnvl", "priority": 0},
    )
    builder.unavailable("allreduce/workspace/mnnvl", cause=MNNVL_CAUSE)
    builder.started(
        "allreduce/workspace/trtllm",
        kind=StepKind.ATTEMPT,
        attributes={"backend": "trtllm", "priority": 1},
    )
    builder.succeeded("allreduce/workspace/trtllm", {"backend": "trtllm"})
    builder.decision("allreduce.backend", "trtllm", step="allreduce/workspace")
    builder.succeeded("allreduce/workspace", "trtllm")
    builder.decision("run.ready", True)
    builder.run_finished()
    return builder


#: Spans per rank in the reference scenario: the root and six steps.
SPANS_PER_RANK = 7


def severity_with_warning_attempts(rank: int, step: str, outcome_event: Event) -> Severity | None:
    """The hook the tests plug in: an all-reduce attempt that failed while a
    fallback remained is a WARNING; the rest as by default."""
    if step == "allreduce/workspace/mnnvl" and outcome_of(outcome_event) is Outcome.UNAVAILABLE:
        return Severity.WARNING
    return default_severity(rank, step, outcome_event)


def reference_logs() -> list[list[Event]]:
    """The reference scenario's events, one list per rank."""
    return [reference_rank(rank).events for rank in range(WORLD_SIZE)]


def reference_stream() -> list[Event]:
    """All ranks merged into one stream, as replay reads a run directory."""
    return list(merge(reference_logs()))
