"""Embed the orchestrator in your engine's own launcher: one process per rank.

Every rank process does what an engine's entry point would do before loading
a model: run the startup with :class:`orchestrator.Startup`, which reads its
identity and the launch's run id from the launcher environment, opens its own
event log in the launch's shared run directory, prints derived messages
through stdlib logging, joins the other ranks in a process group, and records
every way the start can end; then report what it decided.

Run it under torchrun (two ranks agree on the all-reduce backend over gloo)::

    torchrun --nproc-per-node 2 examples/launcher_torchrun.py
    torchrun --nproc-per-node 4 examples/launcher_torchrun.py a100x4 --run-dir /shared/runs/try-1

or as a plain process (a world of one; torch is not needed)::

    python examples/launcher_torchrun.py

The profile argument names a simulated host (``h200x8``, ``a100x4``,
``b200x8``, ``zen4``, ``xeon``, or a JSON profile file); ``--real`` probes
this machine instead; ``--inject`` makes a probe fail on some ranks, as
``startup-orchestrator run --inject`` does. Afterwards, replay the whole launch from its logs::

    startup-orchestrator replay startup-runs/<run-id>
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from orchestrator import FaultSpecError, OrchestratorError, Startup, StartupInterrupted
from orchestrator.engine import EngineState, ProfileError, load_profile


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "profile",
        nargs="?",
        default="h200x8",
        help="simulated host: a built-in profile name or a JSON file (default: h200x8)",
    )
    parser.add_argument(
        "--real", action="store_true", help="probe this machine instead of a simulated one"
    )
    parser.add_argument(
        "--inject",
        action="append",
        default=[],
        metavar="[RANKS:]TARGET=EXCEPTION[:MESSAGE]",
        help="inject a fault, e.g. 1:flash_attn=RuntimeError:broken build (repeatable)",
    )
    parser.add_argument(
        "--run-dir",
        type=Path,
        help="where every rank writes rank-<r>.jsonl (default: ./startup-runs/<run-id>)",
    )
    return parser.parse_args()


def main() -> int:
    args = parse_arguments()
    try:
        profile = None if args.real else load_profile(args.profile)
    except ProfileError as exc:
        sys.exit(f"error: {exc}")

    # Identity (RANK, WORLD_SIZE... as torchrun sets them), the shared run id
    # (torchrun's --rdzv-id), the run directory, this rank's log, messages
    # through logging, tracing from OTEL_*, SIGINT/SIGTERM, and a gloo group
    # for the all-reduce agreement: all from the environment.
    try:
        startup = Startup(profile=profile, faults=args.inject, run_dir=args.run_dir).open()
    except (FaultSpecError, OrchestratorError) as exc:
        sys.exit(f"error: {exc}")
    with startup:
        try:
            result = startup.run()
        except StartupInterrupted:
            return 1
        except Exception:
            # The original error, already in the log and printed as an
            # ERROR on this rank; the result below says where it stopped.
            result = startup.result
    assert result is not None
    state = result.state
    assert isinstance(state, EngineState)
    platform = f"{state.platform} ({state.platform_class})" if state.platform else "-"
    print(
        f"rank {result.rank} of {result.world_size}, run {result.run_id}: {result.outcome}"
        f" platform={platform}"
        f" attention={state.attention_backend or '-'}"
        f" allreduce={state.allreduce_backend or '-'}"
        f" fusion={'on' if state.fusion_enabled else 'off'}"
        f" log={result.log_path}",
        flush=True,
    )
    return 0 if result.ready else 1


if __name__ == "__main__":
    sys.exit(main())
