"""The threads that do steps' blocking work.

A blocking probe runs in a daemon thread: a call that never returns (a
driver blocked in the kernel, an injected ``hang``) is abandoned where it
is when its step times out or the run stops, and, being a daemon, never
keeps the process from exiting — in the command line and in any process
that embeds a run. Threads whose call returned wait :data:`IDLE_S` for the
next call before they end, so a graph of many blocking probes does not
start a thread per probe. The capacity limiter still bounds how many calls
run at once; an abandoned thread gives its place up.

Each running call is known by the step it works for, so the watchdog
(:mod:`orchestrator._watchdog`) can say where a stuck step waits.

These are not anyio's worker threads (those keep a process alive while a
call in one never returns): :func:`anyio.from_thread.run` from a blocking
body needs the loop's ``token`` (:func:`anyio.lowlevel.current_token`,
taken on the loop).
"""

from __future__ import annotations

import contextlib
import contextvars
import queue
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import anyio
import anyio.lowlevel

from events import Redactor, ThreadStack

__all__ = ["StepThreads"]

T = TypeVar("T")


#: Seconds a thread whose call returned waits for the next before it ends.
IDLE_S = 10.0

#: One call for a thread: it runs ``work`` (which reports its own end).
_Job = Callable[[], None]


class _Pool:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._idle = 0

    def submit(self, job: _Job) -> None:
        with self._lock:
            if self._idle:
                self._idle -= 1
                self._jobs.put(job)
                return
        threading.Thread(target=self._work, args=(job,), name="step worker", daemon=True).start()

    def _work(self, job: _Job) -> None:
        while True:
            job()
            with self._lock:
                self._idle += 1
            while True:
                try:
                    job = self._jobs.get(timeout=IDLE_S)
                    break
                except queue.Empty:
                    with self._lock:
                        # A job handed to an idle thread is in the queue
                        # before the count drops: take it, or end.
                        if self._jobs.empty():
                            self._idle -= 1
                            return


_POOL = _Pool()


class StepThreads:
    """Runs blocking calls for steps in daemon threads, and knows which are
    running for which step.

    Args:
        limiter: bounds how many calls run at once (``None``: unbounded).
    """

    def __init__(self, limiter: anyio.CapacityLimiter | None = None) -> None:
        self._limiter = limiter
        self._lock = threading.Lock()
        #: thread ident -> (the step it works for, its name)
        self._running: dict[int, tuple[str, str]] = {}

    async def run(self, step: str, fn: Callable[..., T], *args: Any, name: str = "") -> T:
        """``fn(*args)`` in a daemon thread (named ``name``, by default
        ``step STEP``, while it runs), in this task's context variables; its
        result, or what it raised. Cancelled, the call is abandoned: the
        thread goes on until ``fn`` returns, if ever, and then does nothing
        more."""
        name = name or f"step {step}"
        async with self._limiter if self._limiter is not None else contextlib.nullcontext():
            done = anyio.Event()
            token = anyio.lowlevel.current_token()
            context = contextvars.copy_context()
            result: list[T] = []
            error: list[BaseException] = []

            def work() -> None:
                thread = threading.current_thread()
                thread.name = name
                try:
                    with self.working(step, thread):
                        result.append(context.run(fn, *args))
                except BaseException as exc:
                    error.append(exc)
                finally:
                    thread.name = "step worker (idle)"
                    # Scheduled on the loop without waiting for it (the thread is
                    # free at once); the run may be gone (an abandoned call that
                    # ended late).
                    with contextlib.suppress(Exception):
                        token.backend_class.run_sync_soon(done.set, (), token.native_token)

            _POOL.submit(work)
            await done.wait()
            if error:
                raise error[0]
            return result[0]

    @contextlib.contextmanager
    def working(self, step: str, thread: threading.Thread) -> Iterator[None]:
        """Count ``thread`` as at work for ``step`` while the block runs. A
        thread at work for a step that starts another inside it (a nested
        phase) is the inner one's until that one's block ends."""
        ident = thread.ident
        assert ident is not None, "a thread at work has started"
        with self._lock:
            before = self._running.get(ident)
            self._running[ident] = (step, thread.name)
        try:
            yield
        finally:
            with self._lock:
                if before is None:
                    self._running.pop(ident, None)
                else:
                    self._running[ident] = before

    def stacks(self, step: str, redactor: Redactor) -> tuple[ThreadStack, ...]:
        """The stacks of the threads running for ``step`` now (the abandoned
        ones of a step that timed out or was cancelled too)."""
        frames = sys._current_frames()
        with self._lock:
            running = [(ident, name) for ident, (of, name) in self._running.items() if of == step]
        return tuple(
            ThreadStack.capture(name, frames.get(ident), redactor=redactor)
            for ident, name in running
        )
