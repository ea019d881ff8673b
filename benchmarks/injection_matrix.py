"""Injection matrix: every fault target by every exception class by where it
fires, each checked against what SPEC §3 says should happen.

Run from the repository root::

    .venv/bin/python benchmarks/injection_matrix.py [--jobs 2] [--sample 0]
        [--placements single,all-of-4,one-of-4] [--out injection-matrix.json]

Targets are every module and step path of
``orchestrator.engine._targets.injection_targets()``; exceptions are
ImportError, ModuleNotFoundError, OSError, PermissionError, TypeError,
RuntimeError, AttributeError, KeyError, ValueError, KeyboardInterrupt,
SystemExit, ``hang`` and ``crash``. Placements:

    single     a single-rank run (``run --tp 2``, no launcher): every target
               by every exception;
    all-of-4   ``run --nproc 4``, the fault on every rank;
    one-of-4   ``run --nproc 4``, the fault on rank 1 only.

A four-rank launch costs seconds, so the four-rank placements are sampled:
by default every exception class once per target group (the targets of a
group taking turns), plus ``--sample F``, a fraction of the other target by
exception cells drawn at random (``--sample 1`` runs them all).

**Where a target is reached.** A fault on a target no probe reaches never
fires. Before the matrix, each target is run once with ``RuntimeError`` and
a marker message under a list of configurations, in order — ``h200x8``,
``b200x8``, ``a100x4``, ``zen4``, ``xeon``, ``h200x8 --mla --head-size 576``,
``b200x8 --mla --head-size 576``, then ``h200x8 --attention-backend X`` for
every backend (an explicit selection probes any backend), and last a two-rank ``h200x8`` launch (the
``process_group`` set-up step exists only when ranks form a group) — and the
first configuration whose log carries the marker is the target's. The
steps whose events carry it are the steps the fault reaches (for a module,
the steps that import it; the deepest ones are kept). Targets no
configuration reaches are listed and skipped, with the first configuration
where the fault, though it never fired, still changed how the start ended.

**What should happen** (SPEC §2, §3), per kind of step the fault reaches:

    kind             steps                               Exception classes
    candidate        attention/X, automatic selection    ImportError, OSError (and
                                                         subclasses) -> unavailable,
                                                         other candidates go on;
                                                         others -> failed
    explicit         attention/X, --attention-backend X  any -> failed (ValueError
                                                         from the original)
    plugin           platform/<plugin>                   any Exception recorded, the
                                                         plugin not activated; if it
                                                         is this host's plugin the
                                                         start fails, also when only
                                                         its driver library (pynvml)
                                                         is broken: as in vLLM, the
                                                         cpu plugin activates only
                                                         for a CPU build
    build            platform/build                      any Exception recorded: the
                                                         build target is unknown and
                                                         the cpu plugin declines with
                                                         it as its reason; the run
                                                         goes on
    zentorch         platform/cpu/zentorch               ModuleNotFoundError naming
                                                         zentorch -> absent; other
                                                         ImportError, OSError ->
                                                         unavailable (CpuPlatform);
                                                         others -> the cpu plugin
                                                         fails
    flashinfer_comm  flashinfer_comm                     any Exception -> unavailable
                                                         (fusion off)
    attempt          allreduce_workspace/<backend>       any Exception recorded, the
                                                         chain falls back or ends
                                                         with fusion off
    quant            allreduce_workspace/quant           any Exception recorded,
                                                         ready (one ERROR per rank)
    group            process_group                       ImportError, OSError ->
                                                         unavailable (ranks decide
                                                         alone; on one rank of 4,
                                                         its peers wait for it at
                                                         the rendezvous and fail
                                                         when it times out); others
                                                         -> failed
    required         platform, attention,                any -> failed
                     allreduce_workspace,
                     allreduce_workspace/agree

and for every kind: KeyboardInterrupt -> the run is ``interrupted``;
SystemExit -> ``failed`` (SPEC §2: BaseExceptions propagate, even past a
policy that records every Exception); ``hang`` with ``--timeout 2`` -> the
step ``timed_out``, recorded where the step is an optional probe (the run
goes on, as after an environment failure) and failed where it is required;
``crash`` -> the process dies (no engine step is isolated), so the run is
``incomplete`` and the report lists the steps in flight. The run is
``failed`` when a step fails, or when the faults leave no valid attention
candidate or no platform (a recorded failure of the plugin that activates on
this host). A fault on rank 1 of 4 is expected to make the run end as it
would on every rank, with rank 1 named. Where a fault is recorded, the
report must hold the message SPEC §3.6 names for it, at its severity
(``zentorch.broken`` WARNING, ``zentorch.absent`` and
``attention.backend_unavailable`` DEBUG, ``flashinfer_comm.unavailable``
DEBUG, ``allreduce.attempt_failed`` WARNING or ``allreduce.workspace_failed``
ERROR, ``allreduce.quant_workspace_failed`` ERROR, ``platform.plugin_failed``
DEBUG and ``platform.fallback`` WARNING: a plugin that raised may have
been the one meant to activate); a start that fails or is interrupted must hold
``run.failed`` or ``run.interrupted``.

**What is checked per case**: the exit status (0 exactly when ready; a
single-rank ``crash`` dies by SIGSEGV), the report's outcome and root cause
(its rank is an injected rank; its step is the target step, one of the
steps the fault reached, an ancestor of one, or for a death one of the
steps in flight), the outcome each reached step recorded on an injected
rank, the messages above, uncaught Python tracebacks on stderr (the WARNING tracebacks the
product prints by design are indented inside their message and do not
count), and every log's integrity (``events.validate``: no fatal problem;
every rank that did not die ends with ``run.finished``). Any difference is
a mismatch; the summary lists each, to be judged a product bug or a wrong
expectation.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import contextlib
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if __package__:
    from . import _matrix_common as common
else:
    import _matrix_common as common

from events import validate
from orchestrator.engine._attention import ATTENTION_BACKENDS
from orchestrator.engine._targets import injection_targets

EXCEPTIONS = (
    "ImportError",
    "ModuleNotFoundError",
    "OSError",
    "PermissionError",
    "TypeError",
    "RuntimeError",
    "AttributeError",
    "KeyError",
    "ValueError",
    "KeyboardInterrupt",
    "SystemExit",
    "hang",
    "crash",
)
_ENVIRONMENT = frozenset({"ImportError", "ModuleNotFoundError", "OSError", "PermissionError"})

PLACEMENTS = ("single", "all-of-4", "one-of-4")

#: The message every injected exception carries, to find where it fired.
MARKER = "injected by the injection matrix"

#: ``--timeout`` of the ``hang`` cases (only they get one: a bound meant for
#: a hang must not fail a slow but healthy step on a busy machine).
STEP_TIMEOUT_S = 2

#: Upper bounds for one command; past them the case is a hang.
SINGLE_DEADLINE_S = 30.0
LAUNCH_DEADLINE_S = 200.0  # a rendezvous waits 120 s for a peer that never comes


@dataclass(frozen=True)
class Configuration:
    """A simulated host and engine options; ``nproc`` > 1 for a launch."""

    profile: str
    options: tuple[str, ...] = ()
    nproc: int = 1

    @property
    def explicit(self) -> str | None:
        """The backend an ``--attention-backend`` selects, if any."""
        if "--attention-backend" in self.options:
            return self.options[self.options.index("--attention-backend") + 1]
        return None

    def describe(self) -> str:
        text = " ".join([self.profile, *self.options])
        return text + (f" --nproc {self.nproc}" if self.nproc > 1 else "")


CONFIGURATIONS = (
    Configuration("h200x8"),
    Configuration("b200x8"),
    Configuration("a100x4"),
    Configuration("zen4"),
    Configuration("xeon"),
    Configuration("h200x8", ("--mla", "--head-size", "576")),
    Configuration("b200x8", ("--mla", "--head-size", "576")),
    *(Configuration("h200x8", ("--attention-backend", name)) for name in ATTENTION_BACKENDS),
    Configuration("h200x8", (), nproc=2),
)


# --- commands -------------------------------------------------------------------------


def fault_spec(target: str, exception: str, ranks: str | None) -> str:
    """The ``--inject`` spec of one case."""
    prefix = f"{ranks}:" if ranks else ""
    message = "" if exception in ("hang", "crash") else f":{MARKER}"
    return f"{prefix}{target}={exception}{message}"


def command(
    config: Configuration,
    run_dir: Path,
    nproc: int,
    specs: Sequence[str],
    *,
    timeout: bool = False,
) -> list[str]:
    """``run`` with the configuration, the placement's rank count and the
    faults, printing the JSON report; ``timeout`` adds ``--timeout``."""
    args = ["run", "--simulate", config.profile, *config.options]
    if nproc > 1:
        args += ["--nproc", str(nproc), "--grace", "1"]
    else:
        args += ["--tp", "2"]
    if timeout:
        args += ["--timeout", str(STEP_TIMEOUT_S)]
    args += ["--json", "--run-dir", str(run_dir)]
    for spec in specs:
        args += ["--inject", spec]
    return common.cli(*args)


@dataclass
class Ran:
    """A finished command and what it left."""

    exit: int | None
    stdout: str
    stderr: str
    elapsed_s: float
    hung: bool = False


def execute(args: Sequence[str], cwd: Path, deadline_s: float) -> Ran:
    """Run ``args`` to the end (killing the whole launch past the deadline)."""
    started = time.monotonic()
    with (cwd / "stdout").open("wb") as out, (cwd / "stderr").open("wb") as err:
        process = subprocess.Popen(
            args, cwd=cwd, env=common.environment(), stdout=out, stderr=err, start_new_session=True
        )
        hung = False
        try:
            process.wait(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            hung = True
        finally:
            common.kill_all([process.pid], str(cwd))
            if process.poll() is None:
                process.kill()
            process.wait()
    return Ran(
        exit=None if hung else process.returncode,
        stdout=(cwd / "stdout").read_text(errors="replace"),
        stderr=(cwd / "stderr").read_text(errors="replace"),
        elapsed_s=round(time.monotonic() - started, 3),
        hung=hung,
    )


def report_of(ran: Ran, run_dir: Path) -> tuple[dict[str, Any] | None, bool]:
    """The JSON report the command printed, else ``replay --json`` of its
    run directory; and whether the command printed it itself."""
    with contextlib.suppress(ValueError):
        document = json.loads(ran.stdout)
        if isinstance(document, dict):
            return document, True
    if not run_dir.is_dir():
        return None, False
    replay = subprocess.run(
        common.cli("replay", str(run_dir), "--json"),
        env=common.environment(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    with contextlib.suppress(ValueError):
        document = json.loads(replay.stdout)
        if isinstance(document, dict):
            return document, False
    return None, False


# --- logs -----------------------------------------------------------------------------

#: The events of a step in which a fault fired.
_FIRED = ("step.failed", "step.unavailable")

_TERMINAL = {
    "step.succeeded": "ok",
    "step.failed": "failed",
    "step.timed_out": "timed_out",
    "step.cancelled": "cancelled",
    "step.crashed": "crashed",
}


def step_outcomes(events: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """step -> how it ended (``unavailable``, ``failed``, ``failed
    (recorded)`` for a failure a parent absorbed...), ``in flight`` when it
    started and never ended."""
    outcomes: dict[str, str] = {}
    for event in events:
        step = event.get("step")
        kind = event.get("type")
        if not step or not isinstance(kind, str):
            continue
        if kind == "step.started":
            outcomes.setdefault(step, "in flight")
        elif kind == "step.unavailable":
            outcomes[step] = str(event.get("outcome"))
        elif kind in _TERMINAL:
            outcome = _TERMINAL[kind]
            if kind == "step.failed" and event.get("propagated") is False:
                outcome = "failed (recorded)"
            outcomes[step] = outcome
    return outcomes


def marked_steps(run_dir: Path) -> set[str]:
    """The steps that failed or were recorded unavailable with :data:`MARKER`
    in their exception, deepest only (a parent that reports its child's
    failure is left out, and so is a sibling cancelled because of it)."""
    steps: set[str] = set()
    for log in run_dir.glob("rank-*.jsonl"):
        for line in log.read_text(errors="replace").splitlines():
            if MARKER in line:
                with contextlib.suppress(ValueError):
                    event = json.loads(line)
                    if event.get("step") and event.get("type") in _FIRED:
                        steps.add(event["step"])
    return {s for s in steps if not any(o.startswith(s + "/") for o in steps)}


# --- where each target is reached -----------------------------------------------------


@dataclass
class Reach:
    """Where a fault on one target fires."""

    target: str
    target_kind: str  # "module" or "step"
    config: Configuration | None
    steps: tuple[str, ...] = ()  # the deepest steps it reaches
    group: str = "unreached"
    healthy_candidates: tuple[str, ...] = ()  # attention candidates valid when healthy
    healthy_plugin: str | None = None  # the plugin that activates when healthy
    healthy_ready: bool = True  # False: the start fails on every rank anyway
    side_effect: str | None = None  # never fires, yet changed the start here


@dataclass
class Healthy:
    """A configuration's healthy start: its valid candidates and plugin."""

    candidates: tuple[str, ...]
    plugin: str | None
    ready: bool = True


