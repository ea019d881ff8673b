"""Kill matrix: a local launch disrupted at any moment leaves a whole record.

Run from the repository root::

    .venv/bin/python benchmarks/kill_matrix.py [--trials 72] [--seed 9] [--nproc 3]
        [--profile h200x8] [--grace 1] [--out kill-matrix.json]
        [--hang 1:attention/FLASH_ATTN=hang]

With ``--hang SPEC`` every trial is a launch where a rank hangs for real
(the injected fault blocks a thread forever), run with ``--stall 0.5``, and
each signal is sent once the hung rank has recorded where it waits (its
first ``step.stalled``); a rank kind signals the hung rank. Beside the
figures below, each such trial says whether ``explain`` names the function
the rank hung in, and, for a stop (every kind but SIGKILL of the hung rank:
a signal it handles, or its launcher's death), whether the hung rank
recorded where its thread was abandoned. There are no edge trials then.

First one healthy launch (``run --simulate PROFILE --nproc N --grace G``) is
timed from its start to the end of its startup (the last rank's
``run.finished``). Then every trial is a real launch of the same command in
a run directory of its own, disrupted once, at a time drawn uniformly
between 0 and that duration, by one of six kinds (as many trials of each, in
a shuffled order):

    rank-sigkill       SIGKILL one rank (drawn at random)
    launcher-sigkill   SIGKILL the launcher
    launcher-sigint    SIGINT the launcher
    launcher-sigterm   SIGTERM the launcher
    rank-sigint        SIGINT one rank
    rank-sigterm       SIGTERM one rank

A rank that has not been started yet at the drawn time is signalled as soon
as its process exists. Then come twelve *edge* trials (``--no-edges`` skips
them), each kind twice at moments a random time rarely hits: as soon as the
first rank's process exists (the launcher is still starting the others), and
as soon as every rank's process exists (their logs are not open yet); they
are tabled apart. Each trial then waits for the launcher to end, for every
process of the launch to end (at most ``--orphan-window`` seconds after the
launcher), kills whatever is left, and reads the run directory.

What each trial measures (each must be 0):

events lost
    Per rank log: every fatal problem ``events.validate`` finds (a line that
    does not decode other than a torn last line, a sequence gap — so a log
    is always the gapless prefix 0..n of what the rank appended —, an
    event of another run or rank); a first event other than ``run.started``;
    a torn last line, or a log that has events but stops short of
    ``run.finished``, when the launcher saw the rank *exit* (status 0 or 1:
    it was not killed, so it finished what it began); and, from what the
    rank printed while it ran, an outcome line
    (``[rank N] Startup ready.`` / ``failed`` / ``interrupted``, printed
    only after the event is stored) with no ``run.finished`` of that outcome
    in the log.

ranks whose fate is not recorded
    Every rank of the world (0..N-1) must be accounted for by the record,
    judged in this order:

    1. its log ends with ``run.finished`` (the rank said how it ended); else
    2. the manifest has an ``exit_code`` or ``signal`` for it (the launcher
       saw how the process ended); else
    3. the manifest has an entry for it without a pid (the launcher says it
       never started it); else
    4. *nothing of it exists*: no manifest entry, no log file, and no
       process of that rank was ever seen by this script (which watches the
       launcher's children every few milliseconds and reads each one's
       ``RANK``). This is a rank the launcher never started because it died
       first: there is no fate to record, and the manifest's world size (or
       a peer's ``run.started``) is what makes the run ``incomplete``.

    Anything else is unrecorded — e.g. the manifest has the rank's pid but no
    end (the launcher died) and its log is missing, empty or stops short of
    ``run.finished``: nothing says how that process ended. A process that
    was seen but appears in neither the manifest nor any log is also
    unrecorded (rule 4 fails for its rank). The rule is strict on purpose:
    a report can only say ``ready`` wrongly about a rank nothing accounts for.

wrong verdicts
    ``replay RUN_DIR --json`` must exit 0 or 1 (2 with a one-line error when
    the launcher died before creating the run directory), print no
    traceback, and say ``ready`` exactly when every rank of the world has a
    log ending in ``run.finished`` with outcome ready (exit 0 exactly then).
    It must never say ``ready`` when the disruption landed before the end:
    the signal was delivered to a live process while the target rank (for
    the rank kinds) or some rank (for the launcher kinds) had not yet
    stored its ``run.finished`` (compared by wall clock, after the fact).
    ``validate RUN_DIR`` must exit 0 or 1 without a traceback.

orphans
    Processes of the launch (the launcher's children seen while it lived,
    pids in the manifest and in every ``run.started``, and any process whose
    command line names the run directory) alive — not zombies —
    ``--orphan-window`` seconds (5) after the launcher died.

Also counted, not part of the must-be-zero figures: uncaught Python
tracebacks on the launch's stderr (ranks share the launcher's stderr); a
``replay`` that gives no report (exit 1 with a one-line error instead of the
JSON document, e.g. when no rank had opened its log); the report's
outcomes; and how long ranks outlived their launcher.

The launcher is started in a session of its own with the default SIGINT
and SIGTERM dispositions, whatever this script inherited (a background job
of a non-interactive shell ignores SIGINT, and a launcher would inherit
that until it installs its own handlers).

The script prints a table per kind and totals, writes every trial to
``--out`` as JSON, and keeps the run directories of trials with a non-zero
figure (deleting the others). Ctrl-C kills every process it started.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if __package__:
    from . import _matrix_common as common
else:
    import _matrix_common as common

from events import validate

#: The kinds of disruption: (what is signalled, the signal).
KINDS: Mapping[str, tuple[str, signal.Signals]] = {
    "rank-sigkill": ("rank", signal.SIGKILL),
    "launcher-sigkill": ("launcher", signal.SIGKILL),
    "launcher-sigint": ("launcher", signal.SIGINT),
    "launcher-sigterm": ("launcher", signal.SIGTERM),
    "rank-sigint": ("rank", signal.SIGINT),
    "rank-sigterm": ("rank", signal.SIGTERM),
}

#: Seconds after the launcher ends by which every process of the launch
#: must be gone.
ORPHAN_WINDOW_S = 5.0

#: Upper bound for one launch (a disrupted one ends within two grace
#: periods of the disruption, plus its report; a stuck one is a finding).
LAUNCH_DEADLINE_S = 120.0

#: How often the launcher's children are looked at while it lives.
WATCH_INTERVAL_S = 0.005

#: How often a log is read while waiting for an event in it.
POLL_INTERVAL_S = 0.01

_RUN_ID_VARIABLE = "STARTUP_ORCHESTRATOR_RUN_ID"
_OUTCOME_LINE = re.compile(r"^(?:INFO|ERROR)\s+\[rank (\d+)\] Startup (ready\.|failed|interrupted)")
_PRINTED_OUTCOME = {"ready.": "ready", "failed": "failed", "interrupted": "interrupted"}


# --- when to disrupt ------------------------------------------------------------------


#: The pseudo-event of a :class:`Trigger` that fires as soon as a rank's
#: process exists (it has exec'd; its log is not open yet).
SPAWNED = "process.spawned"


@dataclass(frozen=True)
class Trigger:
    """When a trial's signal is sent: ``after_s`` seconds after the launch
    started, or as soon as the log of rank ``rank`` (of every rank, when
    ``rank`` is ``None``) holds an event of type ``event`` (and of step
    ``step``, when given) — the deterministic form the test suite uses.
    ``event`` :data:`SPAWNED` waits for the rank's process instead."""

    after_s: float | None = None
    rank: int | None = 0
    event: str | None = None
    step: str | None = None

    def describe(self) -> str:
        if self.event is None:
            return f"+{self.after_s or 0.0:.3f} s"
        who = "every rank" if self.rank is None else f"rank {self.rank}"
        return f"{who} {self.event}" + (f" {self.step}" if self.step else "")

    def matches(self, event: Mapping[str, Any]) -> bool:
        return event.get("type") == self.event and (
            self.step is None or event.get("step") == self.step
        )

    def fired(self, run_dir: Path, nproc: int, spawned: Callable[[int], bool]) -> bool:
        """Whether the awaited event is in the log(s) (or the awaited
        processes exist) now."""
        ranks = range(nproc) if self.rank is None else [self.rank]
        if self.event == SPAWNED:
            return all(spawned(r) for r in ranks)
        return all(
            any(self.matches(event) for event in common.read_events(run_dir / f"rank-{r}.jsonl")[0])
            for r in ranks
        )


