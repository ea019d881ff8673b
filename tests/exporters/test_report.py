"""The replay report: the stable JSON document and the text report."""

from __future__ import annotations

import json

from events import Event, RunOutcome, Severity, StepKind, merge, replay
from orchestrator.engine import ATTENTION_STEP, ENGINE, PLATFORM_STEP
from tests.orchestrator.engine.streams import (
    MNNVL_UNSUPPORTED,
    TRTLLM_FAILED,
    RankBuilder,
    dead_rank,
    exception,
    failed_rank,
    healthy_rank,
)

RANK_KEYS: dict[str, type | tuple[type, ...]] = {
    "rank": int,
    "outcome": str,
    "platform": (str, type(None)),
    "platform_class": (str, type(None)),
    "attention_backend": (str, type(None)),
    "allreduce_backend": (str, type(None)),
    "fusion_enabled": bool,
    "flashinfer_comm_available": (bool, type(None)),
    "last_step": (str, type(None)),
    "log": str,
    "in_flight": list,
    "process": (dict, type(None)),
}


def failed_run() -> list[Event]:
    """Eight ranks; rank 5 fails on its platform (zentorch RuntimeError)."""
    streams = [healthy_rank(rank) for rank in range(8) if rank != 5]
    streams.append(failed_rank(5))
    return list(merge(streams))


def test_report_json_fields_and_types() -> None:
    from exporters import report_json

    document = report_json(replay(failed_run(), slices=[ENGINE]))
    json.dumps(document)  # plain JSON all the way down
    assert document["report_version"] == 1
    assert document["run_id"] == "run-7f3a"
    assert document["world_size"] == 8
    assert document["outcome"] == "failed"
    assert [r["rank"] for r in document["ranks"]] == list(range(8))
    for row in document["ranks"]:
        assert set(row) == set(RANK_KEYS)
        for key, kind in RANK_KEYS.items():
            assert isinstance(row[key], kind), key
    rank5 = document["ranks"][5]
    assert rank5["outcome"] == "failed"
    assert rank5["platform"] is None
    assert document["ranks"][0]["platform"] == "cuda"
    assert document["ranks"][0]["allreduce_backend"] == "trtllm"

    for message in document["messages"]:
        assert set(message) == {"code", "severity", "scope", "ranks", "text"}
        assert message["severity"] in {"debug", "info", "warning", "error"}
        assert message["ranks"] == sorted(message["ranks"])
    attempt = next(m for m in document["messages"] if m["code"] == "allreduce.attempt_failed")
    assert attempt["ranks"] == [0, 1, 2, 3, 4, 6, 7]
    assert attempt["severity"] == "warning"
    severities = [Severity[m["severity"].upper()] for m in document["messages"]]
    assert severities == sorted(severities, reverse=True)

    cause = document["root_cause"]
    assert cause["rank"] == 5
    assert cause["step"] == PLATFORM_STEP
    assert cause["outcome"] == "failed"
    exception_json = cause["exception"]
    assert exception_json["type"] == "orchestrator.engine._config.UnspecifiedPlatformError"
    assert exception_json["message"].startswith("Failed to infer device type")
    assert exception_json["cause"] == {
        "type": "RuntimeError",
        "message": "unknown zentorch failure",
        "cause": None,
    }
    assert document["divergences"] == []
    assert document["warnings"] == []


def test_report_json_of_a_ready_run_and_divergences() -> None:
    from exporters import report_json

    streams = []
    for rank in range(4):
        builder = RankBuilder(rank, world_size=4).run_started()
        if rank == 2:
            builder.allreduce([("mnnvl", MNNVL_UNSUPPORTED), ("trtllm", TRTLLM_FAILED)])
        else:
            builder.allreduce([("mnnvl", MNNVL_UNSUPPORTED), ("trtllm", None)])
        streams.append(builder.run_finished())
    document = report_json(replay(streams, slices=[ENGINE]))
    assert document["outcome"] == "ready"
    assert document["root_cause"] is None
    (divergence,) = document["divergences"]
    assert divergence["code"] == "allreduce.divergence"
    assert divergence["severity"] == "error"
    assert divergence["values"] == [
        {"value": "trtllm", "ranks": [0, 1, 3]},
        {"value": None, "ranks": [2]},
    ]
    assert document["messages"][0]["code"] in {"allreduce.divergence", "allreduce.workspace_failed"}
    assert any(m["code"] == "allreduce.divergence" for m in document["messages"])


def test_report_json_is_the_same_for_the_same_logs() -> None:
    from exporters import report_json

    events = failed_run()
    assert report_json(replay(events, slices=[ENGINE])) == report_json(
        replay(list(events), slices=[ENGINE])
    )


