"""Runs for the HTML report's tests, built event by event: any number of
ranks with the same steps, one of which fails with a chained exception."""

from __future__ import annotations

from events import Event, Outcome, RunOutcome, StepFailed, StepKind, StepUnavailable
from events.testing import EventStream, exception_info

#: Text no report may turn into markup: it closes tags, opens a script and an
#: image with a handler, and breaks out of an attribute.
HOSTILE = '</pre></details><script>window.pwned=1</script><img src=x onerror="window.pwned=2">\'"'

_ATTENTION = ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN")


def rank_events(
    rank: int,
    world_size: int,
    *,
    failing: int | None = None,
    message: str = "bad kernel",
    distinct: bool = False,
) -> list[Event]:
    """One rank: a process group, a platform with three candidates, attention
    with a fallback, an exchange; rank ``failing`` fails in attention with a
    chained exception and the others' exchange fails after it (naming the
    rank in its message if ``distinct``)."""
    stream = EventStream(run_id="synthetic", rank=rank, world_size=world_size, local_world_size=8)
    stream.run_started(simulated="h200x8", injected=() if failing is None else (f"{failing}:x",))
    stream.started("process_group").advance(40_000_000).succeeded("process_group")
    stream.started("platform", depends_on=("process_group",))
    for name in ("tpu", "cuda", "rocm"):
        stream.started(f"platform/{name}", kind=StepKind.CANDIDATE)
    stream.end(StepUnavailable, "platform/tpu", outcome=Outcome.ABSENT, reasons=("no libtpu",))
    stream.succeeded("platform/cuda", {"device": "H200"})
    stream.end(StepUnavailable, "platform/rocm", outcome=Outcome.ABSENT, reasons=("no ROCm",))
    stream.succeeded("platform", "cuda")
    stream.started("attention", depends_on=("platform",))
    for name in _ATTENTION:
        stream.started(f"attention/{name}", kind=StepKind.CANDIDATE).advance(5_000_000)
        if rank == failing and name == "FLASH_ATTN":
            cause = exception_info(
                "RuntimeError",
                message,
                cause=exception_info("OSError", "libflash.so: cannot open shared object", errno=2),
            )
            stream.failed(f"attention/{name}", cause)
            stream.failed("attention", cause)
            return stream.run_finished(RunOutcome.FAILED, cause=cause, failed_step="attention")
        stream.succeeded(f"attention/{name}", {"backend": name})
    stream.decision("attention_backend", "FLASH_ATTN", step="attention")
    stream.succeeded("attention", "FLASH_ATTN")
    stream.started("exchange", depends_on=("attention",)).advance(20_000_000)
    if failing is not None:
        group = exception_info(
            "orchestrator.GroupError",
            "all_gather failed: a peer failed" + (f" (seen by rank {rank})" if distinct else ""),
            cause=exception_info("RuntimeError", "connection closed by peer"),
        )
        stream.end(StepFailed, "exchange", cause=group)
        return stream.run_finished(RunOutcome.FAILED, cause=group, failed_step="exchange")
    stream.succeeded("exchange")
    return stream.run_finished()


def synthetic_run(
    world_size: int,
    *,
    failing: int | None = None,
    message: str = "bad kernel",
    distinct: bool = False,
) -> list[list[Event]]:
    """Every rank's events."""
    return [
        rank_events(rank, world_size, failing=failing, message=message, distinct=distinct)
        for rank in range(world_size)
    ]
