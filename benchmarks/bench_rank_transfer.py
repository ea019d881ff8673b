"""What folding ranks in a second process would pay to send them back.

Replays a run directory in this process (the engine's slice, the logs read
as the command line reads them), then pickles and unpickles what a worker
that folded half of the ranks would hand back: those ranks' states, their
``RankMessages`` and their timelines. Prints the replay's CPU time beside
the transfer's, best of ``--repeat``::

    .venv/bin/python benchmarks/bench_rank_transfer.py [--repeat 3] DIR

(``bench_replay_scale.py --keep DIR`` writes run directories of 1,024 and
8,192 ranks to try.)
"""

from __future__ import annotations

import argparse
import gc
import pickle
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from events import replay
from orchestrator.cli._run_logs import read_run
from orchestrator.engine import ENGINE


def best(repeat: int, call: Callable[[], Any]) -> tuple[float, Any]:
    """The best CPU time of ``repeat`` calls, and the last call's value."""
    times = []
    value = None
    for _ in range(repeat):
        started = time.process_time()
        value = call()
        times.append(time.process_time() - started)
    return min(times), value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("run_dir", type=Path)
    args = parser.parse_args()
    gc.disable()  # as the command line runs
    run = read_run([args.run_dir])
    folded, replayed = best(
        args.repeat, lambda: replay(run.contents, launch=run.launch, slices=[ENGINE])
    )
    half = (
        {rank: state for rank, state in replayed.states.items() if rank % 2},
        {rank: kept for rank, kept in replayed.message_state.ranks.items() if rank % 2},
        {rank: steps for rank, steps in replayed.timeline.ranks.items() if rank % 2},
    )
    out, blob = best(args.repeat, lambda: pickle.dumps(half, protocol=pickle.HIGHEST_PROTOCOL))
    back, _ = best(args.repeat, lambda: pickle.loads(blob))
    ranks = len(replayed.states)
    print(f"{ranks} ranks: replay in process {folded:.3f} s CPU")
    print(
        f"{len(half[0])} ranks' states, messages and timelines: {len(blob) / 2**20:.1f} MiB, "
        f"pickle.dumps {out:.3f} s, pickle.loads {back:.3f} s"
    )


if __name__ == "__main__":
    main()
