"""Process isolation: crashes, hangs, results and exceptions as data.

Each test spawns one Python process, so there are few of them.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, BinaryIO

import anyio
import attrs
import pytest

import orchestrator
from events import (
    Event,
    MemoryLog,
    Outcome,
    Redactor,
    RunFinished,
    RunOutcome,
    StallReason,
    StepCancelled,
    StepCrashed,
    StepFailed,
    StepStalled,
    StepSucceeded,
    StepTimedOut,
    StepUnavailable,
)
from orchestrator import (
    PROBE_POLICY,
    Action,
    FaultPlan,
    Graph,
    Isolation,
    Step,
    StepBody,
    StepContext,
    StepCrashedError,
    Unavailable,
)

from . import isolated_bodies
from .harness import DEADLINE_S, assert_log_contract, new_log, of_type, only

pytestmark = pytest.mark.anyio


def isolated(body: StepBody, **options: Any) -> Graph:
    return Graph("g", [Step(name="probe", body=body, isolation=Isolation.PROCESS, **options)])


async def run(graph: Graph, log: MemoryLog, **options: Any) -> orchestrator.RunResult:
    with anyio.fail_after(DEADLINE_S):
        return await orchestrator.run(graph, log, **options)


def isolated_children() -> list[int]:
    """Pids of this process's children that are isolated steps."""
    me = str(os.getpid())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        parent = stat.rpartition(")")[2].split()[1]
        if parent == me and b"orchestrator._isolation" in command:
            found.append(int(entry.name))
    return found


async def test_the_result_comes_back_from_the_child() -> None:
    log = new_log()
    result = await run(isolated(isolated_bodies.succeed), log)

    value = result["probe"].value
    assert isinstance(value, dict)
    assert value["step"] == "probe"
    assert value["rank"] == 0
    assert value["pid"] != os.getpid()
    assert only(log, StepSucceeded, "probe").result == value
    assert_log_contract(log)


CRASHES = [
    (isolated_bodies.segfault, signal.SIGSEGV, None, "about to read address 0"),
    (isolated_bodies.abort, signal.SIGABRT, None, "about to abort"),
    (isolated_bodies.exit_three, None, 3, "leaving with code 3"),
]


@pytest.mark.parametrize(
    ("body", "signal_number", "exit_code", "last_line"),
    CRASHES,
    ids=["segfault", "abort", "exit-3"],
)
async def test_a_dying_child_is_recorded_crashed(
    body: StepBody, signal_number: int | None, exit_code: int | None, last_line: str
) -> None:
    log = new_log()
    result = await run(isolated(body), log)

    crashed = only(log, StepCrashed, "probe")
    assert crashed.signal == signal_number
    assert crashed.exit_code == exit_code
    assert crashed.stderr_tail[-1] == last_line
    assert result["probe"].outcome is Outcome.CRASHED
    assert only(log, RunFinished).outcome is RunOutcome.READY
    assert_log_contract(log)


async def test_a_child_that_exits_zero_without_answering_crashed_with_its_last_lines() -> None:
    log = new_log()
    result = await run(isolated(isolated_bodies.talk_and_exit_zero), log)

    crashed = only(log, StepCrashed, "probe")
    assert (crashed.exit_code, crashed.signal) == (0, None)
    # The last twenty lines, the latest last.
    assert crashed.stderr_tail == tuple(f"line {number}" for number in range(10, 30))
    assert result["probe"].outcome is Outcome.CRASHED
    assert_log_contract(log)


async def test_an_injected_crash_kills_an_isolated_steps_process() -> None:
    log = new_log()
    result = await run(
        isolated(isolated_bodies.succeed), log, faults=FaultPlan.parse(["probe=crash"])
    )

    crashed = only(log, StepCrashed, "probe")
    assert (crashed.exit_code, crashed.signal) == (None, signal.SIGSEGV)
    assert result["probe"].outcome is Outcome.CRASHED
    assert not of_type(log, StepSucceeded, "probe")
    assert_log_contract(log)


async def test_a_crashed_childs_stderr_is_redacted_as_exceptions_are() -> None:
    strict = attrs.evolve(PROBE_POLICY, name="strict", on_crash=Action.PROPAGATE)
    log = new_log()

    with pytest.raises(StepCrashedError) as raised:
        await run(isolated(isolated_bodies.print_a_secret_and_exit, policy=strict), log)

    redacted = "cannot reach https://[REDACTED]@hub.example/x"
    assert only(log, StepCrashed, "probe").stderr_tail == (redacted,)
    assert raised.value.stderr_tail == (redacted,)
    assert "planted-password" not in repr(log.events)


