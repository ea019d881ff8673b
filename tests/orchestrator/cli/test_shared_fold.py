"""A large run is folded on every core: the command's process folds the
first share of the logs while forked workers fold the others, and what the
commands print is what one process folding every log gives (the library's
:func:`events.replay` of the logs as read), errors included.
"""

from __future__ import annotations

import json
import resource
import subprocess
from pathlib import Path
from typing import Any

import attrs
import pytest

from events import RankFolder, encode, read_log, replay
from exporters import report_json
from orchestrator._decisions import check_decisions
from orchestrator.engine import ENGINE, ENGINE_DECIDERS
from tests.orchestrator.cli.harness import COMMAND_TIMEOUT_S, command, environment, run_cli
from tests.orchestrator.engine.streams import attention_failed_rank, healthy_rank

#: Enough ranks for two shares of a 2-core machine's fold.
WORLD = 160
#: A rank of the second share: it fails, and its log is torn.
FAILING = 130
TORN = 141


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("shared") / "run"
    directory.mkdir()
    for rank in range(WORLD):
        events = (
            attention_failed_rank(rank, world_size=WORLD)
            if rank == FAILING
            else healthy_rank(rank, world_size=WORLD)
        )
        data = b"".join(encode(event) + b"\n" for event in events)
        if rank == TORN:
            data += encode(events[-1])[:40]  # a writer that stopped mid-line
        (directory / f"rank-{rank}.jsonl").write_bytes(data)
    return directory


def _one_process(run_dir: Path, until: int | None = None) -> dict[str, Any]:
    """The report document of the logs folded in this process, with the
    recorded decisions that current code decides differently."""
    logs = [read_log(run_dir / f"rank-{rank}.jsonl") for rank in range(WORLD)]
    document = report_json(replay(logs, slices=[ENGINE], until=until))
    cut = [event for log in logs for event in log.events if until is None or event.seq <= until]
    decided = check_decisions(cut, ENGINE_DECIDERS)
    document["divergences"] = [
        *document["divergences"],
        *({"rank": d.ranks[0], "seq": d.seq, "text": d.text} for d in decided),
    ]
    return dict(json.loads(json.dumps(document)))


def _made(run_dir: Path, divergence: dict[str, Any]) -> int:
    """When a divergent decision was made (wall clock)."""
    log = read_log(run_dir / f"rank-{divergence['rank']}.jsonl")
    return log.events[divergence["seq"]].wall_ns


@pytest.mark.parametrize("until", [None, 7])
def test_the_shared_fold_reports_what_one_process_folding_every_log_reports(
    run_dir: Path, tmp_path: Path, until: int | None
) -> None:
    cut = [] if until is None else ["--until", str(until)]
    replayed = run_cli("replay", "--json", *cut, str(run_dir), cwd=tmp_path)

    assert replayed.returncode == 1, replayed.describe()
    shared, one = replayed.json(), _one_process(run_dir, until)
    assert {**shared, "divergences": None} == {**one, "divergences": None}
    # Decision divergences in the order they were made, every one found.
    assert [
        {"rank": d["rank"], "seq": d["seq"], "text": d["text"]} for d in shared["divergences"]
    ] == sorted(one["divergences"], key=lambda d: (_made(run_dir, d), d["rank"], d["seq"]))
    if until is None:
        assert len(shared["divergences"]) >= WORLD - 1
        assert replayed.json()["root_cause"]["rank"] == FAILING
        assert f"rank-{TORN}.jsonl" in " ".join(replayed.json()["warnings"])