def healthy_start(config: Configuration, workdir: Path) -> Healthy:
    """Run ``config`` without faults; it must be ready, unless it selects a
    backend explicitly (whose module the host may lack: the selection then
    fails whatever is injected)."""
    case_dir = Path(tempfile.mkdtemp(prefix="healthy-", dir=workdir))
    run_dir = case_dir / "run"
    ran = execute(command(config, run_dir, config.nproc, ()), case_dir, LAUNCH_DEADLINE_S)
    document, _ = report_of(ran, run_dir)
    if document is None or (document.get("outcome") != "ready" and not config.explicit):
        raise SystemExit(f"the healthy start of {config.describe()} is not ready:\n{ran.stderr}")
    events, _ = common.read_events(run_dir / "rank-0.jsonl")
    outcomes = step_outcomes(events)
    candidates = tuple(
        sorted(s for s, o in outcomes.items() if s.startswith("attention/") and o == "ok")
    )
    shutil.rmtree(case_dir, ignore_errors=True)
    return Healthy(
        candidates=candidates,
        plugin=document["ranks"][0].get("platform"),
        ready=document.get("outcome") == "ready",
    )


def step_kind(step: str, config: Configuration) -> str:
    """The kind of a step (see the module docstring)."""
    if step.startswith("attention/"):
        return "explicit" if config.explicit else "candidate"
    if step == "platform/cpu/zentorch":
        return "zentorch"
    if step == "platform/build":
        return "build"
    if step.startswith("platform/"):
        return "plugin"
    if step == "flashinfer_comm":
        return "flashinfer_comm"
    if step in ("allreduce_workspace/mnnvl", "allreduce_workspace/trtllm"):
        return "attempt"
    if step == "allreduce_workspace/quant":
        return "quant"
    if step == "process_group":
        return "group"
    return "required"


