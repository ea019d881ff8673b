"""``startup-orchestrator watch``: follow a launch in progress from its logs.

The watcher reads nothing but the run directory: the rank logs (each polled
for the bytes appended since the last look; a last line still being written
waits until its newline arrives; a log that appears later is picked up) and
``manifest.json`` when the local launcher wrote one. A run started by
torchrun or an embedding launcher is watched the same way; its world size is
then the one its ranks' ``run.started`` records.

What it shows, per group of ranks in the same state: the step in progress
(the innermost unfinished one) and for how long, or the rank's outcome. It
prints, once each, the outcomes as they land (a step that failed, timed out
or crashed; a rank's ``run.finished``) and a line for each rank that has
appended nothing for longer than the stall threshold, naming the step it
is in. On a terminal the groups are a block redrawn in place below those
lines (plain ANSI cursor movement: no dependency); elsewhere (CI, a pipe)
every line is printed once, and the groups only when they changed, at most
once per stall period.

Each rank's ``step.stalled`` events say where its step waits (the lines
name the function); they are not progress. Where that is where the run's
slices say a thread waits for another process (``Slice.peer_waits``: the
engine's for an engine run, as ``replay`` chooses, or ``--slice``), the
line says so and comes after those of the ranks that do not. A rank that
appended no progress for longer than the stall threshold while its peers
did, or while they are elsewhere, is stalled; every rank of the world in
one step together is that step being slow, said once. The manifest is read
again at each look: a rank whose process ended without ``run.finished`` is
a death, said as it lands with where its step waited. A rank whose process
no launcher's manifest lists (torchrun, an embedding launcher), or whose
launcher was killed before it finished, is dead once the process its
``run.started`` names is gone from this host, as ``replay`` judges it; one
on another host is waited for.

It ends when every rank of the world has recorded ``run.finished`` or died,
with ``replay``'s exit status (0 ready, 1 otherwise), or at ``--timeout``
(exit 1, saying which ranks are still running where). A path that is not a
run directory and does not become one within the stall threshold is one
line and exit 2.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import stat
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TextIO

from events import (
    DecodeError,
    Event,
    Outcome,
    RankProcess,
    RunFinished,
    RunOutcome,
    RunStarted,
    Slice,
    StepStalled,
    Timeline,
    TimelineState,
    decode,
    format_ranks,
    implausible_world,
    outcome_of,
)
from exporters import terminal_text

from .._run_directory import MANIFEST_FILE, Manifest, RunDirectoryError, read_manifest
from ._errors import InputError, UsageError
from ._output import write
from ._run_logs import process_alive, rank_of_file, read_run, recorded_slices
from ._views import given_slices

__all__ = [
    "Follower",
    "LaunchView",
    "RunWatcher",
    "Screen",
    "command_watch",
    "follow",
    "is_terminal",
]

#: Step outcomes worth a line as they land (the expected ones, a candidate
#: absent or unavailable, are what fallbacks are for).
_NOTABLE = frozenset({Outcome.FAILED, Outcome.TIMED_OUT, Outcome.CRASHED})


class _Tail:
    """One rank log, read incrementally: only the bytes appended since the
    last read; an unterminated last line is kept until it is completed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0  # bytes read so far, the pending ones included
        self.pending = b""  # the last line, still without its newline
        self.line = 0  # complete lines decoded so far

    def read(self) -> list[Event]:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
            try:
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode):
                    raise InputError(f"{self.path}: not a regular file; it was not read")
                if info.st_size < self.offset:
                    raise InputError(f"{self.path}: the log got shorter while watched (rewritten?)")
                os.lseek(fd, self.offset, os.SEEK_SET)
                data = b"".join(iter(functools.partial(os.read, fd, 1 << 20), b""))
            finally:
                os.close(fd)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise InputError(f"{self.path}: cannot read log: {exc.strerror or exc}") from None
        self.offset += len(data)
        complete, newline, self.pending = (self.pending + data).rpartition(b"\n")
        if not newline:
            return []
        events = []
        for content in complete.split(b"\n"):
            self.line += 1
            try:
                events.append(decode(content))
            except DecodeError as exc:
                raise InputError(f"{self.path}:{self.line}: {exc.reason}") from None
        return events


