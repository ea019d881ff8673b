"""Running the command line, and reading what it wrote.

:func:`run_cli` runs a command as ``python -m orchestrator ...`` with this
interpreter, in a directory of the test's own, with an environment cleared
of launcher, collector and orchestrator variables, and under a timeout: a
command that runs past it is hung, and failing beats blocking the suite.

:func:`call_cli` calls :func:`orchestrator.cli.main` in this process, in the
same directory and environment, with stdout and stderr captured: for
commands that end before a startup runs (bad usage, bad input, the
read-only commands), where a process of their own adds a second of start-up
and nothing else. A command that runs a startup, signals, launched ranks or
the interpreter's own exit status need :func:`run_cli`.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs

#: Upper bound for one single-rank command (about half a second when healthy;
#: a run on the real host imports torch).
COMMAND_TIMEOUT_S = 90.0

#: Upper bound for a multi-rank launch (each rank imports torch for its gloo
#: group: 10-15 s for 8 ranks on two cores, far more on a loaded machine).
LAUNCH_TIMEOUT_S = 240.0

#: How often :func:`wait_for_event` looks at a log written by another process.
POLL_INTERVAL_S = 0.05

# A test must not inherit a launcher's rank identity, a collector or a
# grace period from the shell that runs pytest.
_LAUNCHER_VARIABLES = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "ROLE_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TRACEPARENT",
        "TRACESTATE",
    }
)
_INHERITED_PREFIXES = (
    "OTEL_",
    "STARTUP_ORCHESTRATOR_",
    "TORCHELASTIC_",
    "SLURM_",
    "OMPI_",
    "PMIX_",
)


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on now (for a rendezvous)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def environment(**extra: str) -> dict[str, str]:
    """This process's environment without launcher, collector and
    orchestrator variables, plus ``extra``."""
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in _LAUNCHER_VARIABLES and not name.startswith(_INHERITED_PREFIXES)
    }
    env.update(extra)
    return env


def command(*args: str) -> list[str]:
    """The command line of ``python -m orchestrator <args>``."""
    return [sys.executable, "-m", "orchestrator", *args]


@attrs.frozen(kw_only=True)
class Completed:
    """A finished command: its arguments, exit status and output."""

    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        """stdout parsed as one JSON document."""
        return json.loads(self.stdout)

    def lines(self) -> list[str]:
        """stdout's lines."""
        return self.stdout.splitlines()

    def describe(self) -> str:
        """Everything about the command, for assertion messages."""
        return (
            f"command: {' '.join(self.args)}\nexit: {self.returncode}\n"
            f"--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"
        )