def find_reach(
    target: str, target_kind: str, workdir: Path, healthy: dict[Configuration, Healthy]
) -> Reach:
    """The first configuration under which a fault on ``target`` fires.
    For a target whose fault never fires, ``side_effect`` tells where the
    fault still changed how the start ended (a fault that makes a module
    findable changes what the host appears to have)."""
    side_effect: str | None = None
    for config in CONFIGURATIONS:
        case_dir = Path(tempfile.mkdtemp(prefix="reach-", dir=workdir))
        run_dir = case_dir / "run"
        spec = fault_spec(target, "RuntimeError", None)
        ran = execute(command(config, run_dir, config.nproc, [spec]), case_dir, LAUNCH_DEADLINE_S)
        if ran.exit not in (0, 1) or not (run_dir / "rank-0.jsonl").is_file():
            # Not a run that reached its probes: say so rather than call
            # the target unreachable.
            print(
                f"warning: {target} under {config.describe()}: exit {ran.exit}: "
                f"{' | '.join(common.last_lines(ran.stderr, 2))}",
                file=sys.stderr,
            )
        steps = marked_steps(run_dir)
        if not steps and side_effect is None and not config.explicit and config.nproc == 1:
            document, _ = report_of(ran, run_dir)
            if config not in healthy:
                healthy[config] = healthy_start(config, workdir)
            if document is not None and (document.get("outcome") == "ready") != (
                healthy[config].ready
            ):
                cause = (document.get("root_cause") or {}).get("description")
                side_effect = f"{config.describe()}: {document.get('outcome')}: {cause}"
        shutil.rmtree(case_dir, ignore_errors=True)
        if not steps:
            continue
        if target_kind == "step":
            steps = {target}
        kinds = {step_kind(step, config) for step in steps}
        if config not in healthy:
            healthy[config] = healthy_start(config, workdir)
        base = healthy[config]
        return Reach(
            target=target,
            target_kind=target_kind,
            config=config,
            steps=tuple(sorted(steps)),
            group=kinds.pop() if len(kinds) == 1 else "shared module",
            healthy_candidates=base.candidates,
            healthy_plugin=base.plugin,
            healthy_ready=base.ready,
        )
    return Reach(target=target, target_kind=target_kind, config=None, side_effect=side_effect)


