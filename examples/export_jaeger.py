"""Export a stored run to a Jaeger-UI JSON file, from its logs alone.

Spans are a projection of the event log: the file holds the same trace the
live run would have sent to a collector (same trace and span ids, parents,
timestamps, attributes, exception events and status), so a run whose
collector was down, or that was copied off a failed cluster, can still be
looked at in Jaeger.

    python examples/export_jaeger.py startup-runs/<run-id>               # a stored run
    python examples/export_jaeger.py startup-runs/<run-id> -o trace.json
    python examples/export_jaeger.py                                     # makes a run first

Without a run directory it first starts 8 simulated H200 ranks (in this
process) into ``./startup-runs/<run-id>``. Without ``-o`` the file is
written into the run directory, as ``jaeger-<run-id>.json`` (nothing is
written into the current directory but ``startup-runs/``). The command line
does the same with
``startup-orchestrator replay RUN_DIR --export jaeger-json=trace.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import anyio

from events import JsonlLog, RankIdentity, merge, read_log, replay
from exporters import JaegerJsonExporter, export_events
from orchestrator import new_run_id
from orchestrator.engine import ENGINE, EngineConfig, Profile, load_profile, prepare_engine


async def start_rank(
    config: EngineConfig, log: JsonlLog, identity: RankIdentity, profile: Profile
) -> None:
    runner, graph = prepare_engine(config, log, identity=identity, profile=profile)
    await runner.run(graph)


def make_run(world_size: int = 8) -> Path:
    """Start ``world_size`` ranks of a simulated 8 x H200 node, one after the
    other, each into its own log in a fresh run directory."""
    run_id = new_run_id()
    run_dir = Path("startup-runs") / run_id
    run_dir.mkdir(parents=True)
    profile = load_profile("h200x8")
    for rank in range(world_size):
        identity = RankIdentity(rank=rank, world_size=world_size, local_world_size=world_size)
        with JsonlLog(run_dir / f"rank-{rank}.jsonl", run_id=run_id, rank=rank) as log:
            anyio.run(start_rank, EngineConfig(tp=world_size), log, identity, profile)
    return run_dir


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", nargs="?", type=Path, help="a run directory (rank-*.jsonl)")
    parser.add_argument(
        "-o", "--output", type=Path, help="the JSON file (default: RUN_DIR/jaeger-<run-id>.json)"
    )
    args = parser.parse_args()

    run_dir = args.run_dir
    if run_dir is None:
        run_dir = make_run()
        print(f"Started 8 simulated ranks into {run_dir}")
    paths = sorted(run_dir.glob("rank-*.jsonl"))
    if not paths:
        sys.exit(f"error: {run_dir}: no rank-*.jsonl logs")

    # One stream of events across ranks (each rank's order kept); every rank
    # of a launch shares one trace id, so the file holds one trace.
    logs = [read_log(path) for path in paths]
    events = list(merge(logs))
    output = args.output or run_dir / f"jaeger-{events[0].run_id}.json"
    exporter = JaegerJsonExporter(output)
    try:
        # Replayed, the run says what no rank knew live: which rank caused a
        # failure (marked on the ranks' root spans). Span status follows the
        # messages' severities, as in the live run: only an ERROR is red; a
        # recovered failure that is a WARNING (mnnvl falling back to trtllm)
        # carries startup.severity=WARNING and its exception event instead.
        count = export_events(events, exporter, replayed=replay(logs, slices=[ENGINE]))
    finally:
        exporter.shutdown()

    # What a user will see: the spans Jaeger marks red are where to look.
    document = json.loads(output.read_text(encoding="utf-8"))
    trace = document["data"][0]
    red = sorted(
        {
            span["operationName"]
            for span in trace["spans"]
            if any(tag["key"] == "error" and tag["value"] is True for tag in span["tags"])
        }
    )
    print(f"Wrote {count} spans of {len(paths)} ranks (trace {trace['traceID']}) to {output}")
    print(f"Spans with status ERROR: {', '.join(red) or 'none'}")
    print()
    print("Open it in the Jaeger UI, no collector needed:")
    print("  1. start Jaeger, e.g.  docker compose -f examples/docker-compose.yml up -d")
    print("  2. open http://localhost:16686 -> Search -> the 'JSON File' tab")
    print(f"  3. upload {output.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