@pytest.mark.parametrize(
    ("view", "render"),
    [
        ("explain", "explain_text"),
        ("blame", "blame_text"),
        ("critical-path", "critical_path_text"),
    ],
)
def test_the_views_of_the_shared_fold_are_what_one_process_shows(
    run_dir: Path, tmp_path: Path, view: str, render: str
) -> None:
    import exporters

    shown = run_cli(view, str(run_dir), cwd=tmp_path)

    assert shown.returncode == 0, shown.describe()
    logs = [read_log(run_dir / f"rank-{rank}.jsonl") for rank in range(WORLD)]
    one = getattr(exporters, render)(replay(logs, slices=[ENGINE]))
    # explain opens with the report's header; the view follows it.
    assert shown.stdout.endswith(one)
    if view == "explain":  # the failing rank, folded by a worker, first
        assert one.startswith(f"== rank {FAILING} ==\n")


def test_the_page_of_the_shared_fold_is_what_one_process_draws(
    run_dir: Path, tmp_path: Path
) -> None:
    from exporters import report_html

    page = tmp_path / "page.html"
    drawn = run_cli("replay", "--html", str(page), str(run_dir), cwd=tmp_path)

    assert drawn.returncode == 1, drawn.describe()
    logs = [read_log(run_dir / f"rank-{rank}.jsonl") for rank in range(WORLD)]
    one = report_html(replay(logs, slices=[ENGINE]))
    # The same page but for the decision divergences the command adds.
    cut = one.index('<section id="divergences">')
    assert page.read_text(encoding="utf-8")[:cut] == one[:cut]
    assert f'data-ranks="rank {FAILING}" data-outcome="failed"' in one


def test_a_corrupt_log_in_a_workers_share_is_named_as_one_process_names_it(
    run_dir: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "run"
    broken.mkdir()
    for log in run_dir.iterdir():
        (broken / log.name).write_bytes(log.read_bytes())
    lines = (broken / "rank-150.jsonl").read_bytes().splitlines(keepends=True)
    lines[3] = b'{"v": 3, "type": "step.started", "seq": "three"}\n'
    (broken / "rank-150.jsonl").write_bytes(b"".join(lines))

    replayed = run_cli("replay", str(broken), cwd=tmp_path)

    assert replayed.returncode == 1, replayed.describe()
    assert replayed.stdout == ""
    assert replayed.stderr.startswith(f"startup-orchestrator: error: {broken}/rank-150.jsonl:4: ")
    assert len(replayed.stderr.splitlines()) == 1


def test_a_worker_that_cannot_write_its_results_leaves_its_share_to_the_command(
    run_dir: Path, tmp_path: Path
) -> None:
    # A machine with no room for the worker's results (here a 4 KiB limit
    # on any file the command's processes write): the worker fails, and the
    # command folds its share itself, to the same report.
    def no_room() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    done = subprocess.run(
        command("replay", "--json", str(run_dir)),
        cwd=tmp_path,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        preexec_fn=no_room,
        check=False,
    )

    assert done.returncode == 1, done.stderr
    assert done.stderr == ""
    assert json.loads(done.stdout) == run_cli("replay", "--json", str(run_dir), cwd=tmp_path).json()


@attrs.frozen
class _Converted:
    """A record whose ``__init__`` converts: it cannot be built from its
    stored field values, so it is pickled as any object is."""

    ranks: tuple[int, ...] = attrs.field(converter=tuple)


def test_a_workers_records_read_back_equal_whatever_their_class(run_dir: Path) -> None:
    # What a worker writes: folded ranks (frozen records all the way down),
    # read back by their builders; a record that converts in its __init__
    # falls back to ordinary pickling.
    import io
    import pickle

    from orchestrator.cli._run_logs import _FieldsPickler, _Job

    job = _Job(RankFolder([ENGINE], None), keep_events=False)
    sent = [job.fold(run_dir / f"rank-{rank}.jsonl") for rank in (0, FAILING, TORN)]
    sent.append(_Converted(ranks=[1, 2]))  # type: ignore[arg-type]
    buffer = io.BytesIO()
    _FieldsPickler(buffer, pickle.HIGHEST_PROTOCOL).dump(sent)

    back = pickle.loads(buffer.getvalue())

    assert back == sent
    assert [type(item) for item in back] == [type(item) for item in sent]
    assert back[-1].ranks == (1, 2)