# --- expectations ---------------------------------------------------------------------

#: What a fault does at one step: the outcomes the step may record, and its
#: effect on the run: "go on" (recorded), "fail", "interrupt" or "die".
Effect = tuple[frozenset[str], str]

_RECORDED_ANY = frozenset({"plugin", "build", "flashinfer_comm", "attempt", "quant"})
_OPTIONAL = frozenset(
    {"candidate", "plugin", "build", "zentorch", "flashinfer_comm", "attempt", "quant", "group"}
)

#: SPEC §3.6: the default severity of the message codes expected below.
SEVERITY = {
    "platform.plugin_failed": "debug",
    "platform.fallback": "warning",
    "zentorch.absent": "debug",
    "zentorch.broken": "warning",
    "attention.backend_unavailable": "debug",
    "flashinfer_comm.unavailable": "debug",
    "allreduce.attempt_failed": "warning",
    "allreduce.workspace_failed": "error",
    "allreduce.quant_workspace_failed": "error",
    "step.timed_out": "error",
    "run.failed": "error",
    "run.interrupted": "error",
}


def effect(kind: str, exception: str, *, target: str) -> Effect:
    """SPEC §2-§3 for one step of ``kind`` that ``exception`` reaches."""
    if exception == "KeyboardInterrupt":
        return frozenset({"failed"}), "interrupt"
    if exception == "SystemExit":
        return frozenset({"failed"}), "fail"
    if exception == "crash":
        return frozenset({"in flight"}), "die"
    if exception == "hang":
        if kind == "group":
            # Torch missing means no group, and ranks go on deciding alone; a
            # rendezvous that hangs past its bound means the launch itself is
            # broken, and the set-up step fails the start (StepTimeoutError).
            return frozenset({"timed_out"}), "fail"
        if kind in _OPTIONAL:
            return frozenset({"timed_out"}), "go on"
        return frozenset({"timed_out"}), "fail"
    environment = exception in _ENVIRONMENT
    if kind in _RECORDED_ANY:
        return frozenset({"unavailable", "failed (recorded)"}), "go on"
    if kind == "zentorch":
        if exception == "ModuleNotFoundError" and target == "zentorch":
            return frozenset({"absent"}), "go on"
        if environment:
            return frozenset({"unavailable"}), "go on"
        return frozenset({"failed"}), "fail"
    if kind in ("candidate", "group"):
        if environment:
            return frozenset({"unavailable"}), "go on"
        return frozenset({"failed"}), "fail"
    if kind == "explicit":
        return frozenset({"unavailable", "failed"}), "fail"
    return frozenset({"failed"}), "fail"