async def test_a_crash_propagates_when_the_policy_says_so() -> None:
    strict = attrs.evolve(PROBE_POLICY, name="strict", on_crash=Action.PROPAGATE)
    log = new_log()

    with pytest.raises(StepCrashedError) as raised:
        await run(isolated(isolated_bodies.exit_three, policy=strict), log)

    assert raised.value.step == "probe"
    assert raised.value.exit_code == 3
    assert raised.value.stderr_tail == ("leaving with code 3",)
    assert only(log, StepCrashed, "probe").exit_code == 3
    assert only(log, RunFinished).outcome is RunOutcome.FAILED
    assert_log_contract(log)


async def test_a_hanging_child_is_killed_at_the_timeout(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    log = new_log()

    result = await run(
        isolated(isolated_bodies.hang, timeout=1.0), log, config={"pid_file": str(pid_file)}
    )

    timed_out = only(log, StepTimedOut, "probe")
    assert timed_out.timeout_s == 1.0
    assert timed_out.elapsed_ns >= 1e9
    assert result["probe"].outcome is Outcome.TIMED_OUT
    assert isolated_children() == []
    if pid_file.exists():  # the child got as far as the body before the timeout
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid_file.read_text()), 0)
    assert_log_contract(log)


async def test_a_process_the_child_leaves_behind_does_not_hold_up_the_step() -> None:
    log = new_log()
    result = await run(isolated(isolated_bodies.leave_a_helper_behind), log)

    assert result["probe"].value == "returned"
    assert only(log, StepSucceeded, "probe").result == "returned"
    assert_log_contract(log)


#: A run's process whose isolated step never returns.
HUNG_RUN = """
import functools, sys, anyio, orchestrator
from events import MemoryLog
from orchestrator import Graph, Isolation, Step
from tests.orchestrator import isolated_bodies

step = Step(name="probe", body=isolated_bodies.tell_and_hang, isolation=Isolation.PROCESS)
log = MemoryLog("run-test", 0)
run = functools.partial(orchestrator.run, config={"pid_fifo": sys.argv[1]})
anyio.run(run, Graph("g", [step]), log)
"""


def test_a_killed_runs_isolated_child_dies_with_it(tmp_path: Path) -> None:
    fifo = tmp_path / "pid"
    os.mkfifo(fifo)
    with subprocess.Popen([sys.executable, "-c", HUNG_RUN, str(fifo)]) as parent:
        child = int(fifo.read_text())  # once the child is in its body
        # Held before the kill: a child that dies and is reaped at once
        # would leave no pid to open afterwards.
        waiting = os.pidfd_open(child)
        parent.kill()
    try:
        assert select.select([waiting], [], [], DEADLINE_S)[0], "the child outlived its run"
    finally:
        os.close(waiting)
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


def open_reader(fifo: Path) -> BinaryIO:
    return fifo.open("rb", buffering=0)


@pytest.mark.parametrize(
    ("body", "helpers"),
    [
        (isolated_bodies.wait_for_the_device, []),
        (isolated_bodies.wait_for_the_device_beside_a_helper, ["helper"]),
    ],
    ids=["alone", "beside-a-helper"],
)
async def test_a_child_given_up_records_where_it_was_before_it_is_killed(
    tmp_path: Path, body: StepBody, helpers: list[str]
) -> None:
    fifo = tmp_path / "in-body"
    os.mkfifo(fifo)
    log = new_log()
    graph = isolated(body)

    readers: list[BinaryIO] = []
    try:
        with anyio.fail_after(DEADLINE_S):
            async with anyio.create_task_group() as group:

                async def start() -> None:
                    config = {"ready_fifo": str(fifo)}
                    await orchestrator.run(graph, log, config=config, stall_s=None)

                group.start_soon(start)
                # Once the first byte arrives, the child is blocked in its
                # write; the reader stays open until the run has ended, so the
                # write neither ends nor fails. (Opening a FIFO blocks until
                # its writer opens it: in a thread.)
                reader = await anyio.to_thread.run_sync(open_reader, fifo, abandon_on_cancel=True)
                readers.append(reader)
                await anyio.to_thread.run_sync(reader.read, 1, abandon_on_cancel=True)
                group.cancel_scope.cancel()
    finally:
        for reader in readers:
            reader.close()

    (left,) = of_type(log, StepStalled, "probe")
    assert left.why is StallReason.ABANDONED
    # The body's thread first, then the others the child has.
    thread, *others = left.threads
    assert thread.thread.startswith("isolated step probe (pid ")
    assert [other.thread for other in others] == helpers
    assert left.waiting_in is not None
    assert left.waiting_in.name == "block_in_the_driver"
    assert left.seq == only(log, StepCancelled, "probe").seq - 1
    assert isolated_children() == []
    assert_log_contract(log)


