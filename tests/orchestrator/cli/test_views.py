"""The read-only views on stored runs: replay's options, explain, blame,
critical-path, diff and validate.

The runs are made by real launches (``conftest``) or written from event
streams; the views of them are called in this process (:func:`call_cli`),
except the trace export, which sets up OpenTelemetry exporters and runs as
its own process."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from events import RunOutcome, encode, launch_span_id
from events.testing import EventStream, exception_info

from .conftest import StoredRun
from .harness import LAUNCH_TIMEOUT_S, call_cli, environment, rank_logs, read_events, run_cli

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)(us|ms|s) (\S+) \(rank (\d+)\)$")
_UNIT_NS = {"us": 1e3, "ms": 1e6, "s": 1e9}


@pytest.mark.slow
def test_explain_shows_the_fallback_tree(eight_ranks: StoredRun, tmp_path: Path) -> None:
    explained = call_cli("explain", str(eight_ranks.directory), "--rank", "3", cwd=tmp_path)

    assert explained.returncode == 0, explained.describe()
    lines = explained.lines()
    # The report's header first: the outcome, and that the host was simulated.
    assert lines[0].startswith("Startup ready: 8 ready")
    assert lines[1] == "Not a real start: simulated host h200x8"
    tree = lines.index("== rank 3 ==")
    assert lines[tree + 1] == "run: ready"
    parent = next(i for i, line in enumerate(lines) if "─ allreduce_workspace: ok" in line)
    child = next(
        i for i, line in enumerate(lines) if "─ allreduce_workspace/mnnvl: unavailable: " in line
    )
    assert child > parent
    # Drawn under its parent: indented one level deeper.
    assert lines[child].index("─") > lines[parent].index("─")
    assert "RuntimeError: mnnvl all-reduce workspace needs NVSwitch multicast" in lines[child]
    assert any("─ allreduce_workspace/trtllm: ok" in line for line in lines[child:])
    assert "decision allreduce.agreed = 'trtllm' (allreduce_workspace)" in lines


@pytest.mark.slow
def test_blame_lists_steps_slowest_first(eight_ranks: StoredRun, tmp_path: Path) -> None:
    blamed = call_cli("blame", str(eight_ranks.directory), cwd=tmp_path)

    assert blamed.returncode == 0, blamed.describe()
    rows = [_DURATION.match(line) for line in blamed.lines()]
    assert all(rows), blamed.stdout
    durations = [float(m[1]) * _UNIT_NS[m[2]] for m in rows if m]
    assert durations == sorted(durations, reverse=True)
    steps = [m[3] for m in rows if m]
    assert len(steps) == len(set(steps))
    assert {"platform", "attention", "allreduce_workspace", "attention/FLASH_ATTN"} <= set(steps)
    assert {int(m[4]) for m in rows if m} <= set(range(8))


@pytest.mark.slow
def test_critical_path_prints_start_and_duration(eight_ranks: StoredRun, tmp_path: Path) -> None:
    path = call_cli("critical-path", str(eight_ranks.directory), cwd=tmp_path)

    assert path.returncode == 0, path.describe()
    lines = path.lines()
    assert lines[0].startswith("run ready +")
    chain = [line for line in lines[1:] if "@" in line]
    assert chain, path.stdout
    assert all(re.search(r"@\d+(\.\d+)?(us|ms|s) \+\d+(\.\d+)?(us|ms|s)$", line) for line in chain)


def test_diff_names_outcome_and_message_changes(
    healthy: StoredRun, attention_failure: StoredRun, tmp_path: Path
) -> None:
    diffed = call_cli(
        "diff", str(healthy.directory), str(attention_failure.directory), cwd=tmp_path
    )

    assert diffed.returncode == 1, diffed.describe()  # they differ, as diff(1) says
    lines = diffed.lines()
    assert lines[:2] == [f"--- {healthy.directory}", f"+++ {attention_failure.directory}"]
    assert "outcome: ready -> failed" in lines
    assert (
        "root cause: none -> rank 0 step attention/FLASH_ATTN: RuntimeError: CUDA error: "
        "no kernel image is available" in lines
    )
    assert "rank 0: attention_backend 'FLASH_ATTN' -> None" in lines
    assert "- INFO [rank 0] Startup ready." in lines
    assert any(
        line.startswith("+ ERROR [rank 0] Step attention/FLASH_ATTN failed: RuntimeError")
        for line in lines
    )


@pytest.fixture(scope="module")
def eight_flashinfer(tmp_path_factory: pytest.TempPathFactory) -> StoredRun:
    """Eight ranks that all chose the FLASHINFER attention backend."""
    cwd = tmp_path_factory.mktemp("eight-flashinfer")
    completed = run_cli(
        "run", "--simulate", "h200x8", "--nproc", "8", "--run-dir", "run",
        "--attention-backend", "FLASHINFER",
        cwd=cwd, timeout=LAUNCH_TIMEOUT_S,
    )  # fmt: skip
    assert completed.returncode == 0, completed.describe()
    return StoredRun(directory=cwd / "run", completed=completed)


@pytest.mark.slow
@pytest.mark.slow
def test_diff_groups_ranks_with_the_same_difference(
    eight_ranks: StoredRun, eight_flashinfer: StoredRun, tmp_path: Path
) -> None:
    diffed = call_cli(
        "diff", str(eight_ranks.directory), str(eight_flashinfer.directory), cwd=tmp_path
    )

    assert diffed.returncode == 1, diffed.describe()
    lines = diffed.lines()[2:]
    assert "ranks 0-7: attention_backend 'FLASH_ATTN' -> 'FLASHINFER'" in lines
    assert "ranks 0-7: decision candidates.select@attention 'FLASH_ATTN' -> 'FLASHINFER'" in lines
    # One line per group of ranks, never one per rank; a rank's pid (it
    # differs between any two launches) is not a difference.
    assert not [line for line in lines if line.startswith("rank ")], lines
    assert not [line for line in lines if "pid" in line], lines
    assert len(lines) <= 6, lines


@pytest.mark.slow
@pytest.mark.slow
def test_diff_of_two_identical_launches_exits_0(eight_ranks: StoredRun, tmp_path: Path) -> None:
    again = run_cli(
        "run", "--simulate", "h200x8", "--nproc", "8", "--run-dir", "again",
        cwd=tmp_path, timeout=LAUNCH_TIMEOUT_S,
    )  # fmt: skip
    assert again.returncode == 0, again.describe()

    diffed = call_cli("diff", str(eight_ranks.directory), str(tmp_path / "again"), cwd=tmp_path)

    assert diffed.returncode == 0, diffed.describe()
    assert diffed.lines()[2:] == [
        # Said, but not a difference.
        "both runs: simulated host h200x8",
        "no differences in outcome, state, decisions or messages",
    ]


@pytest.mark.slow
def test_replay_until_shows_an_earlier_state(eight_ranks: StoredRun, tmp_path: Path) -> None:
    first = read_events(eight_ranks.directory / "rank-0.jsonl")
    platform_done = next(
        e["seq"] for e in first if e["type"] == "step.succeeded" and e["step"] == "platform"
    )
    before = call_cli(
        "replay",
        "--json",
        "--until",
        str(platform_done - 1),
        str(eight_ranks.directory),
        cwd=tmp_path,
    )
    after = call_cli(
        "replay", "--json", "--until", str(platform_done), str(eight_ranks.directory), cwd=tmp_path
    )
    text = call_cli("replay", "--until", "3", str(eight_ranks.directory), cwd=tmp_path)

    # Not finished at that point: still running at the cutoff (not crashed), exit 1.
    assert (before.returncode, after.returncode, text.returncode) == (1, 1, 1)
    assert before.json()["outcome"] == after.json()["outcome"] == "running"
    assert before.json()["until"] == platform_done - 1
    assert before.json()["ranks"][0]["platform_class"] is None
    assert after.json()["ranks"][0]["platform_class"] == "CudaPlatform"
    assert after.json()["ranks"][0]["attention_backend"] is None
    assert text.lines()[0].startswith("Startup running at the cutoff seq 3 ")
    assert "8 running" in text.lines()[0]
    assert "Startup ready." not in text.stdout


def test_replay_until_cuts_the_page_and_the_spans_as_the_report(
    healthy: StoredRun, tmp_path: Path
) -> None:
    events = read_events(healthy.directory / "rank-0.jsonl")
    decided = next(e["seq"] for e in events if e["type"] == "decision.made")
    page, spans = tmp_path / "page.html", tmp_path / "spans.json"
    cut = call_cli(
        "replay",
        "--until",
        str(decided - 1),
        "--html",
        str(page),
        f"--export=jaeger-json={spans}",
        str(healthy.directory),
        cwd=tmp_path,
    )
    whole = call_cli(
        "replay", "--html", str(tmp_path / "whole.html"), str(healthy.directory), cwd=tmp_path
    )

    assert cut.returncode == 1, cut.describe()
    assert whole.returncode == 0, whole.describe()
    # Nothing after the cutoff is on the page or in the trace: no decision
    # yet, and only the spans started by then.
    html = page.read_text(encoding="utf-8")
    assert "<p>none recorded</p>" in html
    assert "<p>none recorded</p>" not in (tmp_path / "whole.html").read_text(encoding="utf-8")
    started = {
        e["span_id"]
        for e in events
        if e["type"] in ("run.started", "step.started") and e["seq"] < decided
    }
    [trace] = json.loads(spans.read_text(encoding="utf-8"))["data"]
    assert {span["spanID"] for span in trace["spans"]} == started


@pytest.mark.slow
def test_replay_one_rank(eight_ranks: StoredRun, tmp_path: Path) -> None:
    text = call_cli("replay", "--rank", "5", str(eight_ranks.directory), cwd=tmp_path)
    document = call_cli(
        "replay", "--json", "--rank", "5", str(eight_ranks.directory), cwd=tmp_path
    ).json()

    assert text.returncode == 0, text.describe()
    assert "Rank 5:" in text.lines()
    tagged = re.findall(r"\[ranks? [^\]]*\]", text.stdout)
    assert tagged, text.stdout
    assert set(tagged) == {"[rank 5]"}
    assert [r["rank"] for r in document["ranks"]] == [5]
    assert {tuple(m["ranks"]) for m in document["messages"]} == {(5,)}


@pytest.mark.slow
def test_run_of_a_rank_without_its_peers_reports_as_replay_rank(tmp_path: Path) -> None:
    # Without a process group a rank cannot wait for its peers: its report
    # is of itself alone, the same document as ``replay --rank``'s.
    done = {}
    for rank in ("1", "0"):
        done[rank] = run_cli(
            "run", "--simulate", "xeon", "--run-id", "both", "--run-dir", "run", "--json",
            cwd=tmp_path, env=environment(RANK=rank, WORLD_SIZE="2", LOCAL_RANK=rank),
        )  # fmt: skip
        assert done[rank].returncode == 0, done[rank].describe()
    replayed = call_cli("replay", "--json", "--rank", "0", "run", cwd=tmp_path).json()

    document = done["0"].json()
    assert [r["rank"] for r in document["ranks"]] == [0]
    assert {tuple(m["ranks"]) for m in document["messages"]} == {(0,)}
    assert document == replayed


@pytest.mark.slow
def test_replay_exports_every_span_to_a_jaeger_file(eight_ranks: StoredRun, tmp_path: Path) -> None:
    target = tmp_path / "trace.json"
    page = tmp_path / "timeline.html"
    exported = run_cli(
        "replay",
        str(eight_ranks.directory),
        f"--export=jaeger-json={target}",
        "--html",
        str(page),
        cwd=tmp_path,
    )

    assert exported.returncode == 0, exported.describe()
    events = [e for log in rank_logs(eight_ranks.directory) for e in read_events(log)]
    # Every rank's spans, and the launch's own (the one root).
    launch = launch_span_id(events[0]["trace_id"], events[0]["run_id"])
    ranks = {e["span_id"] for e in events if e["type"] in ("run.started", "step.started")}
    assert f"exported {len(ranks) + 1} spans (jaeger-json {target})" in exported.stderr
    document = json.loads(target.read_text(encoding="utf-8"))
    [trace] = document["data"]
    assert trace["traceID"] == events[0]["trace_id"]
    assert len(trace["spans"]) == len(ranks) + 1
    assert {s["spanID"] for s in trace["spans"]} == {*ranks, launch}
    html = page.read_text(encoding="utf-8")
    assert html.lstrip().lower().startswith("<!doctype html")
    assert "allreduce_workspace" in html


@pytest.mark.parametrize("export_first", [True, False], ids=["export-first", "paths-first"])
def test_replay_export_names_its_file_in_one_argument(
    healthy: StoredRun, tmp_path: Path, export_first: bool
) -> None:
    # The file is part of --export's argument, so the run directory after it
    # is still the run directory, not a second value of --export.
    target = tmp_path / "trace.json"
    export = ["--export", f"jaeger-json={target}"]
    paths = [str(healthy.directory)]
    arguments = export + paths if export_first else paths + export
    exported = run_cli("replay", *arguments, cwd=tmp_path)

    assert exported.returncode == 0, exported.describe()
    assert exported.lines()[0].startswith("Startup ready")
    assert f"(jaeger-json {target})" in exported.stderr
    [trace] = json.loads(target.read_text(encoding="utf-8"))["data"]
    assert trace["spans"]


def test_validate_of_a_clean_run(healthy: StoredRun, tmp_path: Path) -> None:
    checked = call_cli("validate", str(healthy.directory), cwd=tmp_path)

    assert checked.returncode == 0, checked.describe()
    assert checked.lines() == [
        f"{healthy.directory / 'rank-0.jsonl'}: ok",
        "1 path(s), 1 file(s), 0 problem(s)",
    ]


def test_replay_json_of_one_rank_leaves_out_the_messages_of_the_others(tmp_path: Path) -> None:
    # Rank 1's step failed; rank 0 went on; both timed out in a probe. Rank
    # 0's document has none of rank 1's messages, and names no rank but 0.
    run = tmp_path / "run"
    run.mkdir()
    denied = exception_info("RuntimeError", "cache is read-only")
    for rank in (0, 1):
        stream = EventStream(run_id="two", rank=rank, world_size=2).run_started()
        stream.started("probe").timed_out("probe")
        stream.started("cache")
        if rank:
            stream.failed("cache", denied)
            finished = stream.run_finished(RunOutcome.FAILED, cause=denied, failed_step="cache")
        else:
            finished = stream.succeeded("cache").run_finished()
        (run / f"rank-{rank}.jsonl").write_bytes(b"".join(encode(e) + b"\n" for e in finished))

    whole = call_cli("replay", "--json", "run", cwd=tmp_path).json()
    alone = call_cli("replay", "--json", "--rank", "0", "run", cwd=tmp_path).json()

    assert any(message["ranks"] == [1] for message in whole["messages"])
    assert any(message["ranks"] == [0, 1] for message in whole["messages"])
    assert [r["rank"] for r in alone["ranks"]] == [0]
    assert alone["messages"] == [
        {**message, "ranks": [0]} for message in whole["messages"] if 0 in message["ranks"]
    ]


def _clean_run(run: Path, world_size: int) -> list[Path]:
    """A run directory of ``world_size`` ranks, each log clean."""
    run.mkdir()
    logs = []
    for rank in range(world_size):
        stream = EventStream(run_id=run.name, rank=rank, world_size=world_size).run_started()
        finished = stream.started("a").succeeded("a").run_finished()
        logs.append(run / f"rank-{rank}.jsonl")
        logs[-1].write_bytes(b"".join(encode(event) + b"\n" for event in finished))
    return logs


def test_validate_names_a_nodes_worth_of_clean_logs_one_by_one(tmp_path: Path) -> None:
    logs = _clean_run(tmp_path / "eight", 8)
    checked = call_cli("validate", "eight", cwd=tmp_path)
    assert checked.returncode == 0, checked.describe()
    assert checked.lines() == [
        *(f"{log.relative_to(tmp_path)}: ok" for log in logs),
        "1 path(s), 8 file(s), 0 problem(s)",
    ]

    _clean_run(tmp_path / "nine", 9)
    checked = call_cli("validate", "nine", cwd=tmp_path)
    assert checked.returncode == 0, checked.describe()
    assert checked.lines() == ["nine: 9 logs ok, ranks 0-8", "1 path(s), 9 file(s), 0 problem(s)"]


def test_validate_does_not_call_a_log_with_warnings_ok(tmp_path: Path) -> None:
    (log,) = _clean_run(tmp_path / "run", 1)
    # The writer stopped in the middle of its last record, run.finished.
    data = log.read_bytes()
    log.write_bytes(data[: data.rindex(b"\n", 0, -1) + 10])

    checked = call_cli("validate", "run", cwd=tmp_path)

    assert checked.returncode == 1, checked.describe()
    assert checked.lines() == [
        "run/rank-0.jsonl:4: torn last line (9 bytes without a newline) [torn_tail, warning]",
        "run/rank-0.jsonl:0: no run.finished event: the rank stopped after seq 2 "
        "(step.succeeded a) [not_finished, warning]",
        "1 path(s), 1 file(s), 2 problem(s)",
    ]
