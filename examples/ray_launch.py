"""Start an engine's ranks as Ray actors, one orchestrator per actor.

Starts a local Ray cluster (two CPUs, no dashboard), then
:func:`orchestrator.ray.launch_on_ray` creates one actor per rank; each runs
the reference engine startup on a simulated host, the ranks agree over a
gloo process group, and the driver gathers every rank's log and a manifest
into its run directory (``./startup-runs/<run-id>``). The script prints the
replayed report, the run directory and the command that replays it, and
exits 0 when every rank is ready, 1 otherwise::

    python examples/ray_launch.py
    python examples/ray_launch.py --nproc 4 --inject "2:flash_attn=RuntimeError:broken build"

Needs Ray and torch: ``pip install -e '.[torch,ray]'``.
"""

from __future__ import annotations

import argparse
import os
import sys

import ray

from exporters import report_text
from orchestrator.ray import launch_on_ray


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=4, help="how many ranks (default 4)")
    parser.add_argument("--profile", default="h200x8", help="simulated host (default h200x8)")
    parser.add_argument(
        "--inject", action="append", default=[], help="a fault to inject: [RANKS:]TARGET=ACTION"
    )
    args = parser.parse_args()
    # Quiet and portable: no auth token written to ~/.ray, no usage report,
    # a small object store (nothing big travels), this machine's cluster only.
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.pop("RAY_ADDRESS", None)
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=80 * 2**20,
        logging_level="WARNING",
        log_to_driver=False,  # the ranks' messages are in the report below
    )
    try:
        launch = launch_on_ray(
            args.nproc, profile=args.profile, faults=args.inject, group_timeout_s=30.0
        )
    finally:
        ray.shutdown()
    print(report_text(launch.replay()))
    print(f"The run directory: {launch.run_dir}")
    print(f"Replay it: startup-orchestrator replay {launch.run_dir}")
    return 0 if launch.ready else 1


if __name__ == "__main__":
    sys.exit(main())
