"""Startup benchmark: where the time of a start goes, end to end.

Run from the repository root::

    .venv/bin/python benchmarks/bench_startup.py [--repeat 7] [--launches 3]
        [--nproc 8] [--part a|b|all] [--baseline-tree DIR]

Every figure is a fresh process (or a fresh launch of processes), started
with this checkout first on ``PYTHONPATH``, tracing off (no ``OTEL_*``
variables), in a scratch directory. ``PYTHONDONTWRITEBYTECODE`` is dropped
from the children's environment: an installed package has its bytecode
cached, and the warm-up writes the caches a checkout lacks (without them
every process compiles this project's modules again, 0.1-0.4 s here).

(a) This host, for real. ``python -m orchestrator run`` (the reference graph:
    real imports of torch, zentorch, the attention backends, flashinfer.comm;
    a fresh ``--run-dir`` each time) against ``benchmarks/_plain_startup.py``,
    a plain sequential loop doing the same probes the way an engine does
    today (try/except imports, log lines, no event log; and the same loop
    ending as the command line does, with ``os._exit`` after the ``atexit``
    hooks, so that the exit is alike on both sides), and against
    ``python -c "import torch"`` (the floor: most of a real start is torch's
    import) and ``python -c pass``. The commands run in turns, one of each
    per round, the order rotating between rounds, after one warm-up round;
    the median wall and CPU time (user + system) of ``--repeat`` rounds is
    shown with the best, and the ratios use the medians. From the last
    orchestrated run's log: its own span and its longest probe.

(b) ``run --simulate h200x8 --nproc 8``: the command line's own launcher
    starting 8 rank processes (on however many cores this machine has).
    Where each rank's time goes, from timestamps that do not change what the
    rank does:

    - the launcher's manifest: when each rank was started (after its
      ``exec``) and when the launcher saw it end (it looks at least every
      0.1 s);
    - a ``sitecustomize`` module this benchmark puts on the ranks' path,
      which notes when the interpreter reached it (the end of Python's own
      start), the time its ``atexit`` hook runs (the last one: after the
      command returned and the non-daemon threads were joined, before the
      interpreter tears its modules down), the process's CPU time then,
      how long ``os.write`` and ``os.fsync`` took in the process (the log's
      appends and its durability), and how long the first
      ``importlib.import_module("torch.distributed")`` took (the process
      group's import of torch);
    - the rank's log (``events.read_log``): ``run.started``, the
      ``process_group`` step (importing torch and forming the gloo group),
      the probes and their durations, ``run.finished``.

    One more launch runs with ``PYTHONPROFILEIMPORTTIME=1`` (each rank's
    stderr into its own file) to split the ranks' imports between this
    project's packages, torch, other third-party packages and the standard
    library; ``-X importtime`` slows imports down, so those figures are
    shares, not the timed launches' durations.

    Printed: per phase, the median over ranks and launches and the maximum;
    the largest phase named; the launches' wall time (median) and the
    launcher's own share.

``--baseline-tree DIR`` runs (a)'s orchestrated command and (b)'s launches
from a second checkout too, interleaved with this one's, for a before/after
measured side by side.
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
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import attrs

from events import Event, read_log

ROOT = Path(__file__).resolve().parent.parent
PLAIN = ROOT / "benchmarks" / "_plain_startup.py"
OURS = ("events", "orchestrator", "exporters")

_IMPORT_LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)$")

#: Put on the ranks' path in (b). Only rank processes (``RANK`` set) are
#: touched; what it records is written once, by the last ``atexit`` hook.
SITECUSTOMIZE = """\
import os

