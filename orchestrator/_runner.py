"""The runner: executes a graph in an anyio task group and records everything.

Every transition of every step becomes an event in the log: ``step.started``
then exactly one of succeeded / unavailable / failed / timed_out / cancelled /
crashed. A step starts as soon as its dependencies have finished; independent
steps run concurrently; blocking bodies run in worker threads under a
capacity limiter, each in a daemon thread of its own (a call that never
returns is abandoned, and never keeps the process alive); a watchdog records
where a step that runs past the stall threshold waits.

When an error propagates (the step's policy does not record it), the runner
records it with its full cause chain and flushes the log, cancels every other
running step (each recorded as cancelled), writes the run's final event, and
then raises the **original exception object** — never an ExceptionGroup.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, NoReturn
from urllib.parse import unquote

import anyio
import attrs

from events import (
    DecisionMade,
    Event,
    EventLog,
    ExceptionInfo,
    JsonValue,
    Outcome,
    RankIdentity,
    Redactor,
    RunFinished,
    RunOutcome,
    RunStarted,
    StallReason,
    StepCancelled,
    StepCrashed,
    StepFailed,
    StepKind,
    StepStalled,
    StepStarted,
    StepSucceeded,
    StepTimedOut,
    StepUnavailable,
    Stop,
    ThreadStack,
)
from events._launch import derive_trace_id

from ._context import StepBody, StepContext, StepResult, Unavailable, check_json
from ._decisions import DEFAULT_DECIDERS, Decider
from ._errors import DuplicateStepError, StartupInterrupted, StepCrashedError, StepTimeoutError
from ._faults import FaultPlan
from ._graph import Graph, Isolation, Step
from ._importer import Importer, InjectingImporter, RealImporter
from ._isolation import IsolatedCrash, IsolatedError, run_isolated
from ._policy import Action, ErrorPolicy
from ._threads import StepThreads
from ._watchdog import DEFAULT_STALL_S, InFlight, Watchdog

__all__ = ["RunResult", "Runner", "SpanActivator", "run"]

#: Makes ``(trace_id, span_id)`` the current span while a step body runs, so
#: spans user code creates nest under the step (see ``exporters``).
SpanActivator = Callable[[str, str], AbstractContextManager[object]]


def _new_span_id() -> str:
    while True:
        value = os.urandom(8).hex()
        if value != "0" * 16:
            return value


@attrs.frozen(kw_only=True)
class RunResult:
    """What a finished run produced.

    Attributes:
        run_id, rank: the stream.
        outcome: ``ready`` (the only outcome a returning run has).
        results: every top-level step's result, by name.
        trace_id: the run's trace id.
    """

    run_id: str
    rank: int
    outcome: RunOutcome
    results: Mapping[str, StepResult]
    trace_id: str

    def __getitem__(self, step: str) -> StepResult:
        return self.results[step]


class _Propagating(Exception):
    """Carries an already recorded, propagating exception up through task
    groups (so asyncio never sees a bare KeyboardInterrupt in a task)."""

    def __init__(self, original: BaseException, info: ExceptionInfo, step: str) -> None:
        super().__init__(step)
        self.original = original
        self.info = info
        self.step = step


def _find_propagating(exc: BaseException) -> _Propagating | None:
    if isinstance(exc, BaseExceptionGroup):
        return next(filter(None, map(_find_propagating, exc.exceptions)), None)
    return exc if isinstance(exc, _Propagating) else None


@functools.cache
def _versions() -> Mapping[str, str]:
    # Looking up distributions scans sys.path (milliseconds); they do not
    # change while the process runs.
    import importlib.metadata  # tens of milliseconds: imported when first asked

    versions = {"python": sys.version.split()[0]}
    for distribution in ("startup-orchestrator", "anyio", "torch"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[distribution] = importlib.metadata.version(distribution)
    return versions


#: The fields of the events whose values come from the caller or a step's
#: code (each always given when the event is appended).
_CALLERS_VALUES: Mapping[type[Event], tuple[str, ...]] = {
    RunStarted: ("config", "resource", "injected"),
    StepStarted: ("attributes",),
    StepSucceeded: ("result",),
    DecisionMade: ("value", "inputs"),
}


def _redacted(value: Any, redact: Redactor) -> Any:
    if not value:
        return value  # nothing to hide (most steps' attributes and results)
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {redact(key): _redacted(item, redact) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_redacted(item, redact) for item in value)
    return value


def _resource_attributes(environ: Mapping[str, str]) -> dict[str, str]:
    """The resource attributes OpenTelemetry would take from the environment
    (``OTEL_RESOURCE_ATTRIBUTES``, then ``OTEL_SERVICE_NAME``), recorded so
    replay does not depend on the replaying machine's environment."""
    attributes: dict[str, str] = {}
    for item in environ.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","):
        key, equals, value = item.partition("=")
        if equals and key.strip():
            attributes[key.strip()] = unquote(value.strip())
    service = environ.get("OTEL_SERVICE_NAME", "").strip()
    if service:
        attributes["service.name"] = service
    return attributes


