"""Recording the startup of a process whose control flow is someone else's.

A real engine drives its own start: its code calls its phases one after
another, in its own threads, and spawns its own processes. A
:class:`Recording` turns that into a run of this package's task graph, so it
is recorded as any run is — events, exception chains, spans, replay — by the
same :class:`~orchestrator.Runner`: the graph's bodies only wait for what
the engine's threads announce.

* :meth:`Recording.phase` (a context manager, from the engine's threads)
  brackets one phase of the engine's start: a step ``startup/<name>``
  (nested phases nest) that begins when the block is entered and ends with
  the block: ``ok``, or ``failed`` with the exception the engine's code
  raised, which then goes on as it would have. The exception is captured
  where it was raised and handed over as data (as an isolated step's is),
  so the engine's own exception object is never raised again elsewhere.
* :meth:`Recording.spawned` announces a child process: a step
  ``processes/<name>`` (attribute ``pid``) that ends ``crashed``, with the
  exit status or signal, if the process ends before this process's start
  does, and ``ok`` otherwise.
* :meth:`Recording.finish` ends the start: ``ready``, or failed with the
  exception that ended it. A process that exits while its start is still
  open is recorded failed at exit (:data:`ExitedBeforeReady`); one that is
  killed leaves its log without an end, and its parent names it.
* A stop signal (SIGINT, SIGTERM, SIGHUP) that reaches the process while
  its start is open is remembered, and the engine's own handler still
  runs (:class:`~orchestrator._signals.StopRequests`, chained): the error
  with which the engine's code then stops (vLLM's handlers raise
  ``SystemExit``; Python's raises ``KeyboardInterrupt``) ends the start
  ``interrupted`` by that signal, as a stopped run of this package's own
  ends, not ``failed``.

The graph runs on an event loop of its own, in a daemon thread, so the
engine's threads never wait for it longer than it takes to hand a message
over; a recording started in a process that then forks does nothing in the
child (its thread is not there).
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing.connection
import os
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any, cast

import anyio
import anyio.from_thread
import attrs
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from events import EventLog, JsonValue, RankIdentity

from .._context import StepBody, StepContext
from .._graph import Graph, Step
from .._isolation import IsolatedCrash, IsolatedError
from .._policy import ErrorPolicy
from .._runner import Runner
from .._signals import StopRequests

__all__ = ["PROCESSES_STEP", "STARTUP_STEP", "ExitedBeforeReady", "Recording"]

#: The step whose children are the engine's phases.
STARTUP_STEP = "startup"
#: The step whose children are the processes this one spawned.
PROCESSES_STEP = "processes"

#: A phase's error is the engine's: it propagates, as in the engine.
_PHASE_POLICY = ErrorPolicy(name="phase")
#: The most the engine's thread waits for a phase's start to be recorded.
_PHASE_START_WAIT_S = 2.0
#: A child process that dies is recorded; what the engine makes of it is
#: the phases' business.
_PROCESS_POLICY = ErrorPolicy(name="process")


class ExitedBeforeReady(RuntimeError):
    """The process exited while its start was still open (its own code
    caught the error that ended it, or it was told to stop).

    Attributes:
        role: the process's role (``engine core``).
        phase: the phase it was in, if any.
    """

    __module__ = "orchestrator.recording"

    def __init__(self, role: str, phase: str | None) -> None:
        self.role = role
        self.phase = phase
        where = f" during {phase}" if phase else ""
        super().__init__(f"the {role} process exited before it was ready{where}")


@attrs.frozen
class _Begin:
    name: str
    attributes: Mapping[str, JsonValue]
    inbox: MemoryObjectReceiveStream[Any]
    #: the engine's thread that entered the phase, which does its work
    thread: threading.Thread = attrs.field(factory=threading.current_thread)
    #: set once the phase's step.started is in the log
    started: threading.Event = attrs.field(factory=threading.Event)


@attrs.frozen
class _End:
    error: IsolatedError | None = None


class Recording:
    """One process's recorded start (see the module docstring).

    Args:
        log: this process's log (its run id and rank are the run's).
        identity: this process's place in the launch.
        role: what the process is (``main``, ``engine core DP0``...), for
            messages.
        steps: further graph steps that run beside the phases (the
            platform detection), by name.
        spawns: whether the process starts processes of its own (the
            ``processes`` step watches them).
        runner_options: passed on to :class:`~orchestrator.Runner`.
    """

    def __init__(
        self,
        log: EventLog,
        *,
        identity: RankIdentity,
        role: str,
        steps: tuple[Step, ...] = (),
        spawns: bool = True,
        **runner_options: Any,
    ) -> None:
        self.role = role
        self.pid = os.getpid()
        self._spawns = spawns
        from ..engine._conventions import ENGINE_SLICE

        runner_options.setdefault("slices", (ENGINE_SLICE,))
        self._runner = Runner(log, identity=identity, **runner_options)
        startup = Step(name=STARTUP_STEP, body=self._startup, policy=_PHASE_POLICY)
        watching = Step(name=PROCESSES_STEP, body=self._processes, policy=_PROCESS_POLICY)
        self._graph = Graph(f"vllm {role}", [*steps, startup, *([watching] if spawns else [])])
        self._lock = threading.Lock()
        #: the engine's thread that makes the recording, at work between phases
        self._starter = threading.current_thread()
        self._open: list[tuple[str, MemoryObjectSendStream[Any]]] = []
        self._children: MemoryObjectSendStream[Any] | None = None
        # Set when the start ends; an event of the loop, made by start().
        self._started_up: anyio.Event
        self._portal: anyio.from_thread.BlockingPortal | None = None
        self._loop_thread = contextlib.ExitStack()
        self._done: Any = None
        self._captured: dict[int, tuple[BaseException, IsolatedError]] = {}
        self.finished = False
        #: the stop signals received (watched from start(), in the main thread)
        self._stops = StopRequests()
        # The run's scope, which a stop cancels; made by start().
        self._scope: anyio.CancelScope

    # --- lifecycle -----------------------------------------------------------

    def start(self) -> None:
        """Write ``run.started`` and start the graph on its own loop."""
        self._runner.begin(self._graph)
        self._portal = self._loop_thread.enter_context(anyio.from_thread.start_blocking_portal())
        startup, inbox = anyio.create_memory_object_stream[Any](math.inf)
        self._open = [(STARTUP_STEP, startup)]
        self._startup_begun = _Begin(STARTUP_STEP, {}, inbox, thread=self._starter)
        if self._spawns:
            self._children, self._children_inbox = anyio.create_memory_object_stream[Any](math.inf)
        self._started_up = self._portal.call(anyio.Event)
        self._scope = self._portal.call(anyio.CancelScope)
        self._done = self._portal.start_task_soon(self._run)
        self._stops.install(chain=True)

    async def _run(self) -> None:
        with contextlib.suppress(BaseException), self._scope:
            await self._runner.run(self._graph)

    def _live_portal(self) -> anyio.from_thread.BlockingPortal | None:
        # Nothing after the end, and nothing in a forked child, whose loop
        # thread was left behind in its parent.
        return None if self.finished or os.getpid() != self.pid else self._portal

    def finish(self, error: BaseException | None = None) -> None:
        """End the start: ``ready``, or failed with ``error``; then wait for
        the run's last event to be written. Later calls do nothing."""
        with self._lock:
            portal = self._live_portal()
            if portal is None:
                return
            self.finished = True
            stopped = error is not None and self._stops.requested
            if stopped:
                # The engine's code stopped as a signal asked: the run is
                # interrupted by it, its steps in flight cancelled.
                self._runner.stopping(self._stops.cause())
                portal.call(self._scope.cancel)
            # Phases still open end with the start (outermost last).
            self._end_open(portal, None if stopped else self._end(error))
            if self._children is not None:
                portal.call(self._children.close)
        with contextlib.suppress(BaseException):
            self._done.result(timeout=30)
        self.close()

    def close(self) -> None:
        """Stop the loop thread (the run's end is in the log by then), and
        stop watching the stop signals."""
        if os.getpid() == self.pid:
            self._stops.restore()
            with contextlib.suppress(BaseException):
                self._loop_thread.close()

    def at_exit(self) -> None:
        """At interpreter exit: a start still open failed, in the phase it
        was in."""
        phase = self._open[-1][0] if len(self._open) > 1 else None
        self.finish(ExitedBeforeReady(self.role, phase))

    # --- what the engine's threads announce ------------------------------------

    @property
    def depth(self) -> int:
        """How many phases are open."""
        return max(0, len(self._open) - 1)

    @contextlib.contextmanager
    def phase(self, name: str, attributes: Mapping[str, JsonValue] | None = None) -> Iterator[None]:
        """Bracket one phase of the start (``startup/.../<name>``). The
        block's exception is recorded and re-raised unchanged."""
        token = self.begin_phase(name, attributes)
        try:
            yield
        except BaseException as error:
            self.end_phase(token, error)
            raise
        self.end_phase(token)

    def begin_phase(self, name: str, attributes: Mapping[str, JsonValue] | None = None) -> Any:
        """Open a phase (as :meth:`phase` does on entering its block); the
        token is for :meth:`end_phase`."""
        with self._lock:
            portal = self._live_portal()
            if portal is None:
                return None
            send, receive = anyio.create_memory_object_stream[Any](math.inf)
            begin = _Begin(name, dict(attributes or {}), receive)
            portal.call(self._open[-1][1].send_nowait, begin)
            self._open.append((name, send))
        # The phase's start is in the log before the engine's code goes on:
        # a process killed in the very next line still says where it was.
        # Bounded, so a recording whose loop is stuck never holds vLLM up.
        begin.started.wait(_PHASE_START_WAIT_S)
        return send

    def end_phase(self, token: Any, error: BaseException | None = None) -> None:
        """Close the phase :meth:`begin_phase` opened: ``ok``, or failed
        with ``error``."""
        if token is None:
            return
        if error is not None and self._stops.requested:
            self.finish(error)  # the start ends with it, interrupted
            return
        end = self._end(error)
        with self._lock:
            portal = self._live_portal()
            if portal is None or token not in [inbox for _name, inbox in self._open[1:]]:
                return
            # Phases opened inside this one and never closed end with it.
            self._end_open(portal, end, down_to=token)

    def _end(self, error: BaseException | None) -> _End:
        """The end ``error`` makes, captured here, in the thread that raised
        it, once: the phase it leaves and the start it ends record the same
        capture, so the record says it went up from where it was raised."""
        if error is None:
            return _End()
        if id(error) not in self._captured:
            # Kept with its capture, so no other error can take its id.
            self._captured[id(error)] = (error, IsolatedError.capture(error, self._runner.redactor))
        return _End(error=self._captured[id(error)][1])

    def _end_open(
        self, portal: anyio.from_thread.BlockingPortal, end: _End | None, down_to: Any = None
    ) -> None:
        # Innermost first, down to the inbox ``down_to`` (every one without
        # it); ``None``: the run was cancelled, nothing more is said.
        while self._open:
            inbox = self._open.pop()[1]
            if end is not None:
                portal.call(inbox.send_nowait, end)
            portal.call(inbox.close)
            if inbox is down_to:
                break

    def spawned(self, name: str, process: Any) -> None:
        """Announce a child process (a :class:`multiprocessing.Process` that
        has started)."""
        with self._lock:
            portal = self._live_portal()
            if portal is None or self._children is None:
                return
            spawned = (name, int(process.pid), int(process.sentinel), process)
            portal.call(self._children.send_nowait, spawned)

    # --- the graph's bodies ------------------------------------------------------

    async def _startup(self, ctx: StepContext) -> JsonValue:
        try:
            return await self._follow(ctx, self._startup_begun)
        finally:
            self._started_up.set()

    async def _follow(self, ctx: StepContext, begun: _Begin) -> JsonValue:
        """Run the phases announced to the step's inbox as children, one
        after another, until its own end arrives. The engine's thread does
        the step's work: a step that stalls records where it waits."""
        seen: dict[str, int] = {}
        with ctx.thread_at_work(begun.thread):
            try:
                async for message in begun.inbox:
                    if isinstance(message, _End):
                        if message.error is not None:
                            raise message.error
                        break
                    # A phase's error is recorded on it; whether it ends this one
                    # too is for the engine's code to say, with this phase's end.
                    with contextlib.suppress(Exception), message.inbox:
                        await ctx.run_child(
                            _numbered(seen, message.name),
                            self._phase_body(message),
                            attributes=message.attributes,
                        )
                return None
            finally:
                _close(begun.inbox)

    def _phase_body(self, begin: _Begin) -> StepBody:
        async def phase(ctx: StepContext) -> JsonValue:
            begin.started.set()  # the runner wrote step.started before the body runs
            return await self._follow(ctx, begin)

        return phase

    async def _processes(self, ctx: StepContext) -> JsonValue:
        seen: dict[str, int] = {}
        async with anyio.create_task_group() as watchers:
            # Processes are announced until the start ends (finish closes the
            # stream); each watch ends by itself then, with the process
            # running or dead.
            with self._children_inbox:
                async for name, *spawned in self._children_inbox:
                    watchers.start_soon(self._watch, ctx, _numbered(seen, name), *spawned)
        return {"spawned": sum(seen.values())}

    async def _watch(
        self, ctx: StepContext, name: str, pid: int, sentinel: int, process: Any
    ) -> None:
        status: list[int | None] = []
        # The watch lasts until the start ends, or the process exits first.
        waiting = anyio.CancelScope()
        portal = self._portal
        assert portal is not None

        def wait_for_exit() -> None:
            # A daemon thread of its own: it may wait as long as the child
            # lives, and must never keep this process from exiting.
            multiprocessing.connection.wait([sentinel])
            status.append(_exit_status(process))
            with contextlib.suppress(BaseException):
                portal.call(waiting.cancel)

        threading.Thread(target=wait_for_exit, name=f"watch {name}", daemon=True).start()

        async def watch(child: StepContext) -> JsonValue | IsolatedCrash:
            with waiting:
                await self._started_up.wait()
            if status and self._stops.requested:
                # It ended after this process was asked to stop, as a stop
                # reaches a whole process group: the start's end says how,
                # and a start that the stop ends cancels this with it.
                await self._started_up.wait()
            if not status:
                return {"pid": pid, "running": True}
            return IsolatedCrash.of(status[0])

        # A body that returns the isolation layer's IsolatedCrash ends
        # ``crashed``, as an isolated step whose process died does.
        with contextlib.suppress(Exception):
            await ctx.run_child(name, cast(StepBody, watch), attributes={"pid": pid})


