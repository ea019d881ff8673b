"""Injected faults (SPEC §3, §6.1) through the command line: exit codes, root
causes and grouped messages, live and replayed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import StoredRun
from .harness import message, run_cli


def test_run_json_equals_replay_json_for_one_rank(tmp_path: Path) -> None:
    ran = run_cli("run", "--simulate", "a100x4", "--json", "--run-dir", "run", cwd=tmp_path)
    replayed = run_cli("replay", "--json", "run", cwd=tmp_path)

    assert (ran.returncode, replayed.returncode) == (0, 0), ran.describe()
    assert ran.json() == replayed.json()


def test_broken_zentorch_build_falls_back_to_cpu_with_a_warning(tmp_path: Path) -> None:
    ran = run_cli(
        "run",
        "--simulate",
        "zen4",
        "--run-dir",
        "run",
        "--inject",
        "zentorch=OSError:incompatible shared library",
        cwd=tmp_path,
        # The WARNING carries its traceback by design (SPEC §3.2).
        traceback_expected=True,
    )

    assert ran.returncode == 0, ran.describe()
    assert ran.lines()[0].startswith("Startup ready: 1 ready")
    warning = (
        "WARNING [rank 0] zentorch failed to import (OSError: incompatible shared library); "
        "the zentorch build probably does not match the installed torch"
    )
    assert warning in ran.stdout
    assert "OSError: incompatible shared library" in ran.stderr
    document = run_cli("replay", "--json", "run", cwd=tmp_path).json()
    assert document["ranks"][0]["platform_class"] == "CpuPlatform"
    broken = message(document, "zentorch.broken")
    assert (broken["severity"], broken["ranks"]) == ("warning", [0])
    assert "OSError: incompatible shared library" in broken["text"]


def test_unknown_zentorch_failure_names_the_cause_of_unspecified_platform(
    tmp_path: Path,
) -> None:
    ran = run_cli(
        "run",
        "--simulate",
        "zen4",
        "--run-dir",
        "run",
        "--inject",
        "zentorch=RuntimeError:unknown zentorch failure",
        cwd=tmp_path,
    )

    assert ran.returncode == 1, ran.describe()
    first = ran.lines()[:7]
    assert first[0].startswith("Startup failed: 1 failed"), first
    assert first[1] == (
        "Not a real start: simulated host zen4; injected faults: "
        "zentorch=RuntimeError:unknown zentorch failure"
    ), first
    assert first[2] == "Root cause: rank 0, step platform", first
    assert first[3].strip().startswith("UnspecifiedPlatformError: Failed to infer device type")
    assert "; cpu failed: RuntimeError: unknown zentorch failure" in first[3]
    assert "caused by RuntimeError: unknown zentorch failure" in [line.strip() for line in first]
    replayed = run_cli("replay", "--json", "run", cwd=tmp_path)
    assert replayed.returncode == 1
    cause = replayed.json()["root_cause"]
    assert (cause["rank"], cause["step"]) == (0, "platform")
    assert cause["exception"]["type"].endswith("UnspecifiedPlatformError")
    assert cause["exception"]["cause"] == {
        "type": "RuntimeError",
        "message": "unknown zentorch failure",
        "cause": None,
    }
    assert message(replayed.json(), "platform.unspecified")["severity"] == "error"


@pytest.mark.slow
def test_broken_flashinfer_comm_disables_fusion_with_one_debug_message(tmp_path: Path) -> None:
    ran = run_cli(
        "run",
        "--simulate",
        "h200x8",
        "--tp",
        "2",
        "--run-dir",
        "run",
        "--inject",
        "flashinfer.comm=TypeError:type 'array.array' is not subscriptable",
        cwd=tmp_path,
    )

    assert ran.returncode == 0, ran.describe()
    text = "flashinfer.comm import failed: type 'array.array' is not subscriptable"
    # DEBUG: not printed live nor by default, shown on request.
    assert text not in ran.stdout + ran.stderr
    assert text not in run_cli("replay", "run", cwd=tmp_path).stdout
    debug = run_cli("replay", "--level", "debug", "run", cwd=tmp_path)
    assert debug.returncode == 0
    assert f"DEBUG [rank 0] {text}" in debug.stdout
    document = run_cli("replay", "--json", "run", cwd=tmp_path).json()
    rank = document["ranks"][0]
    assert (rank["fusion_enabled"], rank["flashinfer_comm_available"]) == (False, False)
    unavailable = message(document, "flashinfer_comm.unavailable")
    assert (unavailable["severity"], unavailable["text"]) == ("debug", text)


def test_propagating_attention_failure_is_the_root_cause(attention_failure: StoredRun) -> None:
    ran = attention_failure.completed
    lines = ran.lines()
    assert lines[0].startswith("Startup failed: 1 failed"), ran.describe()
    assert lines[1].startswith("Not a real start: simulated host h200x8; injected faults: ")
    assert lines[2] == "Root cause: rank 0, step attention/FLASH_ATTN"
    assert lines[3].strip() == "RuntimeError: CUDA error: no kernel image is available"
    live = [line.split(None, 1) for line in ran.stderr.splitlines()]
    assert [
        "ERROR",
        "[rank 0] Step attention/FLASH_ATTN failed: RuntimeError: CUDA error: no kernel image "
        "is available; the error propagated and stopped the startup.",
    ] in live


def test_propagating_attention_failure_in_json(attention_failure: StoredRun) -> None:
    replayed = run_cli(
        "replay", "--json", str(attention_failure.directory), cwd=attention_failure.directory
    )

    assert replayed.returncode == 1
    cause = replayed.json()["root_cause"]
    assert (cause["step"], cause["exception"]["type"], cause["exception"]["message"]) == (
        "attention/FLASH_ATTN",
        "RuntimeError",
        "CUDA error: no kernel image is available",
    )


def test_explicit_backend_environment_failure_keeps_its_cause(tmp_path: Path) -> None:
    faults = tmp_path / "faults.json"
    faults.write_text(
        json.dumps(
            [
                {
                    "target": "flashinfer",
                    "exception": "PermissionError",
                    "args": [13, "Permission denied", "/root/.cache/flashinfer"],
                }
            ]
        ),
        encoding="utf-8",
    )

    ran = run_cli(
        "run",
        "--simulate",
        "h200x8",
        "--attention-backend",
        "FLASHINFER",
        "--inject-file",
        str(faults),
        "--json",
        "--run-dir",
        "run",
        cwd=tmp_path,
    )

    assert ran.returncode == 1, ran.describe()
    reason = "PermissionError: [Errno 13] Permission denied: '/root/.cache/flashinfer'"
    cause = ran.json()["root_cause"]
    assert cause["step"] == "attention"
    assert cause["exception"]["type"] == "orchestrator.ExplicitCandidateInvalidError"
    assert cause["exception"]["message"].startswith(
        "Selected backend FLASHINFER is not valid for this configuration. Reason: "
    )
    assert reason in cause["exception"]["message"]
    assert cause["exception"]["cause"] == {
        "type": "PermissionError",
        "message": "[Errno 13] Permission denied: '/root/.cache/flashinfer'",
        "cause": None,
    }
    invalid = message(ran.json(), "attention.explicit_invalid")
    assert (invalid["severity"], invalid["ranks"]) == ("error", [0])
    # No fallback: no other candidate was probed.
    assert [m for m in ran.json()["messages"] if m["code"] == "attention.selected"] == []


@pytest.mark.slow
def test_a_rank_that_never_joined_the_process_group_is_the_root_cause(tmp_path: Path) -> None:
    # RELIABILITY.md, finding 4: rank 1 cannot import torch.distributed,
    # records process_group unavailable and decides alone; its peers wait at
    # the rendezvous until the group timeout and fail there. The report
    # names rank 1, why, and what its going on alone did.
    ran = run_cli(
        "run",
        "--simulate",
        "h200x8",
        "--nproc",
        "4",
        "--grace",
        "1",
        "--group-timeout",
        "3",
        "--run-dir",
        "run",
        "--inject",
        "1:process_group=ImportError:no torch.distributed here",
        cwd=tmp_path,
    )

    assert ran.returncode == 1, ran.describe()
    replayed = run_cli("replay", "run", cwd=tmp_path)
    lines = replayed.lines()
    assert lines[0].startswith("Startup failed: 3 failed, 1 ready"), replayed.describe()
    root = lines.index("Root cause: rank 1, step process_group")
    assert lines[root + 1] == "  ImportError: no torch.distributed here"
    assert (
        "  rank 1 went on without the process group, and the ranks that waited for it there "
        "failed" in lines
    )
    document = run_cli("replay", "--json", "run", cwd=tmp_path).json()
    cause = document["root_cause"]
    assert (cause["rank"], cause["step"], cause["outcome"]) == (1, "process_group", "ready")
    assert cause["left_out"] == "the process group"
    assert document["outcome"] == "failed"
