"""Live, the launcher of ``run --nproc`` sends the launch's own span once
every rank has ended, and the spans a rank that died left open, which no
rank could send (a span is sent when it ends): Jaeger shows the failed
launch by its verdict, with the dead rank's last step red in it."""

from __future__ import annotations

from pathlib import Path

import pytest

from events import TERMINAL_STEP_EVENTS, RunStarted, StepStarted, launch_span_id
from tests.exporters.otlp_receivers import GrpcReceiver
from tests.exporters.tracing_harness import cli_environment, run_cli, run_events

pytestmark = pytest.mark.slow

CRASHED = 1


def test_the_launcher_sends_the_launch_span_and_what_a_dead_rank_left_open(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    with GrpcReceiver() as receiver:
        done = run_cli(
            "run", "--simulate", "h200x8", "--nproc", "2", "--run-dir", str(run_dir),
            "--grace", "1", "--inject", f"{CRASHED}:attention/FLASH_ATTN=crash",
            "--otlp-endpoint", receiver.endpoint, "--otlp-protocol", "grpc",
            env=cli_environment(),
            cwd=tmp_path,
        )  # fmt: skip
        # The launcher sent before it exited: what the receiver has is all.
        received = receiver.spans()
    assert done.returncode == 1, done.stderr
    assert "could not export" not in done.stderr

    events = run_events(run_dir)
    ids = [span.span_id for span in received]
    assert len(ids) == len(set(ids)), "a span was sent twice"
    [own] = [span for span in received if "startup.rank" not in span.resource]
    run_id = events[0].run_id
    assert own.span_id == launch_span_id(events[0].trace_id, run_id)
    # Named for the steps it died in (several were in flight).
    assert own.name.startswith(f"launch 2 ranks: incomplete \N{EM DASH} rank {CRASHED} ")
    assert "attention/FLASH_ATTN" in own.name
    assert "killed by SIGSEGV" in own.attributes["startup.root_cause"]
    assert own.attributes["startup.root_cause_rank"] == CRASHED
    assert own.status_code == 2  # ERROR
    # What rank 1 had open when it died: its root and the steps in flight.
    ended = {e.span_id for e in events if isinstance(e, TERMINAL_STEP_EVENTS)}
    open_ids = {
        e.span_id
        for e in events
        if e.rank == CRASHED and isinstance(e, StepStarted | RunStarted) and e.span_id not in ended
    }
    assert {"attention/FLASH_ATTN", "attention"} <= {
        e.step for e in events if e.span_id in open_ids and isinstance(e, StepStarted)
    }
    sent = {span.span_id: span for span in received}
    for span_id in open_ids:
        assert sent[span_id].attributes["startup.outcome"] == "incomplete", span_id
    # Every span of the healthy rank arrived, from the rank itself.
    healthy = {
        e.span_id for e in events if e.rank != CRASHED and isinstance(e, StepStarted | RunStarted)
    }
    assert healthy <= set(sent)