# --- watching the launch --------------------------------------------------------------


class _Watcher(threading.Thread):
    """Notes every child of the launcher while it lives, and the rank each
    one runs (its ``RANK``, readable once it has exec'd)."""

    def __init__(self, launcher_pid: int, run_id_marker: str) -> None:
        super().__init__(daemon=True)
        self.launcher_pid = launcher_pid
        self.marker = run_id_marker
        self.ranks: dict[int, int | None] = {}  # pid -> rank (None: not known yet)
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.is_set():
            state = common.process_state(self.launcher_pid)
            self.look()
            if state is None or state == "Z":
                break
            time.sleep(WATCH_INTERVAL_S)

    def look(self) -> None:
        for pid in common.children_of(self.launcher_pid):
            with self._lock:
                self.ranks.setdefault(pid, None)
        with self._lock:
            unknown = [pid for pid, rank in self.ranks.items() if rank is None]
        for pid in unknown:
            env = common.environ_of(pid)
            if env is not None and "RANK" in env and env.get(_RUN_ID_VARIABLE):
                with contextlib.suppress(ValueError), self._lock:
                    self.ranks[pid] = int(env["RANK"])

    def stop(self) -> None:
        self._stopping.set()
        self.join(timeout=5)
        self.look()

    def pid_of(self, rank: int) -> int | None:
        with self._lock:
            return next((pid for pid, r in self.ranks.items() if r == rank), None)

    def snapshot(self) -> dict[int, int | None]:
        with self._lock:
            return dict(self.ranks)


# --- one trial ------------------------------------------------------------------------