@dataclass
class Expectation:
    """What SPEC §3 says a case ends in."""

    outcome: str
    #: step -> the outcomes it may record
    steps: dict[str, list[str]]
    #: every entry: one of these message codes must be in the report
    messages: list[list[str]] = field(default_factory=list)
    #: message codes that must not be in the report
    absent_messages: list[str] = field(default_factory=list)


def expect(
    reach: Reach, steps: Sequence[str], exception: str, *, placement: str = "single"
) -> Expectation:
    """The run outcome, step outcomes and messages SPEC §3 gives."""
    assert reach.config is not None
    effects = {
        step: effect(step_kind(step, reach.config), exception, target=reach.target)
        for step in steps
    }
    kinds = {e for _, e in effects.values()}
    result = Expectation(
        outcome="ready", steps={step: sorted(out) for step, (out, _) in effects.items()}
    )
    if "die" in kinds:
        result.outcome = "incomplete"
        return result
    if placement == "one-of-4" and not reach.healthy_ready:
        # The other ranks fail without the fault (an explicit backend this
        # host lacks): whatever rank 1 does, the start has failed.
        result.outcome = "failed"
        return result
    if "interrupt" in kinds:
        result.outcome = "interrupted"
        result.messages.append(["run.interrupted"])
        return result
    if "fail" in kinds:
        result.outcome = "failed"
        result.messages.append(["run.failed"])
        return result
    if placement == "one-of-4" and "process_group" in steps:
        # Rank 1 goes on without a group; its peers wait for it at the
        # rendezvous until the group's timeout, and fail (SPEC §3.4: a
        # rendezvous that fails is a GroupError).
        result.outcome = "failed"
        return result
    if exception == "hang":
        # A step no slice speaks for when it stops says so itself: its
        # timeout is the kernel's ``step.timed_out``.
        unspoken = ("build", "candidate", "flashinfer_comm", "zentorch")
        for step in steps:
            if step_kind(step, reach.config) in unspoken:
                result.messages.append(["step.timed_out"])
        return _expect_recovered(result, reach, steps)
    for step in steps:
        kind = step_kind(step, reach.config)
        if kind == "zentorch":
            code = "zentorch.absent" if effects[step][0] == {"absent"} else "zentorch.broken"
            result.messages.append([code])
        elif kind == "candidate":
            result.messages.append(["attention.backend_unavailable"])
        elif kind == "flashinfer_comm":
            result.messages.append(["flashinfer_comm.unavailable"])
        elif kind == "quant":
            result.messages.append(["allreduce.quant_workspace_failed"])
        elif kind == "attempt":
            result.messages.append(["allreduce.attempt_failed", "allreduce.workspace_failed"])
        elif kind == "plugin":
            result.messages.append(["platform.plugin_failed"])
    return _expect_recovered(result, reach, steps)


def _expect_recovered(result: Expectation, reach: Reach, steps: Sequence[str]) -> Expectation:
    """A fault every reached step recorded: the run is ready unless nothing
    is left to choose from (no valid attention backend, no platform)."""
    lost = {s.removeprefix("attention/") for s in steps if s.startswith("attention/")}
    candidates = {c.removeprefix("attention/") for c in reach.healthy_candidates}
    if candidates and not candidates - lost:
        result.outcome = "failed"  # no valid attention backend left
        return result
    plugins = {
        s.removeprefix("platform/")
        for s in steps
        if step_kind(s, reach.config) == "plugin" and s.count("/") == 1
    }
    if reach.healthy_plugin in plugins:
        # The plugin of this host failed (itself, or its driver library):
        # the cpu plugin activates only for a CPU build, so, as in vLLM,
        # there is no platform.
        result.outcome = "failed"
    elif plugins:
        # A plugin that raised may have been the one meant to activate: the
        # run goes on where it can, with a WARNING naming the plugin.
        result.messages.append(["platform.fallback"])
    return result


# --- one case -------------------------------------------------------------------------


@dataclass
class Case:
    """One target by exception by placement, what happened and how it compares."""

    target: str
    target_kind: str
    group: str
    exception: str
    placement: str
    configuration: str
    spec: str
    injected_ranks: list[int]
    reached_steps: list[str]
    expected_outcome: str = ""
    expected_steps: dict[str, list[str]] = field(default_factory=dict)
    expected_messages: list[list[str]] = field(default_factory=list)
    unwanted_messages: list[str] = field(default_factory=list)
    fails_without_fault: bool = False
    exit: int | None = None
    hung: bool = False
    outcome: str | None = None
    report_printed: bool = False
    step_outcomes: dict[str, str] = field(default_factory=dict)
    root_cause: str | None = None
    root_cause_rank: int | None = None
    root_cause_names: str = ""
    tracebacks: list[str] = field(default_factory=list)
    fatal_log_problems: int = 0
    unfinished_logs: list[int] = field(default_factory=list)
    elapsed_s: float = 0.0
    mismatches: list[str] = field(default_factory=list)


