"""Process isolation: run a step body in a fresh Python subprocess.

The parent sends the child a JSON job, one line on stdin: the body's import
path, the step's identity and configuration, its dependencies' results, the
fault plan and how to rebuild the importer and host facts. The child runs
the body and writes one JSON result line to a private descriptor (its
stdout is redirected to stderr, so user prints never corrupt the result).
The parent reads the result and the last stderr lines; a child that dies
without a result is a crash (exit code or signal). While the child runs,
the parent can ask it for its threads' stacks: a ``stacks`` line on its
stdin, answered by a daemon thread of the child's with a ``stacks`` result
line within :data:`STACKS_WAIT_S`. The rank's watchdog asks so when the
step runs past the stall threshold; a child still running when the step's
timeout or a stop cancels it is asked once more, the run records the
answer as where the step was left, and the child is killed.

The child's environment names the step's span in ``TRACEPARENT``; when the
run traces (it has a span activator), the child makes that span current with
the same activator (loaded by name, as the body is) while the body runs, so
spans the body creates nest under the step as they do in the parent's worker
threads. The runtime itself never imports OpenTelemetry.

Only objects that say how to rebuild themselves cross the boundary: an
importer or host object may define ``isolation_spec()`` returning
``{"factory": "module:function", "args": <JSON>}``; the child imports that
factory (code of this process's own choosing, never from a log) and calls it.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

import anyio
import anyio.abc
import attrs
import orjson

from events import (
    DecodeError,
    ExceptionInfo,
    JsonValue,
    Outcome,
    RankIdentity,
    Redactor,
    ThreadStack,
)
from events._codec import structure, unstructure

from ._context import StepBody, StepContext, StepResult, StepRun, Unavailable, check_json
from ._errors import IsolatedStepError
from ._faults import BUILTIN_EXCEPTIONS, FaultPlan
from ._importer import Importer, InjectingImporter, RealImporter
from ._policy import exception_names
from ._signals import follow_launcher
from ._threads import StepThreads
from ._watchdog import AskChild

__all__ = ["IsolatedCrash", "IsolatedError", "run_isolated"]

#: Lines of the child's stderr kept for the crash record.
STDERR_TAIL_LINES = 20

#: How long a child given up has to send its stacks before it is killed.
STACKS_WAIT_S = 1.0
#: How long the pipes are read after the child exits: a process it started
#: may hold them open for as long as it lives.
PIPES_AFTER_EXIT_S = 1.0
#: Exit code the child uses when it could not even start the body.
_SETUP_FAILED = 86


def _import_path(body: Any) -> str:
    module = getattr(body, "__module__", None)
    qualname = getattr(body, "__qualname__", None)
    if not module or not qualname or "<" in qualname:
        raise TypeError(
            f"an isolated step's body must be a module-level function, not {body!r}: "
            "the child process imports it by name"
        )
    if module == "__main__":
        path = getattr(sys.modules.get("__main__"), "__file__", None)
        if not path:
            raise TypeError("an isolated step's body cannot live in an interactive __main__")
        return f"file:{os.path.abspath(path)}:{qualname}"
    return f"{module}:{qualname}"


def _portable(obj: Any) -> dict[str, Any] | None:
    spec = getattr(obj, "isolation_spec", None)
    return spec() if callable(spec) else None


class _Parent(StepRun, Protocol):
    """The run an isolated step belongs to, in the parent process: what
    :func:`run_isolated` needs of it beyond what the step's context does."""

    #: Its secrets are the child's: hidden in what the child captures.
    redactor: Redactor
    #: Loaded by name in the child, to make the step's span current there.
    span_activator: Callable[[str, str], AbstractContextManager[object]] | None

    def in_child(self, step: str, ask: AskChild | None) -> None:
        """See :meth:`~orchestrator._watchdog.Watchdog.in_child`."""

    def left_in_child(self, step: str, stacks: tuple[ThreadStack, ...]) -> None:
        """Where the child process of isolated ``step`` was when the step was
        given up (its timeout, a stop); recorded as the step ends."""


