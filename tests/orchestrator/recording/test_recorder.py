"""A process whose start is driven by someone else's code, recorded: phases
announced from that code's thread, processes it started, and its end."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import traceback
from pathlib import Path

import pytest

from events import (
    JsonlLog,
    RankIdentity,
    RunFinished,
    RunOutcome,
    StepCancelled,
    StepCrashed,
    StepFailed,
    StepStalled,
    StepStarted,
    StepSucceeded,
    read_log,
    replay,
)
from orchestrator.engine import ENGINE
from orchestrator.recording import ExitedBeforeReady, Recording

from ..cli.harness import poll_file


def recording(
    tmp_path: Path, *, spawns: bool = True, role: str = "engine core", log: JsonlLog | None = None
) -> Recording:
    log = log or JsonlLog(tmp_path / "rank-0.jsonl", run_id="recorded", rank=0)
    started = Recording(log, identity=RankIdentity(role=role), role=role, spawns=spawns)
    started.start()
    return started


def events_of(tmp_path: Path) -> list[object]:
    return list(read_log(tmp_path / "rank-0.jsonl").events)


def ends(events: list[object]) -> dict[str, object]:
    return {
        event.step: event  # type: ignore[attr-defined]
        for event in events
        if not isinstance(event, StepStarted) and getattr(event, "step", "")
    }


def load_model() -> None:
    raise ValueError("Available memory on node 0 is less than requested")


def test_phases_nest_and_a_ready_start_ends_them(tmp_path: Path) -> None:
    started = recording(tmp_path, spawns=False)
    with started.phase("config"), started.phase("inspect_model", {"model": "tiny"}):
        pass
    with started.phase("engine"):
        pass
    started.finish()

    events = events_of(tmp_path)
    steps = [e.step for e in events if isinstance(e, StepStarted)]  # type: ignore[attr-defined]
    assert steps == ["startup", "startup/config", "startup/config/inspect_model", "startup/engine"]
    inspect = next(e for e in events if isinstance(e, StepStarted) and e.step.endswith("model"))
    assert inspect.attributes == {"model": "tiny"}  # type: ignore[attr-defined]
    assert all(isinstance(e, StepSucceeded) for e in ends(events).values())
    finished = events[-1]
    assert isinstance(finished, RunFinished)
    assert finished.outcome is RunOutcome.READY


def test_a_phase_that_stalls_records_where_the_engines_thread_waits(tmp_path: Path) -> None:
    # The phase's work is done by the engine's thread, not by one of the
    # runner's: a stall must still say where it waits.
    log = JsonlLog(tmp_path / "rank-0.jsonl", run_id="recorded", rank=0)
    stalled = threading.Event()
    log.subscribe(
        lambda event: isinstance(event, StepStalled) and event.step != "startup" and stalled.set()
    )
    release = threading.Event()
    started = Recording(
        log, identity=RankIdentity(role="worker"), role="worker", spawns=False, stall_s=0.05
    )
    started.start()

    def load_weights() -> None:
        with started.phase("model_load"):
            release.wait(60)

    engine = threading.Thread(target=load_weights, name="engine thread")
    engine.start()
    try:
        assert stalled.wait(60), "no step.stalled was recorded"
    finally:
        release.set()
        engine.join()
    started.finish()

    # This test's thread, which made the recording, waits outside any phase:
    # it is the one at work for the start itself.
    stalls = {e.step: e for e in events_of(tmp_path) if isinstance(e, StepStalled)}
    assert [stack.thread for stack in stalls["startup"].threads] == ["MainThread"]
    first = stalls["startup/model_load"]
    assert [stack.thread for stack in first.threads] == ["engine thread"]
    assert first.waiting_in is not None
    assert any(frame.name == "load_weights" for frame in first.threads[0].frames)


def test_a_phase_entered_again_is_a_step_of_its_own(tmp_path: Path) -> None:
    # The engine's code may call a hooked function twice: each call is a
    # step, under a path of its own.
    started = recording(tmp_path, spawns=False)
    for _ in range(3):
        with started.phase("profile_run"):
            pass
    with started.phase("engine"), started.phase("profile_run"):
        pass
    started.finish()

    events = events_of(tmp_path)
    steps = [e.step for e in events if isinstance(e, StepStarted)]  # type: ignore[attr-defined]
    assert steps == [
        "startup",
        "startup/profile_run",
        "startup/profile_run-2",
        "startup/profile_run-3",
        "startup/engine",
        "startup/engine/profile_run",
    ]
    assert all(isinstance(e, StepSucceeded) for e in ends(events).values())
    assert isinstance(events[-1], RunFinished)
    assert events[-1].outcome is RunOutcome.READY


def test_a_phase_that_raises_fails_there_and_the_error_goes_on_unchanged(tmp_path: Path) -> None:
    started = recording(tmp_path, spawns=False)
    with pytest.raises(ValueError, match="Available memory") as raised, started.phase("model_load"):
        load_model()
    # The engine's own exception object went on as it was: nothing of the
    # recording's loop thread in its traceback.
    frames = [frame.name for frame in traceback.extract_tb(raised.value.__traceback__)]
    assert frames[-1] == "load_model"
    assert not any("_follow" in name or "run_step" in name for name in frames)
    started.finish(raised.value)

    events = events_of(tmp_path)
    failed = ends(events)["startup/model_load"]
    assert isinstance(failed, StepFailed)
    assert failed.cause.type == "ValueError"
    assert failed.cause.frames[-1].name == "load_model"
    result = replay(events, slices=[ENGINE])  # type: ignore[arg-type]
    assert result.outcome is RunOutcome.FAILED
    assert result.root_cause is not None
    # The failure started in the phase, and went up to the start with it.
    assert result.root_cause.step == "startup/model_load"


@pytest.mark.parametrize("phases", [["warm_up"], ["model_load", "warm_up"]])
def test_a_start_still_open_at_exit_failed_in_the_phase_it_was_in(
    tmp_path: Path, phases: list[str]
) -> None:
    # The innermost phase open is the one it was in.
    started = recording(tmp_path, spawns=False)
    for phase in phases:
        started.begin_phase(phase)
    started.at_exit()

    events = events_of(tmp_path)
    finished = events[-1]
    assert isinstance(finished, RunFinished)
    assert finished.outcome is RunOutcome.FAILED
    assert finished.cause is not None
    assert finished.cause.type.endswith("ExitedBeforeReady")
    assert finished.cause.message == (
        "the engine core process exited before it was ready during warm_up"
    )
    assert str(ExitedBeforeReady("worker TP1", None)) == (
        "the worker TP1 process exited before it was ready"
    )


def test_nothing_is_announced_after_the_end(tmp_path: Path) -> None:
    started = recording(tmp_path, spawns=False)
    started.finish()
    count = len(events_of(tmp_path))

    with started.phase("too_late"):
        pass
    started.finish(RuntimeError("twice"))

    assert len(events_of(tmp_path)) == count


def _sleep_forever() -> None:
    signal.pause()


def test_a_child_killed_before_the_start_ends_is_crashed_with_its_signal(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    killed = context.Process(target=_sleep_forever, name="VllmWorker-1", daemon=True)
    running = context.Process(target=_sleep_forever, name="VllmWorker-0", daemon=True)
    killed.start()
    running.start()
    log = JsonlLog(tmp_path / "rank-0.jsonl", run_id="recorded", rank=0)
    crash_recorded = threading.Event()
    log.subscribe(lambda event: crash_recorded.set() if isinstance(event, StepCrashed) else None)
    try:
        started = recording(tmp_path, log=log)
        started.spawned(killed.name, killed)
        started.spawned(running.name, running)
        os.kill(killed.pid, signal.SIGKILL)
        killed.join()
        with started.phase("workers"):
            pass
        # The start ends once the run has seen the death.
        assert crash_recorded.wait(timeout=30)
        started.finish()
    finally:
        running.kill()
        running.join()

    events = events_of(tmp_path)
    crashed = ends(events)["processes/VllmWorker-1"]
    assert isinstance(crashed, StepCrashed)
    assert crashed.signal == signal.SIGKILL
    alive = ends(events)["processes/VllmWorker-0"]
    assert isinstance(alive, StepSucceeded)
    assert alive.result == {"pid": running.pid, "running": True}
    starts = {e.step: e for e in events if isinstance(e, StepStarted)}
    assert starts["processes/VllmWorker-1"].attributes == {"pid": killed.pid}
    assert killed.exitcode == -signal.SIGKILL, "the owner still reads its child's status"


def test_a_process_name_used_again_is_a_step_of_its_own(tmp_path: Path) -> None:
    # An engine that starts a worker again under the same name (a restart):
    # each process is a step, under a path of its own, with its own pid.
    context = multiprocessing.get_context("spawn")
    first, second = (
        context.Process(target=_sleep_forever, name="VllmWorker-0", daemon=True) for _ in range(2)
    )
    first.start()
    second.start()
    log = JsonlLog(tmp_path / "rank-0.jsonl", run_id="recorded", rank=0)
    watched: list[str] = []
    both = threading.Event()

    def seen(event: object) -> None:
        if isinstance(event, StepStarted) and event.step.startswith("processes/"):
            watched.append(event.step)
            if len(watched) == 2:
                both.set()

    log.subscribe(seen)
    try:
        started = recording(tmp_path, log=log)
        started.spawned(first.name, first)
        started.spawned(second.name, second)
        assert both.wait(timeout=30)
        started.finish()
    finally:
        for process in (first, second):
            process.kill()
            process.join()

    events = events_of(tmp_path)
    starts = {e.step: e for e in events if isinstance(e, StepStarted)}
    assert starts["processes/VllmWorker-0"].attributes == {"pid": first.pid}
    assert starts["processes/VllmWorker-0-2"].attributes == {"pid": second.pid}
    results = {
        step: ends(events)[step] for step in ("processes/VllmWorker-0", "processes/VllmWorker-0-2")
    }
    assert [r.result for r in results.values()] == [  # type: ignore[attr-defined]
        {"pid": first.pid, "running": True},
        {"pid": second.pid, "running": True},
    ]


def test_a_forked_child_records_nothing_and_never_waits(tmp_path: Path) -> None:
    started = recording(tmp_path, spawns=False)
    with started.phase("config"):
        pass
    before = len(events_of(tmp_path))
    context = multiprocessing.get_context("fork")
    child = context.Process(target=_use_in_child, args=(started,))
    child.start()
    child.join(timeout=30)
    started.finish()

    assert child.exitcode == 0
    events = events_of(tmp_path)
    assert not any(getattr(e, "step", "") == "startup/in_child" for e in events)
    assert len(events) == before + 2  # startup's end and run.finished


def _use_in_child(started: Recording) -> None:
    with started.phase("in_child"):
        pass
    started.finish()


def test_the_start_that_is_recorded_has_the_outcome_classes_of_a_run(tmp_path: Path) -> None:
    started = recording(tmp_path, spawns=False)
    started.finish(KeyboardInterrupt())

    finished = events_of(tmp_path)[-1]
    assert isinstance(finished, RunFinished)
    assert finished.outcome is RunOutcome.INTERRUPTED
    startup = ends(events_of(tmp_path))["startup"]
    assert isinstance(startup, StepFailed)
    assert startup.cause.type == "KeyboardInterrupt"


def test_a_phase_is_in_the_log_before_the_engines_code_goes_on(tmp_path: Path) -> None:
    # A process killed on the phase's first line (a worker SIGKILLed as it
    # loads the model) must still leave the phase it was in: the phase's
    # start is written before begin_phase returns, on every try.
    started = recording(tmp_path, spawns=False)
    for attempt in range(20):
        token = started.begin_phase(f"phase_{attempt}")
        logged = [e for e in events_of(tmp_path) if isinstance(e, StepStarted)]
        assert logged[-1].step == f"startup/phase_{attempt}"
        started.end_phase(token)
    started.finish()


def test_a_stop_signal_the_engines_code_stops_for_ends_the_start_interrupted(
    tmp_path: Path,
) -> None:
    # As vLLM's workers do: its handler turns the signal into SystemExit.
    def engines_handler(signum: int, frame: object) -> None:
        raise SystemExit()

    previous = signal.signal(signal.SIGTERM, engines_handler)
    try:
        started = recording(tmp_path, spawns=False)
        with pytest.raises(SystemExit), started.phase("model_load"):
            signal.raise_signal(signal.SIGTERM)
        # The recording watched without taking the signal over, and stopped
        # watching once the start ended.
        assert signal.getsignal(signal.SIGTERM) is engines_handler
    finally:
        signal.signal(signal.SIGTERM, previous)

    events = events_of(tmp_path)
    assert isinstance(ends(events)["startup/model_load"], StepCancelled)
    finished = events[-1]
    assert isinstance(finished, RunFinished)
    assert finished.outcome is RunOutcome.INTERRUPTED
    assert finished.stop is not None
    assert finished.stop.signal == "SIGTERM"
    assert replay(events, slices=[ENGINE]).outcome is RunOutcome.INTERRUPTED  # type: ignore[arg-type]


def test_a_signal_the_engines_code_goes_on_after_leaves_the_start_to_end_as_it_does(
    tmp_path: Path,
) -> None:
    noted: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: noted.append(signum))
    try:
        started = recording(tmp_path, spawns=False)
        with started.phase("model_load"):
            signal.raise_signal(signal.SIGTERM)
        started.finish()
    finally:
        signal.signal(signal.SIGTERM, previous)

    assert noted == [signal.SIGTERM]  # the engine's own handler ran
    finished = events_of(tmp_path)[-1]
    assert isinstance(finished, RunFinished)
    assert finished.outcome is RunOutcome.READY


def test_a_child_that_ends_after_a_stop_signal_is_cancelled_with_the_start(
    tmp_path: Path,
) -> None:
    # Ctrl-C reaches the whole process group: the worker ends, then the
    # engine core's code stops because it did. Neither is a crash.
    worker = multiprocessing.get_context("spawn").Process(
        target=_sleep_forever, name="VllmWorker-0", daemon=True
    )
    worker.start()
    noted: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: noted.append(signum))
    try:
        started = recording(tmp_path)
        started.spawned(worker.name, worker)
        signal.raise_signal(signal.SIGTERM)
        worker.kill()
        worker.join()
        # Once the recording has seen the worker's end (its watching thread
        # is gone), the engine's code stops because of it.
        poll_file(
            lambda: [t for t in threading.enumerate() if t.name == f"watch {worker.name}"],
            lambda watching: not watching,
            alive=lambda: True,
            deadline_s=30,
            what="the recording to see the worker's end",
        )
        with pytest.raises(RuntimeError), started.phase("workers"):
            raise RuntimeError("WorkerProc initialization failed")
    finally:
        signal.signal(signal.SIGTERM, previous)

    assert noted == [signal.SIGTERM]
    events = events_of(tmp_path)
    assert isinstance(ends(events)["processes/VllmWorker-0"], StepCancelled)
    assert isinstance(ends(events)["startup/workers"], StepCancelled)
    finished = events[-1]
    assert isinstance(finished, RunFinished)
    assert finished.outcome is RunOutcome.INTERRUPTED
