"""Declare a probe graph of your own, run it, and read the outcomes from its events.

Three probes an engine might need before it loads a model:

* ``cache_dir``  checks that the kernel cache directory is writable (blocking
  file I/O, so it runs in a worker thread, with a timeout in case the
  directory sits on a hung network filesystem);
* ``tokenizer``  probes an optional extension module: not installed is the
  expected case (``absent``), installed but broken is ``unavailable``, and a
  programming error propagates;
* ``kernels``    chooses between two kernel backends by priority, probing both
  concurrently; it depends on ``cache_dir``, since compiled kernels need it.

The graph runs three times: on this machine as it is; with a fault plan that
makes ``cache_dir`` fail with PermissionError, which the run records (the
step ends ``unavailable`` with its reason, ``kernels`` falls back, and the
run is still ready); and with a fault that raises RuntimeError in the
tokenizer's import, which the run records and then raises, unchanged.

After each run the events are replayed into the report a user reads. The
graph declares what its steps mean in a few lines of data (``MY_ENGINE``, a
slice): two message rules and a report column. Everything else (a step that
failed, a candidate that was unavailable, the run's outcome) gets the
kernel's generic messages, as any graph does.

    python examples/custom_probe_graph.py
    python examples/custom_probe_graph.py --cache-dir /var/cache/my-engine

With ``--runs DIR`` each run is also written as a run directory
(``DIR/healthy``, ``DIR/cache-denied``, ``DIR/tokenizer-broken``) that the
command line replays with the graph's own slice::

    python examples/custom_probe_graph.py --runs my-runs
    startup-orchestrator replay my-runs/cache-denied \\
        --slice examples/custom_probe_graph.py:MY_ENGINE
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Sequence
from pathlib import Path

import anyio

from events import (
    Column,
    Event,
    EventLog,
    JsonlLog,
    JsonValue,
    MemoryLog,
    MessageRule,
    RunFinished,
    Severity,
    Slice,
    StepCancelled,
    StepFailed,
    StepSucceeded,
    StepUnavailable,
    Timeline,
    fold,
    read_log,
    replay,
)
from exporters import report_text
from orchestrator import (
    Candidate,
    Fault,
    FaultPlan,
    Graph,
    Step,
    StepContext,
    optional_module_policy,
    run,
    select_candidate,
)

# --- the probes ----------------------------------------------------------------------


def check_cache_dir(ctx: StepContext) -> JsonValue:
    """Blocking: create the directory and a file in it. PermissionError and
    other OSErrors are recorded as ``unavailable`` by the default policy."""
    directory = Path(str(ctx.config["cache_dir"]))
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=directory):
        pass
    return {"cache_dir": str(directory)}


def probe_tokenizer(ctx: StepContext) -> JsonValue:
    """Always import through the context: fault plans and simulated hosts
    work through it, and nothing patches ``builtins.__import__``."""
    module = ctx.import_module("tokenizers")
    return {"tokenizers": getattr(module, "__version__", "unknown")}


def probe_triton_kernels(ctx: StepContext) -> Sequence[str]:
    """A candidate probe loads the backend and returns the reasons it does not
    fit this configuration (empty: it fits). ImportError means unavailable."""
    ctx.import_module("triton")
    return []


def probe_reference_kernels(ctx: StepContext) -> Sequence[str]:
    # ctx.config is the run's configuration, recorded in the log with it.
    head_size = ctx.config["head_size"]
    if not isinstance(head_size, int) or head_size % 8:
        return [f"head size {head_size} is not a multiple of 8"]
    return []


async def choose_kernels(ctx: StepContext) -> JsonValue:
    """Async: it only awaits its candidate probes, which are child steps."""
    candidates = [Candidate(name="reference", priority=1, probe=probe_reference_kernels)]
    if ctx.dependency("cache_dir").ok:
        # Compiled kernels need a writable cache; without one, only the
        # reference kernels are candidates.
        candidates.append(Candidate(name="triton", priority=0, probe=probe_triton_kernels))
    # Selection goes by priority, never by which probe finished first.
    selection = await select_candidate(ctx, candidates, what="kernel backend")
    return {"selected": selection.selected, "considered": list(selection.considered)}


GRAPH = Graph(
    "my-engine",
    [
        Step(name="cache_dir", body=check_cache_dir, timeout=5.0),
        Step(name="tokenizer", body=probe_tokenizer, policy=optional_module_policy("tokenizers")),
        Step(name="kernels", body=choose_kernels, depends_on=["cache_dir"]),
    ],
)


# What the steps mean, as data: messages for the two outcomes a user must know
# about, and the selected kernels as a column of the report.
MY_ENGINE = Slice(
    name="my-engine",
    rules=[
        MessageRule(
            code="my_engine.cache_unwritable",
            step="cache_dir",
            outcomes="unavailable",
            exception="PermissionError",
            severity=Severity.WARNING,
            text="Kernel cache is not writable ({error}); compiled kernels are off.",
        ),
        MessageRule(
            code="my_engine.kernels",
            step="kernels",
            outcomes="ok",
            text="Using the {result[selected]} kernels.",
        ),
    ],
    columns=[Column(title="KERNELS", fact="kernels", step="kernels", key="selected")],
)


# --- running it and reading the events -----------------------------------------------


def describe(events: Sequence[Event]) -> None:
    """Print every step's outcome, from the events alone."""
    details: dict[str, str] = {}
    for event in events:
        if isinstance(event, StepSucceeded):
            details[event.step] = f"result {event.result}"
        elif isinstance(event, StepUnavailable):
            details[event.step] = "; ".join(event.reasons)
        elif isinstance(event, StepFailed):
            details[event.step] = f"{event.cause.name}: {event.cause.message}"
        elif isinstance(event, StepCancelled):
            details[event.step] = event.reason
    # Timeline is one of the library's pure projections: a fold over events.
    timeline = fold(Timeline(), events)
    for timing in timeline.steps():
        duration = (timing.duration_ns or 0) / 1e6
        print(
            f"  {timing.step:<18} {timing.kind:<9} {timing.outcome or 'running':<11}"
            f" {duration:7.2f} ms  {details.get(timing.step, '')}"
        )
    finished = events[-1]
    assert isinstance(finished, RunFinished)
    print(f"  run: {finished.outcome}")


