"""A collector that refuses connections costs the run nothing but a bounded
flush at the end and one line on stderr; the log holds everything, and
replay export delivers every span later, with the resource the run had."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from events import RunFinished, RunOutcome, StepStarted, validate
from tests.exporters.otlp_receivers import GrpcReceiver
from tests.exporters.tracing_harness import (
    cli_environment,
    closed_port,
    expected_span_ids,
    run_cli,
    run_events,
)

pytestmark = pytest.mark.slow

#: Longer than the whole test may take: a run that waited for the exporter's
#: own retries instead of its bounded flush (which does not retry) would show.
EXPORTER_TIMEOUT_S = 120
#: The run's spans are flushed for at most 5 s at its end; the rest is
#: starting Python and the run itself.
PROMPT_S = 60.0
ENGINE_MESSAGE = re.compile(
    r"^(DEBUG|INFO|WARNING|ERROR)\s+\[rank \d+\] |^startup-orchestrator: the run's logs are in "
)


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_refused_collector_neither_delays_nor_fails_the_run(
    protocol: str, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    started = time.monotonic()
    done = run_cli(
        "run", "--simulate", "h200x8", "--run-dir", str(run_dir),
        "--otlp-endpoint", f"http://127.0.0.1:{closed_port()}", "--otlp-protocol", protocol,
        env=cli_environment(
            OTEL_EXPORTER_OTLP_TIMEOUT=str(EXPORTER_TIMEOUT_S),
            OTEL_SERVICE_NAME="my-engine",
            OTEL_RESOURCE_ATTRIBUTES="deployment.environment=staging",
        ),
        cwd=tmp_path,
    )  # fmt: skip
    elapsed = time.monotonic() - started

    assert done.returncode == 0, done.stderr
    assert elapsed < PROMPT_S
    # The log is whole: it validates, and the run finished ready.
    [log_path] = run_dir.glob("rank-*.jsonl")
    assert validate(log_path) == []
    events = run_events(run_dir)
    assert isinstance(events[-1], RunFinished)
    assert events[-1].outcome is RunOutcome.READY
    # One line says the spans were not exported, and nothing else is noise.
    others = [line for line in done.stderr.splitlines() if not ENGINE_MESSAGE.match(line)]
    assert len(others) == 1, done.stderr
    assert others[0].startswith("could not export")
    assert "replay export" in others[0]
    assert len(others[0]) < 200  # the exporter's own long lines are summarised

    with GrpcReceiver() as receiver:
        replayed = run_cli(
            "replay", str(run_dir), "--export", "otlp",
            # The replaying machine names no service: the recorded one counts.
            env=cli_environment(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint),
            cwd=tmp_path,
        )  # fmt: skip
        assert replayed.returncode == 0, replayed.stderr
        steps = [event for event in events if isinstance(event, StepStarted)]
        spans = receiver.wait_for_spans(len(steps) + 1)

    assert len(spans) == len(steps) + 1  # every step, and the rank's root
    assert {span.span_id for span in spans} == expected_span_ids(events)
    assert f"exported {len(spans)} spans" in replayed.stderr
    for span in spans:
        assert span.trace_id == events[0].trace_id
        assert span.resource["service.name"] == "my-engine"
        assert span.resource["deployment.environment"] == "staging"


def test_a_collector_that_is_down_is_one_line_for_a_launch(tmp_path: Path) -> None:
    """Four ranks meet a refused collector, and one line says so (local
    rank 0 speaks for the node: its ranks share the collector); the
    OpenTelemetry exporters' own lines never show. What it costs in time is
    measured by ``benchmarks/bench_collector_down.py``."""
    done = run_cli(
        "run", "--simulate", "h200x8", "--nproc", "4", "--run-dir", str(tmp_path / "down"),
        env=cli_environment(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{closed_port()}"),
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    stderr = done.stderr
    failures = [line for line in stderr.splitlines() if line.startswith("could not export")]
    assert len(failures) == 1, stderr
    assert "(connection refused)" in failures[0], stderr
    assert "Failed to export" not in stderr
    assert "Transient error" not in stderr
    assert "retrying" not in stderr


def test_replay_export_to_a_collector_that_is_down_fails_promptly_in_one_line(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    done = run_cli(
        "run", "--simulate", "h200x8", "--run-dir", str(run_dir),
        env=cli_environment(), cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    port = closed_port()
    replayed = run_cli(
        "replay", str(run_dir), "--export", "otlp",
        env=cli_environment(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}"),
        cwd=tmp_path,
    )  # fmt: skip

    # The refused connection ends the export at once (no retries, and so no
    # "Exporter already shutdown" from a give-up); how long that takes is
    # measured in BENCHMARKS.md, "replay --export to a refused collector".
    assert replayed.returncode == 1, replayed.stderr
    lines = replayed.stderr.splitlines()
    assert len(lines) == 1, replayed.stderr
    assert lines[0].startswith("startup-orchestrator: error: --export otlp: ")
    assert "0 of" in lines[0]
    # Where and why, as the live warning says it (it said neither).
    assert f"to 127.0.0.1:{port} (connection refused)" in lines[0]
