"""Hangs: where a stuck step waits is in the log, while it waits and when it
is given up, and a call that never returns never keeps a process alive.

The hangs here are real: a thread blocked in ``threading.Event().wait()``,
an async step calling a blocking function on the event loop's thread. The
in-process tests release their hang from a log subscriber once the stall it
waits for is recorded (the subscriber runs on the watchdog's thread, so it
works even while the loop is blocked); the subprocess tests never release
theirs, and the process must still end.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import pytest

import events
import orchestrator
from events import (
    Event,
    JsonValue,
    Redactor,
    RunFinished,
    RunOutcome,
    StallReason,
    StepCancelled,
    StepStalled,
    StepTimedOut,
    ThreadStack,
)
from orchestrator import Graph, Step, StepContext
from orchestrator._threads import StepThreads
from orchestrator._watchdog import InFlight, Watchdog

from .harness import DEADLINE_S, assert_log_contract, new_log, of_type, only

pytestmark = pytest.mark.anyio

#: A stall threshold far below any step's real work.
STALL_S = 0.05


def wait_for_the_driver(release: threading.Event) -> None:
    """Stands for a driver call that does not return."""
    release.wait(DEADLINE_S)


def waits_in(stall: StepStalled) -> str:
    """The function ``stall`` says its step waits in."""
    frame = stall.waiting_in
    assert frame is not None, stall
    return frame.name


def release_after(release: threading.Event, stalls: int) -> events.Subscriber:
    """A subscriber that sets ``release`` once ``stalls`` stalls are logged."""
    seen: list[StepStalled] = []

    def on_event(event: Event) -> None:
        if isinstance(event, StepStalled):
            seen.append(event)
            if len(seen) >= stalls:
                release.set()

    return on_event


async def test_a_stuck_blocking_step_records_where_it_waits_with_backoff() -> None:
    release = threading.Event()

    def driver(ctx: StepContext) -> JsonValue:
        wait_for_the_driver(release)
        return "late"

    log = new_log()
    log.subscribe(release_after(release, 2))
    with anyio.fail_after(DEADLINE_S):
        result = await orchestrator.run(
            Graph("g", [Step(name="driver", body=driver)]), log, stall_s=STALL_S
        )

    assert result["driver"].value == "late"
    first, second, *_ = of_type(log, StepStalled, "driver")
    assert first.why is StallReason.STALLED
    assert first.elapsed_ns >= STALL_S * 1e9
    # Looked at again at twice the time it had run, not at every threshold.
    assert second.elapsed_ns >= 2 * first.elapsed_ns
    (thread,) = first.threads
    assert thread.thread == "step driver"
    assert waits_in(first) == "wait_for_the_driver"
    # Innermost last, as a traceback: the thread is in threading's wait,
    # and the step waits in the innermost frame outside the stdlib.
    assert thread.innermost is not None
    assert thread.innermost.filename.endswith("threading.py")
    assert first.summary().startswith("waiting in wait_for_the_driver (test_hangs.py:")
    # The stall is on the step's span, and the step still ends as it does.
    assert first.span_id == only(log, events.StepStarted, "driver").span_id
    assert only(log, RunFinished).outcome is RunOutcome.READY
    assert_log_contract(log)

    replayed = events.replay(log.events)
    (message,) = [m for m in replayed.messages if m.code == "step.stalled"]
    assert message.severity is events.Severity.INFO
    assert message.text.startswith("Step driver is still running after 0.")
    assert "waiting in wait_for_the_driver (test_hangs.py:" in message.text


async def test_a_stall_has_the_stacks_of_its_own_steps_threads_only() -> None:
    release = threading.Event()

    def driver(ctx: StepContext) -> JsonValue:
        wait_for_the_driver(release)
        return ctx.step

    log = new_log()
    log.subscribe(release_after(release, 4))
    graph = Graph("g", [Step(name="driver", body=driver), Step(name="peer", body=driver)])
    with anyio.fail_after(DEADLINE_S):
        await orchestrator.run(graph, log, stall_s=STALL_S)

    stalls = of_type(log, StepStalled)
    assert {stall.step for stall in stalls} == {"driver", "peer"}
    for stall in stalls:
        assert [thread.thread for thread in stall.threads] == [f"step {stall.step}"]


async def test_a_healthy_step_records_no_stall() -> None:
    async def quick(ctx: StepContext) -> JsonValue:
        return 1

    log = new_log()
    await orchestrator.run(Graph("g", [Step(name="quick", body=quick)]), log, stall_s=STALL_S)
    assert of_type(log, StepStalled) == []


async def test_a_timeout_records_the_abandoned_threads_stack_before_the_timeout() -> None:
    release = threading.Event()

    def driver(ctx: StepContext) -> JsonValue:
        wait_for_the_driver(release)
        return None

    log = new_log()
    try:
        with anyio.fail_after(DEADLINE_S):
            await orchestrator.run(
                Graph("g", [Step(name="driver", body=driver, timeout=0.2)]), log, stall_s=None
            )
    finally:
        release.set()

    (stall,) = of_type(log, StepStalled, "driver")
    assert stall.why is StallReason.TIMED_OUT
    assert waits_in(stall) == "wait_for_the_driver"
    assert stall.summary().endswith(", at its timeout")
    timed_out = only(log, StepTimedOut, "driver")
    assert stall.seq == timed_out.seq - 1
    replayed = events.replay(log.events)
    (message,) = [m for m in replayed.messages if m.code == "step.timed_out"]
    assert message.text.startswith(
        "Step driver timed out after 0.2 s, waiting in wait_for_the_driver (test_hangs.py:"
    )
    assert message.text.endswith("or fix what it waits for.")


async def test_an_async_step_that_blocks_the_loop_is_seen_from_the_watchdog() -> None:
    release = threading.Event()

    async def blocks_the_loop(ctx: StepContext) -> JsonValue:
        # A blocking call on the loop's own thread: nothing else can run.
        wait_for_the_driver(release)
        return "unblocked"

    log = new_log()
    log.subscribe(release_after(release, 1))
    with anyio.fail_after(DEADLINE_S):
        result = await orchestrator.run(
            Graph("g", [Step(name="probe", body=blocks_the_loop)]), log, stall_s=STALL_S
        )

    assert result["probe"].value == "unblocked"
    (stall, *_) = of_type(log, StepStalled, "probe")
    (thread,) = stall.threads
    assert thread.thread == "event loop"
    assert waits_in(stall) == "wait_for_the_driver"
    # The step's own body is on that stack: that is how the step is named.
    assert "blocks_the_loop" in [frame.name for frame in thread.frames]


async def test_a_blocked_loop_is_recorded_for_the_step_blocking_it_not_its_peers() -> None:
    release = threading.Event()
    peer_waiting = anyio.Event()
    probe_done = anyio.Event()

    async def peer(ctx: StepContext) -> JsonValue:
        # In flight on the loop too, but not what blocks it.
        peer_waiting.set()
        await probe_done.wait()
        return "after the probe"

    async def blocks_the_loop(ctx: StepContext) -> JsonValue:
        await peer_waiting.wait()
        wait_for_the_driver(release)
        probe_done.set()
        return "unblocked"

    graph = Graph("g", [Step(name="peer", body=peer), Step(name="probe", body=blocks_the_loop)])
    log = new_log()
    log.subscribe(release_after(release, 1))
    with anyio.fail_after(DEADLINE_S):
        await orchestrator.run(graph, log, stall_s=STALL_S)

    (stall, *_) = of_type(log, StepStalled, "probe")
    assert waits_in(stall) == "wait_for_the_driver"
    assert of_type(log, StepStalled, "peer") == []


async def test_an_async_step_waiting_on_its_children_is_not_the_stalled_one() -> None:
    release = threading.Event()

    async def parent(ctx: StepContext) -> JsonValue:
        return await ctx.to_thread(wait_for_the_driver, release)

    log = new_log()
    log.subscribe(release_after(release, 1))
    with anyio.fail_after(DEADLINE_S):
        await orchestrator.run(Graph("g", [Step(name="probe", body=parent)]), log, stall_s=STALL_S)

    (stall, *_) = of_type(log, StepStalled, "probe")
    # The step's worker thread, not the (answering) event loop.
    (thread,) = stall.threads
    assert thread.thread == "step probe"
    assert waits_in(stall) == "wait_for_the_driver"


async def test_a_cancelled_step_records_where_its_thread_was_left() -> None:
    release = threading.Event()
    entered = threading.Event()

    def driver(ctx: StepContext) -> JsonValue:
        entered.set()
        wait_for_the_driver(release)
        return None

    async def fails(ctx: StepContext) -> JsonValue:
        await anyio.to_thread.run_sync(entered.wait, DEADLINE_S)
        raise RuntimeError("the peer gave up")

    log = new_log()
    began_ns = time.monotonic_ns()
    try:
        with anyio.fail_after(DEADLINE_S), pytest.raises(RuntimeError, match="the peer gave up"):
            await orchestrator.run(
                Graph("g", [Step(name="driver", body=driver), Step(name="fails", body=fails)]),
                log,
                stall_s=None,
            )
    finally:
        release.set()
    ended_ns = time.monotonic_ns()

    (stall,) = of_type(log, StepStalled, "driver")
    assert stall.why is StallReason.ABANDONED
    assert 0 <= stall.elapsed_ns <= ended_ns - began_ns  # how long it ran before it was left
    assert waits_in(stall) == "wait_for_the_driver"
    assert stall.seq == only(log, StepCancelled, "driver").seq - 1
    assert_log_contract(log)


async def test_a_child_that_does_not_answer_holds_back_no_other_stall() -> None:
    """Isolated steps' children are asked for their stacks without waiting
    on one another: a child that never answers (its GIL held) does not hold
    back the stall of a step whose child answers, though it is due first,
    and its own stall is recorded without stacks once it has had its time."""
    token = anyio.lowlevel.current_token()
    answered = anyio.Event()
    given_up = anyio.Event()
    release = anyio.Event()
    recorded: list[tuple[str, int]] = []
    elapsed_ns: list[int] = []
    asked: list[None] = []

    def record(
        flight: InFlight, why: StallReason, elapsed: int, stacks: tuple[ThreadStack, ...]
    ) -> None:
        recorded.append((flight.step, len(stacks)))
        elapsed_ns.append(elapsed)
        done = answered if flight.step == "answers" else given_up
        anyio.from_thread.run_sync(done.set, token=token)

    async def never_answers() -> tuple[ThreadStack, ...]:
        asked.append(None)
        await release.wait()
        return ()

    async def answers() -> tuple[ThreadStack, ...]:
        return (ThreadStack(thread="child main"),)

    watchdog = Watchdog(StepThreads(), STALL_S, record, Redactor())
    for step, ask in (("silent", never_answers), ("answers", answers)):
        watchdog.started(step, "span of " + step, "", None)
        watchdog.in_child(step, ask)
    watchdog.start()
    try:
        with anyio.fail_after(DEADLINE_S):
            await answered.wait()
            assert recorded[0] == ("answers", 1)
            await given_up.wait()
        assert ("silent", 0) in recorded
        # Started before the watchdog was, neither was looked at before it
        # had run the threshold.
        assert min(elapsed_ns) >= STALL_S * 1e9
        # Due again and again meanwhile (the threshold is far below 2 s), it
        # is not asked again while its question is open.
        assert len(asked) == 1
    finally:
        release.set()
        await anyio.to_thread.run_sync(watchdog.stop)


@pytest.mark.parametrize("stall_s", [0.0, -1.0, float("inf"), float("nan")])
def test_a_stall_threshold_must_be_a_positive_number(stall_s: float) -> None:
    with pytest.raises(ValueError, match="stall_s must be a positive number of seconds"):
        orchestrator.Runner(new_log(), stall_s=stall_s)


# --- a hang that is never released ---------------------------------------------------------

#: Runs ``orchestrator.run`` or ``Startup(graph=...)`` with a probe blocked
#: forever, writes the log, and returns: the interpreter must then exit.
SCRIPT = textwrap.dedent(
    """
    import sys
    import threading
    from pathlib import Path

    import anyio

    import orchestrator
    from events import JsonlLog
    from orchestrator import PROBE_POLICY, Graph, Startup, Step

    how, backend, where = sys.argv[1], sys.argv[2], Path(sys.argv[3])

    def wait_for_the_fabric():
        threading.Event().wait()

    def probe(ctx):
        wait_for_the_fabric()

    graph = Graph("g", [Step(name="fabric", body=probe, timeout=0.3, policy=PROBE_POLICY)])

    if how == "run":
        async def main():
            with JsonlLog(where / "rank-0.jsonl", run_id="hung", rank=0) as log:
                result = await orchestrator.run(graph, log, stall_s=0.1)
            print(result["fabric"].outcome.value)

        anyio.run(main, backend=backend)
    else:
        with Startup(
            graph=graph,
            run_dir=where,
            tracing=None,
            configure_logging=False,
            handle_signals=False,
            environ={},
            stall_s=0.1,
        ) as startup:
            print(startup.run().outcome.value)
    """
)


# Startup runs its own (asyncio) event loop.
@pytest.mark.parametrize(
    ("how", "anyio_backend"), [("run", "asyncio"), ("run", "trio"), ("startup", "asyncio")]
)
def test_a_probe_that_never_returns_does_not_keep_the_process_alive(
    tmp_path: Path, how: str, anyio_backend: str
) -> None:
    script = tmp_path / "hung.py"
    script.write_text(SCRIPT, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script), how, anyio_backend, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["timed_out" if how == "run" else "ready"]
    logged = events.read_log(tmp_path / "rank-0.jsonl").events
    assert isinstance(logged[-1], RunFinished)
    stalls = [e for e in logged if isinstance(e, StepStalled)]
    assert [s.why for s in stalls][-1] is StallReason.TIMED_OUT
    assert StallReason.STALLED in [s.why for s in stalls]
    assert {waits_in(stall) for stall in stalls} == {"wait_for_the_fabric"}
