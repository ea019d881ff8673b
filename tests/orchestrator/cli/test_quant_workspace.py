"""A failed quantization-fusion workspace on a two-rank launch (SPEC §3.4):
one ERROR per rank, live and replayed, and the start is still ready."""

from __future__ import annotations

from pathlib import Path

import pytest

from .harness import LAUNCH_TIMEOUT_S, message, run_cli

QUANT_FAILURE = "RuntimeError: quant workspace creation failed"
TEXT = (
    "Failed to initialize FlashInfer allreduce quantization fusion workspace with "
    f"backend=trtllm ({QUANT_FAILURE}); quantization fusion is disabled and startup continues "
    "with the plain allreduce fusion on backend=trtllm. Fix what stopped the workspace from "
    "being created, or turn quantization fusion off in the engine configuration."
)


@pytest.mark.slow
def test_a_failed_quantization_workspace_is_one_error_per_rank(tmp_path: Path) -> None:
    ran = run_cli(
        "run",
        "--simulate",
        "h200x8",
        "--nproc",
        "2",
        "--run-dir",
        "run",
        "--inject",
        f"allreduce_workspace/quant={QUANT_FAILURE.replace(': ', ':', 1)}",
        cwd=tmp_path,
        timeout=LAUNCH_TIMEOUT_S,
    )

    assert ran.returncode == 0, ran.describe()
    # Ready, but the quantized workspace is lost: the first lines say so.
    lines = ran.lines()
    assert lines[0].startswith("Startup ready, degraded: 2 ready"), ran.describe()
    assert lines[2] == "Degraded: allreduce.quant_workspace_failed on ranks 0-1", ran.describe()
    # Live: every rank prints its own ERROR, once, and no other ERROR.
    live = [line.split(None, 1) for line in ran.stderr.splitlines()]
    errors = [fields for fields in live if fields and fields[0] == "ERROR"]
    assert sorted(errors) == [["ERROR", f"[rank {rank}] {TEXT}"] for rank in (0, 1)], ran.describe()
    assert f"ERROR [ranks 0-1] {TEXT}" in ran.stdout

    replayed = run_cli("replay", "--json", "run", cwd=tmp_path)
    assert replayed.returncode == 0, replayed.describe()
    document = replayed.json()
    assert document["outcome"] == "ready"
    assert document["degraded"] == [
        {"code": "allreduce.quant_workspace_failed", "severity": "error", "ranks": [0, 1]}
    ]
    failed = message(document, "allreduce.quant_workspace_failed")
    assert (failed["severity"], failed["ranks"], failed["text"]) == ("error", [0, 1], TEXT)
    assert [m["severity"] for m in document["messages"]].count("error") == 1
    # The plain fusion is still on, on the backend the message names.
    assert [r["fusion_enabled"] for r in document["ranks"]] == [True, True]
    assert [r["allreduce_backend"] for r in document["ranks"]] == ["trtllm", "trtllm"]
