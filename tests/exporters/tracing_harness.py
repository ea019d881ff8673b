"""What the tracing tests share: the command line in a clean environment,
a run in this process with live spans, and spans as plain values.

:func:`run_traced` wires a rank as the command line does and runs what its
caller prepares; :func:`run_graph_traced` runs a graph of the test's own
through :class:`orchestrator.Runner` (the engine's tests run the engine
graph through :func:`run_traced`)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import attrs
from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from events import (
    Event,
    JsonlLog,
    RankIdentity,
    RunStarted,
    Slice,
    StepStarted,
    merge,
    read_log,
    step_severity_hook,
)
from exporters import LiveSpans, LoggingBridge, context_with_span, spans_from_events
from orchestrator import Graph, Runner

#: Upper bound for one in-process run: longer means hung.
DEADLINE_S = 30.0
#: Upper bound for one command-line invocation (eight ranks importing torch
#: on two busy cores included).
CLI_DEADLINE_S = 180.0

#: Variables a launcher or a developer's shell may set that would change
#: what a command-line run does; the tests set the ones they mean.
_INHERITED_PREFIXES = ("OTEL_",)
_INHERITED_NAMES = frozenset(
    {
        "TRACEPARENT",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCHELASTIC_RUN_ID",
        "STARTUP_ORCHESTRATOR_RUN_ID",
        "STARTUP_ORCHESTRATOR_LAUNCHED",
    }
)


def cli_environment(**variables: str) -> dict[str, str]:
    """This process's environment without tracing and launcher variables,
    plus ``variables``."""
    environment = {
        name: value
        for name, value in os.environ.items()
        if name not in _INHERITED_NAMES and not name.startswith(_INHERITED_PREFIXES)
    }
    environment.update(variables)
    return environment


def run_cli(
    *arguments: str, env: Mapping[str, str], cwd: Path, timeout: float = CLI_DEADLINE_S
) -> subprocess.CompletedProcess[str]:
    """``python -m orchestrator ARGUMENTS`` to completion, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *arguments],
        env=dict(env),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def closed_port() -> int:
    """A local TCP port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def run_events(run_dir: Path) -> list[Event]:
    """Every event of every rank log in ``run_dir``, merged as replay merges
    them."""
    return list(merge(read_log(path) for path in sorted(run_dir.glob("rank-*.jsonl"))))


def expected_span_ids(events: Iterable[Event]) -> set[str]:
    """The span ids the log promises: one per step and one root per rank."""
    return {event.span_id for event in events if isinstance(event, StepStarted | RunStarted)}


@contextlib.contextmanager
def activate_span(trace_id: str, span_id: str) -> Iterator[None]:
    """A span activator for :class:`orchestrator.Runner`: the step's span is
    the current OpenTelemetry span while its body runs."""
    token = otel_context.attach(context_with_span(trace_id, span_id))
    try:
        yield
    finally:
        otel_context.detach(token)


def span_fields(span: ReadableSpan) -> dict[str, Any]:
    """Everything a span carries, as plain values, by field name (so a
    difference names the field)."""
    parent = span.parent
    scope = span.instrumentation_scope
    return {
        "name": span.name,
        "trace_id": span.context.trace_id,
        "span_id": span.context.span_id,
        "is_remote": span.context.is_remote,
        "trace_flags": int(span.context.trace_flags),
        "parent": None if parent is None else (parent.trace_id, parent.span_id, parent.is_remote),
        "kind": span.kind,
        "start": span.start_time,
        "end": span.end_time,
        "attributes": dict(span.attributes or {}),
        "events": [
            (event.name, event.timestamp, dict(event.attributes or {})) for event in span.events
        ],
        "links": list(span.links),
        "status": (span.status.status_code, span.status.description),
        "resource": (dict(span.resource.attributes), span.resource.schema_url),
        "scope": None if scope is None else (scope.name, scope.version, scope.schema_url),
    }


def spans_by_id(spans: Sequence[ReadableSpan]) -> dict[str, dict[str, Any]]:
    """:func:`span_fields` of each span, by hex span id."""
    return {format(span.context.span_id, "016x"): span_fields(span) for span in spans}


@attrs.frozen(kw_only=True)
class LiveRun:
    """A run in this process: the spans exported live, the events read back
    from its stored log, the error it raised, if any, and the slices its
    messages were derived with."""

    live: list[ReadableSpan]
    events: list[Event]
    error: BaseException | None
    slices: tuple[Slice, ...] = ()

    def replayed(self) -> list[ReadableSpan]:
        """The spans rebuilt from the stored log, as replay export builds them."""
        return spans_from_events(
            self.events, severity_of=step_severity_hook(self.events, slices=self.slices)
        )


async def run_traced(
    directory: Path,
    prepare: Callable[[JsonlLog], tuple[Runner, Graph]],
    *,
    rank: int = 0,
    slices: Sequence[Slice] = (),
) -> LiveRun:
    """Run the graph ``prepare`` returns with its runner for ``rank``, wired
    as the command line wires a rank: a JSON Lines log (``prepare`` gets it)
    with the logging bridge on ``slices`` subscribed first and live spans
    (into memory) second. ``prepare`` turns the span activator on
    (:func:`activate_span`). What it or the run raises is
    :attr:`LiveRun.error`."""
    log = JsonlLog(directory / f"rank-{rank}.jsonl", run_id="tracing-run", rank=rank)
    bridge = LoggingBridge(slices=tuple(slices))
    captured = InMemorySpanExporter()
    live = LiveSpans(captured, severity_of=bridge.severity_of)
    log.subscribe(bridge)
    log.subscribe(live)
    error: BaseException | None = None
    try:
        with anyio.fail_after(DEADLINE_S):
            runner, graph = prepare(log)
            await runner.run(graph)
    except Exception as exc:
        error = exc
    finally:
        log.close()
    assert live.force_flush(timeout_s=10.0), "live spans were not exported"
    spans = list(captured.get_finished_spans())
    live.shutdown(timeout_s=5.0)
    return LiveRun(
        live=spans, events=list(read_log(log.path).events), error=error, slices=tuple(slices)
    )


async def run_graph_traced(
    directory: Path,
    graph: Graph,
    *,
    rank: int = 0,
    world_size: int = 1,
    slices: Sequence[Slice] = (),
    **runner_options: Any,
) -> LiveRun:
    """:func:`run_traced` of ``graph`` on a :class:`orchestrator.Runner` for
    ``rank`` of a world of ``world_size`` on one node, the span activator on;
    ``runner_options`` go to the runner."""
    identity = RankIdentity(
        rank=rank, local_rank=rank, world_size=world_size, local_world_size=world_size
    )

    def prepare(log: JsonlLog) -> tuple[Runner, Graph]:
        runner = Runner(log, identity=identity, span_activator=activate_span, **runner_options)
        return runner, graph

    return await run_traced(directory, prepare, rank=rank, slices=slices)


def live_span_marks(
    slices: Sequence[Slice], events: Iterable[Event]
) -> tuple[dict[tuple[int, str], Any], dict[tuple[int, str], Any]]:
    """Feed ``events`` (ranks merged) to a :class:`LoggingBridge` with
    ``slices`` and to live spans that take their severity from it, as a run
    does; the finished spans' status codes and ``startup.severity``
    attributes, by ``(rank, step)``."""
    from exporters import SpanProjection

    bridge = LoggingBridge(slices=tuple(slices))
    spans = SpanProjection(severity_of=bridge.severity_of)
    finished = []
    for event in events:
        bridge(event)
        finished.extend(spans.feed(event))
    keys = [(s.resource.attributes["startup.rank"], s.name) for s in finished]
    status = {key: s.status.status_code for key, s in zip(keys, finished, strict=True)}
    severity = {
        key: (s.attributes or {}).get("startup.severity")
        for key, s in zip(keys, finished, strict=True)
    }
    return status, severity


def assert_red_from_the_failing_step(run: LiveRun, path: Sequence[str], error: str) -> None:
    """A failed run's live spans: ERROR on each step of ``path`` (the failing
    step first, up to the rank's root span), the failing step's exception
    event ``error`` (``Type: message``), and every span cancelled because of
    it unset (it is not where the problem is)."""
    from opentelemetry.trace import StatusCode

    from events import RunFinished, RunOutcome

    finished = run.events[-1]
    assert isinstance(finished, RunFinished)
    assert finished.outcome is RunOutcome.FAILED
    spans = {span.name: span for span in run.live}
    for name in path:
        assert spans[name].status.status_code is StatusCode.ERROR, name
    [raised] = [e for e in spans[path[0]].events if e.name == "exception"]
    assert raised.attributes is not None
    kind, _, message = error.partition(": ")
    assert (raised.attributes["exception.type"], raised.attributes["exception.message"]) == (
        kind,
        message,
    )
    cancelled = [s for s in run.live if (s.attributes or {}).get("startup.outcome") == "cancelled"]
    assert all(span.status.status_code is StatusCode.UNSET for span in cancelled)
