"""Log throughput against the eventsourcing library, and replay of 1,024 ranks.

Printed side by side in one run (SPEC §8):

1. The same 1,000 step results appended and replayed by this project's logs
   and by ``eventsourcing`` (an aggregate whose events record step outcomes,
   saved by an ``Application`` in memory and in SQLite, replayed by
   ``repository.get``).
2. A real engine run's log (``h200x8``) copied to 1,024 ranks: reading every
   file, merging and replaying (state, messages, root cause, divergences)
   against bare ``orjson.loads`` of the same files.

Times are CPU seconds of this process (``time.process_time``) except where a
file is fsynced; each figure is the best of ``--repeat`` rounds.

    .venv/bin/python benchmarks/bench_scale.py [--repeat 5] [--ranks 1024]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import attrs
import orjson

from events import (
    JsonlLog,
    MemoryLog,
    RankIdentity,
    StepStarted,
    StepSucceeded,
    Timeline,
    fold,
    merge,
    read_log,
    replay,
)
from orchestrator.engine import ENGINE


def best(repeat: int, run: Callable[[], object]) -> float:
    times = []
    for _ in range(repeat):
        start = time.process_time()
        run()
        times.append(time.process_time() - start)
    return min(times)


# --- 1. against eventsourcing --------------------------------------------------------


def our_events(count: int) -> list[Any]:
    events: list[Any] = []
    for index in range(count // 2):
        common = {
            "run_id": "bench",
            "rank": 0,
            "wall_ns": 1_700_000_000_000_000_000 + index * 2_000,
            "step": f"step-{index}",
            "trace_id": "ab" * 16,
            "span_id": f"{index + 1:016x}",
            "parent_span_id": "cd" * 8,
        }
        events.append(StepStarted(seq=2 * index, mono_ns=index * 2_000, **common))
        events.append(
            StepSucceeded(
                seq=2 * index + 1, mono_ns=index * 2_000 + 1_000, result={"ok": True}, **common
            )
        )
    return events


def eventsourcing_figures(count: int, repeat: int, directory: Path) -> dict[str, float]:
    from eventsourcing.application import Application
    from eventsourcing.domain import Aggregate, event

    class RankSteps(Aggregate):
        def __init__(self, rank: int) -> None:
            self.rank = rank
            self.steps: dict[str, str] = {}

        @event("StepEnded")
        def step_ended(self, step: str, outcome: str) -> None:
            self.steps[step] = outcome

    figures: dict[str, float] = {}
    for label, env in (
        ("memory", {}),
        ("sqlite", {"PERSISTENCE_MODULE": "eventsourcing.sqlite"}),
    ):
        holder: dict[str, Any] = {}

        def append(env: dict[str, str] = env, holder: dict[str, Any] = holder) -> None:
            settings = dict(env)
            if settings:
                settings["SQLITE_DBNAME"] = str(directory / f"es-{time.monotonic_ns()}.db")
            app = Application(env=settings)
            aggregate = RankSteps(rank=0)
            for index in range(count - 1):
                aggregate.step_ended(step=f"step-{index // 2}", outcome="ok")
            app.save(aggregate)
            holder["app"], holder["id"] = app, aggregate.id

        figures[f"eventsourcing {label}: append"] = best(repeat, append) / count
        figures[f"eventsourcing {label}: replay"] = (
            best(repeat, lambda h=holder: h["app"].repository.get(h["id"])) / count
        )
    return figures


def our_figures(count: int, repeat: int, directory: Path) -> dict[str, float]:
    events = our_events(count)
    figures: dict[str, float] = {}

    def memory_append() -> None:
        log = MemoryLog("bench", 0)
        for item in events:
            log.append(item)

    figures["events MemoryLog: append"] = best(repeat, memory_append) / count
    figures["events MemoryLog: replay (fold Timeline)"] = (
        best(repeat, lambda: fold(Timeline(), events)) / count
    )
    path = directory / "ours.jsonl"

    def file_append() -> None:
        if path.exists():
            path.unlink()
        log = JsonlLog(path, run_id="bench", rank=0, durability="never")
        for item in events:
            log.append(item)
        log.close()

    figures["events JsonlLog(never): append"] = best(repeat, file_append) / count
    figures["events JsonlLog: replay (read + fold Timeline)"] = (
        best(repeat, lambda: fold(Timeline(), read_log(path).events)) / count
    )
    return figures


# --- 2. 1,024 ranks ------------------------------------------------------------------


def one_engine_log(directory: Path) -> list[Any]:
    from orchestrator.engine import EngineConfig, load_profile, prepare_engine

    log = MemoryLog("scale", 0)

    async def main() -> None:
        runner, graph = prepare_engine(
            EngineConfig(tp=8),
            log,
            identity=RankIdentity(rank=0, world_size=8, local_world_size=8),
            profile=load_profile("h200x8"),
        )
        await runner.run(graph)

    anyio.run(main)
    return list(log.events)


def write_ranks(template: list[Any], ranks: int, directory: Path) -> list[Path]:
    paths = []
    identity = template[0].identity
    for rank in range(ranks):
        path = directory / f"rank-{rank}.jsonl"
        log = JsonlLog(path, run_id="scale", rank=rank, durability="never")
        for event in template:
            changes: dict[str, Any] = {"rank": rank, "run_id": "scale"}
            if event.TYPE == "run.started":
                changes["identity"] = attrs.evolve(
                    identity, rank=rank, local_rank=rank % 8, world_size=ranks, node_rank=rank // 8
                )
            log.append(attrs.evolve(event, **changes))
        log.close()
        paths.append(path)
    return paths


def scale_figures(ranks: int, repeat: int, directory: Path) -> dict[str, float]:
    template = one_engine_log(directory)
    paths = write_ranks(template, ranks, directory)
    total_events = len(template) * ranks

    def bare() -> None:
        for path in paths:
            with open(path, "rb") as file:
                for line in file:
                    orjson.loads(line)

    def ours() -> None:
        contents = [read_log(path) for path in paths]
        result = replay(contents, slices=[ENGINE])
        assert len(result.states) == ranks

    def ours_merged() -> None:
        contents = [read_log(path) for path in paths]
        result = replay(list(merge(contents)), slices=[ENGINE])
        assert len(result.states) == ranks

    return {
        "events per rank": float(len(template)),
        "total events": float(total_events),
        "bare orjson.loads of every line": best(repeat, bare),
        "read + replay (per-rank folds)": best(repeat, ours),
        "read + merge + replay (one merged stream)": best(repeat, ours_merged),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--count", type=int, default=1000, help="events for part 1")
    parser.add_argument("--ranks", type=int, default=1024)
    args = parser.parse_args()
    print(f"cores: {os.cpu_count()}; best of {args.repeat}; CPU time of this process\n")
    with tempfile.TemporaryDirectory() as temporary:
        directory = Path(temporary)
        print(f"1. {args.count} step events: append and replay, per event")
        ours = our_figures(args.count, args.repeat, directory)
        theirs = eventsourcing_figures(args.count, args.repeat, directory)
        for name, seconds in {**ours, **theirs}.items():
            print(f"   {name:<48} {seconds * 1e6:8.2f} us")
        memory_ratio = (
            theirs["eventsourcing memory: replay"]
            / ours["events MemoryLog: replay (fold Timeline)"]
        )
        sqlite_ratio = (
            theirs["eventsourcing sqlite: append"] / ours["events JsonlLog(never): append"]
        )
        print(
            f"   ratio eventsourcing memory replay / events MemoryLog replay: {memory_ratio:.1f}x"
        )
        print(f"   ratio eventsourcing sqlite append / JsonlLog(never) append: {sqlite_ratio:.1f}x")
        rank_dir = directory / "ranks"
        rank_dir.mkdir()
        print(f"\n2. {args.ranks} ranks of an h200x8 engine run")
        scale = scale_figures(args.ranks, max(1, args.repeat // 2), rank_dir)
        for name, value in scale.items():
            unit = "" if name.endswith("events") or name.startswith("events") else " s"
            shown = f"{value:.0f}" if not unit else f"{value:.3f}"
            print(f"   {name:<48} {shown}{unit}")
        base = scale["bare orjson.loads of every line"]
        per_rank = scale["read + replay (per-rank folds)"] / base
        merged = scale["read + merge + replay (one merged stream)"] / base
        print(f"   ratio read+replay / bare parsing: {per_rank:.1f}x; merged: {merged:.1f}x")


if __name__ == "__main__":
    main()