class RunWatcher:
    """What a run directory's logs say so far, kept up to date by
    :meth:`poll`.

    Args:
        run_dir: the run directory (it may not exist yet).
        slices: what the run's steps mean (where a rank waits for another
            process: :attr:`events.Slice.peer_waits`); by default as
            ``replay`` chooses, from the first ``run.started`` read.
    """

    def __init__(self, run_dir: Path, slices: Sequence[Slice] | None = None) -> None:
        self.run_dir = run_dir
        self.slices = None if slices is None else tuple(slices)
        self._tails: dict[int, _Tail] = {}
        self._timeline = Timeline()
        self.state: TimelineState = self._timeline.initial()
        self.run_id: str | None = None
        self.world_size: int | None = None
        #: rank -> (seconds since its last progress when first seen, clock
        #: then, that event's seq: ``None`` for a log of stalls only so far)
        self._progress: dict[int, tuple[float, float, int | None]] = {}
        #: rank -> how its launcher saw its process end, for a rank that
        #: ended without ``run.finished`` (it died); ``None``: no launcher
        #: watches it, and the process its ``run.started`` names is gone
        self.died: dict[int, RankProcess | None] = {}
        #: rank -> its ``run.started``, for telling whether its process runs
        self._started: dict[int, RunStarted] = {}
        #: the manifest last read (its world is the world; the launch's
        #: start, for times as ``+25 s``)
        self._manifest: Manifest | None = None
        self._manifest_key: tuple[int, int, int] | None = None

    def poll(self) -> list[Event]:
        """Read what was appended since the last poll; return the new events."""
        manifest = self._read_manifest()
        if manifest is not None:
            self.run_id = self.run_id or manifest.run_id
        for path in self.run_dir.glob("rank-*.jsonl"):  # none while the directory is missing
            rank = rank_of_file(path)
            if rank is not None and rank not in self._tails:
                self._tails[rank] = _Tail(path)
        now, now_wall = time.monotonic(), time.time_ns()
        new = [event for rank in sorted(self._tails) for event in self._read(rank, now, now_wall)]
        # Each poll's events are folded at once: the ranks' logs are separate
        # streams, so the order between them does not matter.
        self.state = self._timeline.apply_many(self.state, new)
        if manifest is not None:
            for process in manifest.ranks:
                if process.ended and not self.ended(process.rank):
                    self.died.setdefault(process.rank, process)
        # A rank whose process no launcher watches (a manifest that a rank
        # wrote as it collected the logs does not, nor one whose launcher
        # was killed before it finished), once that process is gone, wrote
        # all it ever will: what it wrote since its log was read above is
        # read now, and a log that then has no end is a death.
        watched = set()
        if manifest is not None and manifest.collected_by is None:
            launcher = manifest.launcher
            if launcher.finished_wall_ns is not None or (
                process_alive(launcher.host, launcher.pid, launcher.started_wall_ns) is not False
            ):
                watched = {process.rank for process in manifest.ranks}
        gone = [
            rank
            for rank, started in self._started.items()
            if rank not in watched
            and not self.ended(rank)
            and process_alive(started.host, started.pid, started.wall_ns) is False
        ]
        late = [event for rank in gone for event in self._read(rank, now, now_wall)]
        self.state = self._timeline.apply_many(self.state, late)
        self.died.update((rank, None) for rank in gone if not self.ended(rank))
        if self._manifest is not None:
            self.world_size = self._world(self._manifest.world_size, self.run_dir / MANIFEST_FILE)
        return new + late

    def _world(self, claimed: int, source: Path) -> int:
        # A number a file claims never sets the cost of watching: a damaged
        # one is refused as replay refuses it, not watched rank by rank.
        if why := implausible_world(claimed, str(source), len(self._tails)):
            raise InputError(why)
        return claimed

    def _read(self, rank: int, now: float, now_wall: int) -> list[Event]:
        """The events appended to the rank's log since it was last read
        (``now``: the clocks of this poll, for the rank's progress)."""
        events = self._tails[rank].read()
        for event in events:
            if isinstance(event, RunStarted):
                self._started.setdefault(rank, event)
                if self.slices is None:
                    self.slices = recorded_slices(event)
                self.run_id = self.run_id or event.run_id
                claimed = self._world(event.identity.world_size, self._tails[rank].path)
                self.world_size = max(self.world_size or 0, claimed)
        progress = [e for e in events if not isinstance(e, StepStalled)]
        # A log that so far holds only stalls still says it is alive.
        if progress or (events and rank not in self._progress):
            last, seq = (progress[-1], progress[-1].seq) if progress else (events[0], None)
            self._progress[rank] = (max(0.0, (now_wall - last.wall_ns) / 1e9), now, seq)
        return events

    def _read_manifest(self) -> Manifest | None:
        """The manifest as it is now (rewritten atomically as ranks end), or
        ``None``; read again only when the file was replaced."""
        try:
            info = (self.run_dir / "manifest.json").stat()
        except OSError:
            return None
        key = (info.st_ino, info.st_mtime_ns, info.st_size)
        if key == self._manifest_key:
            return self._manifest
        try:
            manifest = read_manifest(self.run_dir)
        except RunDirectoryError:
            return None  # being written, or not ours: the logs still say
        self._manifest_key, self._manifest = key, manifest
        return manifest

    def is_run_directory(self) -> bool:
        """Whether the directory holds a run yet (a claim, a manifest or a log)."""
        return self.run_dir.is_dir() and (
            bool(self._tails)
            or (self.run_dir / "manifest.json").exists()
            or (self.run_dir / ".run-id").exists()
        )

    def waiting_in(self, rank: int) -> StepStalled | None:
        """Where the rank's innermost step in flight was last seen waiting
        (the timeline keeps each step's latest ``step.stalled``)."""
        steps, _ = self.in_progress(rank)
        stalls = (self.state.ranks[rank].steps[step].stall for step in steps)
        return next((stall for stall in stalls if stall is not None), None)

    @property
    def joined(self) -> bool:
        """Whether the ranks are a recorded engine start's processes (each
        names its role), which join the run as they are started: its world
        grows."""
        return any(started.identity.role is not None for started in self._started.values())

    def waits_for_another(self, rank: int) -> bool:
        """Whether the rank was last seen waiting for another process of
        the launch (where the slices' ``peer_waits`` say)."""
        stall = self.waiting_in(rank)
        return any(part.waits_for_another(stall) for part in self.slices or ())

    def waiting_text(self, rank: int) -> str:
        """``waiting in barrier (c10d.py:9) for another process``: where the
        rank was last seen waiting; ``""`` where that is not known."""
        stall = self.waiting_in(rank)
        if stall is None or (frame := stall.waiting_in) is None:
            return ""
        other = " for another process" if self.waits_for_another(rank) else ""
        return f"waiting in {frame.where()}{other}"

    @property
    def ranks(self) -> list[int]:
        """Every rank known: the world's, and any with a log."""
        return sorted(set(self._tails) | set(range(self.world_size or 0)))

    def ended(self, rank: int) -> bool:
        """Whether the rank has finished or died."""
        timeline = self.state.ranks.get(rank)
        return rank in self.died or (timeline is not None and timeline.finished is not None)

    def done(self) -> bool:
        """Whether every rank of the world has finished or died."""
        return self.world_size is not None and all(self.ended(rank) for rank in self.ranks)

    def idle_s(self, rank: int) -> float | None:
        """Seconds since the rank last appended an event (``None``: no event yet)."""
        seen = self._progress.get(rank)
        return None if seen is None else seen[0] + time.monotonic() - seen[1]

    def last_seq(self, rank: int) -> int | None:
        """The ``seq`` of the last event read from the rank's log that is
        progress (not a ``step.stalled``)."""
        seen = self._progress.get(rank)
        return None if seen is None else seen[2]

    def in_progress(self, rank: int) -> tuple[tuple[str, ...], float]:
        """The innermost steps the rank has started and not ended (those with
        no unfinished step under them), and the seconds since the oldest of
        them started."""
        timeline = self.state.ranks.get(rank)
        steps = () if timeline is None else timeline.steps.values()
        open_steps = [t for t in steps if not t.finished]
        names = {t.step for t in open_steps}
        leaves = [t for t in open_steps if not any(n.startswith(t.step + "/") for n in names)]
        if not leaves:
            return (), 0.0
        started = min(t.start_wall_ns for t in leaves)
        return tuple(t.step for t in leaves), max(0.0, (time.time_ns() - started) / 1e9)

    def describe(self, rank: int) -> tuple[str, float]:
        """(its state, ending in `` in`` or `` for`` where the duration
        goes, duration in seconds); ranks in the same state say the same."""
        timeline = self.state.ranks.get(rank)
        if timeline is not None and (finished := timeline.finished) is not None:
            where = f" at {finished.failed_step}" if finished.failed_step else ""
            return f"{finished.outcome.value}{where} in", (timeline.duration_ns or 0) / 1e9
        if rank in self.died:
            return self.death(rank), 0.0
        if rank not in self._progress:
            return "no log yet", 0.0
        steps, for_s = self.in_progress(rank)
        if not steps:
            return "between steps for", self.idle_s(rank) or 0.0
        text = f"in {_steps_text(steps)}"
        if waiting := self.waiting_text(rank):
            text += f" ({waiting})"
        return f"{text} for", for_s

    def death(self, rank: int) -> str:
        """``killed by SIGKILL at +25 s in attention/FLASH_ATTN, waiting in
        wait_for_fabric (fabric.py:42) after 22.0 s``: how a rank that died
        ended (as its launcher saw it, or ``process gone without
        run.finished``), where, and where it was last seen waiting."""
        process = self.died[rank]
        if process is None:
            how = "process gone without run.finished (crashed or killed)"
        else:
            since_ns = None if self._manifest is None else self._manifest.launcher.started_wall_ns
            how = process.how(since_ns=since_ns).removeprefix("was ")
        steps, _ = self.in_progress(rank)
        where = f" in {_steps_text(steps)}" if steps else ""
        stall = self.waiting_in(rank)
        summary = stall.summary() if stall is not None else ""
        return f"{how}{where}" + (f", {summary}" if summary else "")

    def status_lines(self, *, durations: bool = True, running: bool = False) -> list[str]:
        """One line per group of ranks in the same state, in the order of
        their lowest rank, those waiting for another process last: ``ranks
        0,2-7: ready in 5.8 s`` (``running``: only the ranks not finished)."""
        shown = [r for r in self.ranks if not (running and self.ended(r))]
        # The ranks the others wait for first, as replay lists them.
        shown.sort(key=self.waits_for_another)
        states = ((*self.describe(r), r) for r in shown)
        return [
            _status_line(text, seconds, self.label(ranks), durations=durations)
            for text, seconds, ranks in _grouped(states)
        ]

    def label(self, ranks: list[int]) -> str:
        """``ranks 0,2-7``; one rank with its role where its log names one
        (``rank 3 (worker TP1)``, a process of a recorded engine start)."""
        started = self._started.get(ranks[0]) if len(ranks) == 1 else None
        role = started.identity.role if started is not None else None
        return f"{format_ranks(ranks)} ({role})" if role else format_ranks(ranks)


