"""Tests of the engine projections (messages, engine state, replay) and of
the logging bridge and report built on them.

The builder here writes engine-shaped event streams by hand, following the
step names and payload conventions of ``events._conventions`` exactly as the
runner writes them: ``step.started`` then one terminal event per step, a
propagating error recorded on the deepest step first and then on each
enclosing step, a parent that absorbs a child's failure ending
``unavailable`` with the same cause, and ``run.finished`` last.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from events import (
    DecisionMade,
    Event,
    ExceptionInfo,
    FrameInfo,
    JsonValue,
    Outcome,
    RankIdentity,
    RunFinished,
    RunOutcome,
    RunStarted,
    StepCancelled,
    StepCrashed,
    StepFailed,
    StepKind,
    StepStarted,
    StepSucceeded,
    StepTimedOut,
    StepUnavailable,
)
from orchestrator.engine import (
    ALLREDUCE_STEP,
    ATTENTION_STEP,
    FLASHINFER_COMM_STEP,
    PLATFORM_STEP,
    ZENTORCH_STEP,
)

RUN_ID = "run-7f3a"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
BASE_NS = 1_767_225_600_000_000_000


def exception(
    type_: str,
    message: str,
    *,
    cause: ExceptionInfo | None = None,
    frame: str | None = None,
    **fields: Any,
) -> ExceptionInfo:
    """An :class:`ExceptionInfo` as capture would record it."""
    name = type_.rpartition(".")[2]
    frames = (
        (FrameInfo(filename="/opt/engine/probe.py", lineno=41, name=frame, line="import x"),)
        if frame
        else ()
    )
    return ExceptionInfo(
        type=type_,
        message=message,
        reason=f"{name}: {message}",
        frames=frames,
        cause=cause,
        **fields,
    )


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


class RankBuilder:
    """One rank's events: gapless ``seq``, deterministic ids and times.

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
        self.rank = rank
        self.world_size = world_size
        self.local_world_size = local_world_size
        self.run_id = run_id
        self.offset_ns = offset_ns
        self.versions = dict(versions or {"torch": "2.13.0"})
        self.events: list[Event] = []
        self._spans = 0
        self._open: dict[str, tuple[str, str]] = {}
        self.root_span_id = self._new_span_id()

    def _new_span_id(self) -> str:
        self._spans += 1
        return f"{self.rank + 1:04x}{self._spans:012x}"

    def _envelope(self, step: str, span_id: str, parent: str | None) -> dict[str, Any]:
        seq = len(self.events)
        return {
            "run_id": self.run_id,
            "rank": self.rank,
            "seq": seq,
            "wall_ns": BASE_NS + self.offset_ns + self.rank * 1_000 + seq * 1_000_000,
            "mono_ns": seq * 1_000_000,
            "step": step,
            "trace_id": TRACE_ID,
            "span_id": span_id,
            "parent_span_id": parent,
        }

    # -- primitives ---------------------------------------------------------

    def run_started(self) -> RankBuilder:
        self.events.append(
            RunStarted(
                **self._envelope("", self.root_span_id, None),
                identity=RankIdentity(
                    rank=self.rank,
                    local_rank=self.rank % self.local_world_size,
                    world_size=self.world_size,
                    local_world_size=self.local_world_size,
                    node_rank=self.rank // self.local_world_size,
                ),
                host=f"node-{self.rank // self.local_world_size}",
                pid=4000 + self.rank,
                versions=self.versions,
            )
        )
        return self

    def start(
        self,
        step: str,
        *,
        kind: StepKind = StepKind.STEP,
        attributes: Mapping[str, JsonValue] | None = None,
    ) -> RankBuilder:
        parent_path = step.rpartition("/")[0]
        parent = self._open[parent_path][0] if parent_path in self._open else self.root_span_id
        span_id = self._new_span_id()
        self._open[step] = (span_id, parent)
        self.events.append(
            StepStarted(
                **self._envelope(step, span_id, parent),
                kind=kind,
                attributes=dict(attributes or {}),
            )
        )
        return self

    def end(self, event_type: type[Event], step: str, **payload: Any) -> RankBuilder:
        span_id, parent = self._open.pop(step)
        self.events.append(event_type(**self._envelope(step, span_id, parent), **payload))
        return self

    def ok(self, step: str, result: JsonValue = None) -> RankBuilder:
        return self.end(StepSucceeded, step, result=result)

    def unavailable(
        self,
        step: str,
        outcome: Outcome = Outcome.UNAVAILABLE,
        *,
        cause: ExceptionInfo | None = None,
        reasons: Sequence[str] | None = None,
    ) -> RankBuilder:
        if reasons is None:
            reasons = (cause.reason,) if cause is not None else ()
        return self.end(StepUnavailable, step, outcome=outcome, reasons=tuple(reasons), cause=cause)

    def failed(self, step: str, cause: ExceptionInfo) -> RankBuilder:
        return self.end(StepFailed, step, cause=cause)

    def timed_out(self, step: str, timeout_s: float = 5.0) -> RankBuilder:
        return self.end(StepTimedOut, step, timeout_s=timeout_s, elapsed_ns=int(timeout_s * 1e9))

    def crashed(
        self, step: str, *, exit_code: int | None = None, signal: int | None = 9
    ) -> RankBuilder:
        return self.end(
            StepCrashed, step, exit_code=exit_code, signal=signal, stderr_tail=("Killed",)
        )

    def cancelled(self, step: str, reason: str = "another step failed") -> RankBuilder:
        return self.end(StepCancelled, step, reason=reason)

    def decision(self, name: str, value: JsonValue, *, step: str = "") -> RankBuilder:
        span_id, parent = self._open.get(step, (self.root_span_id, None))
        self.events.append(
            DecisionMade(**self._envelope(step, span_id, parent), name=name, value=value)
        )
        return self

    def finish(
        self,
        outcome: RunOutcome = RunOutcome.READY,
        *,
        cause: ExceptionInfo | None = None,
        failed_step: str | None = None,
    ) -> list[Event]:
        self.events.append(
            RunFinished(
                **self._envelope("", self.root_span_id, None),
                outcome=outcome,
                cause=cause,
                failed_step=failed_step,
            )
        )
        return self.events

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
        self.start(
            step,
            kind=StepKind.CANDIDATE,
            attributes={"plugin": name, "builtin": True, "priority": priority},
        )
        if cause is not None:
            return self.unavailable(step, cause=cause)
        return self.ok(
            step,
            {"activated": activated is not None, "platform_class": activated, "device": None},
        )

    def cpu_plugin(self, zentorch: str) -> RankBuilder:
        """``platform/cpu`` on a Zen host with the zentorch branch: ``loaded``,
        ``absent``, ``broken`` (OSError) or ``failed`` (RuntimeError, which
        the plugin absorbs and ends unavailable with)."""
        plugin = f"{PLATFORM_STEP}/cpu"
        self.start(
            plugin,
            kind=StepKind.CANDIDATE,
            attributes={"plugin": "cpu", "builtin": True, "priority": 4},
        )
        self.start(ZENTORCH_STEP)
        if zentorch == "loaded":
            self.ok(ZENTORCH_STEP, {"loaded": True})
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
        return self.ok(
            plugin, {"activated": True, "platform_class": platform_class, "device": "cpu"}
        )

    def platform_ok(self, plugin: str, platform_class: str) -> RankBuilder:
        self.decision(
            "platform.select",
            {"plugin": plugin, "platform_class": platform_class},
            step=PLATFORM_STEP,
        )
        return self.ok(
            PLATFORM_STEP,
            {"plugin": plugin, "platform_class": platform_class, "device": None, "builtin": True},
        )

    def cuda_platform(self, *, broken_plugin: ExceptionInfo | None = None) -> RankBuilder:
        self.start(PLATFORM_STEP)
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
        self.start(ATTENTION_STEP, attributes={"explicit": None, "candidates": names})
        for priority, name in enumerate(names):
            self.start(
                f"{ATTENTION_STEP}/{name}",
                kind=StepKind.CANDIDATE,
                attributes={"candidate": name, "priority": priority},
            )
        for priority, (name, outcome) in enumerate(outcomes.items()):
            step = f"{ATTENTION_STEP}/{name}"
            if outcome is None:
                self.ok(step, {"candidate": name, "priority": priority})
            elif isinstance(outcome, ExceptionInfo):
                self.unavailable(step, cause=outcome)
            else:
                self.unavailable(step, Outcome.INVALID, reasons=outcome)
        self.decision("candidates.select", selected, step=ATTENTION_STEP)
        return self.ok(ATTENTION_STEP, {"backend": selected, "explicit": None, "considered": names})

    def flashinfer_comm(self, outcome: str = "ok") -> RankBuilder:
        self.start(FLASHINFER_COMM_STEP)
        if outcome == "ok":
            return self.ok(FLASHINFER_COMM_STEP, {"available": True})
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
        self.start(ALLREDUCE_STEP, attributes={"requested": requested, "nodes": 1, "tp": 8})
        found: str | None = None
        for index, (backend, cause) in enumerate(attempts):
            step = f"{ALLREDUCE_STEP}/{backend}"
            self.start(
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
                self.ok(step, {"backend": backend})
                found = backend
                break
            self.unavailable(step, cause=cause)
        self.decision("fallback.result", found, step=ALLREDUCE_STEP)
        agreed_backend: str | None = found if agreed is FROM_CHAIN else agreed
        self.decision("allreduce.agreed", agreed_backend, step=ALLREDUCE_STEP)
        enabled = agreed_backend is not None
        return self.ok(
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
    return builder.finish()


def codes(events: Iterable[Event]) -> list[str]:
    """The message codes a stream derives, in order."""
    from events import fold
    from orchestrator.engine import EngineMessages as Messages

    return [m.code for m in fold(Messages(), events).messages()]
