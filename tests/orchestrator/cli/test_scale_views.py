"""The read-only commands stay readable at 1,024 ranks: identical ranks are
rank ranges, the ranks that differ come first, and no output grows with the
number of ranks that are alike (``replay``, ``validate``, ``replay --html``).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable
from pathlib import Path

import pytest

from events import Event, encode
from tests.orchestrator.cli.harness import (
    COMMAND_TIMEOUT_S,
    Background,
    call_cli,
    command,
    environment,
    poll_file,
)
from tests.orchestrator.engine.streams import attention_failed_rank, healthy_rank

pytestmark = pytest.mark.slow

WORLD = 1024
#: The node of eight ranks the ``node-missing`` run has no logs of.
MISSING = range(512, 520)
#: The rank the ``failed`` run fails on.
FAILING = 700


def _write(run_dir: Path, streams: Iterable[list[Event]]) -> None:
    run_dir.mkdir()
    for events in streams:
        rank = events[0].rank
        (run_dir / f"rank-{rank}.jsonl").write_bytes(
            b"".join(encode(event) + b"\n" for event in events)
        )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("scale")
    healthy = [healthy_rank(rank, world_size=WORLD) for rank in range(WORLD)]
    made = {name: root / name for name in ("ready", "failed", "node-missing")}
    _write(made["ready"], healthy)
    _write(
        made["failed"],
        (
            attention_failed_rank(r, world_size=WORLD) if r == FAILING else s
            for r, s in enumerate(healthy)
        ),
    )
    _write(made["node-missing"], (s for r, s in enumerate(healthy) if r not in MISSING))
    return made


def _table(lines: list[str]) -> list[str]:
    start = lines.index("Ranks:") + 2  # after the header row
    return lines[start : lines.index("", start)]


def test_replay_of_a_ready_run_is_one_row(runs: dict[str, Path], tmp_path: Path) -> None:
    replayed = call_cli("replay", str(runs["ready"]), cwd=tmp_path)

    assert replayed.returncode == 0, replayed.describe()
    lines = replayed.lines()
    assert lines[0].startswith(f"Startup ready: {WORLD} ready")
    assert [row.split()[0] for row in _table(lines)] == [f"0-{WORLD - 1}"]
    assert len(lines) < 30


def test_replay_puts_the_failed_rank_first(runs: dict[str, Path], tmp_path: Path) -> None:
    replayed = call_cli("replay", str(runs["failed"]), cwd=tmp_path)

    assert replayed.returncode == 1, replayed.describe()
    lines = replayed.lines()
    assert lines[1].startswith(f"Root cause: rank {FAILING}, step attention/FLASH_ATTN")
    assert [row.split()[:2] for row in _table(lines)] == [
        [str(FAILING), "failed"],
        [f"0-{FAILING - 1},{FAILING + 1}-{WORLD - 1}", "ready"],
    ]
    assert len(lines) < 40


def test_replay_of_a_missing_node_is_one_line_per_reason(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    replayed = call_cli("replay", str(runs["node-missing"]), cwd=tmp_path)

    assert replayed.returncode == 1, replayed.describe()
    lines = replayed.lines()
    assert lines[0].startswith(f"Startup incomplete: {WORLD - 8} ready, 8 without events")
    missing = "ranks 512-519: no log (never started, or killed before its first event)"
    assert lines[lines.index("Ranks without events:") + 1] == f"  {missing}"
    assert [row.split()[:2] for row in _table(lines)] == [
        ["512-519", "incomplete"],
        [f"0-511,520-{WORLD - 1}", "ready"],
    ]
    assert len(lines) < 40


def test_validate_groups_clean_logs_and_missing_ranks(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    run = runs["node-missing"]
    checked = call_cli("validate", str(run), cwd=tmp_path)

    assert checked.returncode == 1, checked.describe()
    assert checked.lines() == [
        f"{run}: ranks 512-519 of world size {WORLD} have no log (never started, or killed "
        "before its first event) [run, warning]",
        f"{run}: {WORLD - 8} logs ok, ranks 0-511,520-{WORLD - 1}",
        f"1 path(s), {WORLD - 8} file(s), 1 problem(s)",
    ]


def test_html_report_does_not_grow_with_alike_ranks(runs: dict[str, Path], tmp_path: Path) -> None:
    sizes = {}
    for name, run in runs.items():
        page = tmp_path / f"{name}.html"
        call_cli("replay", "--html", str(page), str(run), cwd=tmp_path)
        sizes[name] = page.stat().st_size
        text = page.read_text(encoding="utf-8")
        assert text.count("<tr") < 40, name
    # A thousand ranks alike are a row, not a thousand rows.
    assert max(sizes.values()) < 256 * 1024, sizes


def test_ctrl_c_stops_the_shared_fold_and_its_workers(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    # Ctrl-C reaches the whole foreground process group: the command says
    # "interrupted" and ends at once, and the workers folding its logs end
    # with it (they leave the signal to the command, which kills them).
    replaying = Background(
        command("replay", str(runs["ready"])), cwd=tmp_path, env=environment(), new_session=True
    )
    try:
        children = Path(f"/proc/{replaying.pid}/task/{replaying.pid}/children")
        workers = poll_file(
            lambda: children.read_text().split() if replaying.running() else [],
            bool,
            alive=replaying.running,
            deadline_s=COMMAND_TIMEOUT_S,
            what="a worker folding the logs",
        )
        os.killpg(replaying.pid, signal.SIGINT)
        done = replaying.finish()
    finally:
        replaying.kill_group()

    assert done.returncode == 1, done.describe()
    assert done.stderr == "startup-orchestrator: interrupted\n", done.describe()
    assert done.stdout == ""
    for worker in workers:
        # Killed and reaped by the command: no such process (or the pid is
        # already another program's).
        cmdline = Path(f"/proc/{worker}/cmdline")
        assert not cmdline.exists() or b"replay" not in cmdline.read_bytes()


#: A slice whose facts hook, in whichever process folds the logs, notes each
#: rank it folds (at the first event that settles facts) and holds the fold
#: of one rank until the test opens the gate (a FIFO).
_GATED_SLICE = """
import os
from pathlib import Path
from events import Slice

