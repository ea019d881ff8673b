"""How soon the local launcher sees its ranks end, two trees side by side.

Run from the repository root::

    .venv/bin/python benchmarks/bench_launcher.py [--rounds 6] [--nproc 3]
        [--baseline /path/to/other/checkout]

Each round runs ``run --simulate h200x8 --nproc N --grace 1`` once with this
checkout's code and, with ``--baseline``, once with the other checkout's
(through ``PYTHONPATH``), alternated, each in a fresh run directory. The
launches end two ways in turn: all ranks ready, and rank 1 failing in its
FLASH_ATTN probe (``--inject 1:attention/FLASH_ATTN=RuntimeError:boom``).

From each run directory it reads, per rank, when the rank stored its
``run.finished`` (the rank's own clock, its log) and when the launcher
recorded the rank's end in the manifest (``ended_wall_ns``, the launcher's
clock, the same machine): the difference is the rank's own exit (closing
its log, interpreter teardown) plus the time the launcher took to notice.
It prints the median and the largest over all ranks and rounds, per tree,
and the whole command's median wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent


def launch(tree: Path, run_dir: Path, nproc: int, failing: bool) -> tuple[float, list[float]]:
    """One launch with ``tree``'s code: its wall time, and per rank the
    seconds from its ``run.finished`` to the launcher's record of its end."""
    command = [
        sys.executable,
        "-m",
        "orchestrator",
        "run",
        "--simulate",
        "h200x8",
        "--nproc",
        str(nproc),
        "--grace",
        "1",
        "--run-dir",
        str(run_dir),
    ]
    if failing:
        command += ["--inject", "1:attention/FLASH_ATTN=RuntimeError:boom"]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    began = time.perf_counter()
    subprocess.run(command, env=env, cwd=tree, capture_output=True, check=False, timeout=300)
    wall = time.perf_counter() - began
    manifest = json.loads((run_dir / "manifest.json").read_text())
    delays = []
    for entry in manifest["ranks"]:
        lines = (run_dir / f"rank-{entry['rank']}.jsonl").read_bytes().splitlines()
        finished = orjson.loads(lines[-1])
        assert finished["type"] == "run.finished", finished["type"]
        delays.append((entry["ended_wall_ns"] - finished["wall_ns"]) / 1e9)
    return wall, delays


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--nproc", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="another checkout to compare with")
    args = parser.parse_args(argv)
    trees = {"this tree": ROOT}
    if args.baseline is not None:
        trees["baseline"] = args.baseline.resolve()
    walls: dict[str, list[float]] = {name: [] for name in trees}
    delays: dict[str, list[float]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(args.rounds):
            for name, tree in trees.items():
                run_dir = Path(scratch) / f"{name.replace(' ', '-')}-{round_}"
                wall, seen = launch(tree, run_dir, args.nproc, failing=round_ % 2 == 1)
                walls[name].append(wall)
                delays[name] += seen
    print(f"{args.rounds} rounds of {args.nproc} ranks (ready and failing in turn), per tree:")
    print("TREE        RANK END -> LAUNCHER RECORD (median, max)   COMMAND WALL (median)")
    for name in trees:
        median, worst = statistics.median(delays[name]), max(delays[name])
        wall = statistics.median(walls[name])
        print(f"{name:<11} {median * 1e3:8.1f} ms {worst * 1e3:8.1f} ms {wall:27.2f} s")


if __name__ == "__main__":
    main()