@attrs.frozen(kw_only=True)
class Dependency:
    """A dependency's result, as an isolated step's child reads it."""

    outcome: Outcome
    value: Any = None
    reasons: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class IsolationJob:
    """What the parent sends an isolated step's child, as one JSON line
    (read by the strict converter); see the module docstring."""

    body: str
    step: str
    run_id: str
    identity: RankIdentity
    config: Mapping[str, Any]
    trace_id: str
    span_id: str
    span_activator: str | None = None
    dependencies: Mapping[str, Dependency] = attrs.field(factory=dict)
    faults: tuple[Mapping[str, Any], ...] = ()
    importer: Mapping[str, Any] | None = None
    host: Mapping[str, Any] | None = None
    sys_path: tuple[str, ...] = ()
    #: The run's process: the child never outlives it.
    parent_pid: int | None = None
    #: The run's redactor's: what the child captures (its stacks, the body's
    #: exception) is redacted as the run's own captures are, before it is
    #: cut to its bounds.
    secrets: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class Answer:
    """One line the child writes on its result descriptor: the body's
    result (``status`` ``ok``, ``unavailable`` or ``error``, the exception
    as data with its MRO by qualified name), or its threads' stacks
    (``stacks``)."""

    status: str
    value: Any = None
    outcome: Outcome = Outcome.UNAVAILABLE
    reasons: tuple[str, ...] = ()
    exception: ExceptionInfo | None = None
    mro: tuple[str, ...] = ()
    module_name: str | None = None
    threads: tuple[ThreadStack, ...] = ()


async def run_isolated(run: _Parent, body: StepBody, context: StepContext) -> Any:
    """Run ``body`` for ``context`` in a subprocess.

    Returns:
        The body's JSON value, an :class:`Unavailable`, or an
        :class:`IsolatedCrash` when the process died without a result.

    Raises:
        IsolatedError: the body raised; the exception as data.
    """
    importer = run.importer
    plan = FaultPlan()
    if isinstance(importer, InjectingImporter):
        plan = importer.plan
        importer = importer.base
    activator: str | None = None
    if run.span_activator is not None:
        with contextlib.suppress(TypeError):  # not importable: the body runs untraced
            activator = _import_path(run.span_activator)
    job = IsolationJob(
        body=_import_path(body),
        step=context.step,
        run_id=run.run_id,
        identity=run.identity,
        config=run.config,
        trace_id=run.trace_id,
        span_id=context.span_id,
        span_activator=activator,
        dependencies={
            name: Dependency(outcome=r.outcome, value=r.value, reasons=r.reasons)
            for name, r in context._dependencies.items()
        },
        faults=tuple(plan.to_json()),
        importer=_portable(importer),
        host=_portable(run.host),
        sys_path=tuple(sys.path),
        parent_pid=os.getpid(),
        secrets=run.redactor.secrets,
    )
    process = await anyio.open_process(
        [sys.executable, "-m", "orchestrator._isolation"],
        stdin=-1,
        stdout=-1,
        stderr=-1,
        env={**os.environ, "TRACEPARENT": context.traceparent},
    )
    child = _Child(process)
    stderr = bytearray()
    try:
        assert process.stdin is not None
        assert process.stderr is not None
        # stdin stays open: the parent asks the child for its stacks.
        await process.stdin.send(orjson.dumps(unstructure(job)) + b"\n")
        run.in_child(context.step, child.stacks)

        async def drain(stream: Any, into: bytearray) -> None:
            async for chunk in stream:
                into.extend(chunk)

        async with anyio.create_task_group() as group:
            group.start_soon(child.read)
            group.start_soon(drain, process.stderr, stderr)
            returncode = await process.wait()
            group.cancel_scope.deadline = anyio.current_time() + PIPES_AFTER_EXIT_S
    finally:
        run.in_child(context.step, None)
        with anyio.CancelScope(shield=True):
            if process.returncode is None:
                async with anyio.create_task_group() as reading:
                    reading.start_soon(child.read)
                    run.left_in_child(context.step, await child.stacks())
                    reading.cancel_scope.cancel()
                process.kill()
            await process.aclose()  # waits for the process to end
    tail = tuple(stderr.decode("utf-8", "replace").splitlines()[-STDERR_TAIL_LINES:])
    # The last answer that is not stacks: the child may answer a question
    # asked as its body ended after its result.
    answers = map(_read_answer, reversed(bytes(child.stdout).splitlines()))
    result = next((a for a in answers if a is not None and a.status != "stacks"), None)
    if result is None:
        return IsolatedCrash.of(returncode, tail)
    if result.status == "ok":
        return result.value
    if result.status == "unavailable":
        return Unavailable(outcome=result.outcome, reasons=result.reasons)
    assert result.exception is not None
    raise IsolatedError(result.exception, result.mro, result.module_name)


