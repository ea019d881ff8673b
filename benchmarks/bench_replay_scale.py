"""Replay at scale: the read-only commands on runs of 1,024 and 8,192 ranks.

Realistic runs are made from real ones: the reference engine is launched
once per outcome on a simulated ``h200x8`` node (``startup-orchestrator run
--simulate h200x8 --nproc 8``, one launch all ready, one with a fault
injected on rank 3), and each node's logs are copied to every node of a
large launch with the rank, run id, span ids and world size rewritten and
the timestamps shifted and stretched per rank, so no two ranks have the
same times. Three outcome mixes:

- ``ready``: every rank ready;
- ``failed``: rank 3 fails with the injected exception, every other rank
  fails in the exchange that follows, as the engine's ranks did (a cause
  chain: ``GroupError`` caused by the transport's error); no other rank's
  failure is earlier than rank 3's;
- ``node-missing``: every rank ready but the eight ranks of one node in the
  middle of the launch (512-519 of 1,024), which have no log.

Each command runs end to end as a user runs it, a fresh
``python -m orchestrator`` process (output to a pipe, counted): ``replay``
(text), ``replay --json``, ``validate`` and ``replay --html``. Each is timed
in wall-clock seconds of the whole process, imports included (best of
``--repeat``, after one run that compiles the bytecode), against a fresh
process that reads the same files and runs bare ``orjson.loads`` on every
line. Peak memory
is measured in a fresh interpreter per command (its high-water mark,
``VmHWM``: Linux only), less the peak of a fresh interpreter that imports the
same modules and parses nothing, plus the growth of the largest worker
process a large replay forks (one on 2 cores; ``workers`` column), and set
against the number of events and the size of the logs.

    .venv/bin/python benchmarks/bench_replay_scale.py [--ranks 1024,8192]
        [--mixes ready,failed,node-missing] [--repeat 3] [--no-memory]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

if __package__:
    from . import _matrix_common as common
else:
    import _matrix_common as common


#: Ranks per node in the template launches.
NODE = 8
#: The rank the ``failed`` mix injects its fault on.
FAILED_RANK = 3
INJECTION = f"{FAILED_RANK}:flashinfer=RuntimeError:CUDA error: an illegal memory access"
#: How far a rank's start may lag behind the launch's, and how much longer
#: its steps may take than the template's.
START_JITTER_NS = 40_000_000
STRETCH = 0.25
MIXES = ("ready", "failed", "node-missing")
COMMANDS: dict[str, list[str]] = {
    "replay": ["replay"],
    "replay --json": ["replay", "--json"],
    "validate": ["validate"],
    "replay --html": ["replay", "--html"],
}


def launch_templates(directory: Path) -> dict[str, list[list[dict[str, Any]]]]:
    """The ranks' events of one real 8-rank launch per outcome, as JSON."""
    templates: dict[str, list[list[dict[str, Any]]]] = {}
    for name, extra in (("ready", []), ("failed", ["--inject", INJECTION])):
        run_dir = directory / f"template-{name}"
        subprocess.run(
            common.cli(
                "run",
                "--simulate",
                "h200x8",
                "--nproc",
                str(NODE),
                "--run-dir",
                str(run_dir),
                "--durability",
                "never",
                *extra,
            ),
            env=common.environment(OTEL_SDK_DISABLED="true"),
            check=False,
            capture_output=True,
        )
        templates[name] = [
            [orjson.loads(line) for line in (run_dir / f"rank-{n}.jsonl").read_bytes().splitlines()]
            for n in range(NODE)
        ]
    return templates


def _span(value: str | None, rank: int) -> str | None:
    if value is None:
        return None
    return f"{(int(value, 16) ^ (rank * 0x9E3779B97F4A7C15)) & 0xFFFF_FFFF_FFFF_FFFF or 1:016x}"


