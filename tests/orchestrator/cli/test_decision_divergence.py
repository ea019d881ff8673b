"""Replay recomputes every recorded decision; a log whose recorded decision
the current deciders would not make is reported as a divergence."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest

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


@pytest.mark.slow
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


def test_every_rank_that_diverges_is_reported_in_the_order_decided(tmp_path: Path) -> None:
    # Each rank's decisions are checked, and all the divergent ones are
    # reported, as the merged run's check finds them (in wall-clock order).
    # Six ranks made from a real rank's log, each with its clock shifted its
    # own way, four of them with the attention selection rewritten.
    from events import RunStarted, merge
    from orchestrator._decisions import check_decisions
    from orchestrator.cli._run_logs import read_run
    from orchestrator.engine import ENGINE_DECIDERS

    healthy = _run(tmp_path, "run", "--simulate", "h200x8", "--run-id", "six")
    assert healthy.returncode == 0, healthy.stderr
    real = list(read_log(tmp_path / "startup-runs" / "six" / "rank-0.jsonl").events)

    def made(rank: int) -> list[Any]:
        shift = (7 - rank) * 1_000_003 * (1 if rank % 2 else -1)
        stream = []
        for event in real:
            changes: dict[str, Any] = {"rank": rank, "wall_ns": event.wall_ns + shift}
            if isinstance(event, RunStarted):
                changes["identity"] = attrs.evolve(event.identity, rank=rank, local_rank=rank)
            selects = isinstance(event, DecisionMade) and event.name == "candidates.select"
            if selects and rank in (1, 2, 3, 4):
                changes["value"] = "TRITON_ATTN"
            stream.append(attrs.evolve(event, **changes))
        return stream

    contents = []
    (tmp_path / "six").mkdir()
    for rank in range(6):
        stream = made(rank)
        path = tmp_path / "six" / f"rank-{rank}.jsonl"
        log = JsonlLog(path, run_id=stream[0].run_id, rank=rank, durability="never")
        for event in stream:
            log.append(event)
        log.close()
        contents.append(read_log(path))

    assert check_decisions(contents[0].events, ENGINE_DECIDERS) == []
    found = read_run([tmp_path / "six"]).decisions()
    merged = check_decisions(merge(contents), ENGINE_DECIDERS)
    assert sorted(d.ranks for d in found) == [(1,), (2,), (3,), (4,)]
    assert sorted(found, key=lambda d: d.ranks) == sorted(merged, key=lambda d: d.ranks)
    # In the order they were decided (each rank's clock is shifted its own way).
    decided = [contents[d.ranks[0]].events[d.seq].wall_ns for d in found if d.seq is not None]
    assert decided == sorted(decided)
    assert len(decided) == 4