HERE = Path(__file__).parent
SEEN = set()

def _facts(facts, event):
    if event.rank not in SEEN:
        SEEN.add(event.rank)
        with open(HERE / "folded", "a") as out:
            out.write(f"{event.rank}\\n")
        if event.rank == int(os.environ["GATED_RANK"]):
            (HERE / "waiting").write_text(str(os.getpid()))
            # Opening a FIFO to read blocks until the test opens it to write.
            with open(HERE / "gate"):
                pass
    return None

SLICE = Slice(name="gated", derive_facts=_facts)
"""


def test_a_worker_stops_when_the_command_is_killed(runs: dict[str, Path], tmp_path: Path) -> None:
    # SIGKILL to the command alone (no Ctrl-C to the group, no chance to
    # stop its workers): a worker sees it is orphaned before its next batch
    # of logs and ends, instead of folding the rest of its share for no one.
    (tmp_path / "gated.py").write_text(_GATED_SLICE)
    os.mkfifo(tmp_path / "gate")
    from orchestrator.cli._run_logs import _OWN_SHARE

    # In the worker's share (after the command's own), its first batch.
    gated = int(WORLD / 2 * _OWN_SHARE) + 1
    replaying = Background(
        command("replay", "--slice", str(tmp_path / "gated.py") + ":SLICE", str(runs["ready"])),
        cwd=tmp_path,
        env=environment(GATED_RANK=str(gated)),
        new_session=True,
    )
    waiting = tmp_path / "waiting"
    try:
        worker = int(
            poll_file(
                lambda: waiting.read_text() if waiting.exists() else "",
                bool,
                alive=replaying.running,
                deadline_s=COMMAND_TIMEOUT_S,
                what="the worker holding its fold",
            )
        )
        replaying.send(signal.SIGKILL)
        replaying.finish()
        with (tmp_path / "gate").open("w"):  # the worker is in open(): both go on
            pass

        def ended() -> bool:
            # Gone, or a zombie its new parent has not reaped yet.
            try:
                return Path(f"/proc/{worker}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
            except OSError:
                return True

        poll_file(
            ended, bool, alive=lambda: True, deadline_s=COMMAND_TIMEOUT_S, what="the worker ending"
        )
    finally:
        with contextlib.suppress(OSError):  # a worker still held: let it go
            os.close(os.open(tmp_path / "gate", os.O_WRONLY | os.O_NONBLOCK))
        replaying.kill_group()

    folded = [int(line) for line in (tmp_path / "folded").read_text().split()]
    after_the_gate = [rank for rank in folded if rank > gated]
    # The rest of its batch at most: not the other 400-odd ranks of its share.
    assert 0 < len(after_the_gate) < 64, sorted(after_the_gate)
