"""``run --nproc N --trace-file F``: one Jaeger-UI document for the launch.

Per-rank files of one trace id, loaded together, show one rank's spans
only; the launcher writes one file from every rank's log instead, with the
ranks told apart by their root spans' names and the root cause marked.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from events import merge, read_log
from exporters import spans_from_events

from .harness import LAUNCH_TIMEOUT_S, rank_logs, run_cli

pytestmark = pytest.mark.slow

RANKS = 4
FAILING = 2


def _tags(span: dict[str, Any]) -> dict[str, Any]:
    return {tag["key"]: tag["value"] for tag in span["tags"]}


def test_a_launch_writes_one_trace_file_with_every_ranks_spans(tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    completed = run_cli(
        "run", "--simulate", "zen4", "--nproc", str(RANKS), "--run-dir", "run",
        "--grace", "1", "--trace-file", str(trace),
        "--inject", f"{FAILING}:zentorch=RuntimeError:unknown zentorch failure",
        cwd=tmp_path,
        timeout=LAUNCH_TIMEOUT_S,
    )  # fmt: skip

    assert completed.returncode == 1, completed.describe()
    written = sorted(p.name for p in tmp_path.rglob("*.json") if p.name != "manifest.json")
    assert written == ["trace.json"]  # no per-rank files
    document = json.loads(trace.read_text(encoding="utf-8"))
    [only] = document["data"]  # one trace
    spans = only["spans"]
    rebuilt = spans_from_events(merge(read_log(log) for log in rank_logs(tmp_path / "run")))
    assert len(rebuilt) > RANKS
    # Every rank's spans, and the launch's own.
    [launch] = [
        span
        for span in spans
        if not any(ref["refType"] == "CHILD_OF" for ref in span["references"])
    ]
    assert sorted(span["spanID"] for span in spans) == sorted(
        [launch["spanID"], *(format(span.context.span_id, "016x") for span in rebuilt)]
    )
    assert (
        launch["operationName"]
        == f"launch {RANKS} ranks: failed \N{EM DASH} rank {FAILING} platform"
    )
    parents = {
        span["operationName"]: [
            ref["spanID"] for ref in span["references"] if ref["refType"] == "CHILD_OF"
        ]
        for span in spans
    }
    roots = {
        span["operationName"]: _tags(span)
        for span in spans
        if parents[span["operationName"]] == [launch["spanID"]]
    }
    links = {
        span["operationName"]: [
            ref["spanID"] for ref in span["references"] if ref["refType"] == "FOLLOWS_FROM"
        ]
        for span in spans
        if span["operationName"] in roots or span is launch
    }
    [failing] = [
        span["spanID"]
        for span in spans
        if (_tags(span).get("startup.rank"), _tags(span).get("startup.step"))
        == (FAILING, "platform")
    ]
    assert sorted(roots) == [f"startup rank {rank}" for rank in range(RANKS)]
    cause = roots[f"startup rank {FAILING}"]
    assert cause["startup.root_cause"] is True
    assert cause["otel.status_code"] == "ERROR"
    assert cause["otel.status_description"].startswith("root cause: step platform: ")
    assert "unknown zentorch failure" in cause["otel.status_description"]
    for rank in set(range(RANKS)) - {FAILING}:
        consequence = roots[f"startup rank {rank}"]
        assert consequence["startup.root_cause"] is False
        assert consequence["startup.root_cause_rank"] == FAILING
        assert consequence["otel.status_description"].startswith(f"consequence of rank {FAILING}")
        # One click from any consequence to the step that failed first.
        assert links[f"startup rank {rank}"] == [failing]
    assert links[launch["operationName"]] == [failing]
    assert _tags(launch)["startup.root_cause_rank"] == FAILING
    assert f"the launch's trace ({len(spans)} spans) is in {trace}" in completed.stderr


def test_an_unwritable_trace_file_stops_the_launch_before_any_rank(tmp_path: Path) -> None:
    completed = run_cli(
        "run", "--simulate", "h200x8", "--nproc", "2", "--run-dir", "run",
        "--trace-file", str(tmp_path / "missing" / "trace.json"),
        cwd=tmp_path,
    )  # fmt: skip

    assert completed.returncode == 2, completed.describe()
    assert "--trace-file" in completed.stderr
    assert "cannot write" in completed.stderr
    assert not (tmp_path / "run").exists()
