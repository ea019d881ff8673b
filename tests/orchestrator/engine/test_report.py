"""The replay report of engine runs: the engine's columns in the JSON
document and the rank table, its message codes and texts, its agreement on
the all-reduce backend, and the root cause of an engine failure (the report
itself, on a slice of its own: ``tests/exporters/test_report.py``)."""

from __future__ import annotations

import json

from events import Event, Severity, merge, replay
from orchestrator.engine import ENGINE, PLATFORM_STEP

from .streams import MNNVL_UNSUPPORTED, TRTLLM_FAILED, RankBuilder, failed_rank, healthy_rank

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


def test_report_json_has_the_engines_columns_codes_and_root_cause() -> None:
    # The document's shape is the report's (tests/exporters/test_report.py):
    # here, what the engine's slice puts in it.
    from exporters import report_json

    document = report_json(replay(failed_run(), slices=[ENGINE]))
    json.dumps(document)  # plain JSON all the way down
    assert document["outcome"] == "failed"
    for row in document["ranks"]:
        assert set(row) == set(RANK_KEYS)
        for key, kind in RANK_KEYS.items():
            assert isinstance(row[key], kind), key
    rank5 = document["ranks"][5]
    assert rank5["outcome"] == "failed"
    assert rank5["platform"] is None
    assert document["ranks"][0]["platform"] == "cuda"
    assert document["ranks"][0]["allreduce_backend"] == "trtllm"
    attempt = next(m for m in document["messages"] if m["code"] == "allreduce.attempt_failed")
    assert attempt["ranks"] == [0, 1, 2, 3, 4, 6, 7]
    assert attempt["severity"] == "warning"

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
    assert "  ERROR [rank 5] Failed to infer device type" in errors_only
    assert "WARNING" not in errors_only
    one = report_text(result, rank=3)
    assert one.splitlines()[0].startswith("Startup failed")
    assert "Rank 3:" in one
    assert "  WARNING [rank 3] FlashInfer allreduce workspace" in one
    assert "[rank 5]" not in one
