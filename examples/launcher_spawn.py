"""Embed the orchestrator in a launcher of your own: spawn the rank processes
yourself, with plain subprocesses.

The parent picks a run id and a free port, and starts N copies of this
script with the variables a rank needs (the torchrun names: RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, and the
run id every rank must share); each child runs its startup with
:class:`orchestrator.Startup` and exits 0 when ready. Then the parent
replays the whole launch from its run directory::

    python examples/launcher_spawn.py --nproc 2
    python examples/launcher_spawn.py --nproc 4 --profile a100x4 \
        --inject "2:flash_attn=RuntimeError:bad"

With torch installed, the ranks agree on the all-reduce backend over gloo.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from pathlib import Path

from events import replay
from exporters import report_text
from orchestrator import RUN_ID_VARIABLE, OrchestratorError, Startup, new_run_id
from orchestrator.engine import ENGINE


def run_rank(profile: str, inject: list[str]) -> int:
    """A child: one rank, everything from the environment its parent set."""
    try:
        with Startup(profile=profile, faults=inject) as startup:
            startup.run()
    except OrchestratorError as exc:  # a bad environment, or a stop
        print(f"rank {os.environ.get('RANK')}: {exc}", file=sys.stderr)
        return 1
    except Exception:
        return 1  # recorded in the log and printed as an ERROR
    return 0


def spawn(nproc: int, profile: str, inject: list[str]) -> int:
    """The parent: start the ranks, wait, replay the launch."""
    run_id = new_run_id()
    with socket.socket() as probe:  # a free port for the ranks' rendezvous
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    children = []
    for rank in range(nproc):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(nproc),
            "LOCAL_WORLD_SIZE": str(nproc),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            RUN_ID_VARIABLE: run_id,
        }
        command = [sys.executable, __file__, "--profile", profile, "--child"]
        command += [f"--inject={spec}" for spec in inject]
        children.append(subprocess.Popen(command, env=env))
    codes = [child.wait() for child in children]
    run_dir = Path("startup-runs") / run_id
    from events import read_log

    print(
        report_text(
            replay(
                [read_log(path) for path in sorted(run_dir.glob("rank-*.jsonl"))], slices=[ENGINE]
            )
        )
    )
    return 0 if codes == [0] * nproc else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2, help="how many ranks (default 2)")
    parser.add_argument("--profile", default="h200x8", help="simulated host (default h200x8)")
    parser.add_argument("--inject", action="append", default=[], help="a fault to inject")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return run_rank(args.profile, args.inject)
    return spawn(args.nproc, args.profile, args.inject)


if __name__ == "__main__":
    sys.exit(main())
