"""Engine-shaped event streams for the tests of the engine projections
(messages, engine state, replay) and of the logging bridge and report built
on them. Import as ``tests.orchestrator.engine.streams``.

The builder here writes engine-shaped event streams by hand on top of
``events.testing.EventStream``, following the step names and payload
conventions of ``orchestrator.engine._conventions`` exactly as the runner writes them:
``step.started`` then one terminal event per step, a propagating error
recorded on the deepest step first and then on each enclosing step, a parent
that absorbs a child's failure ending ``unavailable`` with the same cause,
and ``run.finished`` last.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Self

from events import (
    Event,
    ExceptionInfo,
    FrameInfo,
    JsonValue,
    Outcome,
    RunOutcome,
    StepKind,
)
from events.testing import BASE_WALL_NS, EventStream, exception_info
from orchestrator.engine import (
    ALLREDUCE_STEP,
    ATTENTION_STEP,
    FLASHINFER_COMM_STEP,
    PLATFORM_STEP,
    ZENTORCH_STEP,
)

RUN_ID = "run-7f3a"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
BASE_NS = BASE_WALL_NS


def exception(
    type_: str,
    message: str,
    *,
    cause: ExceptionInfo | None = None,
    frame: str | None = None,
    **fields: Any,
) -> ExceptionInfo:
    """An :class:`ExceptionInfo` as capture would record it, raised in the
    function ``frame`` of an engine probe if one is named."""
    frames = (
        (FrameInfo(filename="/opt/engine/probe.py", lineno=41, name=frame, line="import x"),)
        if frame
        else ()
    )
    return exception_info(type_, message, cause=cause, frames=frames, **fields)


ZENTORCH_ABI = exception(
    "OSError", "libzentorch.so: undefined symbol: _ZN3c104impl8GPUTrace", frame="probe_zentorch"
)
ZENTORCH_RUNTIME = exception("RuntimeError", "unknown zentorch failure", frame="probe_zentorch")
FLASHINFER_PERMISSION = exception(
    "PermissionError",
    "[Errno 13] Permission denied: '/root/.cache/flashinfer'",
    errno=13,
    strerror="Permission denied",
    filename="/root/.cache/flashinfer",
)
COMM_TYPE_ERROR = exception(
    "TypeError", "type 'array.array' is not subscriptable", frame="<module>"
)
MNNVL_UNSUPPORTED = exception(
    "OSError", "[Errno 95] Operation not supported: 'NVSwitch multicast'", errno=95
)
TRTLLM_FAILED = exception("RuntimeError", "trtllm workspace: out of IPC handles")

#: ``RankBuilder.allreduce(agreed=...)`` default: agree on what the chain found.
FROM_CHAIN: Any = object()


class RankBuilder(EventStream):
    """One rank of an 8-rank, 4-ranks-a-node engine run, with the engine's
    steps as one call each.

    Wall time is ``BASE_NS + rank * 1_000 + seq * 1_000_000`` unless
    ``offset_ns`` shifts it; every rank starts at monotonic 0.
    """

    def __init__(
        self,
        rank: int,
        *,
        world_size: int = 8,
        local_world_size: int = 4,
        run_id: str = RUN_ID,
        offset_ns: int = 0,
        versions: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(
            run_id=run_id,
            rank=rank,
            world_size=world_size,
            local_world_size=local_world_size,
            trace_id=TRACE_ID,
            wall_ns=BASE_NS + offset_ns + rank * 1_000,
        )
        self.versions = dict(versions or {"torch": "2.13.0"})

    def run_started(self, **options: Any) -> Self:
        """``run.started`` with the engine's versions."""
        return super().run_started(**{"versions": self.versions, **options})

    # -- engine steps -------------------------------------------------------

    def plugin(
        self,
        name: str,
        *,
        activated: str | None = None,
        cause: ExceptionInfo | None = None,
        priority: int = 0,
    ) -> RankBuilder:
        """``platform/<name>``: activated with a class, not activated, or
        recorded unavailable with ``cause``."""
        step = f"{PLATFORM_STEP}/{name}"
        self.started(
            step,
            kind=StepKind.CANDIDATE,
            attributes={"plugin": name, "builtin": True, "priority": priority},
        )
        if cause is not None:
            return self.unavailable(step, cause=cause)
        return self.succeeded(
            step,
            {"activated": activated is not None, "platform_class": activated, "device": None},
        )

    def cpu_plugin(self, zentorch: str) -> RankBuilder:
        """``platform/cpu`` on a Zen host with the zentorch branch: ``loaded``,
        ``absent``, ``broken`` (OSError) or ``failed`` (RuntimeError, which
        the plugin absorbs and ends unavailable with)."""
        plugin = f"{PLATFORM_STEP}/cpu"
        self.started(
            plugin,
            kind=StepKind.CANDIDATE,
            attributes={"plugin": "cpu", "builtin": True, "priority": 4},
        )
        self.started(ZENTORCH_STEP)
        if zentorch == "loaded":
            self.succeeded(ZENTORCH_STEP, {"loaded": True})
            platform_class = "ZenCpuPlatform"
        elif zentorch == "absent":
            missing = exception("ModuleNotFoundError", "No module named 'zentorch'")
            self.unavailable(ZENTORCH_STEP, Outcome.ABSENT, cause=missing)
            platform_class = "CpuPlatform"
        elif zentorch == "broken":
            self.unavailable(ZENTORCH_STEP, cause=ZENTORCH_ABI)
            platform_class = "CpuPlatform"
        else:
            self.failed(ZENTORCH_STEP, ZENTORCH_RUNTIME)
            return self.unavailable(plugin, cause=ZENTORCH_RUNTIME)
        return self.succeeded(
            plugin, {"activated": True, "platform_class": platform_class, "device": "cpu"}
        )

    def platform_ok(self, plugin: str, platform_class: str) -> RankBuilder:
        self.decision(
            "platform.select",
            {"plugin": plugin, "platform_class": platform_class},
            step=PLATFORM_STEP,
        )
        return self.succeeded(
            PLATFORM_STEP,
            {"plugin": plugin, "platform_class": platform_class, "device": None, "builtin": True},
        )

    def cuda_platform(self, *, broken_plugin: ExceptionInfo | None = None) -> RankBuilder:
        self.started(PLATFORM_STEP)
        self.plugin("cuda", activated="CudaPlatform", priority=1)
        self.plugin("rocm", priority=2)
        if broken_plugin is not None:
            self.plugin("tpu", cause=broken_plugin, priority=0)
        return self.platform_ok("cuda", "CudaPlatform")

    def attention_auto(
        self,
        outcomes: Mapping[str, ExceptionInfo | Sequence[str] | None],
        *,
        selected: str,
    ) -> RankBuilder:
        """Automatic selection: each candidate ok (``None``), unavailable
        (an exception) or invalid (reasons)."""
        names: list[JsonValue] = list(outcomes)
        self.started(ATTENTION_STEP, attributes={"explicit": None, "candidates": names})
        for priority, name in enumerate(names):
            self.started(
                f"{ATTENTION_STEP}/{name}",
                kind=StepKind.CANDIDATE,
                attributes={"candidate": name, "priority": priority},
            )
        for priority, (name, outcome) in enumerate(outcomes.items()):
            step = f"{ATTENTION_STEP}/{name}"
            if outcome is None:
                self.succeeded(step, {"candidate": name, "priority": priority})
            elif isinstance(outcome, ExceptionInfo):
                self.unavailable(step, cause=outcome)
            else:
                self.unavailable(step, Outcome.INVALID, reasons=outcome)
        self.decision("candidates.select", selected, step=ATTENTION_STEP)
        return self.succeeded(
            ATTENTION_STEP, {"backend": selected, "explicit": None, "considered": names}
        )

    def flashinfer_comm(self, outcome: str = "ok") -> RankBuilder:
        self.started(FLASHINFER_COMM_STEP)
        if outcome == "ok":
            return self.succeeded(FLASHINFER_COMM_STEP, {"available": True})
        if outcome == "absent":
            return self.unavailable(
                FLASHINFER_COMM_STEP, Outcome.ABSENT, reasons=("no flashinfer",)
            )
        return self.unavailable(FLASHINFER_COMM_STEP, cause=COMM_TYPE_ERROR)

    def allreduce(
        self,
        attempts: Sequence[tuple[str, ExceptionInfo | None]],
        *,
        requested: str = "auto",
        agreed: Any = FROM_CHAIN,
        reason: str | None = None,
    ) -> RankBuilder:
        """A fallback chain of ``(backend, cause or None for ok)``; stops at
        the first ok. ``agreed`` (default: what the chain found) is the
        decision every rank uses."""
        self.started(ALLREDUCE_STEP, attributes={"requested": requested, "nodes": 1, "tp": 8})
        found: str | None = None
        for index, (backend, cause) in enumerate(attempts):
            step = f"{ALLREDUCE_STEP}/{backend}"
            self.started(
                step,
                kind=StepKind.ATTEMPT,
                attributes={
                    "backend": backend,
                    "attempt": index,
                    "attempts": len(attempts),
                    "fallback_left": index < len(attempts) - 1,
                },
            )
            if cause is None:
                self.succeeded(step, {"backend": backend})
                found = backend
                break
            self.unavailable(step, cause=cause)
        self.decision("fallback.result", found, step=ALLREDUCE_STEP)
        agreed_backend: str | None = found if agreed is FROM_CHAIN else agreed
        self.decision("allreduce.agreed", agreed_backend, step=ALLREDUCE_STEP)
        enabled = agreed_backend is not None
        return self.succeeded(
            ALLREDUCE_STEP,
            {
                "enabled": enabled,
                "backend": agreed_backend,
                "quant_backend": None,
                "reason": reason,
            },
        )


