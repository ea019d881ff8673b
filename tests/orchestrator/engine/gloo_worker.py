"""One rank of the all-reduce agreement test over a real gloo process group,
and the small graph the in-process all-reduce tests share.

Run as ``python -m tests.orchestrator.engine.gloo_worker OUT_DIR`` with the torchrun
variables set (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``) and ``STARTUP_ORCHESTRATOR_RUN_ID``. The
rank joins the gloo group, runs the all-reduce step on a simulated h200x8-like
host (one node, no NVSwitch multicast) where rank 2 cannot build trtllm,
writes ``rank-<r>.jsonl`` and ``rank-<r>.json`` (the step result and what the
workspace factory created and released) to OUT_DIR, and exits 0.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable, Collection
from pathlib import Path
from types import ModuleType

import anyio
import attrs
import orjson

from events import JsonlLog, JsonValue, Outcome
from orchestrator import FaultPlan, Graph, Runner, Step, StepContext, Unavailable
from orchestrator._group import init_torch_distributed_group
from orchestrator._identity import identity_from_environment, run_id_from_environment
from orchestrator.engine import (
    ALLREDUCE_STEP,
    FLASHINFER_COMM_STEP,
    PLATFORM_STEP,
    Devices,
    EngineConfig,
    GpuDevice,
)
from orchestrator.engine._allreduce import SimulatedWorkspaceFactory, make_allreduce_step

#: Only rank 2 fails to build the trtllm workspace.
RANK_2_TRTLLM_FAULT = "2:allreduce_workspace/trtllm=RuntimeError:cannot map trtllm IPC buffers"


@attrs.frozen(kw_only=True)
class FakeHost:
    """Host facts the all-reduce step reads; ``nodes=None`` means unknown,
    ``capability`` is the GPUs' (an SM100 Blackwell by default)."""

    name: str = "fake"
    multicast: bool = False
    node_count: int | None = 1
    capability: tuple[int, int] | None = (10, 0)

    def nvswitch_multicast(self) -> bool:
        return self.multicast

    def nodes(self) -> int | None:
        return self.node_count

    def nvidia_devices(self, importer: object) -> Devices:
        gpu = GpuDevice(vendor="nvidia", name="GPU", capability=self.capability, index=0)
        return Devices(found=(gpu,))


class RecordingFactory:
    """A simulated workspace factory that remembers what it was asked."""

    def __init__(self, host: FakeHost) -> None:
        self._inner = SimulatedWorkspaceFactory(host)
        self._lock = threading.Lock()
        self.created: list[str] = []
        self.released: list[str] = []

    def create(
        self,
        backend: str,
        *,
        rank: int,
        world_size: int,
        gpus_per_node: int,
        import_module: Callable[[str], ModuleType],
    ) -> object | None:
        workspace = self._inner.create(
            backend,
            rank=rank,
            world_size=world_size,
            gpus_per_node=gpus_per_node,
            import_module=import_module,
        )
        with self._lock:
            self.created.append(backend)
        return workspace

    def release(self, workspace: object) -> None:
        with self._lock:
            self.released.append(str(getattr(workspace, "backend", workspace)))


def build_graph(config: EngineConfig, *, comm_missing_on: Collection[int] = ()) -> Graph:
    """Stub platform and flashinfer_comm steps (flashinfer.comm unavailable on
    the ranks in ``comm_missing_on``) plus the real all-reduce step."""

    async def platform(ctx: StepContext) -> JsonValue:
        return {"plugin": "cuda", "platform_class": "CudaPlatform", "device": "cuda"}

    async def flashinfer_comm(ctx: StepContext) -> JsonValue | Unavailable:
        if ctx.identity.rank in comm_missing_on:
            return Unavailable(
                outcome=Outcome.UNAVAILABLE,
                reasons=("TypeError: type 'array.array' is not subscriptable",),
            )
        return {"available": True}

    return Graph(
        "allreduce-test",
        [
            Step(name=PLATFORM_STEP, body=platform),
            Step(name=FLASHINFER_COMM_STEP, body=flashinfer_comm),
            make_allreduce_step(config),
        ],
    )


def main(out_dir: Path) -> int:
    identity = identity_from_environment()
    run_id = run_id_from_environment() or "gloo-test"
    group = init_torch_distributed_group(identity, timeout_s=30.0)
    if group is None:
        print("no process group: torch missing or WORLD_SIZE < 2", file=sys.stderr)
        return 3
    try:
        host = FakeHost(multicast=False, node_count=1)
        factory = RecordingFactory(host)
        log = JsonlLog(out_dir / f"rank-{identity.rank}.jsonl", run_id=run_id, rank=identity.rank)
        try:
            runner = Runner(
                log,
                identity=identity,
                faults=FaultPlan.parse([RANK_2_TRTLLM_FAULT]),
                host=host,
                services={"group": group, "workspace_factory": factory},
            )
            result = anyio.run(functools.partial(runner.run, build_graph(EngineConfig(tp=4))))
        finally:
            log.close()
        summary = {
            "rank": identity.rank,
            "group_rank": group.rank,
            "result": result[ALLREDUCE_STEP].value,
            "created": factory.created,
            "released": factory.released,
        }
        (out_dir / f"rank-{identity.rank}.json").write_bytes(orjson.dumps(summary))
    finally:
        group.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