class Runner:
    """Runs graphs for one rank and records them in a log.

    Args:
        log: where events go (its run id and rank are the run's).
        identity: the rank identity (default: rank ``log.rank`` of 1).
        importer: the importer probes use (default: importlib).
        faults: faults to inject through the importer and on step paths.
        config: the run configuration, recorded in ``run.started``.
        host: host facts handed to steps (``ctx.host``).
        services: named objects handed to steps (``ctx.services``).
        trace_id: the launch's trace id (default: derived from the run id).
        parent_span_id: the launcher's span (from ``TRACEPARENT``), if any.
        deciders: decision functions by name, for ``ctx.decide``.
        max_threads: worker threads for blocking bodies.
        span_activator: makes a step's span current while its body runs.
        redactor: hides secrets in captured exceptions (default: from the
            environment).
        clock: ``(wall_ns, mono_ns)`` source (tests may fix it).
        simulated: the simulated host the probes answer from (a profile
            name, or a file with its content hash), recorded in
            ``run.started`` so no report mistakes the run for a real one.
        stall_s: seconds a step may run before the rank records where it
            waits (``step.stalled``, with its threads' stacks; again at
            twice, four times... that while it stays); ``None`` for never.
        slices: the import paths (``MODULE:NAME``, as ``--slice`` takes
            them) of the slices that give the graph's steps meaning,
            recorded in ``run.started`` so that a replay names them.
    """

    def __init__(
        self,
        log: EventLog,
        *,
        identity: RankIdentity | None = None,
        importer: Importer | None = None,
        faults: FaultPlan | None = None,
        config: Mapping[str, JsonValue] | None = None,
        host: Any = None,
        services: Mapping[str, Any] | None = None,
        trace_id: str | None = None,
        parent_span_id: str | None = None,
        deciders: Mapping[str, Decider] | None = None,
        max_threads: int = 16,
        span_activator: SpanActivator | None = None,
        redactor: Redactor | None = None,
        clock: Callable[[], tuple[int, int]] | None = None,
        simulated: str | None = None,
        stall_s: float | None = DEFAULT_STALL_S,
        slices: Sequence[str] = (),
    ) -> None:
        self.log = log
        self.identity = identity or RankIdentity(rank=log.rank, world_size=log.rank + 1)
        if self.identity.rank != log.rank:
            raise ValueError(
                f"identity rank {self.identity.rank} does not match the log's rank {log.rank}"
            )
        self.faults = faults or FaultPlan()
        self.importer: Importer = importer or RealImporter()
        if self.faults:
            self.importer = InjectingImporter(self.importer, self.faults, self.identity.rank)
        self.config = dict(config or {})
        self.host = host
        self.services = dict(services or {})
        self.trace_id = trace_id or derive_trace_id(log.run_id)
        self.parent_span_id = parent_span_id
        self.deciders = {**DEFAULT_DECIDERS, **(deciders or {})}
        if max_threads < 1:
            raise ValueError(f"max_threads must be at least 1, not {max_threads}")
        self.max_threads = max_threads
        self.span_activator = span_activator
        self.redactor = redactor or Redactor.from_environment()
        self.clock = clock or (lambda: (time.time_ns(), time.monotonic_ns()))
        self.simulated = simulated
        if stall_s is not None and not (0 < stall_s < math.inf):
            raise ValueError(f"stall_s must be a positive number of seconds, not {stall_s!r}")
        self.stall_s = stall_s
        self.slices = tuple(slices)
        self._used = False
        self._began: tuple[Graph, str] | None = None
        self._stop_cause: ExceptionInfo | None = None
        self._stop: Stop | None = None

    def begin(self, graph: Graph) -> None:
        """Write ``run.started`` for ``graph`` now, before :meth:`run`.

        A rank that has slow set-up to do before its graph runs (importing
        tracing exporters, say) calls this first, so that whatever kills it
        during that set-up, its log already says who it was, what it was
        asked to run, on which host and with which injected faults.
        :meth:`run` calls it when it was not called.

        Raises:
            RuntimeError: it already began, with another graph.
        """
        if self._began is not None:
            if self._began[0] is not graph:
                raise RuntimeError("this Runner already began another graph")
            return
        root_span_id = _new_span_id()
        self._append(
            RunStarted,
            span_id=root_span_id,
            parent=self.parent_span_id,
            identity=self.identity,
            host=platform.node(),
            pid=os.getpid(),
            versions=dict(_versions()),
            config=self.config,
            graph=graph.name,
            resource=_resource_attributes(os.environ),
            simulated=self.simulated,
            injected=tuple(fault.describe() for fault in self.faults.faults),
            slices=self.slices,
        )
        self._began = (graph, root_span_id)

    def _append(
        self, cls: type[Event], *, step: str = "", span_id: str, parent: str | None, **payload: Any
    ) -> Event:
        """Append an event of ``cls``, its envelope stamped here (the one
        place that does): this rank's run, rank, clock, trace and the log's
        next ``seq``. Its values from the caller and the steps (``config``,
        ``attributes``, a ``result``, a decision's) are redacted here too:
        what leaves the process holds no secret, whoever passed it in."""
        for key in _CALLERS_VALUES.get(cls, ()):
            payload[key] = _redacted(payload[key], self.redactor)
        wall_ns, mono_ns = self.clock()
        event = cls(
            run_id=self.log.run_id,
            rank=self.identity.rank,
            # The log assigns seq; handing it the number it is about to assign
            # spares it a copy of every event (it still corrects a stale one).
            seq=self.log.next_seq,
            wall_ns=wall_ns,
            mono_ns=mono_ns,
            step=step,
            trace_id=self.trace_id,
            span_id=span_id,
            parent_span_id=parent,
            **payload,
        )
        self.log.append(event)
        return event

    def abandon(self, cause: BaseException) -> None:
        """End a run that began (:meth:`begin`) but whose graph never ran,
        because the caller's set-up failed or was stopped: ``run.finished``
        is ``interrupted`` for a stop (:class:`KeyboardInterrupt`, or after
        :meth:`stopping`), else ``failed``, with ``cause`` recorded.

        Raises:
            RuntimeError: the run never began, or its graph already ran.
        """
        if self._began is None or self._used:
            raise RuntimeError("abandon() ends a run that began and never ran its graph")
        self._used = True
        interrupted = isinstance(cause, KeyboardInterrupt) or self._stop_cause is not None
        outcome = RunOutcome.INTERRUPTED if interrupted else RunOutcome.FAILED
        info = self._stop_cause or ExceptionInfo.capture(cause, redactor=self.redactor)
        self._finish(outcome, info, None, self._stop)

    def _finish(
        self, outcome: RunOutcome, cause: ExceptionInfo | None, step: str | None, stop: Stop | None
    ) -> None:
        """Write ``run.finished`` (the one place that does) and flush the log."""
        assert self._began is not None
        self._append(
            RunFinished,
            span_id=self._began[1],
            parent=self.parent_span_id,
            outcome=outcome,
            cause=cause,
            failed_step=step,
            stop=stop,
        )
        self.log.flush()

    @property
    def ended(self) -> bool:
        """Whether the run ended without its graph (:meth:`abandon`) or its
        graph ran (or runs)."""
        return self._used

    @property
    def stop_requested(self) -> bool:
        """Whether :meth:`stopping` was called."""
        return self._stop_cause is not None

    def stopping(self, cause: StartupInterrupted) -> None:
        """Say why the run is about to be cancelled from outside (a signal,
        a launcher's stop): when the cancellation reaches the run, its
        ``run.finished`` is ``interrupted`` with ``cause`` and its ``stop``
        recorded, and the steps it cancels say so."""
        self._stop_cause = ExceptionInfo.capture(cause, redactor=self.redactor)
        reason = None if cause.reason is None else self.redactor(cause.reason)
        self._stop = Stop(signal=cause.signal, reason=reason)

    async def run(self, graph: Graph) -> RunResult:
        """Run ``graph`` to completion.

        Returns:
            The results, when the run reached ``ready``.

        Raises:
            BaseException: the original exception a step propagated (after
                its ``step.failed`` and the ``run.finished`` events were
                written and flushed). Cancellation from outside is recorded as
                ``interrupted`` and re-raised.
            RuntimeError: this runner already ran (a log holds one run: make a
                new Runner and log for the next one).
        """
        if self._used:
            raise RuntimeError(
                "this Runner already ran a graph; a log holds one run, so create a new "
                "Runner with a new log for the next run"
            )
        self._used = True
        self.begin(graph)
        assert self._began is not None
        return await _Run(self, graph, self._began[1]).execute()