class _Child:
    """The parent's side of an isolated step's running child: what it has
    written on its result descriptor, read by :meth:`read` alone, and the
    questions asked on its stdin, one at a time."""

    def __init__(self, process: anyio.abc.Process) -> None:
        self.process = process
        self.stdout = bytearray()
        self._closed = False
        #: Set when a line has come in, then replaced.
        self._line = anyio.Event()
        self._asking = anyio.Lock()

    async def read(self) -> None:
        assert self.process.stdout is not None
        async for chunk in self.process.stdout:
            self.stdout.extend(chunk)
            if b"\n" in chunk:
                self._line.set()
                self._line = anyio.Event()
        self._closed = True
        self._line.set()

    async def stacks(self) -> tuple[ThreadStack, ...]:
        """The child's threads' stacks, asked for on its stdin and read
        within :data:`STACKS_WAIT_S`, while :meth:`read` runs (``()`` when
        it does not answer, as a child holding the GIL cannot, or has ended)."""
        assert self.process.stdin is not None
        async with self._asking:
            with anyio.move_on_after(STACKS_WAIT_S):
                # The answer is a line after those complete now.
                start = self.stdout.rfind(b"\n") + 1
                try:
                    await self.process.stdin.send(b"stacks\n")
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    return ()
                while True:
                    for line in bytes(self.stdout[start:]).splitlines():
                        answer = _read_answer(line)
                        if answer is not None and answer.status == "stacks":
                            return answer.threads
                    if self._closed:
                        return ()
                    await self._line.wait()
        return ()


def _read_answer(line: bytes) -> Answer | None:
    try:
        return structure(Answer, orjson.loads(line))
    except (orjson.JSONDecodeError, DecodeError):
        return None


@attrs.frozen(kw_only=True)
class IsolatedCrash:
    """An isolated step's process died (returned by the isolation layer)."""

    exit_code: int | None
    signal: int | None
    stderr_tail: tuple[str, ...]

    @classmethod
    def of(cls, status: int | None, stderr_tail: tuple[str, ...] = ()) -> IsolatedCrash:
        """The crash of a process that ended with exit ``status`` (``-N``:
        killed by signal ``N``; ``None``: not known)."""
        signal = -status if status is not None and status < 0 else None
        return cls(exit_code=None if signal else status, signal=signal, stderr_tail=stderr_tail)

    def describe(self) -> str:
        if self.signal is not None:
            return f"process killed by signal {self.signal}"
        return f"process exited with code {self.exit_code}"


class IsolatedError(Exception):
    """An exception that came back as data from an isolated step."""

    def __init__(self, info: ExceptionInfo, mro: Sequence[str], module_name: str | None) -> None:
        super().__init__(info.reason)
        self.info = info
        self.mro = tuple(mro)
        self.module_name = module_name

    @classmethod
    def capture(cls, exc: BaseException, redactor: Redactor | None = None) -> IsolatedError:
        """``exc`` as data, as an isolated step's child sends it back."""
        mro, module_name = exception_names(exc)
        return cls(ExceptionInfo.capture(exc, redactor=redactor), mro, module_name)

    def rebuild(self, step: str) -> BaseException:
        """The same exception type when it is a builtin, else a typed wrapper."""
        cls = BUILTIN_EXCEPTIONS.get(self.info.type)
        if cls is not None:
            with contextlib.suppress(Exception):  # UnicodeDecodeError takes five arguments
                return cls(self.info.message)
        return IsolatedStepError(step, self.info)


# --- the child side ------------------------------------------------------------------


class _ChildRun:
    """The :class:`StepRun` of an isolated step's child process (the
    parent writes every event)."""

    def __init__(self, job: IsolationJob) -> None:
        self.run_id = job.run_id
        self.identity = job.identity
        self.config: Mapping[str, JsonValue] = job.config
        self.trace_id = job.trace_id
        self.services: Mapping[str, Any] = {}
        self.threads = StepThreads()
        base = _rebuild(job.importer) if job.importer else RealImporter()
        #: The run's fault plan: the step's own fault, if any, fires here too.
        self.faults = FaultPlan.from_json(list(job.faults), source="parent")
        self.importer: Importer = (
            InjectingImporter(base, self.faults, self.identity.rank) if self.faults else base
        )
        self.host: Any = _rebuild(job.host) if job.host else None

    async def run_child(self, *, name: str, **_: Any) -> StepResult:
        raise _refused(f"run child step {name!r}")

    def decide(self, context: StepContext, name: str, inputs: dict[str, JsonValue]) -> JsonValue:
        raise _refused(f"decide {name!r}")

    def record_decision(
        self, context: StepContext, name: str, value: JsonValue, inputs: dict[str, JsonValue]
    ) -> None:
        raise _refused(f"record decision {name!r}")

    def children_of(self, step: str) -> Sequence[StepResult]:
        raise _refused("read its children's results")


