"""Crafted and damaged logs: every view reports or gives one line and exit
1, never a traceback and never a verdict the log does not support."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import orjson
import pytest

from events import encode
from events.testing import EventStream

from .conftest import StoredRun
from .harness import call_cli, rank_logs, run_cli

PROG = "startup-orchestrator: error: "
V0_LOG = Path(__file__).resolve().parents[2] / "events" / "fixtures" / "v0-rank0.jsonl"
VIEWS = [
    ("replay",),
    ("replay", "--json"),
    ("replay", "--html", "page.html"),
    ("replay", "--export", "jaeger-json=spans.json"),
    ("explain",),
    ("blame",),
    ("critical-path",),
]
Records = list[dict[str, Any]]


def _crafted(stored: StoredRun, tmp_path: Path, change: Callable[[Records], Records]) -> Path:
    run = tmp_path / "run"
    shutil.copytree(stored.directory, run)
    (log,) = rank_logs(run)
    records = [orjson.loads(line) for line in log.read_bytes().splitlines()]
    log.write_bytes(b"".join(orjson.dumps(record) + b"\n" for record in change(records)))
    return run


def _event_after_the_end(records: Records) -> Records:
    late = {**records[1], "seq": records[-1]["seq"] + 1, "step": "late"}
    return [*records, late]


def _spans_of(records: Records) -> dict[str, str]:
    return {r["step"]: r["span_id"] for r in records if r["type"] == "step.started"}


def _parent_is_itself(records: Records) -> Records:
    for record in records:
        if record.get("step") == "attention":
            record["parent_span_id"] = record["span_id"]
    return records


def _parents_in_a_cycle(records: Records) -> Records:
    spans = _spans_of(records)
    for record in records:
        if record.get("step") == "attention":
            record["parent_span_id"] = spans["platform"]
        elif record.get("step") == "platform":
            record["parent_span_id"] = spans["attention"]
    return records


def _two_steps_one_span(records: Records) -> Records:
    spans = _spans_of(records)
    for record in records:
        if record.get("step") == "attention":
            record["span_id"] = spans["platform"]
    return records


@pytest.mark.parametrize("view", VIEWS, ids=" ".join)
def test_an_event_after_run_finished_is_named_not_read_as_ready(
    healthy: StoredRun, tmp_path: Path, view: tuple[str, ...]
) -> None:
    run = _crafted(healthy, tmp_path, _event_after_the_end)
    completed = call_cli(*view, str(run), cwd=tmp_path)
    assert completed.returncode == 1, completed.describe()
    assert completed.stdout == ""
    (line,) = completed.stderr.splitlines()
    assert line.startswith(PROG)
    assert "step.started (seq" in line
    assert "after run.finished: a finished rank writes nothing more" in line


def test_validate_names_an_event_after_run_finished(healthy: StoredRun, tmp_path: Path) -> None:
    run = _crafted(healthy, tmp_path, _event_after_the_end)
    completed = call_cli("validate", str(run), cwd=tmp_path)
    assert completed.returncode == 1, completed.describe()
    assert "after run.finished: a finished rank writes nothing more" in completed.stdout
    assert "no run.finished event" not in completed.stdout


def test_an_all_zero_span_id_fails_the_export_in_one_line(
    healthy: StoredRun, tmp_path: Path
) -> None:
    def zero(records: Records) -> Records:
        for record in records:
            if record["type"].startswith("step."):
                record["span_id"] = "0" * 16
        return records

    run = _crafted(healthy, tmp_path, zero)
    completed = call_cli("replay", str(run), "--export", "jaeger-json=spans.json", cwd=tmp_path)
    assert completed.returncode == 1, completed.describe()
    (line,) = completed.stderr.splitlines()
    assert line.startswith(f"{PROG}--export jaeger-json: cannot build a span from step.")
    assert "span id must not be all zeros; the log is damaged (validate it)" in line


@pytest.mark.parametrize(
    "change",
    [_parent_is_itself, _parents_in_a_cycle, _two_steps_one_span],
    ids=["parent-is-itself", "parents-in-a-cycle", "two-steps-one-span"],
)
@pytest.mark.parametrize("view", VIEWS, ids=" ".join)
def test_span_ids_that_make_no_tree_never_crash_a_view(
    healthy: StoredRun,
    tmp_path: Path,
    change: Callable[[Records], Records],
    view: tuple[str, ...],
) -> None:
    run = _crafted(healthy, tmp_path, change)
    completed = call_cli(*view, str(run), cwd=tmp_path)
    assert completed.returncode in (0, 1), completed.describe()
    assert "Traceback" not in completed.stderr


@pytest.mark.parametrize(
    "change",
    [_parent_is_itself, _parents_in_a_cycle],
    ids=["parent-is-itself", "parents-in-a-cycle"],
)
def test_explain_shows_every_step_whose_spans_make_no_tree(
    healthy: StoredRun, tmp_path: Path, change: Callable[[Records], Records]
) -> None:
    run = _crafted(healthy, tmp_path, change)
    steps = set(
        _spans_of([orjson.loads(line) for line in rank_logs(run)[0].read_bytes().splitlines()])
    )
    completed = call_cli("explain", str(run), cwd=tmp_path)
    assert completed.returncode == 0, completed.describe()
    shown = {line.lstrip("│├└─ ").split(": ")[0] for line in completed.stdout.splitlines()}
    assert steps <= shown, sorted(steps - shown)


def _nested(depth: int) -> bytes:
    stream = EventStream().run_started()
    path = [f"s{level}" for level in range(depth)]
    for level in range(depth):
        stream.started("/".join(path[: level + 1]))
    for level in reversed(range(depth)):
        stream.succeeded("/".join(path[: level + 1]))
    return b"".join(encode(event) + b"\n" for event in stream.run_finished())


@pytest.mark.parametrize("view", VIEWS, ids=" ".join)
def test_steps_nested_deeper_than_the_recursion_limit_never_crash_a_view(
    tmp_path: Path, view: tuple[str, ...]
) -> None:
    log = tmp_path / "rank-0.jsonl"
    log.write_bytes(_nested(1500))
    completed = call_cli(*view, str(log), cwd=tmp_path)
    assert completed.returncode == 0, completed.describe()
    if view == ("explain",):
        lines = completed.stdout.splitlines()
        assert sum(": ok" in line for line in lines) == 1500
        # Indentation stops growing, so the text stays linear in the log.
        assert max(len(line) - len(line.lstrip(" │")) for line in lines) <= 3 * 32


@pytest.mark.parametrize(
    ("depends_on", "expected"),
    [({"a": ["b"], "b": ["a"]}, ["b", "a"]), ({"b": [], "a": ["a"]}, ["a"])],
    ids=["two-steps-wait-for-each-other", "a-step-waits-for-itself"],
)
def test_critical_path_ends_on_dependencies_in_a_cycle(
    tmp_path: Path, depends_on: dict[str, list[str]], expected: list[str]
) -> None:
    stream = EventStream().run_started()
    for step, needs in depends_on.items():
        stream.started(step, depends_on=needs)
    for step in depends_on:
        stream.succeeded(step)
    log = tmp_path / "rank-0.jsonl"
    log.write_bytes(b"".join(encode(event) + b"\n" for event in stream.run_finished()))
    completed = call_cli("critical-path", str(log), cwd=tmp_path)
    assert completed.returncode == 0, completed.describe()
    chain = [line.split("└─ ")[1].split(" @")[0] for line in completed.stdout.splitlines()[1:]]
    # The step that ended last, then what it waited for, each step once.
    assert chain == expected


def _child_ends_last_without_run_started() -> list[Any]:
    stream = EventStream().started("probe").started("probe/fast").succeeded("probe")
    return stream.advance(5_000_000).succeeded("probe/fast").events


def _parent_unknown_ends_last() -> list[Any]:
    stream = EventStream().run_started().started("platform").started("orphan")
    stream.succeeded("platform").advance(5_000_000).succeeded("orphan")
    return [
        attrs.evolve(event, parent_span_id="feed" * 4) if event.step == "orphan" else event
        for event in stream.run_finished()
    ]


@pytest.mark.parametrize(
    ("crafted", "top", "chain"),
    [
        (_child_ends_last_without_run_started, ["probe"], ["probe", "(slowest inside: probe/fast"]),
        (_parent_unknown_ends_last, ["platform", "orphan"], ["orphan"]),
    ],
    ids=["no-run-started", "parent-span-unknown"],
)
def test_critical_path_chains_the_top_level_steps_explain_shows(
    tmp_path: Path, crafted: Callable[[], list[Any]], top: list[str], chain: list[str]
) -> None:
    # A step whose parent span is no step's is at the top level, with or
    # without run.started; one whose parent is a step is inside it, even
    # where it ended after it.
    log = tmp_path / "rank-0.jsonl"
    log.write_bytes(b"".join(encode(event) + b"\n" for event in crafted()))
    explained = call_cli("explain", str(log), cwd=tmp_path).stdout.splitlines()
    assert [line[3:].split(":")[0] for line in explained if line[:1] in "├└"] == top
    completed = call_cli("critical-path", str(log), cwd=tmp_path)
    assert completed.returncode == 0, completed.describe()
    lines = [line.strip(" └─") for line in completed.stdout.splitlines() if line[:1] != "r"]
    assert [line.split(" @")[0].split(" +")[0] for line in lines if "did not" not in line] == chain


def test_a_version_0_log_shows_each_step_as_its_own_span(tmp_path: Path) -> None:
    log = tmp_path / "rank-0.jsonl"
    shutil.copy(V0_LOG, log)
    completed = call_cli("explain", str(log), cwd=tmp_path)
    assert completed.returncode == 0, completed.describe()
    assert "├─ platform: ok (device=cpu, count=1) [500.0ms]" in completed.stdout
    assert "└─ attention/flashinfer: unavailable: PermissionError" in completed.stdout
    exported = call_cli("replay", str(log), "--export", "jaeger-json=spans.json", cwd=tmp_path)
    # Rank 1 of its two wrote no log: an incomplete run, exported all the same.
    assert exported.returncode == 1, exported.describe()
    assert PROG not in exported.stderr
    spans = json.loads((tmp_path / "spans.json").read_text())["data"][0]["spans"]
    assert len({span["spanID"] for span in spans}) == len(spans) >= 3


def test_a_directory_with_only_an_empty_log_is_an_incomplete_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "rank-0.jsonl").touch()
    completed = call_cli("replay", "--json", str(run), cwd=tmp_path)
    assert completed.returncode == 1, completed.describe()
    document = json.loads(completed.stdout)
    assert document["outcome"] == "incomplete"
    assert document["ranks"][0]["log"] == "empty"
    text = call_cli("replay", str(run), cwd=tmp_path)
    assert "Root cause: rank 0 wrote no events (empty log)" in text.stdout


@pytest.mark.parametrize(("view", "said"), [("blame", "no events"), ("critical-path", "no events")])
def test_a_run_without_steps_says_so(tmp_path: Path, view: str, said: str) -> None:
    # blame printed an empty line.
    run = tmp_path / "run"
    run.mkdir()
    (run / "rank-0.jsonl").touch()
    completed = call_cli(view, str(run), cwd=tmp_path)
    assert completed.returncode == 0, completed.describe()
    assert completed.stdout == said + "\n"


def test_blame_of_a_rank_without_steps_says_so(healthy: StoredRun, tmp_path: Path) -> None:
    run = _crafted(healthy, tmp_path, lambda records: records[:1])
    completed = call_cli("blame", str(run), cwd=tmp_path)
    assert completed.returncode == 0, completed.describe()
    assert completed.stdout == "no steps\n"


#: A directory name that would clear the screen and forge a line if printed.
FORGING_NAME = "evil\x1b[2J\rINFO    [rank 0] Startup ready."


def _escaped_only(stderr: str) -> None:
    assert "\x1b" not in stderr, repr(stderr)
    assert "\r" not in stderr, repr(stderr)
    assert "evil\\x1b[2J\\rINFO" in stderr, stderr


def test_an_error_naming_a_forging_path_escapes_it(tmp_path: Path) -> None:
    completed = call_cli("replay", str(tmp_path / FORGING_NAME / "rank-9.jsonl"), cwd=tmp_path)
    assert completed.returncode == 2, completed.describe()
    (line,) = completed.stderr.splitlines()
    assert line.startswith(PROG)
    _escaped_only(completed.stderr)


def test_a_run_into_a_forging_directory_names_it_escaped(tmp_path: Path) -> None:
    completed = run_cli("run", "--simulate", "xeon", "--run-dir", FORGING_NAME, cwd=tmp_path)
    assert completed.returncode == 0, completed.describe()
    assert (tmp_path / FORGING_NAME / "rank-0.jsonl").is_file()
    (where,) = [line for line in completed.stderr.splitlines() if "the run's logs are in" in line]
    _escaped_only(where)
    _escaped_only(completed.stderr)


@pytest.mark.parametrize("view", VIEWS, ids=" ".join)
def test_a_log_renamed_to_another_rank_is_named_by_every_view(
    healthy: StoredRun, tmp_path: Path, view: tuple[str, ...]
) -> None:
    run = tmp_path / "run"
    shutil.copytree(healthy.directory, run)
    (log,) = rank_logs(run)
    # An identical copy under another rank's name, as a careless copy makes.
    shutil.copy(log, run / "rank-5.jsonl")
    completed = call_cli(*view, str(run), cwd=tmp_path)
    assert completed.returncode == 1, completed.describe()
    assert completed.stdout == ""
    (line,) = completed.stderr.splitlines()
    assert line == (
        f"{PROG}{run / 'rank-5.jsonl'}: holds the events of rank 0, not of rank 5 (a foreign "
        "or renamed log): rename or move it out; validate lists every problem of the run"
    )


def test_empty_logs_of_ranks_outside_the_world_are_named_not_dropped(
    healthy: StoredRun, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    shutil.copytree(healthy.directory, run)
    for rank in (7, 99_999_999_999):
        (run / f"rank-{rank}.jsonl").touch()
    completed = call_cli("replay", str(run), cwd=tmp_path)
    assert completed.returncode == 0, completed.describe()
    assert (
        "empty logs name ranks 7,99999999999, outside the world size 1: not counted"
        in completed.stdout
    )
    document = json.loads(call_cli("replay", "--json", str(run), cwd=tmp_path).stdout)
    assert document["world_size"] == 1
    assert document["warnings"] == [
        "empty logs name ranks 7,99999999999, outside the world size 1: not counted"
    ]