async def test_a_stuck_child_records_where_it_waits_with_backoff(tmp_path: Path) -> None:
    # The child's threads' stacks while it runs past the stall threshold, as
    # for a step in the run's process; the answers do not spoil its result.
    fifo = tmp_path / "release"
    os.mkfifo(fifo)
    in_the_body = threading.Event()

    def on_event(event: Event) -> None:
        stalled = isinstance(event, StepStalled) and event.waiting_in is not None
        if stalled and event.waiting_in.name == "wait_for_the_test":
            in_the_body.set()

    log = new_log()
    log.subscribe(on_event)
    graph = isolated(isolated_bodies.wait_for_the_test, timeout=DEADLINE_S)
    with anyio.fail_after(DEADLINE_S):
        async with anyio.create_task_group() as group:
            results: list[orchestrator.RunResult] = []

            async def start() -> None:
                config = {"release_fifo": str(fifo)}
                # A secret of the run's own, which the child does not know.
                redactor = Redactor(secrets=("release_fifo",))
                results.append(
                    await orchestrator.run(
                        graph, log, config=config, stall_s=0.05, redactor=redactor
                    )
                )

            group.start_soon(start)
            await anyio.to_thread.run_sync(in_the_body.wait, abandon_on_cancel=True)
            # Opening a FIFO blocks until its reader opens it: in a thread.
            await anyio.to_thread.run_sync(fifo.write_bytes, b"x", abandon_on_cancel=True)

    assert results[0]["probe"].value == "released"
    stalls = of_type(log, StepStalled, "probe")
    assert {stall.why for stall in stalls} == {StallReason.STALLED}
    first, second, *_ = stalls
    assert first.elapsed_ns >= 0.05e9
    # Looked at again at twice the time it had run, not at every threshold.
    assert second.elapsed_ns >= 2 * first.elapsed_ns
    stuck = next(s for s in stalls if s.waiting_in and s.waiting_in.name == "wait_for_the_test")
    assert stuck.threads[0].thread.startswith("isolated step probe (pid ")
    assert stuck.summary().startswith("waiting in wait_for_the_test (isolated_bodies.py:")
    # Redacted with the run's own secret, which the child is sent.
    assert stuck.waiting_in is not None
    assert stuck.waiting_in.line
    assert "release_fifo" not in stuck.waiting_in.line
    assert only(log, StepSucceeded, "probe").result == "released"
    assert isolated_children() == []
    assert_log_contract(log)


async def test_the_childs_exception_is_redacted_with_the_runs_own_secrets() -> None:
    # A secret the run's redactor knows and the child's environment does not.
    log = new_log()
    await orchestrator.run(
        isolated(isolated_bodies.refuse_the_token),
        log,
        config={"token": "planted-t0ken-value"},
        redactor=Redactor(secrets=("planted-t0ken-value",)),
    )

    cause = only(log, StepUnavailable, "probe").cause
    assert cause is not None
    assert cause.message == "token [REDACTED] was refused"
    assert "planted-t0ken-value" not in repr(log.events)
    assert_log_contract(log)


async def test_a_recorded_exception_comes_back_as_data() -> None:
    log = new_log()
    result = await run(isolated(isolated_bodies.permission_denied), log)

    unavailable = only(log, StepUnavailable, "probe")
    reason = "PermissionError: [Errno 13] Permission denied: '/root/.cache/flashinfer'"
    assert unavailable.reasons == (reason,)
    assert unavailable.cause is not None
    assert unavailable.cause.errno == 13
    assert unavailable.cause.filename == "/root/.cache/flashinfer"
    assert any(f.name == "permission_denied" for f in unavailable.cause.frames)
    assert result["probe"].outcome is Outcome.UNAVAILABLE


async def test_dependencies_reasons_go_in_and_an_unavailable_result_comes_back() -> None:
    async def platform(ctx: StepContext) -> Unavailable:
        return Unavailable(reasons=("no device", "no driver"))

    graph = Graph(
        "g",
        [
            Step(name="platform", body=platform),
            Step(
                name="probe",
                body=isolated_bodies.pass_on_the_platform,
                depends_on=("platform",),
                isolation=Isolation.PROCESS,
            ),
        ],
    )
    log = new_log()
    result = await run(graph, log)

    unavailable = only(log, StepUnavailable, "probe")
    assert unavailable.outcome is Outcome.INVALID
    assert unavailable.reasons == ("platform unavailable", "no device", "no driver")
    assert result["probe"].outcome is Outcome.INVALID
    assert_log_contract(log)