async def run(graph: Graph, log: EventLog, **options: Any) -> RunResult:
    """Shorthand for ``await Runner(log, **options).run(graph)``."""
    return await Runner(log, **options).run(graph)


class _Run:
    """The state of one execution of one graph."""

    def __init__(self, runner: Runner, graph: Graph, root_span_id: str) -> None:
        self.runner = runner
        self.emit = runner._append
        self.finish = runner._finish
        self.graph = graph
        self.log = runner.log
        self.run_id = runner.log.run_id
        self.identity = runner.identity
        self.importer = runner.importer
        self.config: Mapping[str, JsonValue] = runner.config
        self.host = runner.host
        self.services: Mapping[str, Any] = runner.services
        self.trace_id = runner.trace_id
        self.redactor = runner.redactor
        self.span_activator = runner.span_activator
        self.capture = functools.partial(ExceptionInfo.capture, redactor=runner.redactor)
        self.threads = StepThreads(anyio.CapacityLimiter(runner.max_threads))
        self.watchdog = Watchdog(self.threads, runner.stall_s, self.record_stall, runner.redactor)
        self.in_child = self.watchdog.in_child
        self.root_span_id = root_span_id
        self.results: dict[str, StepResult] = {}
        self.children: dict[str, list[StepResult]] = {}
        #: every step path started so far: a path names one step of the run
        self.paths: set[str] = set()
        self.done = {name: anyio.Event() for name in graph.steps}
        #: the step whose failure is cancelling the others, and why, while one is
        self.cancelling: tuple[str, str] | None = None
        #: The exceptions steps failed with, by id, and the step each failure
        #: started at: a body that raises one again (a parent that caught
        #: its child's error and lets it go on) continues that failure.
        self.origins: dict[int, tuple[BaseException, str]] = {}
        #: isolated step -> its child's stacks, when it was given up
        self.child_stacks: dict[str, tuple[ThreadStack, ...]] = {}

    # Events ----------------------------------------------------------------------------

    def record_stall(
        self, flight: InFlight, why: StallReason, elapsed_ns: int, threads: tuple[ThreadStack, ...]
    ) -> None:
        """Where a step in flight waits (the watchdog's, or a step's end)."""
        self.emit(
            StepStalled,
            step=flight.step,
            span_id=flight.span_id,
            parent=flight.parent,
            elapsed_ns=elapsed_ns,
            why=why,
            threads=threads,
        )

    def left_behind(self, step: str, why: StallReason) -> None:
        """A step that ends while its worker thread or child process still
        runs (it timed out, or was cancelled): where they are, abandoned."""
        flight = self.watchdog.ended(step)
        child = self.child_stacks.pop(step, ())
        if flight is not None and (threads := self.threads.stacks(step, self.redactor) + child):
            self.record_stall(flight, why, time.monotonic_ns() - flight.started_ns, threads)

    def stop_reason(self) -> str:
        cause = self.runner._stop_cause
        if cause is None:
            return "the run was cancelled"
        return f"the run was interrupted: {cause.message or cause.name}"

    # The run ---------------------------------------------------------------------------

    async def execute(self) -> RunResult:
        self.watchdog.start()
        failure: _Propagating | None = None
        try:
            try:
                async with anyio.create_task_group() as group:
                    for name in self.graph.order:
                        group.start_soon(self.run_graph_step, self.graph[name])
            except BaseExceptionGroup as group_error:
                failure = _find_propagating(group_error)
                if failure is None:
                    raise
            finally:
                self.watchdog.stop()
        except anyio.get_cancelled_exc_class():
            self.finish(RunOutcome.INTERRUPTED, self.runner._stop_cause, None, self.runner._stop)
            raise
        except BaseException as unexpected:
            # A bug of ours or a subscriber's; still leave a complete log.
            self.finish(RunOutcome.FAILED, self.capture(unexpected), None, None)
            raise
        if failure is not None:
            # A KeyboardInterrupt is someone asking to stop; any other error,
            # SystemExit from a probe included, failed the startup (SPEC §2).
            interrupted = isinstance(failure.original, KeyboardInterrupt)
            outcome = RunOutcome.INTERRUPTED if interrupted else RunOutcome.FAILED
            self.finish(outcome, failure.info, failure.step, None)
            # Raised outside the except block, so its __context__ stays what it was.
            raise failure.original
        self.finish(RunOutcome.READY, None, None, None)
        return RunResult(
            run_id=self.run_id,
            rank=self.identity.rank,
            outcome=RunOutcome.READY,
            results=dict(self.results),
            trace_id=self.trace_id,
        )

    async def run_graph_step(self, step: Step) -> None:
        for dependency in step.depends_on:
            await self.done[dependency].wait()
        # Only a step that produced a result releases its dependants. One that
        # propagated or was cancelled leaves them waiting: the run is being
        # cancelled, and a woken dependant would find no result to read.
        self.results[step.name] = await self.run_step(
            name=step.name,
            body=step.body,
            policy=step.policy,
            timeout=step.timeout,
            kind=StepKind.STEP,
            attributes=step.attributes,
            parent_span=self.root_span_id,
            isolation=step.isolation,
            depends_on=step.depends_on,
        )
        self.done[step.name].set()

    async def run_child(
        self,
        *,
        parent: StepContext,
        name: str,
        body: StepBody,
        kind: StepKind,
        policy: ErrorPolicy | None,
        timeout: float | None,
        attributes: Mapping[str, JsonValue],
    ) -> StepResult:
        path = f"{parent.step}/{name}"
        if path in self.paths:
            raise DuplicateStepError(path, child=True)
        result = await self.run_step(
            name=path,
            body=body,
            policy=policy or self.graph_policy(parent.step),
            timeout=timeout,
            kind=kind,
            attributes=attributes,
            parent_span=parent.span_id,
        )
        self.children.setdefault(parent.step, []).append(result)
        return result

    def graph_policy(self, step: str) -> ErrorPolicy:
        """The policy of ``step``'s graph ancestor (a child's always has one)."""
        while step not in self.graph.steps:
            step = step.rpartition("/")[0]
        return self.graph[step].policy

    def left_in_child(self, step: str, stacks: tuple[ThreadStack, ...]) -> None:
        self.child_stacks[step] = stacks

    def children_of(self, step: str) -> Sequence[StepResult]:
        return tuple(self.children.get(step, ()))

    # One step --------------------------------------------------------------------------

    async def run_step(
        self,
        *,
        name: str,
        body: StepBody,
        policy: ErrorPolicy,
        timeout: float | None,
        kind: StepKind,
        attributes: Mapping[str, JsonValue],
        parent_span: str,
        isolation: Isolation = Isolation.NONE,
        depends_on: tuple[str, ...] = (),
    ) -> StepResult:
        span_id = _new_span_id()
        self.paths.add(name)
        record = functools.partial(self.emit, step=name, span_id=span_id, parent=parent_span)
        record(StepStarted, kind=kind, depends_on=depends_on, attributes=dict(attributes))
        dependencies = {d: self.results[d] for d in depends_on}
        context = StepContext(self, step=name, span_id=span_id, dependencies=dependencies)
        started_ns = time.monotonic_ns()
        self.watchdog.started(name, span_id, parent_span, getattr(body, "__code__", None))
        value: Any = None
        activator = self.span_activator
        try:
            with nullcontext() if activator is None else activator(self.trace_id, span_id):
                with anyio.move_on_after(timeout) as scope:  # None: no deadline
                    value = await self.call(body, context, isolation)
        except anyio.get_cancelled_exc_class():
            self.left_behind(name, StallReason.ABANDONED)
            reason = self.stop_reason() if self.cancelling is None else self.cancelling[1]
            record(StepCancelled, reason=reason)
            raise
        except BaseException as exc:
            self.watchdog.ended(name)
            return self.handle_error(exc, name=name, policy=policy, record=record)
        self.stopped_below(name)
        if scope.cancelled_caught:
            assert timeout is not None
            self.left_behind(name, StallReason.TIMED_OUT)
            record(StepTimedOut, timeout_s=timeout, elapsed_ns=time.monotonic_ns() - started_ns)
            if policy.on_timeout is Action.PROPAGATE:
                error = StepTimeoutError(name, timeout)
                self.propagate(name, error, self.capture(error), name, error)
            return StepResult(
                step=name, outcome=Outcome.TIMED_OUT, reasons=(f"timed out after {timeout:g} s",)
            )
        self.watchdog.ended(name)
        if isinstance(value, IsolatedCrash):
            # What the child printed may hold a secret, as an exception may.
            tail = tuple(map(self.redactor, value.stderr_tail))
            record(StepCrashed, exit_code=value.exit_code, signal=value.signal, stderr_tail=tail)
            if policy.on_crash is Action.PROPAGATE:
                crash = StepCrashedError(name, value.exit_code, value.signal, tail)
                self.propagate(name, crash, self.capture(crash), name, crash)
            return StepResult(step=name, outcome=Outcome.CRASHED, reasons=(value.describe(),))
        if isinstance(value, Unavailable):
            record(StepUnavailable, outcome=value.outcome, reasons=value.reasons)
            return StepResult(step=name, outcome=value.outcome, reasons=value.reasons)
        try:
            check_json(name, value)
        except TypeError as bad:
            return self.handle_error(bad, name=name, policy=policy, record=record)
        record(StepSucceeded, result=value)
        return StepResult(step=name, outcome=Outcome.OK, value=value)

    def handle_error(
        self, exc: BaseException, *, name: str, policy: ErrorPolicy, record: Callable[..., Event]
    ) -> StepResult:
        carried = _find_propagating(exc)
        if carried is not None:
            # A child already recorded the error. This step's own policy says
            # whether it stops here (a platform plugin whose zentorch import
            # failed is a failed plugin, not a failed run) or goes on up.
            verdict = policy.classify(carried.original)
            info, original = carried.info, carried.original
            if not verdict.record:
                record(StepFailed, cause=info, origin=carried.step)
                raise _Propagating(original, info, carried.step)
        elif isinstance(exc, IsolatedError):
            verdict = policy.classify_names(exc.mro, module_name=exc.module_name)
            info, original = exc.info, exc.rebuild(name)
        else:
            verdict = policy.classify(exc)
            info, original = self.capture(exc), exc
        self.stopped_below(name)
        if verdict.record:
            record(StepUnavailable, outcome=verdict.outcome, reasons=(info.reason,), cause=info)
            return StepResult(
                step=name,
                outcome=verdict.outcome,
                reasons=(info.reason,),
                exception=info,
                error=original,
            )
        # By what the body raised (an isolated error is rebuilt per step).
        known = self.origins.get(id(exc))
        origin = known[1] if known is not None and known[0] is exc else name
        record(StepFailed, cause=info, origin=origin)
        self.propagate(name, exc, info, origin, original)

    def stopped_below(self, step: str) -> None:
        """``step`` ended without passing on a failure of a step below it
        (its policy recorded it, its body caught it): that failure cancels
        nothing from now on."""
        if self.cancelling is not None and self.cancelling[0].startswith(f"{step}/"):
            self.cancelling = None

    def propagate(
        self, name: str, exc: BaseException, info: ExceptionInfo, origin: str, raised: BaseException
    ) -> NoReturn:
        """Step ``name`` fails the run: ``exc``, whose failure started at step
        ``origin``, goes on up as ``raised``, and the other steps are cancelled."""
        self.origins[id(exc)] = (exc, origin)
        if self.cancelling is None:
            self.cancelling = (name, f"cancelled because step {name!r} failed: {info.reason}")
        self.log.flush()
        raise _Propagating(raised, info, origin)

    async def call(self, body: StepBody, context: StepContext, isolation: Isolation) -> Any:
        if isolation is Isolation.PROCESS:
            return await run_isolated(self, body, context)
        if (fault := self.runner.faults.for_target(context.step, self.identity.rank)) is not None:
            return await self.threads.run(context.step, fault.fire)
        if inspect.iscoroutinefunction(body):
            return await body(context)
        return await self.threads.run(context.step, body, context)

    # Decisions -------------------------------------------------------------------------

    def decide(self, context: StepContext, name: str, inputs: dict[str, JsonValue]) -> JsonValue:
        try:
            decider = self.runner.deciders[name]
        except KeyError:
            known = ", ".join(sorted(self.runner.deciders)) or "(none)"
            raise KeyError(f"no decider named {name!r}; registered: {known}") from None
        value = decider(tuple(self.log.read()), inputs)
        self.record_decision(context, name, value, inputs)
        return value

    def record_decision(
        self, context: StepContext, name: str, value: JsonValue, inputs: dict[str, JsonValue]
    ) -> None:
        self.emit(
            DecisionMade,
            step=context.step,
            span_id=context.span_id,
            parent=None,
            name=name,
            value=value,
            inputs=inputs,
        )