def report(events: Sequence[Event]) -> None:
    """Replay the events with the graph's slice and print the report."""
    print("  report:")
    for line in report_text(replay(events, slices=[MY_ENGINE])).splitlines():
        if line:
            print(f"    {line}")


async def start(
    title: str, config: dict[str, JsonValue], faults: FaultPlan, run_dir: Path | None
) -> None:
    print(f"{title}:")
    # A MemoryLog keeps the events in memory; a JsonlLog takes the same place
    # and writes DIR/<run>/rank-0.jsonl, a file that replays anywhere.
    log: EventLog
    if run_dir is None:
        log = MemoryLog(run_id="custom-graph")
    else:
        run_dir.mkdir(parents=True, exist_ok=True)
        log = JsonlLog(run_dir / "rank-0.jsonl", run_id="custom-graph")
    try:
        result = await run(GRAPH, log, config=config, faults=faults)
    except RuntimeError as exc:
        # Programming errors propagate with their original type, after the
        # failed step and the run's end are in the log.
        print(f"  raised {type(exc).__name__}: {exc}")
    else:
        print(f"  selected kernels: {result['kernels'].value}")
    finally:
        log.close()
    events = list(log.read()) if run_dir is None else read_log(run_dir / "rank-0.jsonl").events
    describe(events)
    report(events)
    print()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", default="my-engine-cache", help="kernel cache directory")
    parser.add_argument(
        "--runs", type=Path, default=None, metavar="DIR", help="also write each run under DIR"
    )
    args = parser.parse_args()
    config: dict[str, JsonValue] = {"cache_dir": args.cache_dir, "head_size": 128}

    def run_dir(name: str) -> Path | None:
        return None if args.runs is None else args.runs / name

    await start("This machine", config, FaultPlan(), run_dir("healthy"))

    # Faults are data: the target is a module a probe imports or a step path,
    # and exceptions are named builtins (nothing is imported or evaluated).
    denied = Fault(
        target="cache_dir",
        exception="PermissionError",
        args=(13, "Permission denied", args.cache_dir),
    )
    await start(
        "Cache directory not writable (recorded)",
        config,
        FaultPlan(faults=(denied,)),
        run_dir("cache-denied"),
    )

    # The same plan from command-line style specs.
    broken = FaultPlan.parse(["tokenizers=RuntimeError:tokenizer extension failed to initialise"])
    await start(
        "Tokenizer raises RuntimeError (recorded, then raised)",
        config,
        broken,
        run_dir("tokenizer-broken"),
    )


if __name__ == "__main__":
    anyio.run(main)
