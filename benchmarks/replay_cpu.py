"""CPU time of ``replay`` of run directories, in this process.

Each directory is replayed through the command line's own entry point
(``orchestrator.cli._main.main(["replay", DIR])``, output captured), and the
best of ``--repeat`` CPU times (``time.process_time``) is printed. Give the
tree to measure with ``PYTHONPATH``; run two trees one after the other, in
turns, to compare them.

    .venv/bin/python benchmarks/replay_cpu.py [--repeat 5] DIR [DIR ...]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import time

from orchestrator.cli._main import main


def replay_cpu(run_dir: str, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
            main(["replay", run_dir])
        best = min(best, time.process_time() - started)
    return best


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("dirs", nargs="+")
    arguments = parser.parse_args()
    for run_dir in arguments.dirs:
        print(f"{replay_cpu(run_dir, arguments.repeat):.3f} s  {run_dir}")