@dataclass
class Trial:
    """Everything one trial saw and judged (JSON-ready through ``asdict``)."""

    index: int
    kind: str
    trigger: str
    target_rank: int | None
    nproc: int
    profile: str
    run_dir: str
    injected: list[str] = field(default_factory=list)
    edge: bool = False
    # the disruption
    delivered: bool = False
    sent_after_s: float | None = None
    phase: str = ""
    landed: bool = False
    # the launch
    launcher_exit: int | None = None
    launcher_hung: bool = False
    launcher_lifetime_s: float | None = None
    ranks_outlived_launcher_s: float = 0.0
    launch_tracebacks: list[str] = field(default_factory=list)
    # the record
    manifest: bool = False
    rank_fates: dict[str, str] = field(default_factory=dict)
    untracked_processes: list[int] = field(default_factory=list)
    replay_exit: int | None = None
    replay_outcome: str | None = None
    replay_root_cause: str | None = None
    replay_error: str | None = None
    validate_exit: int | None = None
    torn_tails: int = 0
    # the figures (each must be 0)
    events_lost: int = 0
    unrecorded_fates: int = 0
    orphans: int = 0
    wrong_verdicts: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (
            self.events_lost or self.unrecorded_fates or self.orphans or self.wrong_verdicts
        )


def launch_command(
    *,
    profile: str,
    nproc: int,
    run_dir: Path,
    grace_s: float,
    inject: Sequence[str] = (),
    stall_s: float | None = None,
) -> list[str]:
    """``python -m orchestrator run --simulate PROFILE --nproc N ...``."""
    return common.cli(
        "run",
        "--simulate",
        profile,
        "--nproc",
        str(nproc),
        "--run-dir",
        str(run_dir),
        "--grace",
        f"{grace_s:g}",
        *(part for spec in inject for part in ("--inject", spec)),
        *(("--stall", f"{stall_s:g}") if stall_s is not None else ()),
    )


def run_trial(
    kind: str,
    trigger: Trigger,
    *,
    workdir: Path,
    index: int = 0,
    nproc: int = 3,
    profile: str = "h200x8",
    grace_s: float = 1.0,
    target_rank: int = 0,
    orphan_window_s: float = ORPHAN_WINDOW_S,
    launch_deadline_s: float = LAUNCH_DEADLINE_S,
    inject: Sequence[str] = (),
    stall_s: float | None = None,
    edge: bool = False,
) -> Trial:
    """Launch ``run --simulate PROFILE --nproc N``, disrupt it once as
    ``kind`` says when ``trigger`` fires, and judge what it left (see the
    module docstring). ``inject`` adds ``--inject`` specs (a ``hang`` holds
    the start in a given step until the signal comes). Every process of
    the launch is gone when this returns."""
    target, signum = KINDS[kind]
    trial_dir = workdir / f"trial-{index:03d}-{kind}"
    trial_dir.mkdir(parents=True, exist_ok=False)
    run_dir = trial_dir / "run"
    marker = str(run_dir)
    trial = Trial(
        index=index,
        kind=kind,
        trigger=trigger.describe(),
        target_rank=target_rank if target == "rank" else None,
        nproc=nproc,
        profile=profile,
        run_dir=marker,
        injected=list(inject),
        edge=edge,
    )
    args = launch_command(
        profile=profile,
        nproc=nproc,
        run_dir=run_dir,
        grace_s=grace_s,
        inject=inject,
        stall_s=stall_s,
    )
    stderr_path = trial_dir / "launcher.stderr"
    with (trial_dir / "launcher.stdout").open("wb") as out, stderr_path.open("wb") as err:
        started = time.monotonic()
        launcher = subprocess.Popen(
            args,
            cwd=trial_dir,
            env=common.environment(),
            stdout=out,
            stderr=err,
            start_new_session=True,
            preexec_fn=_default_stop_signals,
        )
    watcher = _Watcher(launcher.pid, marker)
    watcher.start()
    send_wall_ns: int | None = None
    known: set[int] = {launcher.pid}
    try:
        send_wall_ns = _disrupt(
            trial,
            launcher,
            watcher,
            run_dir,
            (target, signum, target_rank),
            trigger,
            started,
            launch_deadline_s,
        )
        try:
            launcher.wait(timeout=max(1.0, launch_deadline_s - (time.monotonic() - started)))
        except subprocess.TimeoutExpired:
            trial.launcher_hung = True
            trial.problems.append(f"the launcher was still running {launch_deadline_s:g} s in")
        ended = time.monotonic()
        trial.launcher_lifetime_s = round(ended - started, 3)
        trial.launcher_exit = launcher.returncode
        watcher.stop()
        known |= set(watcher.snapshot())
        known |= _recorded_pids(run_dir, nproc)
        if not trial.launcher_hung:
            left, lingered = _wait_for_the_end(known, marker, ended, orphan_window_s)
            trial.ranks_outlived_launcher_s = round(lingered, 3)
            if left:
                trial.orphans = len(left)
                trial.problems.append(
                    f"{len(left)} process(es) alive {orphan_window_s:g} s after the launcher "
                    f"ended: {_describe_pids(left, watcher.snapshot())}"
                )
    finally:
        watcher.stop()
        known |= set(watcher.snapshot()) | _recorded_pids(run_dir, nproc)
        common.kill_all(known, marker)
        if launcher.poll() is None:
            launcher.kill()
        launcher.wait()
    _judge(trial, run_dir, stderr_path, watcher.snapshot(), send_wall_ns)
    return trial


