"""Tracing benchmark: what tracing adds to each step, against one bare SDK span.

Run from the repository root::

    .venv/bin/python benchmarks/bench_tracing.py [--steps 1000] [--repeat 15]

``N`` independent no-op async steps run through the runner (``MemoryLog``)
with tracing off and with tracing on, side by side in one process; the cost
of tracing per step is the difference divided by ``N``. Tracing on is what a
traced rank does: a :class:`exporters.LiveSpans` subscribed to the log (its
``BatchSpanProcessor`` hands the spans to an exporter that drops them, on
its own thread) and a span activator that makes each step's span the
current OpenTelemetry context while the step runs. Two wirings:

- *plain*: ``LiveSpans`` with the default severity (outcome alone);
- *with the bridge*: the command line's wiring, a ``LoggingBridge``
  subscribed first and ``LiveSpans`` asking it for each span's severity.
  The bridge is subscribed in the tracing-off run too (it prints the
  messages whether or not spans are exported), so only tracing is counted.

The reference is one bare OpenTelemetry SDK span (``start_as_current_span``
on a ``TracerProvider`` whose ``BatchSpanProcessor`` hands spans to the same
dropping exporter). Target: tracing adds at most 1.5 bare SDK spans per
traced step. What tracing adds is printed twice: the best traced run less
the best untraced one, and (in parentheses) the median of the differences
within each round; the ratios divide them by the best and by the median
bare span. The verdict uses the medians, which a shared machine disturbs
less than the difference of two best times. A breakdown of the tracing
path follows: projecting a step's two events into a span, enqueueing it,
and entering the activator, each timed alone.

Times are the CPU time of the whole process (every thread: the batch
processor's export thread is part of what tracing costs; other programs on
the machine are not). Each figure is timed ``--repeat`` times after a
warm-up run (the variants take turns within each round); the best time is
reported with the median in parentheses.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from importlib.metadata import version
from typing import Any

import anyio
import attrs
from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from events import JsonValue, MemoryLog, RankIdentity, RunStarted, StepStarted, StepSucceeded
from events._launch import derive_trace_id
from exporters import LiveSpans, LoggingBridge, SpanProjection, context_with_span
from orchestrator import Graph, Runner, Step, StepContext

BACKENDS = ("asyncio", "trio")
#: CPU time of the whole process, every thread included.
clock = time.process_time
TARGET_SPANS = 1.5


@attrs.frozen
class Timing:
    """Seconds (per item) of repeated measurements."""

    best: float
    median: float

    @classmethod
    def of(cls, samples: Sequence[float], per: int = 1) -> Timing:
        return cls(best=min(samples) / per, median=statistics.median(samples) / per)


def timed(repeat: int, measure: Callable[[], float], per: int = 1) -> Timing:
    measure()  # warm-up: thread pools, caches, first-call imports
    return Timing.of([measure() for _ in range(repeat)], per)


class DropExporter(SpanExporter):
    """Accepts every span and does nothing with it."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


@contextlib.contextmanager
def activate_span(trace_id: str, span_id: str) -> Iterator[None]:
    """The span activator a traced rank uses (as the command line wires it)."""
    token = otel_context.attach(context_with_span(trace_id, span_id))
    try:
        yield
    finally:
        otel_context.detach(token)


async def noop(ctx: StepContext) -> JsonValue:
    return None


def make_graph(steps: int) -> Graph:
    return Graph("bench", [Step(name=f"step-{i}", body=noop) for i in range(steps)])


# Runner, tracing off and on -----------------------------------------------------------


async def time_runner(graph: Graph, *, traced: bool, bridge: bool) -> float:
    log = MemoryLog("bench", 0)
    live: LiveSpans | None = None
    severity_of = None
    if bridge:
        logging_bridge = LoggingBridge()
        log.subscribe(logging_bridge)
        severity_of = logging_bridge.severity_of
    if traced:
        live = LiveSpans(DropExporter(), severity_of=severity_of)
        log.subscribe(live)
    runner = Runner(log, span_activator=activate_span if traced else None)
    start = clock()
    await runner.run(graph)
    elapsed = clock() - start
    if live is not None:
        live.shutdown(timeout_s=30.0)
    return elapsed


VARIANTS = {
    "plain_off": {"traced": False, "bridge": False},
    "plain_on": {"traced": True, "bridge": False},
    "bridge_off": {"traced": False, "bridge": True},
    "bridge_on": {"traced": True, "bridge": True},
}


async def per_step(steps: int, repeat: int) -> dict[str, Timing]:
    """Seconds per step of each variant, and what tracing adds for each
    wiring (``plain_added``, ``bridge_added``). The variants take turns
    within each round, so a busy moment of the machine falls on all of them
    alike; what tracing adds is the best traced run less the best untraced
    one, with the median of the per-round differences."""
    graph = make_graph(steps)
    samples: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for round_ in range(repeat + 1):
        for name, options in VARIANTS.items():
            elapsed = await time_runner(graph, **options)
            if round_:  # the first round is the warm-up
                samples[name].append(elapsed)
    figures = {name: Timing.of(values, steps) for name, values in samples.items()}
    for wiring in ("plain", "bridge"):
        on, off = samples[f"{wiring}_on"], samples[f"{wiring}_off"]
        figures[f"{wiring}_added"] = Timing(
            best=(min(on) - min(off)) / steps,
            median=statistics.median(a - b for a, b in zip(on, off, strict=True)) / steps,
        )
    return figures