def test_report_text_starts_with_the_outcome_and_the_root_cause() -> None:
    from exporters import report_text

    text = report_text(replay(failed_run(), slices=[ENGINE]))
    lines = text.splitlines()
    assert lines[0] == "Startup failed: 1 failed, 7 ready (run run-7f3a, 8 of 8 ranks)"
    assert lines[1] == "Root cause: rank 5, step platform"
    assert lines[2].startswith("  UnspecifiedPlatformError: Failed to infer device type")
    assert lines[3] == "  caused by RuntimeError: unknown zentorch failure"
    assert lines[4] == "      at /opt/engine/probe.py:41 in probe_zentorch"
    assert "Ranks:" in lines
    assert any(line.startswith("  0-4,6-7 ") and "CudaPlatform" in line for line in lines)
    assert any(line.startswith("  5 ") and "failed" in line for line in lines)
    assert "  WARNING [ranks 0-4,6-7] FlashInfer allreduce workspace with backend=mnnvl" in text
    assert "  ERROR [rank 5] Failed to infer device type" in text
    assert "DEBUG" not in text


def test_report_text_levels_and_one_rank() -> None:
    from exporters import report_text

    result = replay(failed_run(), slices=[ENGINE])
    verbose = report_text(result, min_severity=Severity.DEBUG)
    assert "  DEBUG [ranks 0-4,6-7] Attention backend FLASHINFER is unavailable" in verbose
    errors_only = report_text(result, min_severity=Severity.ERROR)
    assert "WARNING" not in errors_only
    assert "Messages (error and above):" in errors_only
    one = report_text(result, rank=3)
    assert one.splitlines()[0].startswith("Startup failed")
    assert "Rank 3:" in one
    assert "  WARNING [rank 3] FlashInfer allreduce workspace" in one
    assert "[rank 5]" not in one


def test_report_text_of_an_incomplete_run_with_a_torn_tail() -> None:
    from pathlib import Path

    from events import LogContents, TornTail
    from exporters import report_text

    torn = TornTail(path=Path("run/rank-1.jsonl"), line=9, offset=1000, length=12)
    contents = [
        LogContents(path=Path("run/rank-0.jsonl"), events=tuple(healthy_rank(0, world_size=2))),
        LogContents(
            path=Path("run/rank-1.jsonl"),
            events=tuple(dead_rank(1, offset_ns=0, world_size=2)),
            torn_tail=torn,
        ),
    ]
    text = report_text(replay(contents, slices=[ENGINE]))
    lines = text.splitlines()
    assert lines[0].startswith("Startup incomplete: 1 incomplete, 1 ready")
    assert lines[1].startswith(
        "Root cause: rank 1, step attention/FLASHINFER: the process died before the rank finished"
    )
    assert "Log warnings:" in lines
    assert f"  {torn.describe()}" in lines


def test_report_text_of_a_ready_run() -> None:
    from exporters import report_text

    text = report_text(replay([healthy_rank(r, world_size=2) for r in range(2)], slices=[ENGINE]))
    assert text.splitlines()[:2] == [
        "Startup ready: 2 ready (run run-7f3a, 2 of 2 ranks)",
        "Root cause: none (every rank is ready)",
    ]


def test_report_text_collapses_1024_ranks() -> None:
    from exporters import report_text

    streams = [healthy_rank(rank, world_size=1024) for rank in range(1024)]
    boom = exception("RuntimeError", "boom")
    builder = RankBuilder(1024 - 1, world_size=1024, offset_ns=1)
    builder.run_started()
    builder.started(ATTENTION_STEP)
    builder.started("attention/FLASH_ATTN", kind=StepKind.CANDIDATE)
    builder.failed("attention/FLASH_ATTN", boom)
    builder.failed(ATTENTION_STEP, boom)
    streams[-1] = builder.run_finished(
        RunOutcome.FAILED, cause=boom, failed_step="attention/FLASH_ATTN"
    )
    text = report_text(replay(streams, slices=[ENGINE]))
    lines = text.splitlines()
    assert lines[1] == "Root cause: rank 1023, step attention/FLASH_ATTN"
    table = lines[lines.index("Ranks:") + 1 : lines.index("Ranks:") + 4]
    assert table[0].startswith("  RANKS")
    # The rank that differs comes first, the run's common state last.
    assert table[1].startswith("  1023 ")
    assert table[2].startswith("  0-1022 ")
    assert len(lines) < 40


def test_ranks_without_events_stay_a_few_lines_at_scale() -> None:
    from events import LaunchRecord, RankProcess
    from exporters import report_text

    # 1,024 ranks, 24 without events: 12 the launcher saw exit, 12 it never
    # recorded (8 with no log, 4 with an empty one).
    seen = range(100, 112)
    unrecorded = range(500, 512)
    silent = {*seen, *unrecorded}
    streams = [healthy_rank(rank, world_size=1024) for rank in range(1024) if rank not in silent]
    launch = LaunchRecord(
        run_id=streams[0][0].run_id,
        world_size=1024,
        processes={rank: RankProcess(rank=rank, pid=1000 + rank, exit_code=1) for rank in seen},
        empty_logs=frozenset(range(508, 512)),
    )
    lines = report_text(replay(streams, launch=launch, slices=[ENGINE])).splitlines()
    start = lines.index("Ranks without events:") + 1
    listed = lines[start : lines.index("", start)]
    # A node's worth described one by one, the rest as rank ranges by reason.
    assert listed[:8] == [
        f"  rank {r} (pid {1000 + r}) exited with code 1; no log" for r in seen[:8]
    ]
    assert listed[8:] == [
        "  ranks 108-111,500-507: no log (never started, or killed before its first event)",
        "  ranks 508-511: empty log (never started, or killed before its first event)",
    ]
