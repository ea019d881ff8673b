"""Embed the orchestrator in your engine's own launcher: one process per rank.

Every rank process does what an engine's entry point would do before loading
a model: read its identity from the launcher environment, open its own event
log in the launch's shared run directory, print derived messages through
stdlib logging, join the other ranks in a process group, run the startup
graph, and report what it decided.

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
import contextlib
import logging
import sys
from pathlib import Path

import anyio

from events import JsonlLog, RankIdentity, read_log, replay
from exporters import MESSAGE_LOGGER_PREFIX, LoggingBridge
from orchestrator import (
    FaultPlan,
    FaultSpecError,
    GroupError,
    TorchDistributedGroup,
    identity_from_environment,
    init_torch_distributed_group,
    new_run_id,
    run_id_from_environment,
)
from orchestrator.engine import EngineConfig, Profile, ProfileError, load_profile, run_engine


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
        help="where every rank writes rank-<r>.jsonl (default: ./startup-runs/<run-id>); "
        "on several machines, a shared filesystem",
    )
    return parser.parse_args()


def configure_logging() -> None:
    # The bridge logs under "orchestrator.<area>" and already puts "[rank N]"
    # in every message, so a plain format stays readable with many ranks.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)-7s %(message)s"))
    logger = logging.getLogger(MESSAGE_LOGGER_PREFIX)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def shared_run_id(identity: RankIdentity, group: TorchDistributedGroup | None) -> str:
    """The run id every rank of this launch uses (it names the run directory)."""
    # torchrun exports TORCHELASTIC_RUN_ID (--rdzv-id); STARTUP_ORCHESTRATOR_RUN_ID wins if set.
    run_id = run_id_from_environment()
    if run_id is not None:
        return run_id
    if group is not None:
        # No id from the launcher: every rank proposes one and all take rank 0's.
        return str(group.all_gather(new_run_id())[0])
    if identity.world_size == 1:
        return new_run_id()
    sys.exit("several ranks but no shared run id: set TORCHELASTIC_RUN_ID or install torch")


async def start_engine(
    config: EngineConfig,
    log: JsonlLog,
    identity: RankIdentity,
    profile: Profile | None,
    faults: FaultPlan,
    group: TorchDistributedGroup | None,
) -> None:
    # Returns when the startup reached "ready"; otherwise raises the original
    # error of the step that failed, after its events are in the log.
    await run_engine(config, log, identity=identity, profile=profile, faults=faults, group=group)


def main() -> int:
    args = parse_arguments()
    try:
        profile = None if args.real else load_profile(args.profile)
        faults = FaultPlan.parse(args.inject)
    except (ProfileError, FaultSpecError) as exc:
        sys.exit(f"error: {exc}")
    configure_logging()

    # RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE and GROUP_RANK, as torchrun
    # sets them; without them this process is rank 0 of a world of 1.
    identity = identity_from_environment()

    # The ranks must agree on the all-reduce backend (different backends hang
    # collectives), so they exchange their attempt results over a process
    # group. gloo runs on CPU; MASTER_ADDR/MASTER_PORT come from torchrun.
    group = None
    if identity.world_size > 1:
        group = init_torch_distributed_group(identity, backend="gloo", timeout_s=60.0)

    run_id = shared_run_id(identity, group)
    run_dir = args.run_dir or Path("startup-runs") / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / f"rank-{identity.rank}.jsonl"

    # One append-only log per rank; the bridge folds the events into messages
    # (once per rank, with the right severity and scope) and logs them live.
    log = JsonlLog(log_path, run_id=run_id, rank=identity.rank)
    log.subscribe(LoggingBridge())
    config = EngineConfig(tp=identity.world_size)
    try:
        with log:
            anyio.run(start_engine, config, log, identity, profile, faults, group)
    except Exception:
        # Already recorded in the log and printed by the bridge as an ERROR on
        # this rank; the state below says where it stopped.
        pass

    # The same reducers that decided live re-derive this rank's state from
    # its log file, exactly as a replay on another machine would.
    state = replay([read_log(log_path)]).states[identity.rank]
    platform = f"{state.platform} ({state.platform_class})" if state.platform else "-"
    print(
        f"rank {identity.rank} of {identity.world_size}, run {run_id}: {state.outcome}"
        f" platform={platform}"
        f" attention={state.attention_backend or '-'}"
        f" allreduce={state.allreduce_backend or '-'}"
        f" fusion={'on' if state.fusion_enabled else 'off'}"
        f" log={log_path}",
        flush=True,
    )

    if group is not None:
        if state.outcome == "ready":
            # Every ready rank waits here for the others before the group goes
            # away. A rank that failed skips this: its peers may still be in the
            # startup's own exchange and must see it leave (a GroupError there),
            # not receive this value in place of the one they wait for.
            with contextlib.suppress(GroupError):
                group.all_gather("done")
        group.close()
    return 0 if state.outcome == "ready" else 1


if __name__ == "__main__":
    sys.exit(main())
