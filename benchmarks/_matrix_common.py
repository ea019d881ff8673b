"""What the reliability matrices (``kill_matrix.py``, ``injection_matrix.py``)
share: a clean environment for launches, reading logs another process
writes, the processes that belong to one run directory, and telling an
uncaught Python traceback on stderr from one the product prints on purpose.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# A launch must not inherit a launcher's rank identity, a collector or a
# grace period from the shell that runs the matrix.
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
_INHERITED_PREFIXES = ("OTEL_", "STARTUP_ORCHESTRATOR_", "TORCHELASTIC_")


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


def cli(*args: str) -> list[str]:
    """The command line of ``python -m orchestrator <args>`` with this
    interpreter."""
    return [sys.executable, "-m", "orchestrator", *args]


# --- logs written by another process --------------------------------------------------


def read_events(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The complete lines of a JSON Lines log that parse as JSON objects, and
    how many complete lines did not (a last line without its newline is
    still being written, or was cut: it is left out and not counted)."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        return [], 0
    complete, _, _ = data.rpartition(b"\n")
    events: list[dict[str, Any]] = []
    bad = 0
    for line in complete.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(record, dict):
            events.append(record)
        else:
            bad += 1
    return events, bad


# --- processes ------------------------------------------------------------------------


def process_state(pid: int) -> str | None:
    """The state letter of ``pid`` (``R``, ``S``, ``Z``...), or ``None``
    when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces or parentheses.
    return stat[stat.rfind(")") + 2 :].split(" ", 1)[0] or None


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def alive(pid: int, marker: str) -> bool:
    """Whether ``pid`` is a live process (a zombie is dead) whose command
    line mentions ``marker`` (so a reused pid does not count)."""
    state = process_state(pid)
    if state is None or state in ("Z", "X", "x"):
        return False
    return marker.encode() in _cmdline(pid)


def _ancestors() -> set[int]:
    """This process and every process above it (a shell whose command line
    names the same directory is never a process of the launch)."""
    found = set()
    pid = os.getpid()
    while pid > 1 and pid not in found:
        found.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat[stat.rfind(")") + 2 :].split()[1])
    return found


def processes_mentioning(marker: str) -> list[int]:
    """Every live process whose command line mentions ``marker`` (a run
    directory: the launcher's and every rank's command line name it),
    except this process and its ancestors."""
    found = []
    needle = marker.encode()
    mine = _ancestors()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in mine:
            continue
        if needle in _cmdline(int(entry)) and alive(int(entry), marker):
            found.append(int(entry))
    return found


def children_of(pid: int) -> list[int]:
    """The child processes of ``pid`` (all its threads' children)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        with contextlib.suppress(OSError):
            found.extend(
                int(p) for p in Path(f"/proc/{pid}/task/{task}/children").read_text().split()
            )
    return found


def environ_of(pid: int) -> dict[str, str] | None:
    """The environment ``pid`` was started with, or ``None`` when it cannot
    be read (gone, a zombie, or not ours)."""
    try:
        data = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    if not data:
        return None
    env = {}
    for item in data.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep:
            env[name.decode(errors="replace")] = value.decode(errors="replace")
    return env


def kill_all(pids: Iterable[int], marker: str, *, wait_s: float = 5.0) -> list[int]:
    """SIGKILL every process of ``pids`` still alive (and mentioning
    ``marker``), plus every other live process mentioning it, and wait for
    them to go. Returns the pids that were killed."""
    targets = {pid for pid in pids if alive(pid, marker)}
    targets.update(processes_mentioning(marker))
    for pid in targets:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and any(alive(pid, marker) for pid in targets):
        time.sleep(0.02)
    return sorted(targets)


# --- stderr ---------------------------------------------------------------------------

#: Lines that start an uncaught Python traceback or crash report. The product
#: prints a traceback on purpose only inside a log record (a WARNING that
#: carries one), and indents every continuation line of a record, so its own
#: tracebacks never start in column 0. Python's top-level handler, the
#: threading hook, ``sys.unraisablehook`` and the fatal-error handler all
#: print from column 0 (an exception group's header is indented by exactly
#: two spaces and a ``+``).
_UNCAUGHT = re.compile(
    r"^(?:Traceback \(most recent call last\):"
    r"|  \+ Exception Group Traceback \(most recent call last\):"
    r"|Exception ignored in"
    r"|Exception in thread"
    r"|Fatal Python error"
    r")"
)


def uncaught_tracebacks(stderr: str) -> list[str]:
    """The first line of every uncaught traceback (or crash report) on
    ``stderr``; empty when it holds only the product's own messages."""
    return [line for line in stderr.splitlines() if _UNCAUGHT.match(line)]


def last_lines(text: str, count: int = 12) -> list[str]:
    """The last ``count`` lines of ``text``."""
    return text.splitlines()[-count:]


def source_state() -> dict[str, Any]:
    """The commit the measured code is at, and the product files that
    differ from it (the figures are of the working tree)."""
    root = Path(__file__).resolve().parent.parent
    state: dict[str, Any] = {"commit": None, "modified": []}
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        state["commit"] = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--", "orchestrator", "events", "exporters"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        state["modified"] = [line[3:] for line in status.splitlines()]
    return state


def provenance(argv: Sequence[str] | None) -> dict[str, Any]:
    """What a results file says of how it was made: the command, when, the
    code (:func:`source_state`) and the machine."""
    return {
        "command": [Path(sys.argv[0]).name, *(argv or sys.argv[1:])],
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "source": source_state(),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
    }
