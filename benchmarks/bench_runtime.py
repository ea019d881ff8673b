"""Runtime benchmark: what the runner costs per step, and how well it overlaps probes.

Run from the repository root::

    .venv/bin/python benchmarks/bench_runtime.py [--steps 1000] [--repeat 9]

Everything is measured side by side in one process, so the ratios compare
like with like on whatever machine runs it. Each figure is timed ``--repeat``
times after a warm-up run; the best time is reported (noise only ever adds
time) with the median in parentheses, and the verdicts use the best.

(a) Per-step overhead. ``N`` independent no-op steps run through the runner
    (``MemoryLog``, no span activator, i.e. tracing off) against a bare Python
    loop calling the same functions; the overhead per step is the difference
    divided by ``N``. Async bodies and blocking bodies (which the runner hands
    to a worker thread) are measured separately. References printed next to
    it: one bare OpenTelemetry SDK span (``TracerProvider`` with a
    ``SimpleSpanProcessor`` and an exporter that drops every span, and with no
    span processor at all), and the concurrency primitive the runner is built
    on (one anyio task, or one ``anyio.to_thread.run_sync`` call, per
    function). Target: runner overhead per step at most one bare SDK span
    (the one with the ``SimpleSpanProcessor``).

(b) Concurrent probing. 32 candidates, each waiting 20 ms without holding the
    GIL (``time.sleep`` in a blocking probe, ``anyio.sleep`` in an async one),
    selected with ``select_candidate`` inside one graph step, against the
    critical path (20 ms) and a sequential loop doing the same waits; the same
    32 waits in a bare anyio task group are printed for reference. Targets: at
    most 1.15x the critical path, at least 15x faster than the sequential loop.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from importlib.metadata import version
from typing import Any

import anyio
import anyio.to_thread
import attrs
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from events import JsonValue, MemoryLog
from orchestrator import Candidate, Graph, Runner, Step, StepContext, select_candidate

BACKENDS = ("asyncio", "trio")
#: What the bare loops pass where the runner passes a StepContext (the no-op
#: bodies ignore it).
NO_CONTEXT: Any = None
CANDIDATES = 32
WAIT_S = 0.020


@attrs.frozen
class Timing:
    """Seconds (per item, or per run) of repeated measurements."""

    best: float
    median: float

    @classmethod
    def of(cls, samples: Sequence[float], per: int = 1) -> Timing:
        return cls(best=min(samples) / per, median=statistics.median(samples) / per)

    def __sub__(self, other: Timing) -> Timing:
        return Timing(best=self.best - other.best, median=self.median - other.median)


def timed(repeat: int, measure: Callable[[], float], per: int = 1) -> Timing:
    measure()  # warm-up: thread pools, caches, first-call imports
    return Timing.of([measure() for _ in range(repeat)], per)


async def atimed(repeat: int, measure: Callable[[], Awaitable[float]], per: int = 1) -> Timing:
    await measure()
    return Timing.of([await measure() for _ in range(repeat)], per)


# (a) per-step overhead --------------------------------------------------------------


async def noop_async(ctx: StepContext) -> JsonValue:
    return None


def noop_blocking(ctx: StepContext) -> JsonValue:
    return None


async def noop_in_thread() -> None:
    await anyio.to_thread.run_sync(noop_blocking, NO_CONTEXT)


def make_graph(body: Callable[[StepContext], Any], steps: int) -> Graph:
    return Graph("bench", [Step(name=f"step-{i}", body=body) for i in range(steps)])


async def time_runner(graph: Graph) -> float:
    runner = Runner(MemoryLog("bench", 0))
    start = time.perf_counter()
    await runner.run(graph)
    return time.perf_counter() - start


async def time_bare_async(steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        await noop_async(NO_CONTEXT)
    return time.perf_counter() - start


async def time_bare_blocking(steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        noop_blocking(NO_CONTEXT)
    return time.perf_counter() - start


async def time_bare_tasks(steps: int) -> float:
    start = time.perf_counter()
    async with anyio.create_task_group() as group:
        for _ in range(steps):
            group.start_soon(noop_async, NO_CONTEXT)
    return time.perf_counter() - start


async def time_bare_threads(steps: int) -> float:
    start = time.perf_counter()
    async with anyio.create_task_group() as group:
        for _ in range(steps):
            group.start_soon(noop_in_thread)
    return time.perf_counter() - start


async def per_step(steps: int, repeat: int) -> dict[str, Timing]:
    """Seconds per step of each variant."""
    async_graph = make_graph(noop_async, steps)
    blocking_graph = make_graph(noop_blocking, steps)
    return {
        "runner_async": await atimed(repeat, lambda: time_runner(async_graph), steps),
        "bare_async": await atimed(repeat, lambda: time_bare_async(steps), steps),
        "tasks": await atimed(repeat, lambda: time_bare_tasks(steps), steps),
        "runner_blocking": await atimed(repeat, lambda: time_runner(blocking_graph), steps),
        "bare_blocking": await atimed(repeat, lambda: time_bare_blocking(steps), steps),
        "threads": await atimed(repeat, lambda: time_bare_threads(steps), steps),
    }


class DropExporter(SpanExporter):
    """Accepts every span and does nothing with it."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def span_cost(provider: TracerProvider, spans: int, repeat: int) -> Timing:
    tracer = provider.get_tracer("bench")

    def measure() -> float:
        start = time.perf_counter()
        for _ in range(spans):
            with tracer.start_as_current_span("probe"):
                pass
        return time.perf_counter() - start

    return timed(repeat, measure, spans)