def run_cli(
    *args: str,
    cwd: Path,
    timeout: float = COMMAND_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
    traceback_expected: bool = False,
) -> Completed:
    """Run ``python -m orchestrator <args>`` to completion in ``cwd``.

    Unless ``traceback_expected`` (a WARNING that carries its traceback by
    design), stderr must hold no Python traceback: the command line reports
    every error in one line.
    """
    process = subprocess.run(
        command(*args),
        cwd=cwd,
        env=environment() if env is None else dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    completed = Completed(
        args=tuple(args),
        returncode=process.returncode,
        stdout=process.stdout,
        stderr=process.stderr,
    )
    if not traceback_expected:
        assert "Traceback" not in completed.stderr, completed.describe()
    return completed


def call_cli(*args: str, cwd: Path, env: Mapping[str, str] | None = None) -> Completed:
    """Call ``orchestrator.cli.main(args)`` in this process, in ``cwd`` and
    with the environment :func:`environment` gives (or ``env``), both
    restored afterwards; stdout and stderr are captured.

    For commands that end before a startup runs: a run would install signal
    handlers and logging in the test process. As with :func:`run_cli`,
    stderr must hold no Python traceback, and an exception that leaves
    ``main`` fails the test.
    """
    from orchestrator.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with (
        _replaced_environment(environment() if env is None else env),
        contextlib.chdir(cwd),
        contextlib.redirect_stdout(stdout),
        contextlib.redirect_stderr(stderr),
    ):
        returncode = main(list(args))
    completed = Completed(
        args=tuple(args),
        returncode=returncode,
        stdout=stdout.getvalue(),
        stderr=stderr.getvalue(),
    )
    assert "Traceback" not in completed.stderr, completed.describe()
    return completed


@contextlib.contextmanager
def _replaced_environment(values: Mapping[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(values)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


class Background:
    """A command running in the background, its output going to files (a
    pipe nobody reads could fill up and block it)."""

    def __init__(
        self,
        args: list[str],
        *,
        cwd: Path,
        env: Mapping[str, str],
        name: str = "launcher",
        new_session: bool = False,
    ) -> None:
        """With ``new_session`` the command leads a process group of its own,
        which :meth:`kill_group` kills whole (a launcher and its ranks, as a
        machine that goes down)."""
        self.args = tuple(args)
        self.stdout_path = cwd / f"{name}.stdout"
        self.stderr_path = cwd / f"{name}.stderr"
        with self.stdout_path.open("wb") as out, self.stderr_path.open("wb") as err:
            self.process = subprocess.Popen(
                args,
                cwd=cwd,
                env=dict(env),
                stdout=out,
                stderr=err,
                start_new_session=new_session,
            )

    @property
    def pid(self) -> int:
        """The process id."""
        return self.process.pid

    def running(self) -> bool:
        """Whether it has not ended yet."""
        return self.process.poll() is None

    def send(self, signum: signal.Signals) -> None:
        """Send it a signal."""
        self.process.send_signal(signum)

    def finish(self, timeout: float = LAUNCH_TIMEOUT_S) -> Completed:
        """Wait for it to end (at most ``timeout`` seconds) and collect its
        output."""
        self.process.wait(timeout=timeout)
        return Completed(
            args=self.args,
            returncode=self.process.returncode,
            stdout=self.stdout_path.read_text(encoding="utf-8", errors="replace"),
            stderr=self.stderr_path.read_text(encoding="utf-8", errors="replace"),
        )

    def kill_group(self) -> None:
        """SIGKILL its whole process group (started with ``new_session``),
        and reap it."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)

    def kill(self) -> None:
        """SIGKILL it if it still runs, and reap it."""
        if self.running():
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)


def start_cli(*args: str, cwd: Path, env: Mapping[str, str] | None = None) -> Background:
    """Start ``python -m orchestrator <args>`` in the background."""
    return Background(command(*args), cwd=cwd, env=environment() if env is None else env)


# --- reading run directories ------------------------------------------------------------


def read_events(path: Path) -> list[dict[str, Any]]:
    """The complete lines of a JSON Lines log, parsed (a line still being
    written, without its newline, is left out)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    complete, _, _ = data.rpartition(b"\n")
    return [json.loads(line) for line in complete.splitlines() if line.strip()]


def rank_logs(run_dir: Path) -> list[Path]:
    """The rank logs of a run directory, in rank order."""
    return sorted(run_dir.glob("rank-*.jsonl"), key=lambda p: int(p.stem.removeprefix("rank-")))


def only_run_directory(root: Path) -> Path:
    """The single run directory under ``root`` (``./startup-runs``)."""
    found = [p for p in root.iterdir() if p.is_dir()]
    assert len(found) == 1, f"expected one run directory under {root}, found {found}"
    return found[0]


def poll_file(
    read: Callable[[], Any],
    found: Callable[[Any], bool],
    *,
    alive: Callable[[], bool],
    deadline_s: float,
    what: str,
) -> Any:
    """What ``read`` returns once ``found`` says it holds what is awaited.

    The file ``read`` reads belongs to another process, so there is nothing
    to synchronise on but the file: it is read every :data:`POLL_INTERVAL_S`
    seconds, for at most ``deadline_s`` seconds, and the wait fails at once
    when ``alive`` says the writer has ended.
    """
    deadline = time.monotonic() + deadline_s
    while True:
        value = read()
        if found(value):
            return value
        assert alive(), f"the writer ended before {what}"
        assert time.monotonic() < deadline, f"{what}: not in time"
        time.sleep(POLL_INTERVAL_S)


def wait_for_event(
    path: Path,
    matches: Callable[[dict[str, Any]], bool],
    *,
    alive: Callable[[], bool],
    deadline_s: float = LAUNCH_TIMEOUT_S,
) -> dict[str, Any]:
    """The first event of the log at ``path`` that ``matches``, waiting for
    another process to write it (see :func:`poll_file`)."""
    events = poll_file(
        lambda: [event for event in read_events(path) if matches(event)],
        bool,
        alive=alive,
        deadline_s=deadline_s,
        what=f"{path.name} showing the awaited event",
    )
    first: dict[str, Any] = events[0]
    return first


def step_started(step: str) -> Callable[[dict[str, Any]], bool]:
    """Matches the ``step.started`` event of ``step``."""
    return lambda event: event["type"] == "step.started" and event.get("step") == step


def step_succeeded(step: str) -> Callable[[dict[str, Any]], bool]:
    """Matches the ``step.succeeded`` event of ``step``."""
    return lambda event: event["type"] == "step.succeeded" and event.get("step") == step


def pid_of(log: Path) -> int:
    """The pid a rank recorded in its ``run.started`` event."""
    first = read_events(log)[0]
    assert first["type"] == "run.started", first
    pid: int = first["pid"]
    return pid


@contextlib.contextmanager
def reaping(launch: Background, run_dir: Path) -> Iterator[Background]:
    """Whatever happens in the block, leave no process of this launch
    behind: the launcher and every rank that recorded its pid (ranks run in
    sessions of their own, so ending the launcher does not end them)."""
    try:
        yield launch
    finally:
        launch.kill()
        for log in rank_logs(run_dir) if run_dir.is_dir() else []:
            events = read_events(log)
            if events and events[0]["type"] == "run.started" and _is_child_rank(events[0]["pid"]):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(events[0]["pid"], signal.SIGKILL)


def _is_child_rank(pid: int) -> bool:
    """Whether ``pid`` is still a rank process of ours (not a reused pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"orchestrator" in cmdline and sys.executable.encode() in cmdline


def message(document: Mapping[str, Any], code: str) -> dict[str, Any]:
    """The grouped message of ``code`` in a JSON report."""
    found = [m for m in document["messages"] if m["code"] == code]
    assert len(found) == 1, f"expected one {code} message, got {found}"
    result: dict[str, Any] = found[0]
    return result
