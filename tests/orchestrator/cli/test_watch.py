"""``watch``: following a launch in progress from its logs alone.

The launches are real processes; ``watch`` runs in a second process, as it
would from another terminal. Nothing sleeps to synchronise: each wait polls
a file (a rank log, or the watcher's own output) against a deadline.
"""

from __future__ import annotations

import contextlib
import io
import os
import platform
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import orjson
import pytest

from events import FrameInfo, RankProcess, RunStarted, Slice, encode
from events.testing import EventStream, exception_info
from orchestrator._run_directory import LauncherProcess, Manifest
from orchestrator.cli._watch import Follower, RunWatcher, Screen, follow, is_terminal

from .conftest import StoredRun
from .harness import (
    LAUNCH_TIMEOUT_S,
    POLL_INTERVAL_S,
    Background,
    call_cli,
    command,
    environment,
    pid_of,
    poll_file,
    read_events,
    reaping,
    start_cli,
    step_started,
    wait_for_event,
)

SECONDS = "expected seconds (> 0, at most 604,800)"

#: A rank process as an engine's own launcher script runs it, embedding
#: ``Startup`` (its identity from torchrun's variables).
EMBEDDING = Path(__file__).parents[3] / "examples" / "launcher_torchrun.py"


def _from_another_host(run_started: bytes) -> bytes:
    """A recorded ``run.started`` line as a rank on another host wrote it:
    whether its process still runs cannot be seen from here, so its log
    without an end is a run in progress (the recording process has ended)."""
    record = orjson.loads(run_started)
    record["host"] = f"not-{platform.node()}"
    return orjson.dumps(record) + b"\n"


def _wait_for_output(
    watch: Background, matches: Callable[[str], bool], deadline_s: float = LAUNCH_TIMEOUT_S
) -> str:
    """The watcher's stdout once ``matches`` says it holds what is awaited
    (a wait that fails shows what it printed)."""
    try:
        text: str = poll_file(
            lambda: watch.stdout_path.read_text(encoding="utf-8", errors="replace"),
            matches,
            alive=watch.running,
            deadline_s=deadline_s,
            what="watch printing what was awaited",
        )
    except AssertionError as failure:
        printed = [
            path.read_text(errors="replace") for path in (watch.stdout_path, watch.stderr_path)
        ]
        raise AssertionError(f"{failure}; it printed:\n{''.join(printed)}") from None
    return text


@contextlib.contextmanager
def _watching(run_dir: Path, cwd: Path, *args: str) -> Iterator[Background]:
    watch = Background(
        command("watch", str(run_dir), *args),
        cwd=cwd,
        env=environment(),
        name="watch",
    )
    try:
        yield watch
    finally:
        watch.kill()