# References and breakdown -------------------------------------------------------------


def bare_span_cost(spans: int, repeat: int) -> Timing:
    """One ``start_as_current_span`` on a provider with a batch processor."""
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(DropExporter()))
    tracer = provider.get_tracer("bench")

    def measure() -> float:
        start = clock()
        for _ in range(spans):
            with tracer.start_as_current_span("probe"):
                pass
        elapsed = clock() - start
        provider.force_flush()
        return elapsed

    try:
        return timed(repeat, measure, spans)
    finally:
        provider.shutdown()


def step_events(steps: int) -> list[Any]:
    """A rank's ``run.started`` and, per step, ``step.started`` and
    ``step.succeeded``, as the runner records them."""
    trace_id = derive_trace_id("bench")
    root = "0000000000000001"
    envelope: dict[str, Any] = {"run_id": "bench", "rank": 0, "trace_id": trace_id}
    events: list[Any] = [
        RunStarted(
            **envelope,
            seq=0,
            wall_ns=1,
            mono_ns=1,
            span_id=root,
            identity=RankIdentity(rank=0, world_size=1),
            host="bench",
            pid=os.getpid(),
        )
    ]
    for i in range(steps):
        span_id = f"{i + 2:016x}"
        common: dict[str, Any] = {
            **envelope,
            "step": f"step-{i}",
            "span_id": span_id,
            "parent_span_id": root,
        }
        seq = len(events)
        events.append(StepStarted(**common, seq=seq, wall_ns=seq, mono_ns=seq))
        events.append(StepSucceeded(**common, seq=seq + 1, wall_ns=seq + 1, mono_ns=seq + 1))
    return events


def breakdown(steps: int, repeat: int) -> dict[str, Timing]:
    """Per step: projecting its two events into a span, enqueueing the span,
    entering and leaving the activator."""
    events = step_events(steps)
    figures: dict[str, Timing] = {}

    def project() -> float:
        projection = SpanProjection()
        projection.feed(events[0])
        start = clock()
        for event in events[1:]:
            projection.feed(event)
        return clock() - start

    figures["project"] = timed(repeat, project, steps)

    projection = SpanProjection()
    spans = [span for event in events for span in projection.feed(event)]
    processor = BatchSpanProcessor(DropExporter())

    def enqueue() -> float:
        start = clock()
        for span in spans[:steps]:
            processor.on_end(span)
        elapsed = clock() - start
        processor.force_flush()
        return elapsed

    figures["enqueue"] = timed(repeat, enqueue, steps)
    processor.shutdown()

    trace_id = derive_trace_id("bench")
    span_ids = [f"{i + 2:016x}" for i in range(steps)]

    def activate() -> float:
        start = clock()
        for span_id in span_ids:
            with activate_span(trace_id, span_id):
                pass
        return clock() - start

    figures["activate"] = timed(repeat, activate, steps)
    return figures


# Report -------------------------------------------------------------------------------


def us(timing: Timing) -> str:
    return f"{timing.best * 1e6:6.1f} us ({timing.median * 1e6:6.1f})"


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args(argv)

    print(
        f"python {platform.python_version()}, anyio {version('anyio')}, trio {version('trio')}, "
        f"opentelemetry-sdk {version('opentelemetry-sdk')}, {os.cpu_count()} CPUs; "
        f"best of {args.repeat} (median)"
    )
    span = bare_span_cost(args.steps, args.repeat)
    results = {
        backend: anyio.run(per_step, args.steps, args.repeat, backend=backend)
        for backend in BACKENDS
    }
    parts = breakdown(args.steps, args.repeat)

    print(f"\nper traced step, {args.steps} independent no-op async steps, MemoryLog")
    print(f"  one bare SDK span, BatchSpanProcessor + drop exporter  {us(span)}")
    for backend, r in results.items():
        print(f"  [{backend}]")
        for wiring, label in (("plain", "plain      "), ("bridge", "with bridge")):
            off, on, added = r[f"{wiring}_off"], r[f"{wiring}_on"], r[f"{wiring}_added"]
            best, median = added.best / span.best, added.median / span.median
            print(
                f"    {label}  off {us(off)}  on {us(on)}  tracing adds {us(added)}"
                f" = {best:4.2f} ({median:4.2f}) spans ({verdict(median <= TARGET_SPANS)})"
            )
    print("\nwhere tracing's time goes, per step")
    print(f"  SpanProjection.feed of step.started + terminal event  {us(parts['project'])}")
    print(f"  BatchSpanProcessor.on_end (enqueue the span)          {us(parts['enqueue'])}")
    print(f"  span activator: attach + detach the step's context    {us(parts['activate'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
