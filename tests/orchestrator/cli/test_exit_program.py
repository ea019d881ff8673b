"""How the program ends: its atexit hooks and its output, without the
interpreter's teardown; the interpreter's own exit when a thread still runs."""

from __future__ import annotations

import atexit
import io
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.cli._output import exit_program

from .conftest import StoredRun
from .harness import command, environment


class _Exited(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


@pytest.fixture
def ended(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """What ``exit_program`` did, in order; ``os._exit`` raises instead. The
    stops it ignores are handled again afterwards: the test's processes
    inherit what is ignored."""
    done: list[str] = []
    handlers = {stop: signal.getsignal(stop) for stop in (signal.SIGINT, signal.SIGTERM)}

    def exit_now(code: int) -> None:
        done.append(f"_exit {code}")
        raise _Exited(code)

    monkeypatch.setattr(atexit, "_run_exitfuncs", lambda: done.append("atexit"))
    monkeypatch.setattr(os, "_exit", exit_now)
    yield done
    for stop, handler in handlers.items():
        signal.signal(stop, handler)


class _Stream(io.StringIO):
    def __init__(self, name: str, done: list[str], fails: bool = False) -> None:
        super().__init__()
        self.name, self.done, self.fails = name, done, fails

    def flush(self) -> None:
        self.done.append(f"flush {self.name}")
        if self.fails:
            raise BrokenPipeError(32, "Broken pipe")


def test_runs_the_hooks_then_flushes_then_ends(
    ended: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdout", _Stream("stdout", ended))
    monkeypatch.setattr(sys, "stderr", _Stream("stderr", ended))

    with pytest.raises(_Exited) as exited:
        exit_program(3)

    assert exited.value.code == 3
    assert ended == ["atexit", "flush stdout", "flush stderr", "_exit 3"]


def test_stdout_that_cannot_be_flushed_ends_with_120_as_the_interpreter_does(
    ended: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdout", _Stream("stdout", ended, fails=True))
    monkeypatch.setattr(sys, "stderr", _Stream("stderr", ended))

    with pytest.raises(_Exited) as exited:
        exit_program(0)

    assert exited.value.code == 120


def test_a_running_thread_that_is_not_a_daemon_keeps_the_interpreters_exit(
    ended: list[str],
) -> None:
    release = threading.Event()
    thread = threading.Thread(target=release.wait, daemon=False)
    thread.start()
    try:
        with pytest.raises(SystemExit) as exited:
            exit_program(1)
    finally:
        release.set()
        thread.join()

    assert exited.value.code == 1
    assert ended == []


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -c code`` to its end, in ``cwd``, with the test environment."""
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=environment(),
        check=False,
        timeout=120,
    )


def test_a_stop_while_the_program_ends_changes_nothing(tmp_path: Path) -> None:
    # A launcher stopped with SIGINT as it ran its atexit hooks printed
    # "Exception ignored in atexit callback" and a KeyboardInterrupt.
    code = textwrap.dedent(
        """
        import atexit, os, signal, sys
        from orchestrator.cli._output import exit_program
        def stopped():
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGTERM)
            sys.stderr.write("hook ran\\n")
        atexit.register(stopped)
        exit_program(3)
        """
    )
    done = _python(code, tmp_path)

    assert (done.returncode, done.stderr) == (3, "hook ran\n")


def test_the_program_runs_atexit_hooks_and_prints_everything(tmp_path: Path) -> None:
    # python -m orchestrator, with an atexit hook of someone else's and a
    # report longer than a pipe's buffer would hold unflushed.
    code = textwrap.dedent(
        """
        import atexit, runpy, sys
        atexit.register(lambda: sys.stderr.write("hook ran\\n"))
        sys.argv = ["orchestrator", "run", "--simulate", "h200x8", "--run-dir", "run"]
        runpy.run_module("orchestrator", run_name="__main__", alter_sys=True)
        """
    )
    done = _python(code, tmp_path)

    assert done.returncode == 0, done.stderr
    assert done.stderr.endswith("hook ran\n")
    assert "Startup ready" in done.stdout
    assert done.stdout.endswith("\n")


_HOLD = """
import os, signal, threading
from orchestrator.cli._output import hold_stops
release = threading.Event()
worker = threading.Thread(target=release.wait)
worker.start()
print("with a thread running:", hold_stops(), flush=True)
release.set()
worker.join()
answers = []
other = threading.Thread(target=lambda: answers.append(hold_stops()), daemon=True)
other.start()
other.join()
print("off the main thread:", answers[0], signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
# A daemon still there takes a stop the main thread does not.
threading.Thread(target=threading.Event().wait, daemon=True).start()
print("on the main thread:", hold_stops(), flush=True)
os.kill(os.getpid(), signal.SIGTERM)
print("after SIGTERM", flush=True)
"""


def test_stops_are_held_on_the_main_thread_once_no_other_thread_runs(tmp_path: Path) -> None:
    done = _python(_HOLD, tmp_path)

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "with a thread running: False",
        "off the main thread: True True",
        "on the main thread: True",
        "after SIGTERM",
    ]


def test_a_stop_ends_the_program_when_stops_are_not_held(tmp_path: Path) -> None:
    # The same program, cut where hold_stops declined: the stop acts at once.
    done = _python(
        _HOLD.replace(
            "release.set()",
            'os.kill(os.getpid(), signal.SIGTERM)\nprint("after SIGTERM", flush=True)',
        ),
        tmp_path,
    )

    assert done.returncode == -15
    assert done.stdout.splitlines() == ["with a thread running: False"]


def test_a_reader_that_went_away_leaves_the_exit_status_the_outcome(
    healthy: StoredRun, attention_failure: StoredRun, tmp_path: Path
) -> None:
    # `run ... | head` said 0 for a failed startup, `diff ... | head` that
    # the runs did not differ.
    failed, ready = str(attention_failure.directory), str(healthy.directory)
    for args in (
        ["replay", failed],
        ["replay", "--json", failed],
        ["diff", ready, failed],
        [
            "run",
            "--simulate",
            "h200x8",
            "--inject",
            "attention/FLASH_ATTN=RuntimeError:x",
            "--run-dir",
            "r",
        ],
    ):
        read, write = os.pipe()
        os.close(read)  # gone before the first line
        try:
            done = subprocess.run(
                command(*args), stdout=write, stderr=subprocess.PIPE, text=True,
                cwd=tmp_path, env=environment(), check=False, timeout=120,
            )  # fmt: skip
        finally:
            os.close(write)
        assert done.returncode == 1, (args, done.stderr)
        assert "Traceback" not in done.stderr, done.stderr