@pytest.mark.slow
def test_watch_names_the_stalled_rank_and_step_and_exits_1_once_the_ranks_are_interrupted(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    launch = start_cli(
        "run", "--simulate", "h200x8", "--nproc", "2", "--grace", "1", "--timeout", "120",
        "--inject", "1:attention/FLASH_ATTN=hang", "--run-dir", str(run_dir),
        cwd=tmp_path,
    )  # fmt: skip
    with (
        reaping(launch, run_dir),
        _watching(run_dir, tmp_path, "--stall", "1", "--interval", "0.2") as watch,
    ):
        wait_for_event(
            run_dir / "rank-1.jsonl",
            step_started("attention/FLASH_ATTN"),
            alive=launch.running,
        )
        text = _wait_for_output(watch, lambda out: "in attention/FLASH_ATTN\n" in out)
        assert "rank 1 stalled " in text
        stalled = [line for line in text.splitlines() if line.endswith("attention/FLASH_ATTN")]
        assert any(line.startswith("rank 1 stalled ") for line in stalled), text

        launch.send(signal.SIGTERM)
        launch.finish()
        finished = watch.finish()
    assert read_events(run_dir / "rank-1.jsonl")[-1]["outcome"] == "interrupted"
    assert finished.returncode == 1, finished.describe()
    assert "rank 1: interrupted" in finished.stdout, finished.describe()
    assert finished.lines()[-1].endswith(": interrupted"), finished.describe()


@pytest.mark.slow
def test_the_ranks_of_a_launcher_killed_with_them_end_the_watch(tmp_path: Path) -> None:
    # The launcher and its ranks all killed at once (the whole job, by
    # SIGKILL): no one records how a rank ended, and the manifest still
    # lists every rank as running under a launcher that is gone.
    run_dir = tmp_path / "run"
    launch = start_cli(
        "run", "--simulate", "h200x8", "--nproc", "2", "--timeout", "120",
        "--inject", "1:attention/FLASH_ATTN=hang", "--run-dir", str(run_dir),
        cwd=tmp_path,
    )  # fmt: skip
    with (
        reaping(launch, run_dir),
        _watching(
            run_dir, tmp_path, "--stall", "0.5", "--interval", "0.1", "--timeout", "120"
        ) as watch,
    ):
        _wait_for_output(
            watch,
            lambda out: any(
                line.startswith("rank 1 stalled ") and "attention/FLASH_ATTN" in line
                for line in out.splitlines()
            ),
        )
        hanging = pid_of(run_dir / "rank-1.jsonl")
        # Stopped first, so it cannot see its launcher end and record that
        # (rank 0 may have ended already).
        os.kill(hanging, signal.SIGSTOP)
        launch.kill()
        os.kill(hanging, signal.SIGKILL)
        finished = watch.finish()
    assert finished.returncode == 1, finished.describe()
    assert "timed out" not in finished.stdout, finished.describe()
    deaths = [line for line in finished.lines() if "process gone" in line]
    assert any(
        line.startswith("rank 1: process gone without run.finished (crashed or killed)")
        for line in deaths
    ), finished.describe()
    assert finished.lines()[-1].endswith(": incomplete"), finished.describe()


@pytest.mark.slow
def test_a_healthy_launch_watched_to_the_end_exits_0(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    launch = start_cli(
        "run", "--simulate", "h200x8", "--nproc", "2", "--run-dir", str(run_dir), cwd=tmp_path
    )
    with reaping(launch, run_dir), _watching(run_dir, tmp_path, "--interval", "0.2") as watch:
        finished = watch.finish()
        assert launch.finish().returncode == 0
    assert finished.returncode == 0, finished.describe()
    lines = finished.lines()
    assert lines[0].startswith(f"watching {run_dir}: run ")
    assert lines[0].endswith(", 2 ranks")
    assert lines[-1].endswith(": ready"), finished.describe()
    # Each line once: no redraw off a terminal.
    assert "\x1b[" not in finished.stdout


def test_a_finished_run_is_reported_at_once_with_ranks_grouped(
    eight_ranks: StoredRun, tmp_path: Path
) -> None:
    completed = call_cli("watch", str(eight_ranks.directory), cwd=tmp_path)
    assert "\x1b[" not in completed.stdout
    assert completed.returncode == 0, completed.describe()
    lines = completed.lines()
    assert lines[0].endswith(", 8 ranks")
    assert any(line.startswith("ranks 0-7: ready in ") for line in lines), completed.describe()
    assert lines[-1].endswith(": ready")


def test_a_failed_run_exits_1_as_replay_does(attention_failure: StoredRun, tmp_path: Path) -> None:
    completed = call_cli("watch", str(attention_failure.directory), cwd=tmp_path)
    assert completed.returncode == 1, completed.describe()
    assert "rank 0: failed at attention" in completed.stdout, completed.describe()
    assert completed.lines()[-1].endswith(": failed")


def test_a_run_without_a_manifest_takes_its_world_from_run_started(
    healthy: StoredRun, tmp_path: Path
) -> None:
    assert not (healthy.directory / "manifest.json").exists()
    completed = call_cli("watch", str(healthy.directory), cwd=tmp_path)
    assert completed.returncode == 0, completed.describe()
    assert completed.lines()[0].endswith(", 1 rank")


@pytest.mark.parametrize("claimant", ["rank-0.jsonl", "manifest.json"])
def test_a_world_no_run_can_have_is_refused_as_replay_refuses_it(
    healthy: StoredRun, tmp_path: Path, claimant: str
) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(healthy.directory, run_dir)
    log = run_dir / "rank-0.jsonl"
    first, rest = log.read_bytes().split(b"\n", 1)
    if claimant == "rank-0.jsonl":
        record = orjson.loads(first)
        record["identity"]["world_size"] = 65_537
        log.write_bytes(orjson.dumps(record) + b"\n" + rest)
    else:
        run_id = orjson.loads(first)["run_id"]
        Manifest(run_id=run_id, world_size=65_537, launcher=LauncherProcess()).write(run_dir)

    watched = call_cli("watch", "run", "--timeout", "2", "--interval", "0.05", cwd=tmp_path)
    replayed = call_cli("replay", "run", cwd=tmp_path)

    why = (
        f"run/{claimant} claims 65,537 ranks; 1 log is present, and a run of "
        "at most 65,536 ranks is read (is the file damaged?)"
    )
    assert watched.returncode == 1, watched.describe()
    assert watched.stderr == f"startup-orchestrator: error: {why}\n"
    assert why in replayed.stderr, replayed.describe()


def test_a_directory_without_logs_is_waited_for_until_the_timeout(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    completed = call_cli("watch", "run", "--timeout", "0.3", "--interval", "0.05", cwd=tmp_path)
    assert completed.returncode == 1, completed.describe()
    assert completed.lines() == ["timed out after 0.3 s: no rank logs in run yet"]
    missing = call_cli("watch", "later", "--timeout", "0.2", "--interval", "0.05", cwd=tmp_path)
    assert missing.returncode == 1, missing.describe()
    assert missing.lines() == ["timed out after 0.2 s: no run directory in later yet"]


def test_a_long_interval_does_not_outlast_the_timeout_or_the_wait_for_a_run(
    tmp_path: Path,
) -> None:
    began = time.monotonic()
    timed_out = call_cli("watch", "later", "--timeout", "0.2", "--interval", "20", cwd=tmp_path)
    assert timed_out.returncode == 1, timed_out.describe()
    assert timed_out.lines() == ["timed out after 0.2 s: no run directory in later yet"]
    missing = call_cli("watch", "misspelt", "--stall", "0.2", "--interval", "20", cwd=tmp_path)
    assert missing.returncode == 2, missing.describe()
    # Each is said when it passes, not at the next look an interval on.
    assert time.monotonic() - began < 15


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--stall", "0"), "argument --stall: expected seconds (> 0, at most 604,800), got '0'"),
        (
            ("--interval", "soon"),
            "argument --interval: expected seconds (> 0, at most 604,800), got 'soon'",
        ),
        (
            ("--timeout", "-1"),
            "argument --timeout: expected seconds (> 0, at most 604,800), got '-1'",
        ),
    ],
)
def test_bad_arguments_are_one_usage_line_and_exit_2(
    tmp_path: Path, args: tuple[str, ...], expected: str
) -> None:
    completed = call_cli("watch", str(tmp_path), *args, cwd=tmp_path)
    assert completed.returncode == 2
    assert completed.stdout == ""
    assert completed.stderr.splitlines() == [
        f"startup-orchestrator: error: {expected} (see startup-orchestrator watch --help)"
    ]


def test_a_file_is_not_a_run_directory(tmp_path: Path) -> None:
    (tmp_path / "log.jsonl").write_text("")
    completed = call_cli("watch", "log.jsonl", cwd=tmp_path)
    assert completed.returncode == 2
    assert completed.stderr == "startup-orchestrator: error: log.jsonl: not a run directory\n"


def test_the_watcher_reads_only_new_bytes_and_waits_for_a_torn_line(
    healthy: StoredRun, tmp_path: Path
) -> None:
    source = (healthy.directory / "rank-0.jsonl").read_bytes()
    lines = source.splitlines(keepends=True)
    lines[0] = _from_another_host(lines[0])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    watcher = RunWatcher(run_dir)
    assert watcher.poll() == []  # no log yet
    log = run_dir / "rank-0.jsonl"
    half = len(lines[1]) // 2
    log.write_bytes(lines[0] + lines[1][:half])
    assert [e.seq for e in watcher.poll()] == [0]  # the torn line waits
    with log.open("ab") as file:
        file.write(lines[1][half:] + b"".join(lines[2:-1]))
    assert [e.seq for e in watcher.poll()] == list(range(1, len(lines) - 1))
    assert not watcher.done()
    with log.open("ab") as file:
        file.write(lines[-1])
    assert [e.seq for e in watcher.poll()] == [len(lines) - 1]
    assert watcher.done()
    assert watcher.status_lines()[0].startswith("rank 0: ready in ")


def test_run_ids_and_step_names_from_logs_are_escaped(healthy: StoredRun, tmp_path: Path) -> None:
    hostile = "r\x1b[2J\u202e\u200b"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    records = [
        orjson.loads(line)
        for line in (healthy.directory / "rank-0.jsonl").read_bytes().splitlines()
    ]
    for record in records:
        record["run_id"] = hostile
        if record.get("step") == "attention":
            record["step"] = "attention\x1b]0;pwned\x07"
    records = [r for r in records if not r["type"].startswith("step.") or r["step"] != "platform"]
    (run_dir / "rank-0.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    completed = call_cli("watch", str(run_dir), cwd=tmp_path)
    assert "\x1b" not in completed.stdout, completed.describe()
    assert "\u202e" not in completed.stdout
    assert "\u200b" not in completed.stdout
    assert "r\\x1b[2J\\u202e\\u200b" in completed.stdout, completed.describe()


def test_the_live_view_redraws_a_block_in_place(healthy: StoredRun, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(healthy.directory, run_dir)
    log = run_dir / "rank-0.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    lines[0] = _from_another_host(lines[0])
    log.write_bytes(b"".join(lines[:-1]))
    stream = io.StringIO()
    screen = Screen(stream, live=True)
    watcher = RunWatcher(run_dir)
    assert not follow(watcher, screen, stall_s=60, interval_s=0.01, timeout_s=0.05)
    text = stream.getvalue()
    assert "\x1b[1F\x1b[J" in text  # the one-line block was redrawn
    assert text.endswith("\x1b[1F\x1b[J")  # and taken off at the end
    with log.open("ab") as file:
        file.write(lines[-1])
    assert follow(watcher, screen, stall_s=60, interval_s=0.01, timeout_s=5)
    assert "rank 0: ready in " in stream.getvalue()


@pytest.mark.slow
def test_run_nproc_on_a_terminal_shows_the_live_view(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    terminal, child_side = os.openpty()
    process: subprocess.Popen[bytes] | None = None
    try:
        with (tmp_path / "stdout").open("wb") as stdout:
            process = subprocess.Popen(
                command("run", "--simulate", "h200x8", "--nproc", "2", "--run-dir", str(run_dir)),
                cwd=tmp_path,
                env=environment(TERM="xterm"),
                stdout=stdout,
                stderr=child_side,
            )
        os.close(child_side)
        shown = b""
        deadline = time.monotonic() + LAUNCH_TIMEOUT_S
        while time.monotonic() < deadline:
            ready, _, _ = select.select([terminal], [], [], POLL_INTERVAL_S)
            if not ready:
                continue
            try:
                data = os.read(terminal, 1 << 16)
            except OSError:  # EIO: every writer of the terminal is gone
                break
            if not data:
                break
            shown += data
        returncode = process.wait(timeout=LAUNCH_TIMEOUT_S)
    finally:
        os.close(terminal)
        if process is not None and process.poll() is None:
            process.kill()
    text = shown.decode("utf-8", "replace").replace("\r\n", "\n")
    assert returncode == 0, text
    assert "\x1b[1F\x1b[J" in text or "\x1b[2F\x1b[J" in text, text  # redrawn in place
    # The ranks' own lines come through, above the block; the outcomes land.
    assert "[rank 0] Startup ready." in text, text
    assert "ranks 0-1: ready in " in text or "rank 1: ready in " in text, text
    assert (tmp_path / "stdout").read_text().startswith("Startup ready: 2 ready"), text


def test_help(tmp_path: Path) -> None:
    listed = call_cli("--help", cwd=tmp_path)
    assert "watch" in listed.stdout
    shown = call_cli("watch", "--help", cwd=tmp_path)
    assert shown.returncode == 0, shown.describe()
    assert shown.stdout.startswith("usage: startup-orchestrator watch")
    for word in ("RUN_DIR", "--stall", "--interval", "--timeout", "exit status"):
        assert word in shown.stdout, word


def _write_logs(run_dir: Path, streams: list[EventStream], **started: Any) -> None:
    """The streams' logs; ``started``: fields their ``run.started`` records
    differently."""
    run_dir.mkdir(exist_ok=True)
    for stream in streams:
        first, *rest = stream.events
        assert isinstance(first, RunStarted)
        events = [attrs.evolve(first, **started), *rest]
        (run_dir / f"rank-{stream.rank}.jsonl").write_bytes(
            b"".join(encode(event) + b"\n" for event in events)
        )


def _ranks_in(step: str, world: int, *, ago_s: float) -> list[EventStream]:
    """``world`` ranks whose last progress, ``ago_s`` seconds ago, was
    entering ``step``."""
    streams = []
    for rank in range(world):
        stream = EventStream(
            run_id="slow", rank=rank, world_size=world, wall_ns=time.time_ns() - int(ago_s * 1e9)
        )
        stream.run_started()
        stream.started(step)
        streams.append(stream)
    return streams


def test_every_rank_in_one_step_together_is_that_step_being_slow_said_once(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    _write_logs(run_dir, _ranks_in("process_group", 8, ago_s=30))
    out = io.StringIO()
    follower = Follower(RunWatcher(run_dir), Screen(out, live=False), stall_s=10, header=False)

    assert not follower.step()
    assert not follower.step()
    (line,) = out.getvalue().splitlines()
    assert line.startswith("ranks 0-7: process_group is slow (")
    assert line.endswith(" so far, every rank in it together)")
    assert "stalled" not in out.getvalue()


def test_a_rank_behind_its_peers_is_stalled_and_named_where_it_waits(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    behind, ahead = _ranks_in("attention", 2, ago_s=30)
    behind.advance(20 * 10**9)
    behind.stalled("attention", 20.0)  # 10 s ago, where it waits: not progress
    ahead.succeeded("attention")
    ahead.advance(30 * 10**9 - 2 * 10**6)  # its last progress: now
    ahead.started("allreduce_workspace")
    _write_logs(run_dir, [behind, ahead])
    out = io.StringIO()
    follower = Follower(RunWatcher(run_dir), Screen(out, live=False), stall_s=10, header=False)

    assert not follower.step()
    (line,) = out.getvalue().splitlines()
    assert line == "rank 0 stalled 30 s in attention, waiting in wait_for_fabric (fabric.py:42)"
    # The live view's groups name it too.
    assert follower.watcher.status_lines(durations=False) == [
        "rank 0: in attention (waiting in wait_for_fabric (fabric.py:42))",
        "rank 1: in allreduce_workspace",
    ]


@pytest.mark.slow
def test_a_rank_killed_while_it_hangs_is_said_with_where_it_waited(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    launch = start_cli(
        "run", "--simulate", "h200x8", "--nproc", "2", "--grace", "1", "--stall", "0.2",
        "--inject", "1:attention/FLASH_ATTN=hang", "--run-dir", str(run_dir),
        cwd=tmp_path,
    )  # fmt: skip
    log = run_dir / "rank-1.jsonl"
    with (
        reaping(launch, run_dir),
        _watching(run_dir, tmp_path, "--stall", "60", "--interval", "0.1") as watch,
    ):
        wait_for_event(
            log,
            lambda e: e["type"] == "step.stalled" and e["step"] == "attention/FLASH_ATTN",
            alive=launch.running,
        )
        os.kill(read_events(log)[0]["pid"], signal.SIGKILL)
        finished = watch.finish()
        launch.finish()

    assert finished.returncode == 1, finished.describe()
    (death,) = [line for line in finished.lines() if line.startswith("rank 1: ")]
    assert re.fullmatch(
        r"rank 1: killed by SIGKILL at \+\d+\.\d s in attention/FLASH_ATTN, "
        r"waiting in fire \(_faults\.py:\d+\) after \d+\.\d s",
        death,
    ), death
    assert finished.lines()[-1].endswith(": incomplete"), finished.describe()


def test_a_path_that_does_not_become_a_run_directory_is_one_line_and_exit_2(
    tmp_path: Path,
) -> None:
    completed = call_cli("watch", "misspelt", "--stall", "0.3", "--interval", "0.05", cwd=tmp_path)
    assert completed.returncode == 2, completed.describe()
    assert completed.stdout == ""
    (line,) = completed.stderr.splitlines()
    assert line.startswith("startup-orchestrator: error: misspelt: not a run directory (no such ")


def test_a_rank_whose_process_is_gone_from_this_host_has_ended(tmp_path: Path) -> None:
    # Rank 0's process: a real one that ran and was reaped. Its log began an
    # hour ago, so its pid now names no process, or one started since the
    # log began, which is not the rank's.
    ended = subprocess.Popen([sys.executable, "-c", ""])
    assert ended.wait() == 0
    run_dir = tmp_path / "run"
    streams = []
    for rank, (host, pid, ago_s) in enumerate(
        [(platform.node(), ended.pid, 3600), ("node-1", None, 0)]
    ):
        began = time.time_ns() - ago_s * 10**9
        stream = EventStream(run_id="gone", rank=rank, world_size=2, wall_ns=began)
        stream.run_started(host=host, pid=pid)
        stream.started("attention")
        streams.append(stream)
    _write_logs(run_dir, streams)
    out = io.StringIO()
    follower = Follower(RunWatcher(run_dir), Screen(out, live=False), stall_s=60, header=False)

    # Rank 1's host cannot be looked at from here: it is waited for.
    assert not follower.step()
    assert out.getvalue().splitlines() == [
        "rank 0: process gone without run.finished (crashed or killed) in attention"
    ]
    streams[1].succeeded("attention")
    streams[1].run_finished()
    _write_logs(run_dir, streams[1:])
    assert follower.step()


@pytest.mark.slow
def test_a_rank_of_an_outside_launcher_killed_while_it_hangs_ends_the_watch(
    tmp_path: Path,
) -> None:
    # Two ranks as torchrun starts them, each its own script embedding
    # Startup: no launcher's manifest records how a rank's process ended.
    run_dir = tmp_path / "run"
    ranks = [
        Background(
            [sys.executable, str(EMBEDDING), "--inject", "1:attention/FLASH_ATTN=hang",
             "--run-dir", str(run_dir)],
            cwd=tmp_path,
            env=environment(
                RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                GROUP_RANK="0", TORCHELASTIC_RUN_ID="outside",
            ),
            name=f"rank-{rank}",
        )
        for rank in range(2)
    ]  # fmt: skip
    try:
        # The watch gives a directory that is not yet a run's only its stall
        # threshold (0.5 s) to become one: it starts once the ranks' logs are
        # there, however long a loaded machine takes to start them.
        for number, process in enumerate(ranks):
            wait_for_event(
                run_dir / f"rank-{number}.jsonl",
                lambda event: event["type"] == "run.started",
                alive=process.running,
            )
        with _watching(
            run_dir, tmp_path, "--stall", "0.5", "--interval", "0.1", "--timeout", "120"
        ) as watch:
            # While its process runs, the hanging rank is waited for.
            _wait_for_output(
                watch,
                lambda out: any(
                    line.startswith("rank 1 stalled ") and "attention/FLASH_ATTN" in line
                    for line in out.splitlines()
                ),
            )
            assert pid_of(run_dir / "rank-1.jsonl") == ranks[1].pid
            ranks[1].kill()
            finished = watch.finish()
    finally:
        for rank in ranks:
            rank.kill()

    assert ranks[1].process.returncode == -signal.SIGKILL
    assert finished.returncode == 1, finished.describe()
    assert "timed out" not in finished.stdout, finished.describe()
    (death,) = [line for line in finished.lines() if "process gone" in line]
    assert death.startswith(
        "rank 1: process gone without run.finished (crashed or killed) in attention/FLASH_ATTN"
    ), finished.describe()
    assert finished.lines()[-1] == "run outside: incomplete", finished.describe()


def _follower(
    run_dir: Path, *, stall_s: float = 10, header: bool = False
) -> tuple[Follower, io.StringIO]:
    out = io.StringIO()
    screen = Screen(out, live=False)
    return Follower(RunWatcher(run_dir), screen, stall_s=stall_s, header=header), out


@pytest.mark.parametrize(
    ("end", "said"),
    [
        (lambda stream: stream.failed("attention", exception_info("RuntimeError")), "failed"),
        (lambda stream: stream.timed_out("attention"), "timed_out"),
        (lambda stream: stream.crashed("attention"), "crashed"),
        (lambda stream: stream.unavailable("attention"), None),
    ],
    ids=["failed", "timed_out", "crashed", "unavailable"],
)
def test_a_step_that_failed_timed_out_or_crashed_is_a_line_as_it_lands(
    tmp_path: Path, end: Callable[[EventStream], object], said: str | None
) -> None:
    run_dir = tmp_path / "run"
    streams = _ranks_in("attention", 2, ago_s=0)
    _write_logs(run_dir, streams)
    follower, out = _follower(run_dir, stall_s=60)
    assert not follower.step()
    for stream in streams:
        end(stream)
    _write_logs(run_dir, streams)

    assert not follower.step()
    # An expected outcome (a candidate unavailable) is what fallbacks are for.
    assert out.getvalue().splitlines() == ([] if said is None else [f"ranks 0-1: attention {said}"])


@pytest.mark.parametrize(
    ("duration_s", "said"), [(5.8, "5.8 s"), (9.94, "9.9 s"), (10.0, "10 s"), (25.4, "25 s")]
)
def test_durations_have_one_decimal_below_ten_seconds(
    tmp_path: Path, duration_s: float, said: str
) -> None:
    run_dir = tmp_path / "run"
    stream = EventStream(run_id="timed", tick_ns=0)
    stream.run_started()
    stream.advance(round(duration_s * 1e9))
    stream.run_finished()
    _write_logs(run_dir, [stream])
    watcher = RunWatcher(run_dir)
    watcher.poll()

    assert watcher.status_lines() == [f"rank 0: ready in {said}"]


def test_a_rank_with_several_steps_in_flight_names_the_innermost_ones(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (stream,) = _ranks_in("platform", 1, ago_s=0)
    stream.started("platform/tpu")
    stream.started("platform/cuda")
    stream.started("platform/rocm")
    stream.succeeded("platform/rocm")
    _write_logs(run_dir, [stream])
    watcher = RunWatcher(run_dir)
    watcher.poll()

    assert watcher.in_progress(0)[0] == ("platform/tpu", "platform/cuda")
    assert watcher.status_lines(durations=False) == ["rank 0: in platform/tpu (+1 more)"]


def test_a_lone_rank_that_makes_no_progress_is_stalled(tmp_path: Path) -> None:
    # With no peer to compare it with, its step is not "slow together":
    # the line names where it waits.
    run_dir = tmp_path / "run"
    (stream,) = _ranks_in("attention", 1, ago_s=30)
    stream.advance(20 * 10**9)
    stream.stalled("attention", 20.0)
    _write_logs(run_dir, [stream])
    follower, out = _follower(run_dir)

    assert not follower.step()
    assert out.getvalue().splitlines() == [
        "rank 0 stalled 30 s in attention, waiting in wait_for_fabric (fabric.py:42)"
    ]


def test_ranks_stuck_in_different_steps_are_each_stalled_and_said_once(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    streams = _ranks_in("attention", 3, ago_s=40)
    streams[1].advance(10 * 10**9).succeeded("attention")  # its last progress: 30 s ago
    streams[1].started("allreduce_workspace")
    # Rank 0's last progress, in the step rank 2 is in: 20 s ago.
    streams[0].advance(20 * 10**9).decision("backend", "FLASH_ATTN", step="attention")
    _write_logs(run_dir, streams)
    follower, out = _follower(run_dir)

    assert not follower.step()
    assert not follower.step()  # no progress since: nothing more to say
    assert out.getvalue().splitlines() == [
        "ranks 0,2 stalled 40 s in attention",  # the longest of the group
        "rank 1 stalled 30 s in allreduce_workspace",
    ]


def test_a_rank_waiting_for_another_process_is_said_so_after_the_one_it_waits_for(
    tmp_path: Path,
) -> None:
    # Rank 0 waits in torch.distributed's rendezvous (the engine slice's
    # peer_waits) for rank 1, stuck in its own attention step; both stalled.
    run_dir = tmp_path / "run"
    rendezvous = FrameInfo(
        filename="/venv/torch/distributed/distributed_c10d.py", lineno=4500, name="barrier"
    )
    waiting, stuck = _ranks_in("process_group", 2, ago_s=30)
    waiting.advance(20 * 10**9).stalled("process_group", 20.0, waiting_in=rendezvous)
    stuck.succeeded("process_group").started("attention")
    stuck.advance(20 * 10**9).stalled("attention", 20.0)
    _write_logs(run_dir, [waiting, stuck])
    follower, out = _follower(run_dir)

    assert not follower.step()
    assert out.getvalue().splitlines() == [
        "rank 1 stalled 30 s in attention, waiting in wait_for_fabric (fabric.py:42)",
        "rank 0 stalled 30 s in process_group, "
        "waiting in barrier (distributed_c10d.py:4500) for another process",
    ]
    assert follower.watcher.status_lines(durations=False) == [
        "rank 1: in attention (waiting in wait_for_fabric (fabric.py:42))",
        "rank 0: in process_group "
        "(waiting in barrier (distributed_c10d.py:4500) for another process)",
    ]


def test_a_stalled_rank_is_said_again_once_it_records_where_it_waits(tmp_path: Path) -> None:
    # The watch's threshold passed before the rank's own watchdog recorded
    # where it waits; that record is news, though not progress.
    run_dir = tmp_path / "run"
    (stream,) = _ranks_in("attention", 1, ago_s=30)
    _write_logs(run_dir, [stream])
    follower, out = _follower(run_dir)

    assert not follower.step()
    stream.stalled("attention", 20.0)
    _write_logs(run_dir, [stream])
    assert not follower.step()
    stream.stalled("attention", 40.0)  # the same place: nothing new
    _write_logs(run_dir, [stream])
    assert not follower.step()
    assert [
        line.split(" stalled ")[1].partition(" in ")[2] for line in out.getvalue().splitlines()
    ] == [
        "attention",
        "attention, waiting in wait_for_fabric (fabric.py:42)",
    ]


def test_a_run_of_another_graph_has_no_peer_waits_unless_its_slice_is_given(
    tmp_path: Path,
) -> None:
    # A run recorded with a slice of its own: what it means is not loaded
    # unasked (nor the engine's taken instead), so where its rank waits is
    # named but not judged; given its slice, it is. The engine's slice
    # would judge this frame as a wait for another process, too.
    run_dir = tmp_path / "run"
    frame = FrameInfo(filename="/venv/torch/distributed/join.py", lineno=7, name="join")
    (stream,) = _ranks_in("mesh", 1, ago_s=30)
    stream.advance(20 * 10**9).stalled("mesh", 20.0, waiting_in=frame)
    _write_logs(run_dir, [stream], slices=("app:MESH",))
    mesh = Slice(name="mesh", peer_waits=("*/distributed/*",))

    for slices, said in (
        (None, "waiting in join (join.py:7)"),
        ([mesh], "waiting in join (join.py:7) for another process"),
    ):
        watcher = RunWatcher(run_dir, slices)
        watcher.poll()
        assert watcher.waiting_text(0) == said


def test_a_recorded_engine_start_is_announced_as_one_whose_processes_join_by_role(
    tmp_path: Path,
) -> None:
    # Its first process knows a world of one; the others join as started.
    run_dir = tmp_path / "run"
    (stream,) = _ranks_in("startup", 1, ago_s=0)
    _write_logs(run_dir, [stream], identity=attrs.evolve(stream.identity, role="main"))
    follower, out = _follower(run_dir, stall_s=60, header=True)

    assert not follower.step()
    header, status = out.getvalue().splitlines()
    assert header == f"watching {run_dir}: run slow, its processes join as they start"
    # Each process is named by its role, as replay names it.
    assert status.startswith("rank 0 (main): in startup for "), status


def test_a_rank_of_the_world_without_a_log_keeps_the_watch_going(tmp_path: Path) -> None:
    # Rank 1's log is not there yet: the world (from rank 0's run.started)
    # has not finished although every log there has.
    run_dir = tmp_path / "run"
    stream = EventStream(run_id="late", world_size=2, wall_ns=time.time_ns())
    stream.run_started()
    stream.run_finished()
    _write_logs(run_dir, [stream])
    follower, _ = _follower(run_dir, stall_s=60)

    assert not follower.step()
    assert follower.watcher.status_lines(durations=False) == [
        "rank 0: ready",
        "rank 1: no log yet",
    ]


def test_off_a_terminal_the_groups_are_printed_once_a_stall_period_when_they_changed(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    (stream,) = _ranks_in("attention", 1, ago_s=0)
    _write_logs(run_dir, [stream])
    follower, out = _follower(run_dir, stall_s=60, header=True)

    assert not follower.step()
    stream.succeeded("attention")
    stream.started("allreduce_workspace")
    _write_logs(run_dir, [stream])
    assert not follower.step()  # changed, but within the stall period
    assert not follower.step()

    lines = out.getvalue().splitlines()
    assert lines[0] == f"watching {run_dir}: run slow, 1 rank"
    assert [line.rsplit(" for ", 1)[0] for line in lines[1:]] == ["rank 0: in attention"]


def test_off_a_terminal_groups_that_did_not_change_are_not_printed_again(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _write_logs(run_dir, _ranks_in("attention", 1, ago_s=0))
    # A stall period so short that every look is a period later.
    follower, out = _follower(run_dir, stall_s=1e-9, header=True)

    for _ in range(3):
        assert not follower.step()

    groups = [line for line in out.getvalue().splitlines() if line.startswith("rank 0: ")]
    assert [line.rsplit(" for ", 1)[0] for line in groups] == ["rank 0: in attention"]


def test_a_run_a_rank_of_which_died_ends_the_watch_incomplete(tmp_path: Path) -> None:
    # Rank 0's process ran on this host and is gone (reaped an hour before
    # its log is looked at); rank 1 reached ready.
    ended = subprocess.Popen([sys.executable, "-c", ""])
    assert ended.wait() == 0
    run_dir = tmp_path / "run"
    streams = []
    for rank, (host, pid) in enumerate([(platform.node(), ended.pid), ("node-1", None)]):
        stream = EventStream(
            run_id="died", rank=rank, world_size=2, wall_ns=time.time_ns() - 3600 * 10**9
        )
        stream.run_started(host=host, pid=pid)
        stream.started("attention")
        streams.append(stream)
    streams[1].succeeded("attention")
    streams[1].run_finished()
    _write_logs(run_dir, streams)

    completed = call_cli("watch", str(run_dir), "--timeout", "60", cwd=tmp_path)

    assert completed.returncode == 1, completed.describe()
    assert completed.lines()[-1] == "run died: incomplete", completed.describe()


def test_a_timeout_names_each_group_of_ranks_still_running(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    streams = _ranks_in("attention", 3, ago_s=0)
    streams[2].succeeded("attention")
    streams[2].started("allreduce_workspace")
    _write_logs(run_dir, streams)

    completed = call_cli(
        "watch", str(run_dir), "--timeout", "0.2", "--interval", "0.05", cwd=tmp_path
    )

    assert completed.returncode == 1, completed.describe()
    assert re.fullmatch(
        r"timed out after 0\.2 s; still running: ranks 0-1: in attention for \d+\.\d s; "
        r"rank 2: in allreduce_workspace for \d+\.\d s",
        completed.lines()[-1],
    ), completed.describe()


def test_a_dumb_terminal_gets_plain_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    controller, terminal = os.openpty()
    try:
        with open(terminal, "w", closefd=False) as stream:
            monkeypatch.setenv("TERM", "xterm")
            assert is_terminal(stream)
            monkeypatch.setenv("TERM", "dumb")
            assert not is_terminal(stream)
            assert not is_terminal(io.StringIO())
    finally:
        os.close(controller)
        os.close(terminal)


def _manifest(run_id: str, world_size: int, **fields: object) -> Manifest:
    """A manifest whose launcher is this process (running, on this host)."""
    launcher = LauncherProcess(
        pid=os.getpid(), host=platform.node(), started_wall_ns=time.time_ns()
    )
    return Manifest(run_id=run_id, world_size=world_size, launcher=launcher, **fields)


def test_a_launch_whose_ranks_have_no_log_yet_is_watched_from_its_manifest(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _manifest("claimed", 2).write(run_dir)
    follower, out = _follower(run_dir, stall_s=60, header=True)

    assert not follower.step()
    assert out.getvalue().splitlines() == [
        f"watching {run_dir}: run claimed, 2 ranks",
        "ranks 0-1: no log yet",
    ]


def test_a_rank_gone_from_this_host_is_dead_in_a_run_whose_logs_a_rank_collected(
    tmp_path: Path,
) -> None:
    # Rank 0 collected the logs and wrote the manifest (its process is the
    # manifest's launcher, and it still runs): it watched no rank's process,
    # so rank 1, whose process is gone, died.
    ended = subprocess.Popen([sys.executable, "-c", ""])
    assert ended.wait() == 0
    run_dir = tmp_path / "run"
    streams = []
    for rank, (pid, ago_s) in enumerate([(os.getpid(), 0), (ended.pid, 3600)]):
        began = time.time_ns() - ago_s * 10**9
        stream = EventStream(run_id="collected", rank=rank, world_size=2, wall_ns=began)
        stream.run_started(host=platform.node(), pid=pid)
        stream.started("attention")
        streams.append(stream)
    _write_logs(run_dir, streams)
    ranks = tuple(RankProcess(rank=rank) for rank in range(2))
    _manifest("collected", 2, ranks=ranks, collected_by=0).write(run_dir)
    follower, out = _follower(run_dir, stall_s=1e9)

    assert not follower.step()
    assert out.getvalue().splitlines() == [
        "rank 1: process gone without run.finished (crashed or killed) in attention"
    ]