if os.environ.get("RANK") is not None and os.environ.get("BENCH_STARTUP_RECORDS"):
    import atexit
    import json
    import resource
    import threading
    import time

    _reached_ns = time.time_ns()
    _directory = os.environ["BENCH_STARTUP_RECORDS"]
    if os.environ.get("BENCH_STARTUP_STDERR") == "1":
        _fd = os.open(
            os.path.join(_directory, f"stderr-{os.environ['RANK']}"),
            os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
            0o644,
        )
        os.dup2(_fd, 2)
        os.close(_fd)
    _io = {"write": [0, 0], "fsync": [0, 0]}

    def _timed(name, function):
        totals = _io[name]

        def timed(*args):
            start = time.perf_counter_ns()
            try:
                return function(*args)
            finally:
                totals[0] += 1
                totals[1] += time.perf_counter_ns() - start

        return timed

    os.write = _timed("write", os.write)
    os.fsync = _timed("fsync", os.fsync)

    import importlib

    _first_imports = {}
    _import_module = importlib.import_module

    def _import_timed(name, package=None):
        # The process group imports torch.distributed by name: how long the
        # first such import of each torch module took.
        if name.partition(".")[0] != "torch" or name in _first_imports:
            return _import_module(name, package)
        start = time.perf_counter_ns()
        try:
            return _import_module(name, package)
        finally:
            _first_imports.setdefault(name, time.perf_counter_ns() - start)

    importlib.import_module = _import_timed

    def _record():
        usage = resource.getrusage(resource.RUSAGE_SELF)
        record = {
            "rank": int(os.environ["RANK"]),
            "pid": os.getpid(),
            "reached_ns": _reached_ns,
            "atexit_ns": time.time_ns(),
            "cpu_s": usage.ru_utime + usage.ru_stime,
            "threads": threading.active_count(),
            "io": _io,
            "imports": _first_imports,
        }
        path = os.path.join(_directory, f"record-{os.environ['RANK']}.json")
        with open(path, "w", encoding="utf-8") as file:
            file.write(json.dumps(record))

    atexit.register(_record)
"""


# --- common -------------------------------------------------------------------------


def environment(tree: Path, *extra_path: Path, **variables: str) -> dict[str, str]:
    """This environment without collector or launcher variables (tracing off,
    one rank), with ``tree`` first on the path (after ``extra_path``)."""
    launcher = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR"}
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("OTEL_", "STARTUP_ORCHESTRATOR_", "TORCHELASTIC_", "BENCH_"))
        and name not in launcher
        and name not in ("TRACEPARENT", "PYTHONPROFILEIMPORTTIME", "PYTHONDONTWRITEBYTECODE")
    }
    path = [*map(str, extra_path), str(tree)]
    if env.get("PYTHONPATH"):
        path.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(path)
    env.update(variables)
    return env


def measure(command: Sequence[str], cwd: Path, env: Mapping[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds of one run of ``command`` (and its children); it
    must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(
        command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True
    )
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed, cpu


def median(values: Iterable[float]) -> float:
    found = list(values)
    return statistics.median(found) if found else float("nan")


def ms(seconds: float) -> str:
    return f"{seconds * 1000:8.1f}"


def load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


# --- (a) this host, for real ----------------------------------------------------------


@attrs.frozen
class Command:
    label: str
    argv: list[str]
    tree: Path
    run_dir: bool = False  # append a fresh --run-dir


@attrs.define
class Samples:
    walls: list[float] = attrs.Factory(list)
    cpus: list[float] = attrs.Factory(list)


def part_a(repeat: int, baseline: Path | None, scratch: Path) -> None:
    print("(a) this host, for real: fresh processes, in turns")
    python = sys.executable
    commands = [
        Command("python -c pass", [python, "-c", "pass"], ROOT),
        Command('python -c "import torch"', [python, "-c", "import torch"], ROOT),
        Command("plain sequential probes", [python, str(PLAIN)], ROOT),
        Command("  the same, ending with os._exit", [python, str(PLAIN), "--exit-now"], ROOT),
        Command("python -m orchestrator run", [python, "-m", "orchestrator", "run"], ROOT, True),
    ]
    if baseline is not None:
        commands.append(
            Command(
                "  the same, --baseline-tree",
                [python, "-m", "orchestrator", "run"],
                baseline,
                True,
            )
        )
    samples = {c.label: Samples() for c in commands}
    last_log: Path | None = None
    for round_ in range(-1, repeat):
        shift = round_ % len(commands)
        for command in commands[shift:] + commands[:shift]:
            argv = list(command.argv)
            if command.run_dir:
                run_dir = scratch / f"a-{len(samples[command.label].walls)}-{round_}-{id(command)}"
                argv += ["--run-dir", str(run_dir)]
                if command.tree == ROOT:
                    last_log = run_dir / "rank-0.jsonl"
            wall, cpu = measure(argv, scratch, environment(command.tree))
            if round_ >= 0:
                samples[command.label].walls.append(wall)
                samples[command.label].cpus.append(cpu)
    plain = samples["plain sequential probes"]
    floor = samples['python -c "import torch"']
    print(f"  median of {repeat} rounds after a warm-up (best in parentheses); load {load()}")
    print(f"  {'':<34} {'wall':>20} {'cpu':>20} {'wall/plain':>11} {'cpu/plain':>10}")
    for command in commands:
        s = samples[command.label]
        print(
            f"  {command.label:<34} {ms(median(s.walls))} ms ({ms(min(s.walls))})"
            f" {ms(median(s.cpus))} ms ({ms(min(s.cpus))})"
            f" {median(s.walls) / median(plain.walls):10.2f}x"
            f" {median(s.cpus) / median(plain.cpus):9.2f}x"
        )
    ours = samples["python -m orchestrator run"]
    floor_wall, floor_cpu = median(floor.walls), median(floor.cpus)
    print(
        "  beyond import torch: plain "
        f"{ms(median(plain.walls) - floor_wall).strip()} ms wall, "
        f"{ms(median(plain.cpus) - floor_cpu).strip()} ms cpu; orchestrated "
        f"{ms(median(ours.walls) - floor_wall).strip()} ms wall, "
        f"{ms(median(ours.cpus) - floor_cpu).strip()} ms cpu"
    )
    print(
        "  orchestrated - plain: "
        f"{ms(median(ours.walls) - median(plain.walls)).strip()} ms wall, "
        f"{ms(median(ours.cpus) - median(plain.cpus)).strip()} ms cpu"
    )
    if last_log is not None:
        events = read_log(last_log).events
        durations = step_durations(events)
        run_s = (events[-1].mono_ns - events[0].mono_ns) / 1e9
        longest = max(leaves(durations).items(), key=lambda item: item[1])
        print(
            "  the last orchestrated run's log: run.started -> run.finished "
            f"{ms(run_s).strip()} ms; longest probe {longest[0]} {ms(longest[1]).strip()} ms"
        )
    print()


def step_durations(events: Sequence[Event]) -> dict[str, float]:
    """Seconds from each step's ``step.started`` to its terminal event."""
    started: dict[str, int] = {}
    durations: dict[str, float] = {}
    for event in events:
        step = getattr(event, "step", "")
        if not step:
            continue
        if event.TYPE == "step.started":
            started[step] = event.mono_ns
        elif event.TYPE.startswith("step.") and step in started:
            durations[step] = (event.mono_ns - started[step]) / 1e9
    return durations