def placement_ranks(placement: str) -> tuple[int, str | None, list[int]]:
    """(nproc, --inject rank prefix, the injected ranks)."""
    if placement == "single":
        return 1, None, [0]
    if placement == "all-of-4":
        return 4, None, [0, 1, 2, 3]
    return 4, "1", [1]


def run_case(reach: Reach, exception: str, placement: str, workdir: Path) -> Case:
    """Run one case and judge it."""
    assert reach.config is not None
    nproc, prefix, injected = placement_ranks(placement)
    steps = list(reach.steps)
    spec = fault_spec(reach.target, exception, prefix)
    case = Case(
        target=reach.target,
        target_kind=reach.target_kind,
        group=reach.group,
        exception=exception,
        placement=placement,
        configuration=Configuration(reach.config.profile, reach.config.options).describe(),
        spec=spec,
        injected_ranks=injected,
        reached_steps=steps,
    )
    expectation = expect(reach, steps, exception, placement=placement)
    case.expected_outcome, case.expected_steps = expectation.outcome, expectation.steps
    case.expected_messages = expectation.messages
    case.fails_without_fault = not reach.healthy_ready
    case.unwanted_messages = expectation.absent_messages
    case_dir = Path(tempfile.mkdtemp(prefix="case-", dir=workdir))
    run_dir = case_dir / "run"
    deadline = SINGLE_DEADLINE_S if nproc == 1 else LAUNCH_DEADLINE_S
    args = command(reach.config, run_dir, nproc, [spec], timeout=exception == "hang")
    ran = execute(args, case_dir, deadline)
    case.exit, case.hung, case.elapsed_s = ran.exit, ran.hung, ran.elapsed_s
    case.tracebacks = common.uncaught_tracebacks(ran.stderr)
    document, case.report_printed = report_of(ran, run_dir)
    _judge(case, document, run_dir, nproc)
    if not case.mismatches:
        shutil.rmtree(case_dir, ignore_errors=True)
    return case


def _judge(case: Case, document: dict[str, Any] | None, run_dir: Path, nproc: int) -> None:
    mismatches = case.mismatches
    died = case.exception == "crash"
    if case.hung:
        mismatches.append("the command did not end")
    if document is None:
        mismatches.append("no report, from the command or from replay")
    else:
        case.outcome = str(document.get("outcome"))
        cause = document.get("root_cause") or {}
        if cause:
            case.root_cause = cause.get("description")
            case.root_cause_rank = cause.get("rank")
            case.root_cause_names = _names(cause, case.reached_steps)
    if case.outcome is not None and case.outcome != case.expected_outcome:
        mismatches.append(f"outcome {case.outcome}, expected {case.expected_outcome}")
    if not case.report_printed and not (died and nproc == 1):
        mismatches.append("the command printed no JSON report")
    expected_exit = {0} if case.expected_outcome == "ready" else {1}
    if died and nproc == 1:
        expected_exit = {-11}  # the process itself dies by SIGSEGV
    if not case.hung and case.exit not in expected_exit:
        mismatches.append(f"exit {case.exit}, expected {sorted(expected_exit)[0]}")
    if case.outcome not in (None, "ready"):
        # Where the start fails on every rank anyway (an explicit backend
        # this host lacks), any rank's failure is a true root cause.
        if case.root_cause_rank not in case.injected_ranks and not case.fails_without_fault:
            mismatches.append(f"root cause on rank {case.root_cause_rank}, not an injected rank")
        if case.root_cause_names == "no":
            mismatches.append(f"root cause names none of {case.reached_steps}: {case.root_cause}")
    if case.tracebacks:
        mismatches.append(f"uncaught traceback on stderr: {case.tracebacks[0]}")
    # What the reached steps recorded, on the first injected rank. When the
    # run stops, the first of several reached steps decides; the others may
    # have been cancelled with it, or never started.
    events, _ = common.read_events(run_dir / f"rank-{case.injected_ranks[0]}.jsonl")
    recorded = step_outcomes(events)
    for step in case.expected_steps:
        case.step_outcomes[step] = recorded.get(step, "not run")
    hits = [s for s, ok in case.expected_steps.items() if case.step_outcomes[s] in ok]
    stopped = case.expected_outcome != "ready" and len(case.expected_steps) > 1
    for step, allowed in case.expected_steps.items():
        got = case.step_outcomes[step]
        if got in allowed or (stopped and hits and got in ("cancelled", "not run")):
            continue
        mismatches.append(f"step {step} {got}, expected {' or '.join(allowed)}")
    # The messages SPEC §3.5-3.6 derives from what happened.
    if document is not None:
        codes = {m.get("code"): m.get("severity") for m in document.get("messages", [])}
        for alternatives in case.expected_messages:
            found = [code for code in alternatives if code in codes]
            if not found:
                mismatches.append(f"no {' or '.join(alternatives)} message")
            elif codes[found[0]] != SEVERITY.get(found[0], codes[found[0]]):
                mismatches.append(f"{found[0]} is {codes[found[0]]}, expected {SEVERITY[found[0]]}")
        for code in case.unwanted_messages:
            if code in codes:
                mismatches.append(f"unexpected {code} message ({codes[code]})")
    # The logs.
    for rank in range(nproc):
        log = run_dir / f"rank-{rank}.jsonl"
        if not log.is_file():
            mismatches.append(f"rank {rank} wrote no log")
            continue
        problems = validate(log)
        fatal = [p for p in problems if p.fatal]
        case.fatal_log_problems += len(fatal)
        for problem in fatal:
            mismatches.append(f"rank {rank} log: {problem.kind}: {problem.message}")
        if any(p.kind == "not_finished" for p in problems):
            case.unfinished_logs.append(rank)
            if not (died and rank in case.injected_ranks):
                mismatches.append(f"rank {rank} log has no run.finished")