def _default_stop_signals() -> None:
    """In the launcher's process, before it runs: SIGINT and SIGTERM do
    what they do by default, whatever this process inherited (a background
    job of a non-interactive shell ignores SIGINT, and the launcher would
    inherit that until it installs its own handlers)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _disrupt(
    trial: Trial,
    launcher: subprocess.Popen[bytes],
    watcher: _Watcher,
    run_dir: Path,
    disruption: tuple[str, signal.Signals, int],
    trigger: Trigger,
    started: float,
    deadline_s: float,
) -> int | None:
    """Wait for ``trigger``, then send the signal to the target (the
    launcher, or a rank). Returns the wall-clock time it was sent, or
    ``None`` when it could not be."""
    target, signum, target_rank = disruption
    deadline = started + deadline_s
    if trigger.event is None:
        time.sleep(max(0.0, started + (trigger.after_s or 0.0) - time.monotonic()))
    else:

        def spawned(rank: int) -> bool:
            return watcher.pid_of(rank) is not None

        while not trigger.fired(run_dir, trial.nproc, spawned):
            if launcher.poll() is not None or time.monotonic() > deadline:
                trial.problems.append(f"the launch ended before {trigger.describe()}")
                return None
            time.sleep(0.001 if trigger.event == SPAWNED else POLL_INTERVAL_S)
    pid: int | None
    if target == "launcher":
        pid = launcher.pid
    else:
        # A rank not started yet is signalled as soon as it exists.
        while (pid := watcher.pid_of(target_rank) or _manifest_pid(run_dir, target_rank)) is None:
            if launcher.poll() is not None or time.monotonic() > deadline:
                trial.problems.append(f"rank {target_rank} never started; nothing was sent")
                return None
            time.sleep(0.001)
    trial.phase = _phase(run_dir, trial.nproc, target, target_rank, watcher)
    if common.process_state(pid) in (None, "Z"):
        trial.phase += " (target already ended)"
        return None
    sent = time.time_ns()
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        trial.phase += " (target already ended)"
        return None
    trial.delivered = True
    trial.sent_after_s = round(time.monotonic() - started, 3)
    return sent


def _phase(run_dir: Path, nproc: int, target: str, rank: int, watcher: _Watcher) -> str:
    """Where the target (a rank, or the least advanced rank for the
    launcher) stood when the signal went: ``no ranks``, ``before log``,
    ``in process_group``, ``in probes``, ``finished``."""
    ranks = [rank] if target == "rank" else list(range(nproc))
    stages = []
    for r in ranks:
        events, _ = common.read_events(run_dir / f"rank-{r}.jsonl")
        if watcher.pid_of(r) is None and _manifest_pid(run_dir, r) is None and not events:
            stages.append((0, "not started"))
        elif not events:
            stages.append((1, "before log"))
        elif events[-1].get("type") == "run.finished":
            stages.append((4, "finished"))
        elif any(
            e.get("type") in ("step.succeeded", "step.failed") and e.get("step") == "process_group"
            for e in events
        ):
            stages.append((3, "in probes"))
        else:
            stages.append((2, "in process_group"))
    return min(stages)[1]


def _manifest(run_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((run_dir / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _manifest_pid(run_dir: Path, rank: int) -> int | None:
    manifest = _manifest(run_dir)
    for entry in manifest["ranks"] if manifest else []:
        if entry.get("rank") == rank and isinstance(entry.get("pid"), int):
            pid: int = entry["pid"]
            return pid
    return None


def _recorded_pids(run_dir: Path, nproc: int) -> set[int]:
    """Pids the manifest and the logs' ``run.started`` events name."""
    pids: set[int] = set()
    manifest = _manifest(run_dir)
    for entry in manifest["ranks"] if manifest else []:
        if isinstance(entry.get("pid"), int):
            pids.add(entry["pid"])
    if manifest and isinstance(manifest.get("launcher", {}).get("pid"), int):
        pids.add(manifest["launcher"]["pid"])
    for rank in range(nproc):
        events, _ = common.read_events(run_dir / f"rank-{rank}.jsonl")
        if events and isinstance(events[0].get("pid"), int):
            pids.add(events[0]["pid"])
    return pids


def _wait_for_the_end(
    pids: set[int], marker: str, launcher_ended: float, window_s: float
) -> tuple[list[int], float]:
    """Wait until no process of the launch is alive, for at most
    ``window_s`` seconds after the launcher ended. Returns those still alive
    then, and how long after the launcher the last one went."""
    while True:
        live = {pid for pid in pids if common.alive(pid, marker)}
        live.update(common.processes_mentioning(marker))
        now = time.monotonic()
        if not live:
            return [], max(0.0, now - launcher_ended)
        if now >= launcher_ended + window_s:
            return sorted(live), now - launcher_ended
        time.sleep(0.05)


def _describe_pids(pids: Iterable[int], ranks: Mapping[int, int | None]) -> str:
    return ", ".join(
        f"pid {pid}" + (f" (rank {ranks[pid]})" if ranks.get(pid) is not None else "")
        for pid in pids
    )


# --- judging the record ---------------------------------------------------------------