def rank_lines(
    template: list[dict[str, Any]], rank: int, ranks: int, origin: tuple[int, int], jitter: Any
) -> bytes:
    """One rank's log: ``template`` rewritten for ``rank`` of ``ranks``."""
    wall_origin, mono_origin = origin
    if jitter is None:
        start, stretch = 0, 1.0
    else:
        start, stretch = jitter.randrange(START_JITTER_NS), 1.0 + jitter.random() * STRETCH
    mono_base = (rank // NODE) * 7_919_000_000_000  # each node has its own clock
    out = []
    for record in template:
        event = dict(record)
        event["rank"] = rank
        event["run_id"] = "scale"
        event["wall_ns"] = wall_origin + start + int((record["wall_ns"] - wall_origin) * stretch)
        event["mono_ns"] = (
            mono_base + mono_origin + start + int((record["mono_ns"] - mono_origin) * stretch)
        )
        for key in ("span_id", "parent_span_id"):
            if key in event:
                event[key] = _span(event[key], rank)
        if event["type"] == "run.started":
            event["identity"] = {
                **record["identity"],
                "rank": rank,
                "local_rank": rank % NODE,
                "world_size": ranks,
                "node_rank": rank // NODE,
            }
            # Each node its own host: a log naming this host with a pid that
            # runs here now would read as a rank still running.
            event["host"] = f"node-{rank // NODE}"
            event["pid"] = 1000 + rank
        for key in ("attributes", "result"):
            value = event.get(key)
            if isinstance(value, dict) and "world_size" in value:
                event[key] = {**value, "world_size": ranks}
        out.append(orjson.dumps(event))
    return b"\n".join(out) + b"\n"


def write_run(
    templates: dict[str, list[list[dict[str, Any]]]], mix: str, ranks: int, directory: Path
) -> list[Path]:
    """A run of ``ranks`` ranks with outcome ``mix`` in ``directory``; its logs."""
    directory.mkdir(parents=True)
    source = templates["failed" if mix == "failed" else "ready"]
    first = source[FAILED_RANK][0]
    origin = (first["wall_ns"], first["mono_ns"])
    missing = range(ranks // 2, ranks // 2 + NODE) if mix == "node-missing" else range(0)
    jitter = random.Random(f"{mix}-{ranks}")
    paths = []
    for rank in range(ranks):
        if rank in missing:
            continue
        local = rank % NODE
        if mix == "failed" and local == FAILED_RANK and rank != FAILED_RANK:
            local = FAILED_RANK - 1  # one failure: the other nodes' rank 3 is a consequence
        path = directory / f"rank-{rank}.jsonl"
        cause = mix == "failed" and rank == FAILED_RANK
        path.write_bytes(rank_lines(source[local], rank, ranks, origin, None if cause else jitter))
        paths.append(path)
    return paths


#: What each process runs in: bytecode is written and read, as an installed
#: package has it, and tracing is off. ``python -m`` puts the current
#: directory first on ``sys.path``; safe-path mode leaves it off, so the tree
#: a side-by-side run names by ``PYTHONPATH`` is the one measured, wherever
#: the benchmark is started from.
_ENV = {
    **{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
    "OTEL_SDK_DISABLED": "true",
    "PYTHONSAFEPATH": "1",
}

#: The baseline: a process that reads every file and parses every line.
_BARE = """
import sys, orjson
for path in sys.argv[1:]:
    with open(path, "rb") as file:
        for line in file:
            orjson.loads(line)
"""


def timed(argv: Sequence[str]) -> tuple[float, int, bytes]:
    """Run ``argv`` as a fresh process: its wall time, exit status and output."""
    start = time.perf_counter()
    done = subprocess.run(list(argv), capture_output=True, env=_ENV, check=False)
    return time.perf_counter() - start, done.returncode, done.stdout


def best_wall(repeat: int, argv: Sequence[str]) -> tuple[float, int, bytes]:
    """The best of ``repeat`` runs, after one that warms the caches."""
    timed(argv)
    runs = [timed(argv) for _ in range(repeat)]
    return min(runs, key=lambda run: run[0])


def command(argv: Sequence[str]) -> list[str]:
    """The command line, as a fresh process runs it."""
    return [sys.executable, "-m", "orchestrator", *argv]


def argv_of(name: str, run_dir: Path, html: Path) -> list[str]:
    argv = [*COMMANDS[name], str(run_dir)]
    if name == "replay --html":
        argv[1:2] = ["--html", str(html)]
    return argv


# The peak is the process's own high-water mark (VmHWM), not ru_maxrss:
# Linux carries a parent's peak over to a child through fork and exec. The
# workers a large replay forks are counted with it: the largest worker's
# peak (ru_maxrss of the children), as each started from the command's
# memory at the fork.
_PEAK = """
import contextlib, io, resource, sys
import orchestrator.cli._main, orchestrator.cli._views, orchestrator.engine, exporters
from exporters import report_html, report_json, report_text
argv = sys.argv[1:]
if argv:
    with contextlib.redirect_stdout(io.StringIO()):
        orchestrator.cli._main.main(argv)
with open("/proc/self/status") as status:
    print(next(line.split()[1] for line in status if line.startswith("VmHWM:")))
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def peak_kib(argv: Sequence[str]) -> tuple[int, int]:
    """The peak RSS (KiB) of a fresh interpreter running ``argv`` (none:
    only the imports), and that of the largest process it forked (0 for
    none). Linux only (``/proc/self/status``)."""
    done = subprocess.run(
        [sys.executable, "-c", _PEAK, *argv],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "OTEL_SDK_DISABLED": "true"},
    )
    own, children = done.stdout.split()[-2:]
    return int(own), int(children)


def measure(
    mix: str, ranks: int, paths: list[Path], run_dir: Path, repeat: int, memory: bool
) -> dict[str, Any]:
    events = sum(len(path.read_bytes().splitlines()) for path in paths)
    size = sum(path.stat().st_size for path in paths)
    html = run_dir.parent / f"{run_dir.name}.html"
    base = best_wall(repeat, [sys.executable, "-c", _BARE, *map(str, paths)])[0]
    rows: dict[str, Any] = {}
    for name in COMMANDS:
        argv = argv_of(name, run_dir, html)
        seconds, code, out = best_wall(repeat, command(argv))
        lines = out.count(b"\n")
        shown = (
            f"{html.stat().st_size / 1024:.0f} KiB html"
            if name == "replay --html"
            else f"{lines} lines, {len(out) / 1024:.0f} KiB"
        )
        rows[name] = {"seconds": seconds, "ratio": seconds / base, "exit": code, "output": shown}
        if memory:
            rows[name]["peak_kib"] = peak_kib(argv)
    return {"mix": mix, "ranks": ranks, "events": events, "bytes": size, "bare": base, **rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="1024,8192", help="comma-separated rank counts")
    parser.add_argument("--mixes", default=",".join(MIXES), help="comma-separated outcome mixes")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory runs")
    parser.add_argument("--keep", type=Path, help="write the runs here and keep them")
    args = parser.parse_args()
    mixes = args.mixes.split(",")
    unknown = set(mixes) - set(MIXES)
    if unknown:
        parser.error(f"unknown mixes {sorted(unknown)}; valid: {', '.join(MIXES)}")
    print(f"cores: {os.cpu_count()}; best of {args.repeat}; wall time of each whole process\n")
    with contextlib.ExitStack() as stack:
        if args.keep is not None:
            directory = args.keep
            directory.mkdir(parents=True, exist_ok=True)
        else:
            directory = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        templates = launch_templates(directory)
        baseline = 0 if args.no_memory else peak_kib([])[0]
        if baseline:
            print(f"fresh interpreter with the command line's modules: {baseline / 1024:.0f} MiB")
        header = f"{'':>6} {'mix':<13} {'command':<14} {'seconds':>8} {'ratio':>7} {'output':<24}"
        if not args.no_memory:
            header += f" {'peak-base':>10} {'B/event':>8} {'workers':>8}"
        for ranks in (int(value) for value in args.ranks.split(",")):
            for mix in mixes:
                run_dir = directory / f"{mix}-{ranks}"
                paths = write_run(templates, mix, ranks, run_dir)
                row = measure(mix, ranks, paths, run_dir, args.repeat, not args.no_memory)
                print(
                    f"\n{ranks} ranks, {mix}: {row['events']} events, "
                    f"{row['bytes'] / 2**20:.1f} MiB of logs "
                    f"({row['bytes'] / row['events']:.0f} B/event); "
                    f"bare parsing (read + orjson.loads, a process) {row['bare']:.3f} s"
                )
                print(header)
                for name in COMMANDS:
                    cells = row[name]
                    line = (
                        f"{ranks:>6} {mix:<13} {name:<14} {cells['seconds']:8.3f} "
                        f"{cells['ratio']:6.1f}x {cells['output']:<24}"
                    )
                    if "peak_kib" in cells:
                        # The command and the largest worker, each above the
                        # interpreter it started as; the workers' column says
                        # how much of that they were.
                        own, child = cells["peak_kib"]
                        workers = max(0, child - baseline) * 1024
                        grown = (own - baseline) * 1024 + workers
                        line += (
                            f" {grown / 2**20:7.0f} MiB {grown / row['events']:8.0f}"
                            f" {workers / 2**20:5.0f} MiB"
                        )
                    print(line, flush=True)
                if args.keep is None:
                    for path in run_dir.iterdir():
                        path.unlink()
                    run_dir.rmdir()


if __name__ == "__main__":
    main()