# (b) concurrent probing -------------------------------------------------------------


def wait_blocking(ctx: StepContext) -> list[str]:
    time.sleep(WAIT_S)
    return []


async def wait_async(ctx: StepContext) -> list[str]:
    await anyio.sleep(WAIT_S)
    return []


def probing_graph(probe: Callable[[StepContext], Any]) -> Graph:
    candidates = [Candidate(name=f"B{i}", priority=i, probe=probe) for i in range(CANDIDATES)]

    async def attention(ctx: StepContext) -> JsonValue:
        selection = await select_candidate(ctx, candidates)
        return selection.selected

    return Graph("bench-probing", [Step(name="attention", body=attention)])


async def probing(repeat: int) -> dict[str, Timing]:
    """Wall seconds of the concurrent runs, the bare task groups and the
    sequential loop."""
    figures: dict[str, Timing] = {}
    limiter = anyio.CapacityLimiter(CANDIDATES)
    for label, probe in (("blocking", wait_blocking), ("async", wait_async)):
        graph = probing_graph(probe)

        async def concurrent(graph: Graph = graph) -> float:
            # One worker thread per candidate, so no probe queues for a thread.
            runner = Runner(MemoryLog("bench", 0), max_threads=CANDIDATES)
            start = time.perf_counter()
            result = await runner.run(graph)
            elapsed = time.perf_counter() - start
            assert result["attention"].value == "B0"
            return elapsed

        async def bare(probe: Callable[[StepContext], Any] = probe) -> float:
            async def one() -> None:
                if probe is wait_async:
                    await wait_async(NO_CONTEXT)
                else:
                    await anyio.to_thread.run_sync(wait_blocking, NO_CONTEXT, limiter=limiter)

            start = time.perf_counter()
            async with anyio.create_task_group() as group:
                for _ in range(CANDIDATES):
                    group.start_soon(one)
            return time.perf_counter() - start

        figures[label] = await atimed(repeat, concurrent)
        figures[f"bare_{label}"] = await atimed(repeat, bare)

    def sequential() -> float:
        start = time.perf_counter()
        for _ in range(CANDIDATES):
            wait_blocking(NO_CONTEXT)
        return time.perf_counter() - start

    figures["sequential"] = timed(max(1, repeat // 3), sequential)
    return figures


# Report -----------------------------------------------------------------------------


def us(timing: Timing) -> str:
    return f"{timing.best * 1e6:6.1f} us ({timing.median * 1e6:6.1f})"


def ms(timing: Timing) -> str:
    return f"{timing.best * 1e3:6.1f} ms ({timing.median * 1e3:6.1f})"


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args(argv)

    print(
        f"python {platform.python_version()}, anyio {version('anyio')}, trio {version('trio')}, "
        f"opentelemetry-sdk {version('opentelemetry-sdk')}, {os.cpu_count()} CPUs; "
        f"best of {args.repeat} (median)"
    )
    simple = TracerProvider()
    simple.add_span_processor(SimpleSpanProcessor(DropExporter()))
    span = span_cost(simple, args.steps, args.repeat)
    span_bare = span_cost(TracerProvider(), args.steps, args.repeat)

    results_a: dict[str, dict[str, Timing]] = {}
    results_b: dict[str, dict[str, Timing]] = {}
    for backend in BACKENDS:
        results_a[backend] = anyio.run(per_step, args.steps, args.repeat, backend=backend)
        results_b[backend] = anyio.run(probing, args.repeat, backend=backend)

    print(f"\n(a) per-step overhead, {args.steps} independent no-op steps, tracing off, MemoryLog")
    print(f"  one bare SDK span, SimpleSpanProcessor + drop exporter {us(span)}")
    print(f"  one bare SDK span, no span processor                   {us(span_bare)}")
    for backend, r in results_a.items():
        print(f"  [{backend}]")
        for kind, primitive in (("async", "anyio task"), ("blocking", "to_thread.run_sync")):
            overhead = r[f"runner_{kind}"] - r[f"bare_{kind}"]
            ratio = overhead.best / span.best
            print(
                f"    {kind:8} runner {us(r[f'runner_{kind}'])}  bare loop {us(r[f'bare_{kind}'])}"
                f"  overhead {us(overhead)} = {ratio:4.2f} spans ({verdict(ratio <= 1)})"
            )
            print(f"             one bare {primitive} per function: {us(r[primitive_key(kind)])}")

    print(f"\n(b) {CANDIDATES} candidates each waiting {WAIT_S * 1e3:g} ms (the critical path)")
    for backend, r in results_b.items():
        sequential = r["sequential"]
        print(f"  [{backend}] sequential loop {ms(sequential)}")
        for kind in ("blocking", "async"):
            wall = r[kind]
            critical = wall.best / WAIT_S
            speedup = sequential.best / wall.best
            print(
                f"    {kind:8} probes {ms(wall)} = {critical:4.2f}x critical path "
                f"({verdict(critical <= 1.15)}), {speedup:4.1f}x faster than sequential "
                f"({verdict(speedup >= 15)})"
            )
            bare = r[f"bare_{kind}"]
            print(
                f"             bare task group, same waits: {ms(bare)} = "
                f"{bare.best / WAIT_S:4.2f}x critical path"
            )
    return 0


def primitive_key(kind: str) -> str:
    return "tasks" if kind == "async" else "threads"


if __name__ == "__main__":
    sys.exit(main())
