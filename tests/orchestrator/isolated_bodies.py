"""Step bodies for process-isolation tests.

An isolated body runs in a fresh Python process that imports it by name, so
these live at module level in an importable module.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from events import JsonValue, Outcome
from orchestrator import StepContext, Unavailable


def succeed(ctx: StepContext) -> JsonValue:
    """Return facts only the child knows, to show the result crosses over."""
    return {"pid": os.getpid(), "step": ctx.step, "rank": ctx.identity.rank}


def segfault(ctx: StepContext) -> JsonValue:
    """Dereference address 0."""
    print("about to read address 0", file=sys.stderr, flush=True)
    ctypes.string_at(0)
    return None  # pragma: no cover - the process is dead


def abort(ctx: StepContext) -> JsonValue:
    """Abort the process (SIGABRT)."""
    print("about to abort", file=sys.stderr, flush=True)
    os.abort()


def exit_three(ctx: StepContext) -> JsonValue:
    """Leave with exit code 3, skipping Python's cleanup."""
    print("leaving with code 3", flush=True)  # stdout goes to stderr in the child
    os._exit(3)


def pass_on_the_platform(ctx: StepContext) -> Unavailable:
    """Reject the configuration for the reasons the step's dependency gave."""
    platform = ctx.dependency("platform")
    reasons = (f"platform {platform.outcome.value}", *platform.reasons)
    return Unavailable(outcome=Outcome.INVALID, reasons=reasons)


def talk_and_exit_zero(ctx: StepContext) -> JsonValue:
    """Print thirty numbered lines, then leave with code 0 without answering."""
    for number in range(30):
        print(f"line {number}", file=sys.stderr)
    sys.stderr.flush()
    os._exit(0)


def hang(ctx: StepContext) -> JsonValue:
    """Write the child's pid where the test can find it, then never return."""
    Path(str(ctx.config["pid_file"])).write_text(str(os.getpid()))
    while True:
        time.sleep(60)


def leave_a_helper_behind(ctx: StepContext) -> JsonValue:
    """Start a process that outlives the body holding the child's stdin,
    stdout and stderr (as a library's daemon does), and return at once: the
    helper lives until the run lets go of the child's stdin."""
    subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.buffer.read()"])
    return "returned"


def tell_and_hang(ctx: StepContext) -> JsonValue:
    """Write the child's pid to the test's FIFO, then never return."""
    with open(str(ctx.config["pid_fifo"]), "w") as out:
        out.write(str(os.getpid()))
    threading.Event().wait()
    return None  # pragma: no cover - never returns


def wait_for_the_device(ctx: StepContext) -> JsonValue:
    """Block as a driver call that never returns (see below)."""
    block_in_the_driver(str(ctx.config["ready_fifo"]))
    return None  # pragma: no cover - never returns


def wait_for_the_device_beside_a_helper(ctx: StepContext) -> JsonValue:
    """Start a helper thread that waits too (as a library's watcher does),
    then block as :func:`wait_for_the_device` does."""
    threading.Thread(target=threading.Event().wait, name="helper", daemon=True).start()
    block_in_the_driver(str(ctx.config["ready_fifo"]))
    return None  # pragma: no cover - never returns


def block_in_the_driver(fifo: str) -> None:
    """Write more than a pipe holds to the test's FIFO: once the test has
    read the first byte, the child is here, in a write that never returns."""
    with open(fifo, "wb", buffering=0) as out:
        out.write(b"x" * (16 * 1024 * 1024))


def return_a_set(ctx: StepContext) -> JsonValue:
    """A result that is not JSON."""
    return {"cuda", "rocm"}  # type: ignore[return-value]


def permission_denied(ctx: StepContext) -> JsonValue:
    """A recorded environment failure."""
    raise PermissionError(13, "Permission denied", "/root/.cache/flashinfer")


def kernel_image_missing(ctx: StepContext) -> JsonValue:
    """A programming error that must propagate."""
    raise RuntimeError("CUDA error: no kernel image is available")


def import_flashinfer(ctx: StepContext) -> JsonValue:
    """Import through the run's importer, where a fault may be injected."""
    ctx.import_module("flashinfer")
    return "imported"


def read_child_results(ctx: StepContext) -> JsonValue:
    """Ask for what only the parent process has: the step's children."""
    return len(ctx.child_results())


def print_a_secret_and_exit(ctx: StepContext) -> JsonValue:
    """Print a URL with a password, as a failing client might, and die."""
    print("cannot reach https://:planted-password@hub.example/x", flush=True)
    os._exit(3)


def refuse_the_token(ctx: StepContext) -> JsonValue:
    """A client that quotes the credential it was refused with."""
    raise PermissionError(f"token {ctx.config['token']} was refused")


def wait_for_the_test(ctx: StepContext) -> JsonValue:
    """Block until the test writes to its FIFO (opening a FIFO waits for its
    writer), as a call that does not return while the test looks at it."""
    with open(str(ctx.config["release_fifo"]), "rb") as release:
        release.read(1)
    return "released"
