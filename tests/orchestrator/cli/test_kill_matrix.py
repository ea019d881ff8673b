"""The kill matrix's fast subset (``benchmarks/kill_matrix.py``): one trial of
each kind of disruption on a real two-rank launch, each signal sent at a
moment read from the rank logs rather than after a sleep, so every run of
the test disrupts the same phase of the start.

Each trial must leave a whole record: no event lost, every rank's fate in
its log or the launcher's manifest, no process of the launch alive 5 s after
the launcher ended, and a report that never says ``ready`` for a start that
was disrupted (see the script's docstring for the exact rules).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.kill_matrix import Trial, Trigger, run_trial

pytestmark = pytest.mark.slow

#: A launch of two ranks: each imports torch to form its gloo group, which
#: takes a while, so a signal sent once the group step has started lands
#: before the end of the start.
NPROC = 2

_IN_PROCESS_GROUP = {"event": "step.started", "step": "process_group"}

#: For a signal in the middle of the probes (normally over in milliseconds),
#: FLASH_ATTN's probe hangs until the signal comes; the other probes and
#: the all-reduce agreement are in flight beside it.
_HANG = ("attention/FLASH_ATTN=hang",)
_IN_PROBES = {"event": "step.started", "step": "attention/FLASH_ATTN"}

CASES = [
    # kind, trigger, target rank, injected faults
    pytest.param(
        "rank-sigkill", Trigger(rank=1, **_IN_PROCESS_GROUP), 1, (), id="rank-sigkill-group"
    ),
    pytest.param(
        "launcher-sigkill",
        Trigger(rank=None, **_IN_PROCESS_GROUP),
        0,
        (),
        id="launcher-sigkill-group",
    ),
    pytest.param(
        "launcher-sigint",
        Trigger(rank=None, event="run.started"),
        0,
        (),
        id="launcher-sigint-started",
    ),
    pytest.param(
        "launcher-sigterm", Trigger(rank=None, **_IN_PROBES), 0, _HANG, id="launcher-sigterm-probes"
    ),
    pytest.param("rank-sigint", Trigger(rank=0, **_IN_PROBES), 0, _HANG, id="rank-sigint-probes"),
    pytest.param(
        "rank-sigterm", Trigger(rank=1, **_IN_PROCESS_GROUP), 1, (), id="rank-sigterm-group"
    ),
]


def _describe(trial: Trial) -> str:
    return "\n".join(
        [
            f"{trial.kind} at {trial.trigger} ({trial.phase}): launcher exit "
            f"{trial.launcher_exit}, report {trial.replay_outcome} ({trial.replay_error})",
            f"fates: {trial.rank_fates}",
            *trial.problems,
        ]
    )


@pytest.mark.parametrize(("kind", "trigger", "rank", "inject"), CASES)
def test_a_disrupted_launch_leaves_a_whole_record(
    tmp_path: Path, kind: str, trigger: Trigger, rank: int, inject: tuple[str, ...]
) -> None:
    trial = run_trial(
        kind, trigger, workdir=tmp_path, nproc=NPROC, grace_s=1.0, target_rank=rank, inject=inject
    )

    # The signal went to a live process before the start was over.
    assert trial.delivered, _describe(trial)
    assert trial.landed, _describe(trial)
    assert trial.problems == [], _describe(trial)
    assert trial.events_lost == 0, _describe(trial)
    assert trial.unrecorded_fates == 0, _describe(trial)
    assert trial.orphans == 0, _describe(trial)
    assert trial.wrong_verdicts == 0, _describe(trial)
    assert trial.replay_outcome in ("interrupted", "incomplete", "failed"), _describe(trial)
    assert trial.replay_exit == 1, _describe(trial)
    assert trial.launch_tracebacks == [], _describe(trial)
    # Every rank had opened its log by then, so each one is accounted for by
    # its own log, or (killed outright) by the launcher's manifest.
    expected_sources = {str(r): ("log:", "manifest:") for r in range(NPROC)}
    for r, fate in trial.rank_fates.items():
        assert fate.startswith(expected_sources[r]), _describe(trial)