def _names(cause: Mapping[str, Any], steps: Sequence[str]) -> str:
    """How the root cause names the steps the fault reached: ``exact``,
    ``ancestor`` (a parent step that failed because of it), ``in flight``
    (a process that died with it running), or ``no``."""
    step = cause.get("step")
    if step in steps:
        return "exact"
    if step and any(s.startswith(f"{step}/") for s in steps):
        return "ancestor"
    if set(cause.get("in_flight") or ()) & set(steps):
        return "in flight"
    return "no"


# --- the matrix -----------------------------------------------------------------------


def plan_four_ranks(
    reaches: Sequence[Reach], placement: str, sample: float, rng: random.Random
) -> list[tuple[Reach, str]]:
    """The four-rank cases of ``placement``: every exception once per
    target group (the group's targets taking turns), plus a fraction
    ``sample`` of the other cells."""
    groups: dict[str, list[Reach]] = collections.defaultdict(list)
    for reach in reaches:
        groups[reach.group].append(reach)
    chosen: list[tuple[Reach, str]] = []
    offset = PLACEMENTS.index(placement)
    for members in groups.values():
        for index, exception in enumerate(EXCEPTIONS):
            chosen.append((members[(index + offset) % len(members)], exception))
    picked = {(r.target, e) for r, e in chosen}
    rest = [(r, e) for r in reaches for e in EXCEPTIONS if (r.target, e) not in picked]
    chosen += [cell for cell in rest if rng.random() < sample]
    return chosen


def summarise(cases: Sequence[Case], unreached: Sequence[Reach]) -> str:
    lines = [f"{'PLACEMENT':<10}{'CASES':>7}{'MISMATCHES':>12}  OUTCOMES"]
    for placement in [*PLACEMENTS, "total"]:
        group = [c for c in cases if placement in ("total", c.placement)]
        if not group:
            continue
        outcomes = collections.Counter(c.outcome or "?" for c in group)
        lines.append(
            f"{placement:<10}{len(group):>7}{sum(bool(c.mismatches) for c in group):>12}  "
            + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()))
        )
    lines.append("")
    lines.append(f"{'GROUP':<16}{'TARGETS':>8}{'CASES':>7}{'MISMATCHES':>12}")
    for name in sorted({c.group for c in cases}):
        group = [c for c in cases if c.group == name]
        lines.append(
            f"{name:<16}{len({c.target for c in group}):>8}{len(group):>7}"
            f"{sum(bool(c.mismatches) for c in group):>12}"
        )
    lines.append("")
    lines.append(f"{'EXCEPTION':<20}{'CASES':>7}{'MISMATCHES':>12}")
    for exception in EXCEPTIONS:
        group = [c for c in cases if c.exception == exception]
        if group:
            lines.append(
                f"{exception:<20}{len(group):>7}{sum(bool(c.mismatches) for c in group):>12}"
            )
    if unreached:
        lines.append("")
        lines.append(
            "not reached by any configuration (skipped): " + ", ".join(r.target for r in unreached)
        )
        for reach in unreached:
            if reach.side_effect:
                lines.append(
                    f"  {reach.target}: the fault never fires, yet changes the start: "
                    f"{reach.side_effect}"
                )
    return "\n".join(lines)


def mismatch_digest(cases: Sequence[Case]) -> str:
    """Mismatches grouped by what differs, with the cases under each."""
    buckets: dict[str, list[Case]] = collections.defaultdict(list)
    for case in cases:
        for mismatch in case.mismatches:
            key = f"[{case.group}] {case.exception}: {_generic(mismatch)}"
            buckets[key].append(case)
    lines = []
    for key, members in sorted(buckets.items()):
        where = ", ".join(sorted({f"{c.target} ({c.placement})" for c in members}))
        lines.append(f"  {len(members):>3} x {key}\n        {where}")
    return "\n".join(lines)


