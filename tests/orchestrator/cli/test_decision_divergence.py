"""Replay recomputes every recorded decision; a log whose recorded decision
the current deciders would not make is reported as a divergence."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import attrs

from events import DecisionMade, JsonlLog, read_log


def _run(cwd: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *arguments],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_tampered_decision_is_reported_and_a_faithful_log_is_not(tmp_path: Path) -> None:
    healthy = _run(tmp_path, "run", "--simulate", "h200x8", "--run-id", "faithful", "--json")
    assert healthy.returncode == 0, healthy.stderr
    assert list(json.loads(healthy.stdout)["divergences"]) == []

    # Rewrite the log as an older release with a different selection rule
    # would have written it: same probes, another attention backend chosen.
    original = tmp_path / "startup-runs" / "faithful" / "rank-0.jsonl"
    events = list(read_log(original).events)
    tampered_dir = tmp_path / "startup-runs" / "tampered"
    tampered_dir.mkdir()
    log = JsonlLog(tampered_dir / "rank-0.jsonl", run_id="faithful", rank=0, durability="never")
    for event in events:
        if isinstance(event, DecisionMade) and event.name == "candidates.select":
            event = attrs.evolve(event, value="TRITON_ATTN")
        log.append(event)
    log.close()

    replayed = _run(tmp_path, "replay", str(tampered_dir), "--json")
    divergences = json.loads(replayed.stdout)["divergences"]
    assert divergences == [
        {
            "code": "decision.divergence",
            "severity": "error",
            "subject": "candidates.select",
            "rank": 0,
            "seq": divergences[0]["seq"],
            "step": "attention",
            "recorded": "TRITON_ATTN",
            "recomputed": "FLASH_ATTN",
            "text": divergences[0]["text"],
        }
    ]
    assert "TRITON_ATTN" in divergences[0]["text"]
    assert "FLASH_ATTN" in divergences[0]["text"]

    text = _run(tmp_path, "replay", str(tampered_dir))
    assert "Decision divergences" in text.stdout
    assert "decision candidates.select was 'TRITON_ATTN' live, replay decides 'FLASH_ATTN'" in (
        text.stdout
    )
