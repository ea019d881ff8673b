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

from collections.abc import Mapping
from typing import Any

from events import (
    DecisionMade,
    Event,
    ExceptionInfo,
    FrameInfo,
    JsonValue,
    Outcome,
    RankIdentity,
    RunFinished,
    RunOutcome,
    RunStarted,
    Severity,
    StepKind,
    StepStarted,
    StepSucceeded,
    StepUnavailable,
    merge,
    outcome_of,
)
from exporters import default_severity

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
LAUNCHER_SPAN_ID = "00f067aa0ba902b7"
RUN_ID = "run-7f3a"
WORLD_SIZE = 8
#: Every timestamp is a whole number of microseconds, so Jaeger's µs
#: resolution round-trips exactly.
BASE_NS = 1_767_225_600_000_000_000

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


class RankEvents:
    """Builds one rank's events: gapless seq, deterministic ids and times."""

    def __init__(
        self,
        rank: int,
        *,
        world_size: int = WORLD_SIZE,
        run_id: str = RUN_ID,
        trace_id: str = TRACE_ID,
        launcher_span_id: str | None = LAUNCHER_SPAN_ID,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.run_id = run_id
        self.trace_id = trace_id
        self.launcher_span_id = launcher_span_id
        self.events: list[Event] = []
        self._spans = 0
        self._open: dict[str, tuple[str, str | None]] = {}
        self.root_span_id = self._new_span_id()

    def _new_span_id(self) -> str:
        self._spans += 1
        return f"{self.rank + 1:04x}{self._spans:012x}"

    def time_ns(self, index: int | None = None) -> int:
        """Wall time of the event at ``index`` (default: the next one)."""
        position = len(self.events) if index is None else index
        return BASE_NS + self.rank * 1_000_000 + position * 10_000_000

    def _envelope(self, step: str, span_id: str, parent: str | None) -> dict[str, Any]:
        wall = self.time_ns()
        return {
            "run_id": self.run_id,
            "rank": self.rank,
            "seq": len(self.events),
            "wall_ns": wall,
            "mono_ns": wall - BASE_NS,
            "step": step,
            "trace_id": self.trace_id,
            "span_id": span_id,
            "parent_span_id": parent,
        }

    def run_started(self, *, graph: str = "engine") -> RankEvents:
        self.events.append(
            RunStarted(
                **self._envelope("", self.root_span_id, self.launcher_span_id),
                identity=RankIdentity(
                    rank=self.rank,
                    local_rank=self.rank % 4,
                    world_size=self.world_size,
                    local_world_size=4,
                    node_rank=self.rank // 4,
                ),
                host=f"node-{self.rank // 4}",
                pid=4000 + self.rank,
                versions={"torch": "2.6.0"},
                graph=graph,
            )
        )
        return self

    def start(
        self,
        step: str,
        *,
        parent: str | None = None,
        kind: StepKind = StepKind.STEP,
        attributes: Mapping[str, JsonValue] | None = None,
        depends_on: tuple[str, ...] = (),
    ) -> str:
        """Open ``step`` under ``parent`` (a step path; default the root)."""
        parent_span = self.root_span_id if parent is None else self._open[parent][0]
        span_id = self._new_span_id()
        self._open[step] = (span_id, parent_span)
        self.events.append(
            StepStarted(
                **self._envelope(step, span_id, parent_span),
                kind=kind,
                depends_on=depends_on,
                attributes=dict(attributes or {}),
            )
        )
        return span_id

    def end(self, event_type: type[Event], step: str, **payload: Any) -> None:
        """Close ``step`` with a terminal event of ``event_type``."""
        span_id, parent = self._open.pop(step)
        self.events.append(event_type(**self._envelope(step, span_id, parent), **payload))

    def decision(self, name: str, value: JsonValue, *, step: str | None = None) -> None:
        span_id, parent = (
            (self.root_span_id, self.launcher_span_id) if step is None else self._open[step]
        )
        self.events.append(
            DecisionMade(**self._envelope(step or "", span_id, parent), name=name, value=value)
        )

    def run_finished(
        self,
        outcome: RunOutcome = RunOutcome.READY,
        *,
        cause: ExceptionInfo | None = None,
        failed_step: str | None = None,
    ) -> list[Event]:
        self.events.append(
            RunFinished(
                **self._envelope("", self.root_span_id, self.launcher_span_id),
                outcome=outcome,
                cause=cause,
                failed_step=failed_step,
            )
        )
        return self.events


def reference_rank(rank: int, *, world_size: int = WORLD_SIZE) -> RankEvents:
    """The reference scenario of the module docstring for one rank."""
    builder = RankEvents(rank, world_size=world_size).run_started()
    builder.start("platform")
    builder.start(
        "platform/cpu",
        parent="platform",
        kind=StepKind.CANDIDATE,
        attributes={"candidate": "cpu", "priority": 4},
    )
    builder.start(
        "platform/cpu/zentorch",
        parent="platform/cpu",
        kind=StepKind.ATTEMPT,
        attributes={"module": "zentorch"},
    )
    builder.end(
        StepUnavailable,
        "platform/cpu/zentorch",
        outcome=Outcome.UNAVAILABLE,
        reasons=(ZENTORCH_CAUSE.reason,),
        cause=ZENTORCH_CAUSE,
    )
    builder.end(StepSucceeded, "platform/cpu", result={"activated": True, "class": "CpuPlatform"})
    builder.end(StepSucceeded, "platform", result="cpu")
    builder.start("allreduce/workspace", attributes={"backend": "auto"}, depends_on=("platform",))
    builder.start(
        "allreduce/workspace/mnnvl",
        parent="allreduce/workspace",
        kind=StepKind.ATTEMPT,
        attributes={"backend": "mnnvl", "priority": 0},
    )
    builder.end(
        StepUnavailable,
        "allreduce/workspace/mnnvl",
        outcome=Outcome.UNAVAILABLE,
        reasons=(MNNVL_CAUSE.reason,),
        cause=MNNVL_CAUSE,
    )
    builder.start(
        "allreduce/workspace/trtllm",
        parent="allreduce/workspace",
        kind=StepKind.ATTEMPT,
        attributes={"backend": "trtllm", "priority": 1},
    )
    builder.end(StepSucceeded, "allreduce/workspace/trtllm", result={"backend": "trtllm"})
    builder.decision("allreduce.backend", "trtllm", step="allreduce/workspace")
    builder.end(StepSucceeded, "allreduce/workspace", result="trtllm")
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