def leaves(durations: Mapping[str, float]) -> dict[str, float]:
    parents = {step.rsplit("/", 1)[0] for step in durations if "/" in step}
    return {step: d for step, d in durations.items() if step not in parents}


# --- (b) a simulated launch of N ranks ------------------------------------------------

PHASES = (
    ("interpreter start", "exec (as the launcher saw it) -> sitecustomize"),
    ("imports, command line", "sitecustomize -> run.started"),
    ("set-up after run.started", "run.started -> first step (engine graph, logging bridge)"),
    ("process group", "the process_group step: import torch, gloo rendezvous"),
    ("probes", "process group formed -> run.finished"),
    ("return", "run.finished -> last atexit hook (close log and group, threads)"),
    ("teardown", "last atexit hook -> the launcher saw the exit (<= 0.1 s late)"),
)


@attrs.frozen
class RankTimes:
    phases: dict[str, float]
    total: float
    cpu: float
    write: tuple[int, float]
    fsync: tuple[int, float]
    probe_sum: float
    agree: float
    torch_import: float


@attrs.frozen
class Launch:
    wall: float
    launcher_before: float  # launcher start -> first rank started
    launcher_spawn: float  # first rank started -> last rank started
    launcher_after: float  # last rank ended -> launcher exited
    ranks: list[RankTimes]