def _grouped(items: Iterable[tuple[str, float, int]]) -> list[tuple[str, float, list[int]]]:
    """(text, longest duration, ranks) per text of ``(text, duration, rank)``
    items, in the order of their first."""
    grouped: dict[str, tuple[float, list[int]]] = {}
    for text, seconds, rank in items:
        longest, ranks = grouped.setdefault(text, (seconds, []))
        ranks.append(rank)
        grouped[text] = (max(longest, seconds), ranks)
    return [(text, longest, ranks) for text, (longest, ranks) in grouped.items()]


def _status_line(text: str, seconds: float, who: str, *, durations: bool = True) -> str:
    """``ranks 0,2-7: ready in 5.8 s``: a text that ends in `` in`` or
    `` for`` takes the duration (or, without ``durations``, drops that word)."""
    if text.endswith((" in", " for")):
        text = f"{text} {_seconds(seconds)}" if durations else text.rsplit(" ", 1)[0]
    return f"{who}: {text}"


def _steps_text(steps: tuple[str, ...]) -> str:
    """``attention/FLASH_ATTN``, or ``platform/tpu (+4 more)`` for several."""
    return steps[0] if len(steps) == 1 else f"{steps[0]} (+{len(steps) - 1} more)"


def _seconds(value: float) -> str:
    return f"{value:.1f} s" if value < 10 else f"{value:.0f} s"