def _judge(
    trial: Trial,
    run_dir: Path,
    stderr_path: Path,
    seen: Mapping[int, int | None],
    send_wall_ns: int | None,
) -> None:
    stderr = stderr_path.read_text(encoding="utf-8", errors="replace")
    trial.launch_tracebacks = common.uncaught_tracebacks(stderr)
    manifest = _manifest(run_dir)
    trial.manifest = manifest is not None
    entries = {
        entry["rank"]: entry
        for entry in (manifest or {}).get("ranks", [])
        if isinstance(entry, dict) and isinstance(entry.get("rank"), int)
    }
    printed = _printed_outcomes(stderr)
    finished_at: dict[int, int | None] = {}
    ready_everywhere = True
    recorded_pids: set[int] = {e["pid"] for e in entries.values() if isinstance(e.get("pid"), int)}
    for rank in range(trial.nproc):
        path = run_dir / f"rank-{rank}.jsonl"
        events, undecodable = common.read_events(path)
        if events and isinstance(events[0].get("pid"), int):
            recorded_pids.add(events[0]["pid"])
        last = events[-1] if events else None
        finished = last if last is not None and last.get("type") == "run.finished" else None
        finished_at[rank] = finished.get("wall_ns") if finished else None
        if finished is None or finished.get("outcome") != "ready":
            ready_everywhere = False
        entry = entries.get(rank)
        exited = entry is not None and entry.get("exit_code") is not None
        trial.events_lost += _lost_events(trial, rank, path, events, undecodable, exited, printed)
        observed = [pid for pid, r in seen.items() if r == rank]
        fate = _fate(path, events, entry, observed)
        trial.rank_fates[str(rank)] = fate[1]
        if not fate[0]:
            trial.unrecorded_fates += 1
            trial.problems.append(f"rank {rank}: fate not recorded: {fate[1]}")
    untracked = sorted(pid for pid, r in seen.items() if r is not None and pid not in recorded_pids)
    trial.untracked_processes = untracked
    if untracked:
        trial.problems.append(
            f"rank process(es) in neither the manifest nor a log: {_describe_pids(untracked, seen)}"
        )

    if send_wall_ns is not None:
        if trial.kind.startswith("rank"):
            candidates = [trial.target_rank or 0]
        else:
            candidates = list(range(trial.nproc))
        trial.landed = any(
            finished_at.get(rank) is None or (finished_at[rank] or 0) > send_wall_ns
            for rank in candidates
        )
    _judge_views(trial, run_dir, ready_everywhere)


def _printed_outcomes(stderr: str) -> dict[int, set[str]]:
    """rank -> the outcomes it printed while it ran."""
    printed: dict[int, set[str]] = collections.defaultdict(set)
    for line in stderr.splitlines():
        match = _OUTCOME_LINE.match(line)
        if match:
            printed[int(match.group(1))].add(_PRINTED_OUTCOME[match.group(2)])
    return printed


def _lost_events(
    trial: Trial,
    rank: int,
    path: Path,
    events: Sequence[Mapping[str, Any]],
    undecodable: int,
    exited: bool,
    printed: Mapping[int, set[str]],
) -> int:
    """The events of one rank's log that are missing or damaged."""
    lost = 0
    if path.is_file():
        for problem in validate(path):
            if problem.fatal:
                lost += 1
                trial.problems.append(f"rank {rank}: {problem.kind}: {problem}")
            elif problem.kind == "torn_tail":
                trial.torn_tails += 1
                if exited:
                    lost += 1
                    trial.problems.append(f"rank {rank} exited yet its log is torn: {problem}")
    elif undecodable:
        lost += undecodable
    if events and events[0].get("type") != "run.started":
        lost += 1
        trial.problems.append(f"rank {rank}: first event is {events[0].get('type')}")
    finished = [i for i, e in enumerate(events) if e.get("type") == "run.finished"]
    if finished and finished[0] != len(events) - 1:
        lost += 1
        trial.problems.append(f"rank {rank}: events after run.finished")
    outcome = events[-1].get("outcome") if finished else None
    if exited and events and not finished:
        lost += 1
        trial.problems.append(f"rank {rank} exited, yet its log stops short of run.finished")
    for said in printed.get(rank, set()):
        if said != outcome:
            lost += 1
            trial.problems.append(
                f"rank {rank} printed 'Startup {said}' but its log ends with "
                f"{'run.finished ' + str(outcome) if finished else 'no run.finished'}"
            )
    return lost


def _fate(
    path: Path,
    events: Sequence[Mapping[str, Any]],
    entry: Mapping[str, Any] | None,
    observed: Sequence[int],
) -> tuple[bool, str]:
    """Whether the record accounts for a rank (the rules of the module
    docstring), and how."""
    if events and events[-1].get("type") == "run.finished":
        return True, f"log: {events[-1].get('outcome')}"
    if entry is not None and entry.get("signal"):
        return True, f"manifest: killed by {entry['signal']}"
    if entry is not None and entry.get("exit_code") is not None:
        return True, f"manifest: exit {entry['exit_code']}"
    if entry is not None and entry.get("pid") is None:
        return True, f"manifest: {entry.get('stopped_by_launcher') or 'never started'}"
    if entry is None and not path.exists() and not observed:
        return True, "never started (no manifest entry, no log, no process)"
    known = []
    if entry is not None:
        known.append(f"manifest: pid {entry.get('pid')}, no end")
    elif observed:
        known.append(f"process(es) {', '.join(map(str, observed))} seen, not in the manifest")
    if not path.exists():
        known.append("no log")
    elif not events:
        known.append("empty log")
    else:
        last = events[-1]
        known.append(f"log stops at seq {last.get('seq')} ({last.get('type')} {last.get('step')})")
    return False, "; ".join(known)


