"""A failed 8-rank start, and the replay that names its root cause.

The reference engine starts 8 ranks of a simulated AMD Zen 4 host (zentorch
installed). On rank 5, ``import zentorch`` raises RuntimeError, which the
platform probe does not recover from: rank 5 ends with no platform, while
ranks 0-4 and 6-7 start fine. Each rank writes its own log file into one run
directory, as the ranks of a real launch would.

Then the run directory is replayed, with nothing but its files: the events
are folded by the same reducers the live run used, and the report's first
lines name the outcome and the root cause (rank, step, exception chain).

The ranks run one after the other in this process, without a process group,
so the example needs no torch -- and no peer waits for rank 5 in a
collective: the report reads "1 failed, 7 ready". The same failure from the
command line (the README's tour) starts one process per rank, and they agree
on the all-reduce backend over a process group: when rank 5 leaves, the
other seven fail in that agreement too, and the report reads "8 failed",
with rank 5's failure still the root cause::

    startup-orchestrator run --simulate zen4 --nproc 8 \\
        --inject "5:zentorch=RuntimeError:unknown zentorch failure"

Run it::

    python examples/failed_start_and_replay.py             # ./startup-runs/failed-zen4-<time>
    python examples/failed_start_and_replay.py --run-dir /tmp/failed-start

Like ``startup-orchestrator replay``, it exits 1 because the start failed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import anyio

from events import JsonlLog, RankIdentity, read_log, replay
from exporters import report_text
from orchestrator import FaultPlan
from orchestrator.engine import ENGINE, EngineConfig, load_profile, prepare_engine

WORLD_SIZE = 8


async def start_rank(rank: int, run_id: str, run_dir: Path, faults: FaultPlan) -> str:
    """Start one rank, as its own process would; returns its outcome."""
    identity = RankIdentity(rank=rank, world_size=WORLD_SIZE, local_world_size=WORLD_SIZE)
    config = EngineConfig(tp=WORLD_SIZE)
    with JsonlLog(run_dir / f"rank-{rank}.jsonl", run_id=run_id, rank=rank) as log:
        runner, graph = prepare_engine(
            config, log, identity=identity, profile=load_profile("zen4"), faults=faults
        )
        try:
            await runner.run(graph)
        except Exception as exc:
            # The failure is in the log already, with its cause chain; a real
            # rank would exit non-zero here.
            return f"failed ({type(exc).__name__})"
    return "ready"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, help="where to write rank-<r>.jsonl")
    args = parser.parse_args()
    run_id = time.strftime("failed-zen4-%Y%m%dT%H%M%S")
    run_dir = args.run_dir or Path("startup-runs") / run_id
    run_dir.mkdir(parents=True, exist_ok=True)

    # Same syntax as `startup-orchestrator run --inject`: on rank 5 only.
    faults = FaultPlan.parse(["5:zentorch=RuntimeError:unknown zentorch failure"])
    for rank in range(WORLD_SIZE):
        outcome = anyio.run(start_rank, rank, run_id, run_dir, faults)
        print(f"rank {rank}: {outcome}", file=sys.stderr)

    # --- later, anywhere: replay the directory from its files alone ---
    logs = [read_log(path) for path in sorted(run_dir.glob("rank-*.jsonl"))]
    result = replay(logs, slices=[ENGINE])
    print(report_text(result))
    print(f"Replay it again with: startup-orchestrator replay {run_dir}", file=sys.stderr)
    print(
        "(The ranks ran one after the other without a process group, so none waited for "
        "rank 5; with `startup-orchestrator run --nproc 8` the peers fail in the all-reduce "
        "agreement too: 8 failed.)",
        file=sys.stderr,
    )
    return 0 if result.outcome == "ready" else 1


if __name__ == "__main__":
    sys.exit(main())