def healthy_rank(rank: int, *, world_size: int = 8, **options: Any) -> list[Event]:
    """An 8xH200-like rank: CUDA, FLASHINFER unavailable (permission), FLASH_ATTN
    selected, flashinfer.comm ok, mnnvl failing then trtllm: ready."""
    builder = RankBuilder(rank, world_size=world_size, **options).run_started()
    builder.cuda_platform()
    builder.attention_auto(
        {
            "FLASH_ATTN": None,
            "FLASHINFER": FLASHINFER_PERMISSION,
            "TRITON_ATTN": None,
            "FLEX_ATTENTION": ["head size 80 is not supported"],
        },
        selected="FLASH_ATTN",
    )
    builder.flashinfer_comm()
    builder.allreduce([("mnnvl", MNNVL_UNSUPPORTED), ("trtllm", None)])
    return builder.run_finished()


def codes(events: Iterable[Event]) -> list[str]:
    """The message codes a stream derives, in order."""
    from events import Messages, fold
    from orchestrator.engine import ENGINE

    return [m.code for m in fold(Messages(slices=[ENGINE]), events).messages()]


def failed_rank(rank: int, *, offset_ns: int = 0) -> list[Event]:
    """The zentorch RuntimeError case: the cpu plugin absorbs it, the
    platform step fails with UnspecifiedPlatformError caused by it."""
    unspecified = exception(
        "orchestrator.engine._config.UnspecifiedPlatformError",
        "Failed to infer device type: no platform plugin activated. "
        "Failed plugins: cpu: RuntimeError: unknown zentorch failure",
        cause=ZENTORCH_RUNTIME,
    )
    builder = RankBuilder(rank, offset_ns=offset_ns).run_started()
    builder.started(PLATFORM_STEP)
    builder.cpu_plugin("failed")
    builder.failed(PLATFORM_STEP, unspecified)
    return builder.run_finished(RunOutcome.FAILED, cause=unspecified, failed_step=PLATFORM_STEP)