async def test_a_propagating_exception_comes_back_with_its_type() -> None:
    log = new_log()
    with pytest.raises(RuntimeError) as raised:
        await run(isolated(isolated_bodies.kernel_image_missing), log)

    assert type(raised.value) is RuntimeError
    assert str(raised.value) == "CUDA error: no kernel image is available"
    failed = only(log, StepFailed, "probe")
    assert failed.cause.type == "RuntimeError"
    assert only(log, RunFinished).cause == failed.cause
    assert_log_contract(log)


async def test_a_non_json_result_is_named_as_in_the_runs_process() -> None:
    log = new_log()
    with pytest.raises(TypeError) as raised:
        await run(isolated(isolated_bodies.return_a_set), log)

    message = (
        "step 'probe' returned set, which is not JSON serialisable; "
        "return JSON values (dict, list, str, numbers, None): Type is not JSON serializable: set"
    )
    failed = only(log, StepFailed, "probe")
    assert (failed.cause.type, failed.cause.message) == ("TypeError", message)
    assert str(raised.value) == message
    assert_log_contract(log)


async def test_the_child_refuses_what_only_the_parent_can_do() -> None:
    log = new_log()
    with pytest.raises(RuntimeError) as raised:
        await run(isolated(isolated_bodies.read_child_results), log)

    assert str(raised.value) == (
        "an isolated step cannot read its children's results: its events are written by the "
        "parent process; give that work a step of its own without process isolation"
    )
    assert only(log, StepFailed, "probe").cause.type == "RuntimeError"
    assert_log_contract(log)


async def test_an_injected_import_fault_reaches_the_child() -> None:
    plan = FaultPlan.from_json(
        [
            {
                "target": "flashinfer",
                "exception": "PermissionError",
                "args": [13, "Permission denied", "/root/.cache/flashinfer"],
            }
        ]
    )
    log = new_log()
    result = await run(isolated(isolated_bodies.import_flashinfer), log, faults=plan)

    assert result["probe"].reasons == (
        "PermissionError: [Errno 13] Permission denied: '/root/.cache/flashinfer'",
    )
    assert_log_contract(log)


def test_an_isolated_body_must_be_importable_by_name() -> None:
    from orchestrator._isolation import _import_path

    def local(ctx: Any) -> None:
        return None

    with pytest.raises(TypeError, match="module-level function"):
        _import_path(local)
    assert _import_path(isolated_bodies.hang) == "tests.orchestrator.isolated_bodies:hang"


def child_job(body: str, parent_pid: int | None = None) -> bytes:
    """The job line a parent sends its isolated step's child."""
    from events import RankIdentity
    from events._codec import unstructure
    from orchestrator._isolation import IsolationJob

    job = IsolationJob(
        body=body,
        step="probe",
        run_id="run-1",
        identity=RankIdentity(),
        config={},
        trace_id="0" * 31 + "1",
        span_id="0" * 15 + "1",
        sys_path=tuple(sys.path),
        parent_pid=parent_pid,
    )
    return json.dumps(unstructure(job)).encode() + b"\n"


@pytest.mark.parametrize("stdin_open", [True, False], ids=["stdin-open", "stdin-closed"])
def test_the_child_exits_cleanly_once_it_has_answered(stdin_open: bool) -> None:
    # The parent keeps the child's stdin open (to ask for stacks) until the
    # child exits: the child's stdin reader must not hold up or abort its exit.
    read_end, write_end = os.pipe()
    os.write(write_end, child_job("tests.orchestrator.isolated_bodies:succeed"))
    if not stdin_open:
        os.close(write_end)
    try:
        with subprocess.Popen(
            [sys.executable, "-m", "orchestrator._isolation"],
            stdin=read_end,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        ) as child:
            os.close(read_end)
            stdout, stderr = child.communicate(timeout=DEADLINE_S)
    finally:
        if stdin_open:
            os.close(write_end)
    assert b"Fatal Python error" not in stderr, stderr.decode()
    assert child.returncode == 0
    assert json.loads(stdout.splitlines()[0])["status"] == "ok"


def test_a_child_whose_run_is_gone_before_it_starts_ends_at_once() -> None:
    # The run's process died before the child could ask to follow it: the
    # signal would never come, so the child ends itself, its body not run.
    gone = os.getppid()  # not the child's parent
    child = subprocess.run(
        [sys.executable, "-m", "orchestrator._isolation"],
        input=child_job("tests.orchestrator.isolated_bodies:succeed", parent_pid=gone),
        capture_output=True,
        timeout=DEADLINE_S,
        check=False,
    )
    assert child.returncode == -signal.SIGTERM, child.stderr.decode()
    assert child.stdout == b""