def _refused(what: str) -> RuntimeError:
    return RuntimeError(
        f"an isolated step cannot {what}: its events are written by the parent process; "
        "give that work a step of its own without process isolation"
    )


def _rebuild(spec: Mapping[str, Any]) -> Any:
    return _load_body(spec["factory"])(spec.get("args"))


def _load_body(path: str) -> Any:
    target: Any
    if path.startswith("file:"):
        import runpy

        _, file, qualname = path.split(":", 2)
        first, *parts = qualname.split(".")
        target = runpy.run_path(file, run_name="__isolated__")[first]
    else:
        module, _, qualname = path.partition(":")
        target, parts = importlib.import_module(module), qualname.split(".")
    for part in parts:
        target = getattr(target, part)
    return target


def _child_main() -> int:
    result_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    writing = threading.Lock()

    def answer(payload: Answer) -> None:
        data = orjson.dumps(unstructure(payload)) + b"\n"
        with writing:
            while data:
                data = data[os.write(result_fd, data) :]

    try:
        # Read from the descriptor itself, never through sys.stdin: a daemon
        # thread blocked in sys.stdin's reader holds its lock, and the
        # interpreter's exit waits a second for that lock and then aborts.
        lines = _lines(0)
        job = structure(IsolationJob, orjson.loads(next(lines, b"")))
        if job.parent_pid is not None:
            # Killed (SIGKILL too), the run's process takes the child with it.
            follow_launcher(job.parent_pid)
        redactor = Redactor(secrets=job.secrets)
        threading.Thread(
            target=_answer_stacks,
            args=(answer, job.step, lines, redactor),
            name="stacks",
            daemon=True,
        ).start()
        sys.path[:] = job.sys_path
        run = _ChildRun(job)
        body = _load_body(job.body)
        dependencies = {
            name: StepResult(step=name, outcome=d.outcome, value=d.value, reasons=d.reasons)
            for name, d in job.dependencies.items()
        }
        context = StepContext(run, step=job.step, span_id=job.span_id, dependencies=dependencies)
    except Exception as exc:
        print(f"isolated step could not start: {exc!r}", file=sys.stderr)
        return _SETUP_FAILED
    try:
        fault = run.faults.for_target(job.step, run.identity.rank)
        if fault is not None:
            fault.fire()
        activator = _load_body(job.span_activator) if job.span_activator else None
        with activator(job.trace_id, job.span_id) if activator else contextlib.nullcontext():
            if inspect.iscoroutinefunction(body):
                value = anyio.run(body, context)
            else:
                value = body(context)
        if isinstance(value, Unavailable):
            answer(Answer(status="unavailable", outcome=value.outcome, reasons=value.reasons))
        else:
            check_json(job.step, value)
            answer(Answer(status="ok", value=value))
    except BaseException as exc:  # everything goes back to the parent as data
        mro, module_name = exception_names(exc)
        info = ExceptionInfo.capture(exc, redactor=redactor)
        answer(Answer(status="error", exception=info, mro=mro, module_name=module_name))
    return 0


def _lines(fd: int) -> Iterator[bytes]:
    pending = b""
    while chunk := os.read(fd, 65536):
        *lines, pending = (pending + chunk).split(b"\n")
        yield from lines
    if pending:
        yield pending


def _answer_stacks(
    answer: Callable[[Answer], None], step: str, lines: Iterator[bytes], redactor: Redactor
) -> None:
    """In the child: answer each ``stacks`` line of ``lines`` (the rest of
    stdin) with the stacks of every other thread (the body's first), until
    stdin closes."""
    me = threading.get_ident()
    for line in lines:
        if line.strip() != b"stacks":
            continue
        names = {thread.ident: thread.name for thread in threading.enumerate()}
        main = threading.main_thread().ident
        names[main] = f"isolated step {step} (pid {os.getpid()})"
        frames = sorted(sys._current_frames().items(), key=lambda item: item[0] != main)
        stacks = tuple(
            ThreadStack.capture(names.get(ident, f"thread {ident}"), frame, redactor=redactor)
            for ident, frame in frames
            if ident != me
        )
        answer(Answer(status="stacks", threads=stacks))


if __name__ == "__main__":
    sys.exit(_child_main())