def attention_failed_rank(rank: int, *, world_size: int = 8) -> list[Event]:
    """A CUDA error in the only attention candidate: the rank fails there,
    just after its peers' first events (one nanosecond later)."""
    boom = exception("RuntimeError", "CUDA error: an illegal memory access")
    builder = RankBuilder(rank, world_size=world_size, offset_ns=1).run_started()
    builder.started(ATTENTION_STEP)
    builder.started("attention/FLASH_ATTN", kind=StepKind.CANDIDATE)
    builder.failed("attention/FLASH_ATTN", boom)
    builder.failed(ATTENTION_STEP, boom)
    return builder.run_finished(RunOutcome.FAILED, cause=boom, failed_step="attention/FLASH_ATTN")


def dead_rank(rank: int, *, offset_ns: int = 0, world_size: int = 8) -> list[Event]:
    """Killed while probing attention candidates: no run.finished."""
    builder = (
        RankBuilder(rank, offset_ns=offset_ns, world_size=world_size).run_started().cuda_platform()
    )
    builder.started(ATTENTION_STEP)
    builder.started("attention/FLASH_ATTN", kind=StepKind.CANDIDATE)
    builder.started("attention/FLASHINFER", kind=StepKind.CANDIDATE)
    builder.succeeded("attention/FLASH_ATTN")
    return builder.events


def zentorch_rank(zentorch: str, rank: int = 0, **options: object) -> RankBuilder:
    builder = RankBuilder(rank, **options).run_started()  # type: ignore[arg-type]
    builder.started(PLATFORM_STEP)
    builder.cpu_plugin(zentorch)
    if zentorch == "failed":
        unspecified = exception(
            "orchestrator.engine._config.UnspecifiedPlatformError",
            "Failed to infer device type: no platform plugin activated. "
            "Failed plugins: cpu: RuntimeError: unknown zentorch failure",
            cause=ZENTORCH_RUNTIME,
        )
        builder.failed(PLATFORM_STEP, unspecified)
        builder.run_finished(RunOutcome.FAILED, cause=unspecified, failed_step=PLATFORM_STEP)
        return builder
    platform_class = "ZenCpuPlatform" if zentorch == "loaded" else "CpuPlatform"
    builder.platform_ok("cpu", platform_class)
    builder.run_finished()
    return builder


def eight_ranks_two_nodes(zentorch: str = "broken") -> list[Event]:
    events: list[Event] = []
    for rank in range(8):
        events.extend(zentorch_rank(zentorch, rank, world_size=8, local_world_size=4).events)
    return events
