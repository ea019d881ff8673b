"""The threads that do steps' blocking work.

A blocking probe runs in a thread of its own, a daemon thread made for the
call: a call that never returns (a driver blocked in the kernel, an
injected ``hang``) is abandoned where it is when its step times out or the
run stops, and, being a daemon, never keeps the process from exiting — in
the command line and in any process that embeds a run. The capacity limiter
still bounds how many run at once; an abandoned thread gives its place up.

Each running thread is known by the step it works for, so the watchdog
(:mod:`orchestrator._watchdog`) can say where a stuck step waits.

These are not anyio's worker threads (those keep a process alive while a
call in one never returns): :func:`anyio.from_thread.run` from a blocking
body needs the loop's ``token`` (:func:`anyio.lowlevel.current_token`,
taken on the loop).
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel
import attrs

__all__ = ["StepThread", "StepThreads"]

T = TypeVar("T")


@attrs.frozen
class StepThread:
    """A thread at work for a step: the step, its name, when it started
    (``time.monotonic_ns()``) and its id."""

    step: str
    name: str
    started_ns: int
    ident: int

    def frame(self) -> FrameType | None:
        """The thread's current frame (``None`` once it ended)."""
        return sys._current_frames().get(self.ident)


class StepThreads:
    """Runs blocking calls for steps in daemon threads, and knows which are
    running for which step.

    Args:
        limiter: bounds how many calls run at once (``None``: unbounded).
    """

    def __init__(self, limiter: anyio.CapacityLimiter | None = None) -> None:
        self._limiter = limiter
        self._lock = threading.Lock()
        self._running: dict[int, StepThread] = {}

    async def run(self, step: str, fn: Callable[..., T], *args: Any, name: str = "") -> T:
        """``fn(*args)`` in a daemon thread of its own (named ``name``, by
        default ``step STEP``), in this task's context variables; its
        result, or what it raised. Cancelled, the call is abandoned: the
        thread goes on until ``fn`` returns, if ever, and then does nothing
        more."""
        async with self._limiter if self._limiter is not None else contextlib.nullcontext():
            return await self._run(step, fn, args, name or f"step {step}")

    async def _run(self, step: str, fn: Callable[..., T], args: tuple[Any, ...], name: str) -> T:
        done = anyio.Event()
        token = anyio.lowlevel.current_token()
        context = contextvars.copy_context()
        result: list[T] = []
        error: list[BaseException] = []

        def work() -> None:
            ident = threading.get_ident()
            with self._lock:
                self._running[ident] = StepThread(
                    step=step, name=name, started_ns=time.monotonic_ns(), ident=ident
                )
            try:
                result.append(context.run(fn, *args))
            except BaseException as exc:
                error.append(exc)
            finally:
                with self._lock:
                    self._running.pop(ident, None)
                # The run may be gone (an abandoned call that ended late).
                with contextlib.suppress(Exception):
                    anyio.from_thread.run_sync(done.set, token=token)

        threading.Thread(target=work, name=name, daemon=True).start()
        await done.wait()
        if error:
            raise error[0]
        return result[0]

    def of(self, step: str) -> list[StepThread]:
        """The threads running for ``step`` now."""
        with self._lock:
            return [thread for thread in self._running.values() if thread.step == step]

    def running(self) -> list[StepThread]:
        """Every thread running now."""
        with self._lock:
            return list(self._running.values())