def _generic(mismatch: str) -> str:
    """A mismatch without its case-specific details (for grouping)."""
    if mismatch.startswith("root cause names none"):
        return "root cause names none of the reached steps"
    if mismatch.startswith("uncaught traceback"):
        return "uncaught traceback on stderr"
    if mismatch.startswith("step "):
        return "a reached step " + mismatch.split(" ", 2)[2]
    if mismatch.startswith("rank ") and " log: " in mismatch:
        return "log: " + mismatch.split(" log: ", 1)[1].split(":", 1)[0]
    return mismatch


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2, help="single-rank cases at once (2)")
    parser.add_argument(
        "--placements", default=",".join(PLACEMENTS), help="comma-separated (default: all)"
    )
    parser.add_argument(
        "--sample", type=float, default=0.0, help="extra fraction of four-rank cells (0)"
    )
    parser.add_argument("--seed", type=int, default=9, help="random seed (default 9)")
    parser.add_argument("--targets", help="only these targets (comma-separated)")
    parser.add_argument("--exceptions", help="only these exceptions (comma-separated)")
    parser.add_argument("--out", type=Path, help="write every case to this JSON file")
    parser.add_argument("--workdir", type=Path, help="where the run directories go")
    options = parser.parse_args(argv)
    placements = [p for p in options.placements.split(",") if p]
    if not set(placements) <= set(PLACEMENTS) or options.jobs < 1:
        parser.error(f"--placements takes {', '.join(PLACEMENTS)}; --jobs at least 1")
    exceptions = options.exceptions.split(",") if options.exceptions else list(EXCEPTIONS)

    workdir = options.workdir or Path(tempfile.mkdtemp(prefix="injection-matrix-"))
    workdir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(options.seed)
    began = time.monotonic()
    targets = injection_targets()
    wanted = set(options.targets.split(",")) if options.targets else None
    todo = [(t, "module") for t in targets.modules] + [(t, "step") for t in targets.steps]
    todo = [(t, k) for t, k in todo if wanted is None or t in wanted]
    healthy: dict[Configuration, Healthy] = {}
    cases: list[Case] = []
    try:
        reaches = [find_reach(target, kind, workdir, healthy) for target, kind in todo]
        reached = [r for r in reaches if r.config is not None]
        unreached = [r for r in reaches if r.config is None]
        print(
            f"{len(reached)} of {len(reaches)} targets reached ({time.monotonic() - began:.0f} s):"
        )
        for reach in reaches:
            where = reach.config.describe() if reach.config else "no configuration"
            print(f"  {reach.target:<28} {reach.group:<16} {where:<42} {', '.join(reach.steps)}")
        if "single" in placements:
            single = [r for r in reached if r.config is not None and r.config.nproc == 1]
            skipped = [r.target for r in reached if r not in single]
            if skipped:
                print(f"single-rank runs form no process group; not in 'single': {skipped}")
            work = [(r, e) for r in single for e in exceptions]
            with concurrent.futures.ThreadPoolExecutor(options.jobs) as pool:
                futures = [pool.submit(run_case, r, e, "single", workdir) for r, e in work]
                for future in concurrent.futures.as_completed(futures):
                    cases.append(future.result())
            print(f"single: {len(work)} cases ({time.monotonic() - began:.0f} s)", flush=True)
        for placement in (p for p in placements if p != "single"):
            work = [
                (r, e)
                for r, e in plan_four_ranks(reached, placement, options.sample, rng)
                if e in exceptions
            ]
            for index, (reach, exception) in enumerate(work):
                case = run_case(reach, exception, placement, workdir)
                cases.append(case)
                flag = "  <-- " + "; ".join(case.mismatches) if case.mismatches else ""
                print(
                    f"{placement} {index + 1}/{len(work)} {case.spec}: {case.outcome}{flag}",
                    flush=True,
                )
    except KeyboardInterrupt:
        print("interrupted; killing what is left", file=sys.stderr)
        raise
    finally:
        common.kill_all((), f"{workdir}/")
    elapsed = time.monotonic() - began
    order = {p: i for i, p in enumerate(PLACEMENTS)}
    cases.sort(key=lambda c: (order[c.placement], c.target, EXCEPTIONS.index(c.exception)))

    print()
    print(summarise(cases, unreached))
    if any(c.mismatches for c in cases):
        print("\nmismatches (each a product bug or a wrong expectation):")
        print(mismatch_digest(cases))
    print(f"\n{len(cases)} cases in {elapsed:.0f} s; cases with a mismatch kept under {workdir}")
    if options.out:
        options.out.write_text(
            json.dumps(
                {
                    **common.provenance(argv),
                    "elapsed_s": round(elapsed, 1),
                    "reach": [
                        {
                            "target": r.target,
                            "kind": r.target_kind,
                            "group": r.group,
                            "configuration": r.config.describe() if r.config else None,
                            "steps": list(r.steps),
                            "side_effect": r.side_effect,
                        }
                        for r in reaches
                    ],
                    "cases": [asdict(c) for c in cases],
                },
                indent=2,
            )
            + "\n"
        )
        print(f"wrote {options.out}")
    with contextlib.suppress(OSError):
        workdir.rmdir()
    return 0 if not any(c.mismatches for c in cases) else 1


if __name__ == "__main__":
    sys.exit(main())