def _numbered(seen: dict[str, int], name: str) -> str:
    """``name`` the first time, then ``name-2``, ``name-3``...: a phase the
    engine's code enters again, or a process name used again, is a step of
    its own (a path names one step of a run)."""
    count = seen[name] = seen.get(name, 0) + 1
    return name if count == 1 else f"{name}-{count}"


def _close(inbox: MemoryObjectReceiveStream[Any]) -> None:
    """Close ``inbox`` and the inboxes of the phases announced to it that
    never ran (the run ended first)."""
    while True:
        try:
            message = inbox.receive_nowait()
        except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
            break
        if isinstance(message, _Begin):
            _close(message.inbox)
    inbox.close()


def _exit_status(process: Any) -> int | None:
    """The ended child's exit status as :attr:`multiprocessing.Process.exitcode`
    gives it (``-N`` for signal ``N``): read without reaping it from under
    its owner (``waitid`` with ``WNOWAIT``), else, when the owner reaped it
    first, what the owner's own process object recorded; ``None`` when
    neither knows."""
    with contextlib.suppress(ChildProcessError):
        result = os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)
        if result is not None:
            killed = result.si_code in (os.CLD_KILLED, os.CLD_DUMPED)
            return -result.si_status if killed else int(result.si_status)
    # Its owner is reaping it this very moment (it saw the same sentinel):
    # its process object has the status a moment later.
    deadline = time.monotonic() + 1.0
    while not isinstance(process.exitcode, int) and time.monotonic() < deadline:
        time.sleep(0.01)
    code = process.exitcode
    return code if isinstance(code, int) else None