def simulated_launch(
    tree: Path, scratch: Path, name: str, nproc: int, *, importtime: bool = False
) -> tuple[Launch, Path]:
    records = scratch / f"{name}-records"
    records.mkdir()
    run_dir = scratch / f"{name}-run"
    variables = {"BENCH_STARTUP_RECORDS": str(records)}
    if importtime:
        variables.update(BENCH_STARTUP_STDERR="1", PYTHONPROFILEIMPORTTIME="1")
    env = environment(tree, scratch / "site", **variables)
    command = [sys.executable, "-m", "orchestrator", "run", "--simulate", "h200x8"]
    command += ["--nproc", str(nproc), "--run-dir", str(run_dir)]
    start = time.perf_counter()
    process = subprocess.run(command, cwd=scratch, env=env, capture_output=True, check=False)
    wall = time.perf_counter() - start
    exited_ns = time.time_ns()
    if process.returncode != 0:
        sys.exit(
            f"{' '.join(command)} exited {process.returncode}:\n"
            + process.stderr.decode(errors="replace")[-2000:]
        )
    manifest = json.loads((run_dir / "manifest.json").read_text(encoding="utf-8"))
    ranks: list[RankTimes] = []
    for entry in manifest["ranks"]:
        rank = entry["rank"]
        record = json.loads((records / f"record-{rank}.json").read_text(encoding="utf-8"))
        events = read_log(run_dir / f"rank-{rank}.jsonl").events
        durations = step_durations(events)
        first_step = next(e for e in events if e.TYPE == "step.started")
        group_end = next(
            (
                e
                for e in events
                if e.TYPE != "step.started" and getattr(e, "step", "") == "process_group"
            ),
            first_step,
        )
        started_ns = events[0].wall_ns
        finished_ns = events[-1].wall_ns
        phases = {
            "interpreter start": record["reached_ns"] - entry["started_wall_ns"],
            "imports, command line": started_ns - record["reached_ns"],
            "set-up after run.started": first_step.wall_ns - started_ns,
            "process group": group_end.wall_ns - first_step.wall_ns,
            "probes": finished_ns - group_end.wall_ns,
            "return": record["atexit_ns"] - finished_ns,
            "teardown": entry["ended_wall_ns"] - record["atexit_ns"],
        }
        probe_sum = sum(
            d for step, d in leaves(durations).items() if not step.startswith("process_group")
        )
        ranks.append(
            RankTimes(
                phases={k: v / 1e9 for k, v in phases.items()},
                total=(entry["ended_wall_ns"] - entry["started_wall_ns"]) / 1e9,
                cpu=record["cpu_s"],
                write=(record["io"]["write"][0], record["io"]["write"][1] / 1e9),
                fsync=(record["io"]["fsync"][0], record["io"]["fsync"][1] / 1e9),
                probe_sum=probe_sum,
                agree=durations.get("allreduce_workspace/agree", 0.0),
                torch_import=record["imports"].get("torch.distributed", 0) / 1e9,
            )
        )
    launcher = manifest["launcher"]
    starts = [r["started_wall_ns"] for r in manifest["ranks"]]
    ends = [r["ended_wall_ns"] for r in manifest["ranks"]]
    launch = Launch(
        wall=wall,
        launcher_before=(min(starts) - launcher["started_wall_ns"]) / 1e9,
        launcher_spawn=(max(starts) - min(starts)) / 1e9,
        launcher_after=(exited_ns - max(ends)) / 1e9,
        ranks=ranks,
    )
    return launch, records


@attrs.define
class ImportShares:
    ours: float = 0.0
    torch: float = 0.0
    third_party: float = 0.0
    stdlib: float = 0.0
    ours_blocks: dict[str, float] = attrs.Factory(dict)


def import_shares(records: Path, nproc: int) -> ImportShares:
    """Mean per rank of the ranks' ``-X importtime`` lines, by owner. Lines
    are post-order (a module after what it imported): every line up to a
    top-level one is that module's subtree. A torch subtree counts whole as
    torch; elsewhere each module's own time counts for its owner."""
    shares = ImportShares()
    for rank in range(nproc):
        path = records / f"stderr-{rank}"
        block: list[tuple[str, int]] = []
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            match = _IMPORT_LINE.match(line)
            if match is None:
                continue
            name, self_us, cumulative_us = match[4], int(match[1]), int(match[2])
            depth = len(match[3]) // 2
            block.append((name, self_us))
            if depth != 0:
                continue
            root = name.partition(".")[0]
            if root == "torch":
                shares.torch += cumulative_us / 1e6 / nproc
            else:
                for module, own in block:
                    top = module.partition(".")[0]
                    seconds = own / 1e6 / nproc
                    if top in OURS:
                        shares.ours += seconds
                    elif top in sys.stdlib_module_names or top.startswith("_"):
                        shares.stdlib += seconds
                    else:
                        shares.third_party += seconds
                if root in OURS:
                    shares.ours_blocks[name] = (
                        shares.ours_blocks.get(name, 0.0) + cumulative_us / 1e6 / nproc
                    )
            block = []
    return shares