def _judge_views(trial: Trial, run_dir: Path, ready_everywhere: bool) -> None:
    replay = subprocess.run(
        common.cli("replay", str(run_dir), "--json"),
        env=common.environment(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    trial.replay_exit = replay.returncode
    tracebacks = common.uncaught_tracebacks(replay.stderr)
    if tracebacks:
        trial.wrong_verdicts += 1
        trial.problems.append(f"replay printed a traceback: {common.last_lines(replay.stderr, 3)}")
    if not run_dir.exists():
        if replay.returncode != 2 or len(replay.stderr.strip().splitlines()) != 1:
            trial.wrong_verdicts += 1
            trial.problems.append(
                f"replay of a missing run directory: exit {replay.returncode}, "
                f"stderr {common.last_lines(replay.stderr, 3)}"
            )
        trial.replay_outcome = "(no run directory)"
    elif replay.returncode not in (0, 1):
        trial.wrong_verdicts += 1
        trial.problems.append(
            f"replay exited {replay.returncode}: {common.last_lines(replay.stderr, 3)}"
        )
    else:
        try:
            document = json.loads(replay.stdout)
        except ValueError:
            document = None
            error = replay.stderr.strip().splitlines()
            if replay.returncode == 1 and len(error) == 1 and not tracebacks:
                # Not a wrong verdict (exit 1, one line), but no report either.
                trial.replay_outcome = "(no report)"
                trial.replay_error = error[0]
            else:
                trial.wrong_verdicts += 1
                trial.problems.append(
                    f"replay --json printed no JSON document: {common.last_lines(replay.stderr, 3)}"
                )
        if isinstance(document, dict):
            outcome = document.get("outcome")
            trial.replay_outcome = str(outcome)
            cause = document.get("root_cause") or {}
            if cause:
                trial.replay_root_cause = (
                    cause.get("description")
                    or f"rank {cause.get('rank')}, step {cause.get('step')}"
                )
            if (outcome == "ready") != ready_everywhere:
                trial.wrong_verdicts += 1
                trial.problems.append(
                    f"replay says {outcome} while "
                    + ("every" if ready_everywhere else "not every")
                    + " rank's log ends ready"
                )
            if outcome == "ready" and trial.landed:
                trial.wrong_verdicts += 1
                trial.problems.append("replay says ready although the disruption landed first")
            if (replay.returncode == 0) != (outcome == "ready"):
                trial.wrong_verdicts += 1
                trial.problems.append(f"replay exit {replay.returncode} with outcome {outcome}")
    if run_dir.exists():
        checked = subprocess.run(
            common.cli("validate", str(run_dir)),
            env=common.environment(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        trial.validate_exit = checked.returncode
        if checked.returncode not in (0, 1) or common.uncaught_tracebacks(checked.stderr):
            trial.wrong_verdicts += 1
            trial.problems.append(
                f"validate exited {checked.returncode}: {common.last_lines(checked.stderr, 3)}"
            )


# --- the matrix -----------------------------------------------------------------------


def healthy_duration(workdir: Path, *, nproc: int, profile: str, grace_s: float) -> float:
    """Seconds from a healthy launch's start to the end of its startup (the
    last rank's ``run.finished``); the launch must be ready."""
    run_dir = workdir / "healthy" / "run"
    started_ns = time.time_ns()
    completed = subprocess.run(
        launch_command(profile=profile, nproc=nproc, run_dir=run_dir, grace_s=grace_s),
        env=common.environment(),
        capture_output=True,
        text=True,
        timeout=LAUNCH_DEADLINE_S,
        check=False,
    )
    if completed.returncode != 0:
        raise SystemExit(
            f"the healthy launch failed (exit {completed.returncode}):\n{completed.stderr}"
        )
    ends = [common.read_events(run_dir / f"rank-{rank}.jsonl")[0][-1] for rank in range(nproc)]
    shutil.rmtree(run_dir.parent, ignore_errors=True)
    return max(int(event["wall_ns"]) for event in ends) / 1e9 - started_ns / 1e9


def plan(
    trials: int, nproc: int, healthy_s: float, rng: random.Random
) -> list[tuple[str, float, int]]:
    """``(kind, delay, target rank)`` for each trial: the kinds as evenly as
    ``trials`` allows, shuffled; delays uniform over the healthy start."""
    kinds = [kind for _ in range(trials // len(KINDS) + 1) for kind in KINDS][:trials]
    rng.shuffle(kinds)
    return [(kind, rng.uniform(0.0, healthy_s), rng.randrange(nproc)) for kind in kinds]


def edge_trials(nproc: int) -> list[tuple[str, Trigger, int, bool]]:
    """Each kind twice at the moments a random time rarely hits: as soon as
    the first rank's process exists (the launcher is still starting the
    others), and as soon as every rank's process exists (no log is open
    yet). A rank kind signals the rank that just started."""
    return [
        (kind, Trigger(rank=rank, event=SPAWNED), 0 if rank == 0 else nproc - 1, True)
        for rank in (0, None)
        for kind in KINDS
    ]


def summarise(trials: Sequence[Trial]) -> str:
    """The per-kind table and totals."""
    header = (
        f"{'KIND':<18}{'TRIALS':>7}{'LANDED':>8}{'LOST':>6}{'UNRECORDED':>12}{'ORPHANS':>9}"
        f"{'WRONG':>7}{'NO REPORT':>11}{'TRACEBACKS':>12}  REPORTS"
    )
    lines = [header]
    for kind in [*KINDS, "total"]:
        group = [t for t in trials if kind in ("total", t.kind)]
        if not group:
            continue
        outcomes = collections.Counter(t.replay_outcome or "?" for t in group)
        lines.append(
            f"{kind:<18}{len(group):>7}{sum(t.landed for t in group):>8}"
            f"{sum(t.events_lost for t in group):>6}{sum(t.unrecorded_fates for t in group):>12}"
            f"{sum(t.orphans for t in group):>9}{sum(t.wrong_verdicts for t in group):>7}"
            f"{sum(t.replay_error is not None for t in group):>11}"
            f"{sum(bool(t.launch_tracebacks) for t in group):>12}  "
            + ", ".join(f"{name} {count}" for name, count in sorted(outcomes.items()))
        )
    return "\n".join(lines)


def _phases(trials: Sequence[Trial]) -> str:
    lines = []
    for kind in KINDS:
        counts = collections.Counter(t.phase for t in trials if t.kind == kind)
        if counts:
            lines.append(f"  {kind:<18}" + ", ".join(f"{p} {c}" for p, c in sorted(counts.items())))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=72, help="number of trials (default 72)")
    parser.add_argument("--seed", type=int, default=9, help="random seed (default 9)")
    parser.add_argument("--nproc", type=int, default=3, help="ranks per launch (default 3)")
    parser.add_argument("--profile", default="h200x8", help="simulated host (default h200x8)")
    parser.add_argument("--grace", type=float, default=1.0, help="launcher --grace (default 1)")
    parser.add_argument(
        "--orphan-window", type=float, default=ORPHAN_WINDOW_S, help="seconds (default 5)"
    )
    parser.add_argument("--out", type=Path, help="write every trial to this JSON file")
    parser.add_argument("--workdir", type=Path, help="where the run directories go")
    parser.add_argument("--keep", action="store_true", help="keep every run directory")
    parser.add_argument(
        "--no-edges",
        dest="edges",
        action="store_false",
        help="skip the edge trials (each kind as the first rank starts, and once every "
        "rank has started but before any log is open)",
    )
    parser.add_argument("--quiet", action="store_true", help="no line per trial")
    parser.add_argument(
        "--hang",
        metavar="SPEC",
        help="a rank hangs for real in every trial (RANK:STEP=hang); signals are sent once it "
        "has recorded where it waits",
    )
    options = parser.parse_args(argv)
    if options.trials < 1 or options.nproc < 1 or not options.grace > 0:
        parser.error("--trials and --nproc must be at least 1, --grace above 0")

    workdir = options.workdir or Path(tempfile.mkdtemp(prefix="kill-matrix-"))
    workdir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(options.seed)
    results: list[Trial] = []
    began = time.monotonic()
    try:
        healthy_s = healthy_duration(
            workdir, nproc=options.nproc, profile=options.profile, grace_s=options.grace
        )
        print(
            f"healthy launch: {healthy_s:.2f} s ({options.profile}, {options.nproc} ranks); "
            f"{options.trials} trials, seed {options.seed}, run directories in {workdir}",
            flush=True,
        )
        hang = _hang(options.hang) if options.hang else None
        if hang is None:
            trials = [
                (kind, Trigger(after_s=delay), rank, False)
                for kind, delay, rank in plan(options.trials, options.nproc, healthy_s, rng)
            ]
            if options.edges:
                trials += edge_trials(options.nproc)
        else:
            hung_rank, hung_step = hang
            stalled = Trigger(rank=hung_rank, event="step.stalled", step=hung_step)
            trials = [
                (kind, stalled, hung_rank, False)
                for kind, _delay, _rank in plan(options.trials, options.nproc, healthy_s, rng)
            ]
        hangs: list[dict[str, Any]] = []
        for index, (kind, trigger, rank, edge) in enumerate(trials):
            trial = run_trial(
                kind,
                trigger,
                workdir=workdir,
                index=index,
                nproc=options.nproc,
                profile=options.profile,
                grace_s=options.grace,
                target_rank=rank,
                orphan_window_s=options.orphan_window,
                inject=[options.hang] if hang is not None else (),
                stall_s=HUNG_STALL_S if hang is not None else None,
                edge=edge,
            )
            results.append(trial)
            if hang is not None:
                hangs.append(_judge_hang(trial, *hang))
            if trial.clean and not options.keep:
                shutil.rmtree(Path(trial.run_dir).parent, ignore_errors=True)
            if not options.quiet:
                _print_trial(trial)
    except KeyboardInterrupt:
        print("interrupted; killing what is left", file=sys.stderr)
        common.kill_all((), f"{workdir}/trial-")
        raise
    finally:
        common.kill_all((), f"{workdir}/trial-")
    elapsed = time.monotonic() - began

    timed = [t for t in results if not t.edge]
    edges = [t for t in results if t.edge]
    if hang is None:
        print(f"\nat random times (0 to {healthy_s:.2f} s):")
    else:
        print(f"\nonce rank {hang[0]} recorded where it waits in {hang[1]}:")
    print(summarise(timed))
    print("\nwhere the signal landed (the target, or the least advanced rank):")
    print(_phases(timed))
    if edges:
        print("\nat the edges (as the first rank starts; every rank started, no log open):")
        print(summarise(edges))
        print(_phases(edges))
    if hangs:
        print("\nwith a rank hung in " + options.hang + ":")
        print(_hang_table(hangs))
    problems = [t for t in results if t.problems]
    if problems:
        print("\nproblems (figures that must be 0):")
        for t in problems:
            for problem in t.problems:
                print(f"  #{t.index} {t.kind} at {t.trigger} ({t.phase}): {problem}")
    remarks = [t for t in results if t.launch_tracebacks or t.replay_error]
    if remarks:
        print("\nremarks (not counted above):")
        for t in remarks:
            where = f"  #{t.index} {t.kind} at {t.trigger} ({t.phase}):"
            if t.launch_tracebacks:
                print(f"{where} {len(t.launch_tracebacks)} uncaught traceback(s) on the stderr")
            if t.replay_error:
                print(f"{where} replay gave no report: {t.replay_error}")
    print(f"\n{len(results)} trials in {elapsed:.0f} s")
    if options.out:
        options.out.write_text(
            json.dumps(
                {
                    **common.provenance(argv),
                    "healthy_s": round(healthy_s, 3),
                    "seed": options.seed,
                    "nproc": options.nproc,
                    "profile": options.profile,
                    "grace_s": options.grace,
                    "elapsed_s": round(elapsed, 1),
                    "trials": [asdict(t) for t in results],
                    "hangs": hangs,
                },
                indent=2,
            )
            + "\n"
        )
        print(f"wrote {options.out}")
    with contextlib.suppress(OSError):
        workdir.rmdir()  # only when every trial's directory was removed
    clean = all(t.clean for t in results)
    return 0 if clean else 1


#: The stall threshold of the hung launches.
HUNG_STALL_S = 0.5


def _hang(spec: str) -> tuple[int, str]:
    """The hung rank and step of ``RANK:STEP=hang``."""
    where, _, fault = spec.partition("=")
    rank, _, step = where.rpartition(":")
    if fault != "hang" or not rank.isdigit() or not step:
        raise SystemExit(f"--hang: expected RANK:STEP=hang, got {spec!r}")
    return int(rank), step


def _judge_hang(trial: Trial, rank: int, step: str) -> dict[str, Any]:
    """What the record of a trial with a hung rank says of the hang: whether
    ``explain`` names where the hung step waited, and whether the hung rank
    recorded the abandoned thread's stack (a stop: every kind but a SIGKILL
    of the hung rank)."""
    run_dir = Path(trial.run_dir)
    explained = subprocess.run(
        common.cli("explain", str(run_dir)), capture_output=True, text=True, timeout=120
    )
    events, _ = common.read_events(run_dir / f"rank-{rank}.jsonl")
    abandoned = any(
        e.get("type") == "step.stalled" and e.get("step") == step and e.get("why") == "abandoned"
        for e in events
    )
    return {
        "index": trial.index,
        "kind": trial.kind,
        "named": "waiting in fire (_faults.py:" in explained.stdout,
        "abandoned_recorded": abandoned,
        # Every kind but a SIGKILL of the hung rank itself stops it: a
        # signal it handles, or its launcher's death.
        "stopped": trial.kind != "rank-sigkill",
    }


def _hang_table(hangs: Sequence[Mapping[str, Any]]) -> str:
    """Per kind: trials, how many name the hang in explain, and (for the
    stops) how many recorded the abandoned stack."""
    lines = [f"{'KIND':<18}{'TRIALS':>7}{'NAMED':>7}{'ABANDONED STACK':>17}"]
    for kind in KINDS:
        of_kind = [h for h in hangs if h["kind"] == kind]
        if not of_kind:
            continue
        stops = [h for h in of_kind if h["stopped"]]
        abandoned = f"{sum(h['abandoned_recorded'] for h in stops)}" if stops else "-"
        lines.append(
            f"{kind:<18}{len(of_kind):>7}{sum(h['named'] for h in of_kind):>7}{abandoned:>17}"
        )
    return "\n".join(lines)


def _print_trial(trial: Trial) -> None:
    figures = (
        f"lost {trial.events_lost} unrecorded {trial.unrecorded_fates} "
        f"orphans {trial.orphans} wrong {trial.wrong_verdicts}"
    )
    target = f" rank {trial.target_rank}" if trial.target_rank is not None else ""
    print(
        f"#{trial.index:<3} {trial.kind:<17}{target:<8} at {trial.trigger:<10} "
        f"{trial.phase:<17} -> launcher {trial.launcher_exit}, report {trial.replay_outcome}; "
        f"{figures}" + ("" if trial.clean else "  <-- see problems"),
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