class Screen:
    """Where the watcher writes: permanent lines, and on a terminal a block
    of status lines redrawn in place below them. Safe from several threads."""

    def __init__(self, stream: TextIO, *, live: bool) -> None:
        self.stream = stream
        self.live = live
        self._height = 0
        self._block: list[str] = []
        self._lock = threading.Lock()

    def line(self, text: str) -> None:
        """Print a line once, above the live block (escaped as every view
        escapes text from logs: a run id or step name is the log's)."""
        with self._lock:
            self._show(terminal_text(text) + "\n")

    def block(self, lines: list[str]) -> None:
        """Replace the live block (drawn on a terminal only: ``live``)."""
        with self._lock:
            width = max(20, shutil.get_terminal_size().columns - 1)
            self._block = [terminal_text(text, indent="")[:width] for text in lines]
            self._show("")

    def close(self) -> None:
        """Take the live block off the screen."""
        self.block([])

    def _show(self, above: str) -> None:
        """Erase the live block, print ``above`` and draw the block again, in
        one write (a terminal that hung up takes nothing: see ``write``)."""
        # To the start of the block's first line, then clear to the end.
        erase = f"\x1b[{self._height}F\x1b[J" if self._height else ""
        write(self.stream, erase + above + "".join(f"{text}\n" for text in self._block))
        self._height = len(self._block)


