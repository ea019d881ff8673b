"""Command-line benchmark: a tool that speeds up startup must start fast itself.

Run from the repository root::

    .venv/bin/python benchmarks/bench_cli.py [--repeat 9] [--top 12]

Everything is measured side by side in one run, as fresh processes (what a
user waits for), so the ratios compare like with like on whatever machine
runs it. Each command runs once to warm the file cache, then ``--repeat``
times; the best wall time is reported (noise only ever adds time) with the
median in parentheses, and next to it the best CPU time (user + system) of
the process, which the other work of a shared machine disturbs less.

(a) Wall time of ``startup-orchestrator --help`` and of a simulated
    single-rank start (``run --simulate h200x8``, a fresh run directory each
    time) against ``python -c pass``, as ratios. Next to it, from the events
    of the last simulated run: the sum of the probe durations (every leaf
    step: plugin, candidate, attempt) and the run's own span (``run.started``
    to ``run.finished``) — the part of the wall time that is the startup
    itself rather than the tool.

    The embedding entry point is measured the same way: ``from orchestrator
    import Startup`` alone, and that import plus its first call,
    ``Startup(profile="h200x8").run()``, in a fresh run directory.

(b) ``python -X importtime``: the imports with the largest cumulative time
    for ``import orchestrator.cli`` (all that ``--help`` loads) and for the
    simulated run, and a check that heavy modules (OpenTelemetry exporters,
    grpc, protobuf, torch) are not imported by either; tracing is off
    (no ``OTEL_*`` variables), as in a plain ``run``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs

#: Modules that must load only when used: exporters and their transports,
#: serialisation, and torch (a simulated run reads torch's version from its
#: metadata, never imports it).
HEAVY_PREFIXES = (
    "opentelemetry.exporter",
    "opentelemetry.proto",
    "grpc",
    "google.protobuf",
    "torch",
)

_IMPORT_LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)$")


@attrs.frozen
class Timing:
    """Seconds of repeated measurements: wall clock (best and median) and the
    child's CPU time, user + system (best), which other load on the machine
    disturbs less."""

    best: float
    median: float
    cpu: float

    @classmethod
    def of(cls, samples: Sequence[tuple[float, float]]) -> Timing:
        walls = [w for w, _ in samples]
        return cls(best=min(walls), median=statistics.median(walls), cpu=min(c for _, c in samples))


@attrs.frozen
class Import:
    """One line of ``-X importtime``."""

    name: str
    self_us: int
    cumulative_us: int
    depth: int


def environment() -> dict[str, str]:
    """This environment without collector or launcher variables: tracing
    off, one rank."""
    launcher = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR"}
    return {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("OTEL_", "STARTUP_ORCHESTRATOR_", "TORCHELASTIC_"))
        and name not in launcher
        and name != "TRACEPARENT"
    }


def tool() -> list[str]:
    """The installed ``startup-orchestrator`` script, else ``python -m``."""
    script = Path(sys.executable).with_name("startup-orchestrator")
    return [str(script)] if script.exists() else [sys.executable, "-m", "orchestrator"]


def measure(command: Sequence[str], cwd: Path) -> tuple[float, float]:
    """Wall and CPU seconds of one run of ``command``; it must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(
        command,
        cwd=cwd,
        env=environment(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=True,
    )
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed, cpu


def timed(repeat: int, command_for: Callable[[int], list[str]], cwd: Path) -> Timing:
    """``repeat`` runs of ``command_for(i)``, after one warm-up run (file
    cache, bytecode)."""
    measure(command_for(-1), cwd)
    return Timing.of([measure(command_for(i), cwd) for i in range(repeat)])


def probe_figures(log: Path) -> tuple[int, float, float]:
    """From a rank log: how many leaf steps (probes) ran, the sum of their
    durations, and the run's span, in seconds."""
    events = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    started: dict[str, int] = {}
    ended: dict[str, int] = {}
    for event in events:
        step = event.get("step")
        if event["type"] == "step.started":
            started[step] = event["mono_ns"]
        elif step is not None and event["type"].startswith("step.") and step in started:
            ended[step] = event["mono_ns"]
    parents = {step.rsplit("/", 1)[0] for step in started if "/" in step}
    leaves = [step for step in ended if step not in parents]
    total_ns = sum(ended[step] - started[step] for step in leaves)
    run_ns = events[-1]["mono_ns"] - events[0]["mono_ns"]
    return len(leaves), total_ns / 1e9, run_ns / 1e9


def import_profile(command: Sequence[str], cwd: Path) -> list[Import]:
    """``-X importtime`` of ``command`` (a Python command line)."""
    process = subprocess.run(
        [command[0], "-X", "importtime", *command[1:]],
        cwd=cwd,
        env=environment(),
        capture_output=True,
        text=True,
        check=True,
    )
    found = []
    for line in process.stderr.splitlines():
        match = _IMPORT_LINE.match(line)
        if match:
            found.append(
                Import(
                    name=match[4],
                    self_us=int(match[1]),
                    cumulative_us=int(match[2]),
                    depth=len(match[3]) // 2,
                )
            )
    return found


def heavy(imports: Sequence[Import]) -> list[str]:
    """The heavy modules among ``imports``."""
    return sorted(
        i.name
        for i in imports
        if any(i.name == prefix or i.name.startswith(prefix + ".") for prefix in HEAVY_PREFIXES)
    )


def print_profile(title: str, imports: Sequence[Import], top: int) -> None:
    total = sum(i.cumulative_us for i in imports if i.depth == 0)
    print(f"  {title}: {len(imports)} modules, {total / 1000:.1f} ms at top level")
    for item in sorted(imports, key=lambda i: -i.cumulative_us)[:top]:
        print(
            f"    {item.cumulative_us / 1000:7.1f} ms cumulative {item.self_us / 1000:6.1f} ms self"
            f"  {'  ' * item.depth}{item.name}"
        )
    found = heavy(imports)
    otel_sdk = any(i.name == "opentelemetry.sdk.trace" for i in imports)
    print(f"    heavy modules imported: {', '.join(found) if found else 'none'}")
    print(f"    (opentelemetry.sdk.trace imported: {'yes' if otel_sdk else 'no'})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()

    print(
        f"Python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs, "
        f"load average {', '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    print(f"best of {args.repeat}, fresh processes\n")
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as scratch:
        cwd = Path(scratch)
        baseline = timed(args.repeat, lambda _i: [sys.executable, "-c", "pass"], cwd)
        help_ = timed(args.repeat, lambda _i: [*tool(), "--help"], cwd)

        def simulated(i: int) -> list[str]:
            run_dir = cwd / f"run-{i}"
            shutil.rmtree(run_dir, ignore_errors=True)
            return [*tool(), "run", "--simulate", "h200x8", "--run-dir", str(run_dir)]

        run = timed(args.repeat, simulated, cwd)
        probes, probe_s, run_span_s = probe_figures(cwd / f"run-{args.repeat - 1}" / "rank-0.jsonl")
        embed_import = timed(
            args.repeat, lambda _i: [sys.executable, "-c", "from orchestrator import Startup"], cwd
        )

        def embedded(i: int) -> list[str]:
            run_dir = cwd / f"embed-{i}"
            shutil.rmtree(run_dir, ignore_errors=True)
            code = (
                "from orchestrator import Startup\n"
                f"Startup(profile='h200x8', run_dir={str(run_dir)!r}).run()"
            )
            return [sys.executable, "-c", code]

        embed_run = timed(args.repeat, embedded, cwd)

        print("(a) wall time")
        rows = [
            ("python -c pass", baseline),
            ("startup-orchestrator --help", help_),
            ("startup-orchestrator run --simulate h200x8", run),
            ("from orchestrator import Startup", embed_import),
            ("  + Startup(profile='h200x8').run()", embed_run),
        ]
        print(f"  {'':<44} {'wall, best (median)':>21} {'ratio':>6}  {'cpu':>8} {'ratio':>6}")
        for label, timing in rows:
            print(
                f"  {label:<44} {timing.best * 1000:7.1f} ms ({timing.median * 1000:7.1f})"
                f"  {timing.best / baseline.best:5.1f}x"
                f"  {timing.cpu * 1000:5.1f} ms {timing.cpu / baseline.cpu:5.1f}x"
            )
        print("  (ratios: against python -c pass)")
        print(
            f"  from the last run's log: {probes} probes, sum of their durations "
            f"{probe_s * 1000:.1f} ms; run.started -> run.finished {run_span_s * 1000:.1f} ms"
        )
        print(
            f"  the tool's own cost in a simulated run: {(run.best - run_span_s) * 1000:.1f} ms "
            f"of {run.best * 1000:.1f} ms ({(run.best - baseline.best - run_span_s) * 1000:.1f} ms "
            "beyond python -c pass)\n"
        )

        print("(b) import time (python -X importtime), top cumulative")
        print_profile(
            "import orchestrator.cli (what --help loads)",
            import_profile([sys.executable, "-c", "import orchestrator.cli"], cwd),
            args.top,
        )
        print_profile(
            "python -m orchestrator run --simulate h200x8",
            import_profile(
                [
                    sys.executable,
                    "-m",
                    "orchestrator",
                    "run",
                    "--simulate",
                    "h200x8",
                    "--run-dir",
                    str(cwd / "run-importtime"),
                ],
                cwd,
            ),
            args.top,
        )
        help_imports = import_profile([sys.executable, "-m", "orchestrator", "--help"], cwd)
        print(
            f"  --help itself: heavy modules imported: {', '.join(heavy(help_imports)) or 'none'}"
        )


if __name__ == "__main__":
    main()