def print_launches(label: str, launches: Sequence[Launch]) -> str:
    """Print the per-phase table; return the largest phase's name."""
    ranks = [r for launch in launches for r in launch.ranks]
    print(f"  {label}: {len(launches)} launches of {len(launches[0].ranks)} ranks")
    print(f"    {'phase, per rank':<28} {'median':>9} {'max':>9}   what")
    medians = {}
    for phase, what in PHASES:
        values = [r.phases[phase] for r in ranks]
        medians[phase] = median(values)
        print(f"    {phase:<28} {ms(medians[phase])} {ms(max(values))}   {what}")
        if phase == "process group":
            imports = [r.torch_import for r in ranks]
            rest = [r.phases[phase] - r.torch_import for r in ranks]
            print(
                f"    {'  of which import torch':<28} {ms(median(imports))} {ms(max(imports))}"
                "   (importlib.import_module('torch.distributed'), first call)"
            )
            print(
                f"    {'  the rest (rendezvous)':<28} {ms(median(rest))} {ms(max(rest))}"
                "   (init_process_group: waiting for the last rank to import torch)"
            )
    totals = [r.total for r in ranks]
    print(f"    {'total, exec -> exit':<28} {ms(median(totals))} {ms(max(totals))}")
    cpus = [r.cpu for r in ranks]
    print(f"    {'cpu time of a rank':<28} {ms(median(cpus))} {ms(max(cpus))}")
    writes = [r.write[1] for r in ranks]
    fsyncs = [r.fsync[1] for r in ranks]
    print(
        f"    {'  of which os.write':<28} {ms(median(writes))} {ms(max(writes))}"
        f"   ({median(r.write[0] for r in ranks):.0f} calls, inside the phases above)"
    )
    print(
        f"    {'  of which os.fsync':<28} {ms(median(fsyncs))} {ms(max(fsyncs))}"
        f"   ({median(r.fsync[0] for r in ranks):.0f} calls, inside the phases above)"
    )
    sums = [r.probe_sum for r in ranks]
    agree = [r.agree for r in ranks]
    print(f"    {'  sum of probe durations':<28} {ms(median(sums))} {ms(max(sums))}")
    print(f"    {'  all-reduce agreement':<28} {ms(median(agree))} {ms(max(agree))}")
    largest = max(medians, key=lambda phase: medians[phase])
    print(
        f"    launch wall time {ms(median(x.wall for x in launches)).strip()} ms (median); "
        f"launcher before the first rank {ms(median(x.launcher_before for x in launches)).strip()}"
        f" ms, starting the ranks {ms(median(x.launcher_spawn for x in launches)).strip()} ms, "
        f"after the last rank ended {ms(median(x.launcher_after for x in launches)).strip()} ms"
    )
    print(f"    largest phase: {largest} ({ms(medians[largest]).strip()} ms median per rank)")
    return largest


def part_b(launches: int, nproc: int, baseline: Path | None, scratch: Path) -> None:
    print(f"(b) run --simulate h200x8 --nproc {nproc}: where each rank's time goes")
    site = scratch / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    trees = [("this tree", ROOT)]
    if baseline is not None:
        trees.append(("--baseline-tree", baseline))
    results: dict[str, list[Launch]] = {label: [] for label, _ in trees}
    simulated_launch(ROOT, scratch, "warm-up", nproc)
    for index in range(launches):
        order = trees if index % 2 == 0 else trees[::-1]
        for label, tree in order:
            name = f"b-{index}-{trees.index((label, tree))}"
            launch, _ = simulated_launch(tree, scratch, name, nproc)
            results[label].append(launch)
    print(f"  load {load()}")
    for label, _ in trees:
        print_launches(label, results[label])
    for label, tree in trees:
        _, records = simulated_launch(
            tree, scratch, f"importtime-{trees.index((label, tree))}", nproc, importtime=True
        )
        shares = import_shares(records, nproc)
        print(f"  {label}: imports per rank (python -X importtime, mean over ranks)")
        print(
            f"    this project {ms(shares.ours).strip()} ms own time; torch (whole, in the "
            f"process_group step) {ms(shares.torch).strip()} ms; other third-party "
            f"{ms(shares.third_party).strip()} ms; standard library {ms(shares.stdlib).strip()} ms"
        )
        top = sorted(shares.ours_blocks.items(), key=lambda item: -item[1])[:6]
        print(
            "    this project's top-level imports, cumulative: "
            + ", ".join(f"{name} {ms(seconds).strip()} ms" for name, seconds in top)
        )
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeat", type=int, default=7, help="rounds of (a)")
    parser.add_argument("--launches", type=int, default=3, help="timed launches of (b)")
    parser.add_argument("--nproc", type=int, default=8)
    parser.add_argument("--part", choices=("a", "b", "all"), default="all")
    parser.add_argument("--baseline-tree", type=Path, default=None)
    args = parser.parse_args()
    baseline = args.baseline_tree.resolve() if args.baseline_tree is not None else None
    print(
        f"Python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs, "
        f"load average {load()}\n"
    )
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as directory:
        scratch = Path(directory)
        if args.part in ("a", "all"):
            part_a(args.repeat, baseline, scratch)
        if args.part in ("b", "all"):
            part_b(args.launches, args.nproc, baseline, scratch)
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