def is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is a terminal a live view can redraw on."""
    try:
        return stream.isatty() and os.environ.get("TERM", "") != "dumb"
    except (AttributeError, ValueError):
        return False


def _outcome_lines(events: Iterable[Event], watcher: RunWatcher) -> list[str]:
    """The lines for the outcomes among ``events``, ranks with the same
    outcome at the same step grouped (with the longest duration)."""
    outcomes: list[tuple[str, float, int]] = []
    for event in events:
        if isinstance(event, RunFinished):
            text, seconds = watcher.describe(event.rank)
            outcomes.append((text, max(0.0, seconds), event.rank))
        elif (outcome := outcome_of(event)) in _NOTABLE:
            outcomes.append((f"{event.step} {outcome.value}", 0.0, event.rank))
    return [
        _status_line(text, seconds, watcher.label(ranks))
        for text, seconds, ranks in _grouped(outcomes)
    ]


class Follower:
    """One look at the run at a time: what :func:`follow` does in a loop, and
    the launcher between its own checks on the ranks (``run --nproc`` on a
    terminal).

    Args:
        watcher: the run being watched.
        screen: where lines and the live block go.
        stall_s: a rank that appended nothing for longer is stalled.
        header: say which run is watched once its world is known, and, off
            a terminal, print the groups as plain lines.
    """

    def __init__(
        self, watcher: RunWatcher, screen: Screen, *, stall_s: float, header: bool = True
    ) -> None:
        self.watcher = watcher
        self.screen = screen
        self.stall_s = stall_s
        self.header = header
        #: rank -> (its last seq, where it waited) when said stalled
        self._reported: dict[int, tuple[int | None, str]] = {}
        self._slow: set[tuple[str, ...]] = set()  # steps said to be slow
        self._deaths: set[int] = set()
        self._announced = False
        self._last_status: list[str] | None = None
        self._last_status_at = float("-inf")

    def step(self) -> bool:
        """Read what is new and show it; ``True`` once every rank finished."""
        watcher, screen = self.watcher, self.screen
        new = watcher.poll()
        if self.header and not self._announced and watcher.world_size is not None:
            self._announced = True
            size = watcher.world_size
            world = f"{size} rank{'s' if size != 1 else ''}"
            if watcher.joined:
                world = "its processes join as they start"
            screen.line(f"watching {watcher.run_dir}: run {watcher.run_id}, {world}")
        for text in _outcome_lines(new, watcher):
            screen.line(text)
        for rank in sorted(set(watcher.died) - self._deaths):
            self._deaths.add(rank)
            screen.line(f"{watcher.label([rank])}: {watcher.death(rank)}")
        for text in self._stall_lines():
            screen.line(text)
        if watcher.done():
            screen.close()
            return True
        if screen.live:
            screen.block(watcher.status_lines())
        elif self.header:
            # Plain lines: the groups when they changed, at most once a stall period.
            status = watcher.status_lines(durations=False, running=True)
            now = time.monotonic()
            if (
                status != self._last_status
                and now - self._last_status_at >= self.stall_s
                and watcher.ranks
            ):
                self._last_status, self._last_status_at = status, now
                for text in watcher.status_lines(running=True):
                    screen.line(text)
        return False

    def _stall_lines(self) -> list[str]:
        """The stalls and slow steps not said yet (see the module docstring)."""
        watcher = self.watcher
        running = [r for r in watcher.ranks if not watcher.ended(r)]
        stuck = {r: i for r in running if (i := watcher.idle_s(r)) is not None and i > self.stall_s}
        if not stuck:
            return []
        together = {watcher.in_progress(r)[0] for r in running}
        if len(running) > 1 and len(stuck) == len(running) and len(together) == 1:
            (steps,) = together
            for rank in stuck:
                self._reported[rank] = (watcher.last_seq(rank), watcher.waiting_text(rank))
            if not steps or steps in self._slow:
                return []
            self._slow.add(steps)
            return [
                f"{format_ranks(running)}: {_steps_text(steps)} is slow "
                f"({_seconds(max(stuck.values()))} so far, every rank in it together)"
            ]
        stalls: list[tuple[str, float, int]] = []
        for rank, idle in stuck.items():
            # Said again once it records where it waits, or waits elsewhere.
            seen = (watcher.last_seq(rank), watcher.waiting_text(rank))
            if self._reported.get(rank) == seen:
                continue
            self._reported[rank] = seen
            steps, _ = watcher.in_progress(rank)
            where = _steps_text(steps) if steps else "no step (between steps)"
            if seen[1]:
                where += f", {seen[1]}"
            stalls.append((where, idle, rank))
        # The ranks the others wait for first, as replay lists them.
        stalls.sort(key=lambda stall: watcher.waits_for_another(stall[2]))
        return [
            f"{watcher.label(ranks)} stalled {_seconds(longest)} in {where}"
            for where, longest, ranks in _grouped(stalls)
        ]


def follow(
    watcher: RunWatcher,
    screen: Screen,
    *,
    stall_s: float,
    interval_s: float,
    timeout_s: float | None = None,
) -> bool:
    """Watch until every rank of the world finished or died (``True``) or
    the timeout passed (``False``).

    Raises:
        UsageError: the directory is not a run directory and did not become
            one within ``stall_s`` seconds.
    """
    follower = Follower(watcher, screen, stall_s=stall_s)
    began = time.monotonic()
    deadline = began + (float("inf") if timeout_s is None else timeout_s)
    while not follower.step():
        now = time.monotonic()
        unclaimed = not watcher.is_run_directory()
        if unclaimed and now - began >= stall_s:
            screen.close()
            what = "no such directory" if not watcher.run_dir.exists() else "nothing of a run in it"
            raise UsageError(
                f"{watcher.run_dir}: not a run directory ({what} after {stall_s:g} s: no "
                "manifest.json, .run-id or rank-N.jsonl); give the directory a launch writes to"
            )
        if now >= deadline:
            screen.close()
            return False
        # The next look, never later than the timeout or the end of the wait
        # for a run directory: each is said when it passes, not an interval on.
        wake = min(now + interval_s, deadline, began + stall_s if unclaimed else deadline)
        time.sleep(max(0.0, wake - now))
    return True


class LaunchView(Follower):
    """The live view ``run --nproc`` shows on a terminal: the launcher calls
    :meth:`tick` while it waits for its ranks, sends its own lines and the
    ranks' stderr to its :attr:`screen`, and :meth:`close` s it when the
    ranks have ended."""

    def __init__(self, run_dir: Path, stream: TextIO) -> None:
        super().__init__(RunWatcher(run_dir), Screen(stream, live=True), stall_s=10.0, header=False)

    def tick(self) -> None:
        """Look at the logs, until every rank finished."""
        if not self.watcher.done():
            self.step()

    def close(self) -> None:
        """A last look (the outcomes that landed since), then the block goes."""
        self.tick()
        self.screen.close()


def command_watch(args: argparse.Namespace) -> int:
    """Follow the run directory until its world finished, then judge it as
    ``replay`` does."""
    run_dir: Path = args.run_dir
    if run_dir.exists() and not run_dir.is_dir():
        raise UsageError(f"{run_dir}: not a run directory")
    if run_dir.is_dir():
        try:
            os.scandir(run_dir).close()
        except OSError as exc:
            raise InputError(f"{run_dir}: cannot read: {exc.strerror or exc}") from None
    screen = Screen(sys.stdout, live=is_terminal(sys.stdout))
    watcher = RunWatcher(run_dir, given_slices(args))
    try:
        done = follow(
            watcher, screen, stall_s=args.stall, interval_s=args.interval, timeout_s=args.timeout
        )
    finally:
        screen.close()
    if not done:
        if not watcher.ranks:
            where = "no run directory" if not run_dir.is_dir() else "no rank logs"
            screen.line(f"timed out after {args.timeout:g} s: {where} in {run_dir} yet")
        else:
            running = watcher.status_lines(running=True)
            screen.line(f"timed out after {args.timeout:g} s; still running: {'; '.join(running)}")
        return 1
    result = read_run([run_dir], slices=watcher.slices).replay()
    screen.line(f"run {result.run_id}: {result.outcome.value}")
    return 0 if result.outcome is RunOutcome.READY else 1
