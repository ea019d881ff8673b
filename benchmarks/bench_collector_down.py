"""What a collector that is down costs a launch.

Run from the repository root::

    .venv/bin/python benchmarks/bench_collector_down.py [--repeat 5] [--nproc 1 4]

For each rank count, side by side in one run: ``run --simulate h200x8
[--nproc N]`` with no collector configured (no ``OTEL_*`` variables), and
the same with ``OTEL_EXPORTER_OTLP_ENDPOINT`` naming a local port nothing
listens on (the default export timeout, gRPC). Each command runs once to
warm the file cache, then ``--repeat`` times, alternating; the best wall
time of each is reported (noise only ever adds time) with the median in
parentheses, then the difference and the ratio down / none.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_DROPPED_PREFIXES = ("OTEL_", "STARTUP_ORCHESTRATOR_", "TORCHELASTIC_")
_DROPPED = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR"}
_DROPPED |= {"MASTER_PORT", "TRACEPARENT", "TRACESTATE"}


def _environment(**extra: str) -> dict[str, str]:
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in _DROPPED and not name.startswith(_DROPPED_PREFIXES)
    }
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
    env.update(extra)
    return env


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def _launch(nproc: int, env: dict[str, str], workdir: Path, name: str) -> float:
    run_dir = workdir / name
    command = [sys.executable, "-m", "orchestrator", "run", "--simulate", "h200x8"]
    if nproc > 1:
        command += ["--nproc", str(nproc)]
    started = time.perf_counter()
    done = subprocess.run(
        [*command, "--run-dir", str(run_dir)],
        env=env,
        cwd=workdir,
        capture_output=True,
        text=True,
        check=False,
    )
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--nproc", type=int, nargs="+", default=[1, 4])
    args = parser.parse_args()

    down = _environment(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{_closed_port()}")
    none = _environment()
    print(f"best of {args.repeat} (median), wall time of a fresh process")
    print(f"  {'ranks':>5}  {'no collector':>18}  {'collector down':>18}  {'cost':>8}  ratio")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        counter = 0
        for nproc in args.nproc:
            times: dict[str, list[float]] = {"none": [], "down": []}
            for attempt in range(args.repeat + 1):
                for label, env in (("none", none), ("down", down)):
                    counter += 1
                    elapsed = _launch(nproc, env, workdir, f"run-{counter}")
                    if attempt:  # the first round warms the file cache
                        times[label].append(elapsed)
            best = {label: min(values) for label, values in times.items()}
            median = {label: statistics.median(values) for label, values in times.items()}
            print(
                f"  {nproc:>5}  {best['none'] * 1000:8.0f} ms ({median['none'] * 1000:5.0f})"
                f"  {best['down'] * 1000:8.0f} ms ({median['down'] * 1000:5.0f})"
                f"  {(best['down'] - best['none']) * 1000:5.0f} ms"
                f"  {best['down'] / best['none']:.2f}x"
            )


if __name__ == "__main__":
    main()
