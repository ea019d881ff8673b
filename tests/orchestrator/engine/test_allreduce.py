"""The all-reduce fusion workspace step (SPEC §3.4): backend chains, fallback,
configuration errors, quantization-workspace reuse, and cross-rank agreement
through a Group (in process, and over a real gloo process group)."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import threading
import warnings
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

from events import (
    DecisionMade,
    JsonValue,
    MemoryLog,
    Outcome,
    RankIdentity,
    RunFinished,
    RunOutcome,
    Severity,
    StepKind,
    StepStarted,
    StepSucceeded,
    StepUnavailable,
    outcome_of,
    read_log,
    replay,
)
from orchestrator import FaultPlan, OrchestratorError, RankEnvironmentError, Runner
from orchestrator._decisions import check_decisions
from orchestrator._group import (
    Group,
    GroupError,
    LocalGroup,
    TorchDistributedGroup,
    init_torch_distributed_group,
)
from orchestrator.engine import (
    ALLREDUCE_AGREE_STEP,
    ALLREDUCE_QUANT_STEP,
    ALLREDUCE_STEP,
    ENGINE,
    AllreduceBackend,
    EngineConfig,
    EngineConfigError,
)
from orchestrator.engine._allreduce import (
    SimulatedWorkspace,
    SimulatedWorkspaceFactory,
    allreduce_chain,
)

from ..harness import DEADLINE_S, assert_log_contract, of_type, only, terminal
from .gloo_worker import RANK_2_TRTLLM_FAULT, FakeHost, RecordingFactory, build_graph

pytestmark = pytest.mark.anyio

MNNVL_STEP = f"{ALLREDUCE_STEP}/mnnvl"
TRTLLM_STEP = f"{ALLREDUCE_STEP}/trtllm"
ROOT = Path(__file__).resolve().parents[3]


# Running one rank ------------------------------------------------------------------------


class Rank:
    """One rank's finished (or failed) run."""

    def __init__(self, log: MemoryLog, factory: RecordingFactory) -> None:
        self.log = log
        self.factory = factory
        self.error: BaseException | None = None

    @property
    def result(self) -> dict[str, Any]:
        value = terminal(self.log, ALLREDUCE_STEP)
        assert isinstance(value, StepSucceeded), value
        assert isinstance(value.result, dict)
        return value.result

    def step_result(self, step: str) -> Any:
        event = terminal(self.log, step)
        assert isinstance(event, StepSucceeded), event
        return event.result

    def attempts(self) -> list[StepStarted]:
        return [e for e in of_type(self.log, StepStarted) if e.kind is StepKind.ATTEMPT]

    def decisions(self) -> dict[str, JsonValue]:
        return {e.name: e.value for e in of_type(self.log, DecisionMade)}

    def started(self, step: str) -> bool:
        return any(e.step == step for e in of_type(self.log, StepStarted))

    def finished(self) -> RunFinished:
        return only(self.log, RunFinished)


async def run_rank(
    config: EngineConfig,
    *,
    host: Any = None,
    rank: int = 0,
    world_size: int = 1,
    local_world_size: int | None = None,
    faults: Sequence[str] = (),
    group: Group | None = None,
    comm_missing_on: Collection[int] = (),
    factory: RecordingFactory | None = None,
) -> Rank:
    host = FakeHost() if host is None else host
    log = MemoryLog("run-allreduce", rank)
    factory = RecordingFactory(host) if factory is None else factory
    services: dict[str, Any] = {"workspace_factory": factory}
    if group is not None:
        services["group"] = group
    runner = Runner(
        log,
        identity=RankIdentity(
            rank=rank,
            local_rank=rank % (local_world_size or world_size),
            world_size=world_size,
            local_world_size=local_world_size or world_size,
            node_rank=rank // (local_world_size or world_size),
        ),
        faults=FaultPlan.parse(faults),
        host=host,
        services=services,
    )
    outcome = Rank(log, factory)
    with anyio.fail_after(DEADLINE_S):
        try:
            await runner.run(build_graph(config, comm_missing_on=comm_missing_on))
        except (Exception, SystemExit) as exc:
            outcome.error = exc
    assert_log_contract(log)
    assert check_decisions(log.events) == [], "replay must decide as the live run did"
    return outcome


# One rank --------------------------------------------------------------------------------


async def test_auto_on_one_node_without_multicast_falls_back_to_trtllm() -> None:
    rank = await run_rank(EngineConfig(tp=8), host=FakeHost(multicast=False, node_count=1))

    assert rank.result == {
        "enabled": True,
        "backend": "trtllm",
        "quant_backend": "trtllm",
        "reason": None,
        "quant_reason": None,
        "nodes": 1,
    }
    mnnvl, trtllm = rank.attempts()
    assert (mnnvl.step, trtllm.step) == (MNNVL_STEP, TRTLLM_STEP)
    assert mnnvl.attributes["fallback_left"] is True
    assert trtllm.attributes["fallback_left"] is False
    failed = terminal(rank.log, MNNVL_STEP)
    assert isinstance(failed, StepUnavailable)
    assert failed.outcome is Outcome.UNAVAILABLE
    assert failed.reasons[0].startswith("RuntimeError: mnnvl all-reduce workspace needs NVSwitch")
    assert isinstance(terminal(rank.log, TRTLLM_STEP), StepSucceeded)
    assert rank.decisions() == {"fallback.result": "trtllm", "allreduce.agreed": "trtllm"}
    assert rank.step_result(ALLREDUCE_AGREE_STEP) == {
        "backend": "trtllm",
        "local": "trtllm",
        "group": None,
        "rounds": 0,
        "released": [],
    }
    started = only(rank.log, StepStarted, ALLREDUCE_STEP)
    assert started.attributes == {"requested": "auto", "tp": 8}
    assert started.depends_on == ("platform", "flashinfer_comm")
    assert rank.finished().outcome is RunOutcome.READY


async def test_explicit_mnnvl_failing_disables_fusion_and_the_run_is_still_ready() -> None:
    rank = await run_rank(
        EngineConfig(tp=8, allreduce_backend="mnnvl"), host=FakeHost(multicast=False)
    )

    result = rank.result
    assert result["enabled"] is False
    assert result["backend"] is None
    assert result["quant_backend"] is None
    assert result["reason"].startswith("no all-reduce workspace backend worked: mnnvl (")
    assert "NVSwitch multicast" in result["reason"]
    [attempt] = rank.attempts()
    assert attempt.step == MNNVL_STEP
    assert attempt.attributes["fallback_left"] is False
    assert not rank.started(ALLREDUCE_QUANT_STEP)
    assert rank.decisions() == {"fallback.result": None, "allreduce.agreed": None}
    assert rank.error is None
    assert rank.finished().outcome is RunOutcome.READY


async def test_explicit_trtllm_on_two_nodes_is_a_configuration_error() -> None:
    rank = await run_rank(
        EngineConfig(tp=16, allreduce_backend="trtllm"), host=FakeHost(node_count=2)
    )

    assert isinstance(rank.error, EngineConfigError)
    assert isinstance(rank.error, ValueError)
    assert "trtllm works within one node" in str(rank.error)
    assert rank.attempts() == []
    finished = rank.finished()
    assert finished.outcome is RunOutcome.FAILED
    assert finished.failed_step == ALLREDUCE_STEP


@pytest.mark.parametrize(
    ("host", "world_size", "works"),
    [
        pytest.param(FakeHost(multicast=True, node_count=2), 16, True, id="host-says-2-nodes"),
        pytest.param(FakeHost(multicast=False, node_count=2), 16, False, id="no-multicast"),
        pytest.param(FakeHost(multicast=True, node_count=None), 16, True, id="from-identity"),
        # Eight ranks on one node and four on another are still two nodes.
        pytest.param(FakeHost(multicast=True, node_count=None), 12, True, id="partial-node"),
    ],
)
async def test_auto_on_several_nodes_tries_only_mnnvl(
    host: FakeHost, world_size: int, works: bool
) -> None:
    rank = await run_rank(
        EngineConfig(tp=world_size), host=host, world_size=world_size, local_world_size=8
    )

    assert [a.step for a in rank.attempts()] == [MNNVL_STEP]
    assert rank.attempts()[0].attributes["fallback_left"] is False
    assert rank.result["nodes"] == 2
    assert rank.result["enabled"] is works
    assert rank.result["backend"] == ("mnnvl" if works else None)
    assert rank.finished().outcome is RunOutcome.READY


async def test_auto_on_several_nodes_without_mnnvl_gpus_is_off_at_debug() -> None:
    # vLLM 0.33: multi-node auto needs an MNNVL-capable (Blackwell) system;
    # without one the fusion is off at DEBUG, with nothing tried and
    # nothing lost (an H200 pair of nodes is a healthy start).
    rank = await run_rank(
        EngineConfig(tp=16),
        host=FakeHost(multicast=True, node_count=2, capability=(9, 0)),
        world_size=16,
        local_world_size=8,
    )

    assert rank.attempts() == []
    assert rank.result["enabled"] is False
    assert rank.result["reason"] == (
        "multi-node process groups require an MNNVL-capable Blackwell system"
    )
    assert not rank.started(ALLREDUCE_AGREE_STEP)
    replayed = replay(rank.log.read(), slices=[ENGINE])
    messages = [(m.code, m.severity) for m in replayed.messages]
    assert ("allreduce.unsupported", Severity.DEBUG) in messages
    assert "allreduce.workspace_failed" not in dict(messages)
    assert replayed.states[0].facts["fusion_lost"] is False


@pytest.mark.parametrize(
    ("config", "comm_missing", "reason"),
    [
        pytest.param(EngineConfig(tp=1), False, "tensor parallel size is 1", id="tp1"),
        pytest.param(EngineConfig(tp=8), True, "flashinfer.comm unavailable", id="no-comm"),
    ],
)
async def test_disabled_without_any_attempt(
    config: EngineConfig, comm_missing: bool, reason: str
) -> None:
    rank = await run_rank(config, comm_missing_on={0} if comm_missing else ())

    assert rank.result == {
        "enabled": False,
        "backend": None,
        "quant_backend": None,
        "reason": reason,
        "quant_reason": None,
        "nodes": 1,
    }
    assert rank.attempts() == []
    assert not rank.started(ALLREDUCE_AGREE_STEP)
    assert rank.factory.created == []
    assert rank.finished().outcome is RunOutcome.READY
    # Tensor parallel size 1 has nothing to fuse: only a missing
    # flashinfer.comm loses the fusion.
    assert replay(rank.log.read(), slices=[ENGINE]).states[0].facts["fusion_lost"] is comm_missing


async def test_the_quantization_workspace_reuses_the_plain_one() -> None:
    rank = await run_rank(EngineConfig(tp=8), host=FakeHost(multicast=True))

    assert rank.factory.created == ["mnnvl"]
    assert rank.step_result(ALLREDUCE_QUANT_STEP) == {"backend": "mnnvl", "reused": True}
    assert only(rank.log, StepStarted, ALLREDUCE_QUANT_STEP).attributes == {"backend": "mnnvl"}
    assert rank.result["quant_backend"] == "mnnvl"
    assert rank.result["quant_reason"] is None
    assert rank.factory.released == []


async def test_without_quantization_fusion_there_is_no_quant_workspace() -> None:
    rank = await run_rank(EngineConfig(tp=8, quant_fusion=False), host=FakeHost(multicast=True))

    assert rank.result["backend"] == "mnnvl"
    assert rank.result["quant_backend"] is None
    assert rank.result["quant_reason"] == "quantization fusion is off in the configuration"
    assert not rank.started(ALLREDUCE_QUANT_STEP)


async def test_a_failed_quantization_workspace_disables_only_the_quantization_fusion() -> None:
    rank = await run_rank(
        EngineConfig(tp=8),
        host=FakeHost(multicast=True),
        faults=["allreduce_workspace/quant=RuntimeError:quant workspace creation failed"],
    )

    failed = terminal(rank.log, ALLREDUCE_QUANT_STEP)
    assert isinstance(failed, StepUnavailable)
    assert failed.reasons == ("RuntimeError: quant workspace creation failed",)
    assert rank.result == {
        "enabled": True,
        "backend": "mnnvl",
        "quant_backend": None,
        "reason": None,
        "quant_reason": "the quantization fusion workspace failed "
        "(RuntimeError: quant workspace creation failed)",
        "nodes": 1,
    }
    assert rank.factory.created == ["mnnvl"]
    assert rank.factory.released == [], "the plain workspace stays in use"
    assert rank.error is None
    assert rank.finished().outcome is RunOutcome.READY


async def test_a_quantization_workspace_that_times_out_is_recorded_and_startup_goes_on() -> None:
    # The bound times the hung quantization workspace out; it must also let
    # the plain workspace's attempt end in time on a loaded machine (0.05 s
    # did not, beside two 8-rank launches: the chain fell back to trtllm).
    rank = await run_rank(
        EngineConfig(tp=8, step_timeout=1.0),
        host=FakeHost(multicast=True),
        faults=["allreduce_workspace/quant=hang"],
    )

    assert outcome_of(terminal(rank.log, ALLREDUCE_QUANT_STEP)) is Outcome.TIMED_OUT
    assert rank.result["backend"] == "mnnvl"
    assert rank.result["quant_backend"] is None
    assert rank.result["quant_reason"].startswith("the quantization fusion workspace failed (")
    assert rank.finished().outcome is RunOutcome.READY


async def test_a_programming_error_of_the_factory_is_a_failed_attempt_not_a_crash() -> None:
    # A real flashinfer workspace raises RuntimeError when it cannot be built.
    rank = await run_rank(
        EngineConfig(tp=8),
        host=FakeHost(multicast=True),
        faults=["allreduce_workspace/mnnvl=AttributeError:no attribute 'mcast'"],
    )

    assert rank.result["backend"] == "trtllm"
    failed = terminal(rank.log, MNNVL_STEP)
    assert isinstance(failed, StepUnavailable)
    assert failed.reasons == ("AttributeError: no attribute 'mcast'",)


async def test_a_base_exception_in_an_attempt_propagates() -> None:
    rank = await run_rank(
        EngineConfig(tp=8),
        host=FakeHost(multicast=True),
        faults=["allreduce_workspace/mnnvl=SystemExit:3"],
    )

    assert isinstance(rank.error, SystemExit)
    assert terminal(rank.log, MNNVL_STEP).TYPE == "step.failed"
    # A SystemExit from a probe fails the startup (SPEC §2); only a
    # KeyboardInterrupt is someone asking to stop.
    assert rank.finished().outcome is RunOutcome.FAILED


async def test_a_factory_returning_none_makes_the_attempt_unavailable() -> None:
    class NoMnnvl(RecordingFactory):
        def create(self, backend: str, **kwargs: Any) -> object | None:
            return None if backend == "mnnvl" else super().create(backend, **kwargs)

    host = FakeHost(multicast=True)
    rank = await run_rank(EngineConfig(tp=8), host=host, factory=NoMnnvl(host))

    failed = terminal(rank.log, MNNVL_STEP)
    assert isinstance(failed, StepUnavailable)
    assert failed.reasons == ("the workspace factory created no mnnvl workspace",)
    assert rank.result["backend"] == "trtllm"


async def test_an_exhausted_chain_names_every_failed_attempt_in_order() -> None:
    rank = await run_rank(
        EngineConfig(tp=8),
        host=FakeHost(multicast=False),
        faults=["allreduce_workspace/trtllm=RuntimeError:peer access is not supported"],
    )

    assert rank.result["enabled"] is False
    assert rank.result["reason"] == (
        "no all-reduce workspace backend worked: mnnvl (RuntimeError: mnnvl all-reduce "
        "workspace needs NVSwitch multicast, which this host does not support), "
        "trtllm (RuntimeError: peer access is not supported)"
    )


@pytest.mark.parametrize(
    ("rank", "world_size", "local_world_size", "asked"),
    [
        pytest.param(5, 8, 8, {"rank": 1, "world_size": 4, "gpus_per_node": 4}, id="tp-in-node"),
        pytest.param(3, 4, 2, {"rank": 3, "world_size": 4, "gpus_per_node": 2}, id="tp-spans"),
    ],
)
async def test_a_workspace_is_created_for_the_ranks_place_in_its_tensor_parallel_group(
    rank: int, world_size: int, local_world_size: int, asked: dict[str, int]
) -> None:
    host = FakeHost(multicast=True, node_count=None)
    calls: list[dict[str, Any]] = []

    class Asked(RecordingFactory):
        def create(self, backend: str, **kwargs: Any) -> object | None:
            calls.append({k: v for k, v in kwargs.items() if k != "import_module"})
            return super().create(backend, **kwargs)

    ran = await run_rank(
        EngineConfig(tp=4),
        host=host,
        rank=rank,
        world_size=world_size,
        local_world_size=local_world_size,
        factory=Asked(host),
    )

    assert ran.result["backend"] == "mnnvl"
    assert calls == [asked]


def test_the_chain_follows_the_configuration_and_the_node_count() -> None:
    assert allreduce_chain(AllreduceBackend.AUTO, 1) == ("mnnvl", "trtllm")
    assert allreduce_chain("auto", 2, (10, 0)) == ("mnnvl",)
    assert allreduce_chain("auto", 2, (9, 0)) == ()
    assert allreduce_chain("auto", 2) == (), "an unknown capability is not MNNVL-capable"
    assert allreduce_chain("mnnvl", 4) == ("mnnvl",)
    assert allreduce_chain("trtllm", 1) == ("trtllm",)
    with pytest.raises(EngineConfigError, match="spans 3 nodes"):
        allreduce_chain("trtllm", 3)
    with pytest.raises(EngineConfigError, match="valid: auto, mnnvl, trtllm"):
        allreduce_chain("nccl", 1)


def test_the_simulated_factory_answers_from_host_facts() -> None:
    def create(host: FakeHost, backend: str) -> object:
        return SimulatedWorkspaceFactory(host).create(
            backend, rank=1, world_size=8, gpus_per_node=8, import_module=__import__
        )

    assert create(FakeHost(multicast=True), "mnnvl") == SimulatedWorkspace(
        backend="mnnvl", rank=1, world_size=8
    )
    with pytest.raises(RuntimeError, match="NVSwitch multicast"):
        create(FakeHost(multicast=False), "mnnvl")
    assert isinstance(create(FakeHost(node_count=1), "trtllm"), SimulatedWorkspace)
    with pytest.raises(RuntimeError, match="spans 2 nodes"):
        create(FakeHost(node_count=2), "trtllm")
    with pytest.raises(ValueError, match="unknown all-reduce backend"):
        create(FakeHost(), "nccl")


# Groups ----------------------------------------------------------------------------------


def test_the_local_group_is_a_world_of_one_exchanging_json_copies() -> None:
    group = LocalGroup()
    assert isinstance(group, Group)
    assert (group.rank, group.world_size) == (0, 1)
    value: JsonValue = {"status": {"mnnvl": "ok"}, "chain": ["mnnvl"]}
    [copy] = group.all_gather(value)
    assert copy == value
    assert copy is not value
    with pytest.raises(TypeError, match="JSON values only"):
        group.all_gather({"workspace": object()})  # type: ignore[dict-item]


async def test_a_local_group_decides_locally() -> None:
    rank = await run_rank(EngineConfig(tp=8), group=LocalGroup())

    assert rank.result["backend"] == "trtllm"
    assert rank.step_result(ALLREDUCE_AGREE_STEP)["group"] is None


class FakeDistributed:
    """Stands in for ``torch.distributed`` (importing torch here would cost
    seconds and warn); the real module is exercised by the gloo test."""

    def __init__(self, *, initialized: bool, fail: BaseException | None = None) -> None:
        self.initialized = initialized
        self.fail = fail
        self.init_calls: list[dict[str, Any]] = []
        self.destroyed = 0

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return self.initialized

    def get_rank(self, group: object = None) -> int:
        return 1

    def get_world_size(self, group: object = None) -> int:
        return 2

    def get_backend(self, group: object = None) -> str:
        return "gloo"

    def init_process_group(self, **options: Any) -> None:
        self.init_calls.append(options)
        if self.fail is not None:
            raise self.fail
        self.initialized = True

    def all_gather(self, output: list[Any], tensor: Any, group: object = None) -> None:
        # Both ranks of this fake world send the same value.
        if self.fail is not None:
            raise self.fail
        for item in output:
            item.copy_(tensor)

    def destroy_process_group(self) -> None:
        self.destroyed += 1
        self.initialized = False


def use_fake_distributed(
    monkeypatch: pytest.MonkeyPatch, fake: FakeDistributed, torch: Any = None
) -> None:
    monkeypatch.setattr("orchestrator._group._distributed", lambda: fake)
    monkeypatch.setattr("orchestrator._group._torch", lambda: torch)


@pytest.fixture(scope="module")
def real_torch() -> Any:
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed: tensors are needed to exchange values")
    with warnings.catch_warnings():
        # torch warns on import when numpy is absent, which is fine here.
        warnings.simplefilter("ignore")
        import torch
    return torch


def test_a_torch_group_needs_an_initialised_process_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    use_fake_distributed(monkeypatch, FakeDistributed(initialized=False))
    with pytest.raises(GroupError, match=r"torch\.distributed is not initialised") as raised:
        TorchDistributedGroup()
    assert raised.value.rank is None
    assert isinstance(raised.value, OrchestratorError)


def test_a_torch_group_gathers_json_and_keeps_the_rank_when_it_fails(
    monkeypatch: pytest.MonkeyPatch, real_torch: Any
) -> None:
    fake = FakeDistributed(initialized=True)
    use_fake_distributed(monkeypatch, fake, real_torch)
    group = TorchDistributedGroup()
    assert isinstance(group, Group)
    assert (group.rank, group.world_size) == (1, 2)
    value: JsonValue = {"mine": [1, 2], "text": "ünïcode"}
    assert group.all_gather(value) == [value, value]

    fake.fail = RuntimeError("Connection closed by peer [127.0.0.1]:29500")
    with pytest.raises(GroupError) as raised:
        group.all_gather("x")
    assert (raised.value.rank, raised.value.world_size) == (1, 2)
    assert raised.value.operation == "all_gather"
    # The text is the same on every rank (so reports group it); the rank is
    # in the fields and the transport's error is the cause.
    assert str(raised.value) == (
        "all_gather across the process group failed: a peer failed, exited, or never "
        "reached this exchange (the transport's error is the cause; look for the rank "
        "that failed first)"
    )
    assert isinstance(raised.value.__cause__, RuntimeError)
    assert "Connection closed by peer" in str(raised.value.__cause__)


class PeerSendsMore(FakeDistributed):
    """Rank 1 of two, whose peer (rank 0) sends ``peer``, longer than what
    rank 1 sends: each exchange pads to the longest."""

    def __init__(self, peer: bytes) -> None:
        super().__init__(initialized=True)
        self.peer = peer

    def all_gather(self, output: list[Any], tensor: Any, group: object = None) -> None:
        if tensor.numel() == 1 and output[0].numel() == 1:  # the lengths
            output[0].fill_(len(self.peer))
        else:
            output[0][: len(self.peer)] = tensor.new_tensor(list(self.peer))
        output[1].copy_(tensor)


def test_a_torch_group_gathers_values_of_different_lengths(
    monkeypatch: pytest.MonkeyPatch, real_torch: Any
) -> None:
    peer: JsonValue = {"backend": "trtllm", "reason": "a longer value than this rank's"}
    use_fake_distributed(monkeypatch, PeerSendsMore(orjson.dumps(peer)), real_torch)
    assert TorchDistributedGroup().all_gather("x") == [peer, "x"]


def test_init_uses_the_launcher_environment_and_owns_what_it_creates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeDistributed(initialized=False)
    use_fake_distributed(monkeypatch, fake)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    identity = RankIdentity(rank=1, local_rank=1, world_size=2, local_world_size=2)

    group = init_torch_distributed_group(identity, timeout_s=12.0)

    assert group is not None
    [options] = fake.init_calls
    assert options["init_method"] == "env://"
    assert (options["backend"], options["rank"], options["world_size"]) == ("gloo", 1, 2)
    assert options["timeout"].total_seconds() == 12.0
    group.close()
    group.close()
    assert fake.destroyed == 1
    # An existing default group is wrapped, not re-created, and not destroyed.
    fake.initialized = True
    borrowed = init_torch_distributed_group(identity)
    assert borrowed is not None
    borrowed.close()
    assert len(fake.init_calls) == 1
    assert fake.destroyed == 1


def test_init_failures_are_typed(monkeypatch: pytest.MonkeyPatch) -> None:
    identity = RankIdentity(rank=3, local_rank=3, world_size=4, local_world_size=4)
    use_fake_distributed(
        monkeypatch, FakeDistributed(initialized=False, fail=RuntimeError("timed out"))
    )
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.setenv("MASTER_PORT", "29500")
    with pytest.raises(RankEnvironmentError, match="MASTER_ADDR"):
        init_torch_distributed_group(identity)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    with pytest.raises(GroupError, match=r"^init_process_group across the process group failed"):
        init_torch_distributed_group(identity)
    # Restarts without the agent's store: nothing of a last attempt to read.
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "1")
    with pytest.raises(GroupError) as raised:
        init_torch_distributed_group(identity)
    assert raised.value.reason == "RuntimeError: timed out"
    # Under a torchrun that may restart its workers, on the store its agent
    # keeps from one attempt to the next, the error says how to get another.
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    with pytest.raises(GroupError) as raised:
        init_torch_distributed_group(identity)
    assert raised.value.reason == (
        "RuntimeError: timed out; a restarted torchrun worker group may read the last "
        "attempt's addresses from torchrun's shared store (pytorch/pytorch#135712): start "
        "torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"
    )


def test_no_torch_group_without_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> Any:
        raise ModuleNotFoundError("No module named 'torch'", name="torch")

    monkeypatch.setattr("orchestrator._group._distributed", missing)
    assert init_torch_distributed_group(RankIdentity(rank=0, world_size=2)) is None


def test_no_torch_group_for_a_world_of_one() -> None:
    assert init_torch_distributed_group(RankIdentity(world_size=1)) is None


class ThreadHub:
    """An in-process group of ``size`` ranks exchanging through a barrier;
    each rank's ``all_gather`` runs in its own worker thread."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.barrier = threading.Barrier(size, timeout=DEADLINE_S)
        self.slots: list[bytes] = [b"null"] * size
        self.exchanges = [0] * size

    def member(self, rank: int) -> ThreadGroup:
        return ThreadGroup(self, rank)


class ThreadGroup:
    def __init__(self, hub: ThreadHub, rank: int) -> None:
        self.hub = hub
        self._rank = rank

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self.hub.size

    def all_gather(self, value: JsonValue) -> list[JsonValue]:
        hub = self.hub
        hub.slots[self._rank] = orjson.dumps(value)
        try:
            hub.barrier.wait()  # every rank has written
            gathered: list[JsonValue] = [orjson.loads(slot) for slot in hub.slots]
            hub.barrier.wait()  # every rank has read; the slots may be reused
        except threading.BrokenBarrierError as exc:
            raise GroupError(self._rank, hub.size, "all_gather", "barrier broken") from exc
        hub.exchanges[self._rank] += 1
        return gathered


async def run_world(
    config: EngineConfig,
    *,
    size: int = 4,
    host: FakeHost,
    faults: Sequence[str] = (),
    comm_missing_on: Collection[int] = (),
) -> tuple[list[Rank], ThreadHub]:
    hub = ThreadHub(size)
    ranks: list[Rank | None] = [None] * size

    async def one(rank: int) -> None:
        try:
            ranks[rank] = await run_rank(
                config,
                host=host,
                rank=rank,
                world_size=size,
                faults=faults,
                group=hub.member(rank),
                comm_missing_on=comm_missing_on,
            )
        finally:
            finished = ranks[rank]
            if finished is None or finished.error is not None:
                hub.barrier.abort()  # never leave the other ranks waiting

    async with anyio.create_task_group() as tasks:
        for rank in range(size):
            tasks.start_soon(one, rank)
    finished = [r for r in ranks if r is not None]
    for index, rank_run in enumerate(finished):
        assert rank_run.error is None, f"rank {index} failed: {rank_run.error!r}"
    return finished, hub


async def test_ranks_agree_that_no_backend_works_when_rank_2_cannot_build_trtllm() -> None:
    ranks, hub = await run_world(
        EngineConfig(tp=4), host=FakeHost(multicast=False), faults=[RANK_2_TRTLLM_FAULT]
    )

    expected_reason = (
        "no all-reduce workspace backend worked on every rank: "
        "mnnvl failed on ranks 0-3; trtllm failed on rank 2"
    )
    for index, rank in enumerate(ranks):
        assert rank.result == {
            "enabled": False,
            "backend": None,
            "quant_backend": None,
            "reason": expected_reason,
            "quant_reason": None,
            "nodes": 1,
        }, f"rank {index}"
        assert rank.decisions()["allreduce.agreed"] is None
        agree = rank.step_result(ALLREDUCE_AGREE_STEP)
        assert agree["backend"] is None
        assert agree["rounds"] == 1
        assert len(agree["group"]) == 4
        assert rank.finished().outcome is RunOutcome.READY
    assert [r.decisions()["fallback.result"] for r in ranks] == ["trtllm", "trtllm", None, "trtllm"]
    assert [r.factory.released for r in ranks] == [["trtllm"], ["trtllm"], [], ["trtllm"]]
    assert [r.step_result(ALLREDUCE_AGREE_STEP)["released"] for r in ranks] == [
        ["trtllm"],
        ["trtllm"],
        [],
        ["trtllm"],
    ]
    assert hub.exchanges == [1, 1, 1, 1]


async def test_ranks_that_stopped_early_catch_up_on_the_backend_others_need() -> None:
    # mnnvl works everywhere but on rank 2, which falls back to trtllm: the
    # others must try trtllm too, agree on it, and release their mnnvl.
    ranks, hub = await run_world(
        EngineConfig(tp=4),
        host=FakeHost(multicast=True),
        faults=["2:allreduce_workspace/mnnvl=RuntimeError:multicast object creation failed"],
    )

    for index, rank in enumerate(ranks):
        assert rank.result["backend"] == "trtllm", f"rank {index}"
        assert rank.result["quant_backend"] == "trtllm"
        assert rank.decisions()["allreduce.agreed"] == "trtllm"
        assert rank.step_result(ALLREDUCE_AGREE_STEP)["rounds"] == 2
        assert [a.step for a in rank.attempts()] == [MNNVL_STEP, TRTLLM_STEP]
    assert [r.decisions()["fallback.result"] for r in ranks] == [
        "mnnvl",
        "mnnvl",
        "trtllm",
        "mnnvl",
    ]
    catch_ups = [rank.attempts()[1].attributes.get("catch_up", False) for rank in ranks]
    assert catch_ups == [True, True, False, True]
    assert [r.factory.released for r in ranks] == [["mnnvl"], ["mnnvl"], [], ["mnnvl"]]
    assert [r.factory.created for r in ranks] == [["mnnvl", "trtllm"]] * 2 + [["trtllm"]] + [
        ["mnnvl", "trtllm"]
    ]
    assert hub.exchanges == [2, 2, 2, 2]


async def test_a_rank_without_flashinfer_comm_disables_fusion_everywhere() -> None:
    ranks, _ = await run_world(
        EngineConfig(tp=4), host=FakeHost(multicast=True), comm_missing_on={3}
    )

    assert ranks[3].result["reason"] == "flashinfer.comm unavailable"
    assert ranks[3].attempts() == []
    for rank in ranks[:3]:
        assert rank.result["enabled"] is False
        assert "mnnvl unavailable (no flashinfer.comm) on rank 3" in rank.result["reason"]
        assert rank.factory.released == ["mnnvl"]
    assert all(r.decisions()["allreduce.agreed"] is None for r in ranks)


async def test_healthy_ranks_agree_in_one_exchange_and_release_nothing() -> None:
    ranks, hub = await run_world(EngineConfig(tp=4), host=FakeHost(multicast=True))

    assert {r.result["backend"] for r in ranks} == {"mnnvl"}
    assert all(r.factory.created == ["mnnvl"] and r.factory.released == [] for r in ranks)
    assert hub.exchanges == [1, 1, 1, 1]


class BrokenGroup:
    """A group whose peers never arrive."""

    rank = 1
    world_size = 2

    def all_gather(self, value: JsonValue) -> list[JsonValue]:
        raise GroupError(1, 2, "all_gather", "RuntimeError: Timed out waiting 30000ms")


async def test_a_failed_exchange_fails_the_run_naming_the_rank() -> None:
    rank = await run_rank(
        EngineConfig(tp=2), host=FakeHost(multicast=True), rank=1, world_size=2, group=BrokenGroup()
    )

    assert isinstance(rank.error, GroupError)
    assert (rank.error.rank, rank.error.world_size) == (1, 2)
    assert str(rank.error).startswith(
        "all_gather across the process group failed: RuntimeError: Timed out"
    )
    finished = rank.finished()
    assert finished.outcome is RunOutcome.FAILED
    assert finished.failed_step == ALLREDUCE_AGREE_STEP
    assert "allreduce.agreed" not in rank.decisions()


async def test_a_peer_in_another_exchange_fails_the_agreement_naming_it() -> None:
    # Rank 0 left the startup early and waits at its end, in the end-of-run
    # exchange; rank 1's agreement meets it there. Rank 0's part says
    # nothing about its backends and must not be read as "none works there".
    hub = ThreadHub(2)
    end_of_run: JsonValue = {"exchange": "run.finished", "outcome": "failed", "warnings": []}
    peer: list[JsonValue] = []
    peer_done = anyio.Event()

    async def wait_at_the_end() -> None:
        try:
            peer.extend(await anyio.to_thread.run_sync(hub.member(0).all_gather, end_of_run))
        finally:
            peer_done.set()

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(wait_at_the_end)
        try:
            rank = await run_rank(
                EngineConfig(tp=2),
                host=FakeHost(multicast=True),
                rank=1,
                world_size=2,
                group=hub.member(1),
            )
            # The peer still reads what it gathered: let it finish first.
            with anyio.fail_after(DEADLINE_S):
                await peer_done.wait()
        finally:
            hub.barrier.abort()  # never leave the peer waiting

    assert hub.exchanges == [1, 1]
    assert isinstance(rank.error, GroupError)
    assert (rank.error.rank, rank.error.world_size) == (1, 2)
    assert "rank 0 is not in the all-reduce agreement (it joined 'run.finished')" in str(rank.error)
    finished = rank.finished()
    assert finished.outcome is RunOutcome.FAILED
    assert finished.failed_step == ALLREDUCE_AGREE_STEP
    assert "allreduce.agreed" not in rank.decisions()
    assert rank.factory.released == []
    # The peer saw rank 1's part for what it is: another exchange.
    assert isinstance(peer[1], dict)
    assert peer[1]["exchange"] == ALLREDUCE_AGREE_STEP


async def test_tensor_parallel_size_1_never_exchanges() -> None:
    ranks, hub = await run_world(EngineConfig(tp=1), host=FakeHost(multicast=True))

    assert all(r.result["reason"] == "tensor parallel size is 1" for r in ranks)
    assert hub.exchanges == [0, 0, 0, 0]


# A real gloo process group ----------------------------------------------------------------

GLOO_WORLD = 4
GLOO_TIMEOUT_S = 90.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("torch") is None,
    reason="torch is not installed: the gloo process-group test needs torch.distributed",
)
@pytest.mark.slow
def test_four_gloo_ranks_agree_that_fusion_is_disabled(tmp_path: Path) -> None:
    port = _free_port()
    processes: list[subprocess.Popen[bytes]] = []
    environment = {
        key: value
        for key, value in os.environ.items()
        if key not in ("TORCHELASTIC_RUN_ID", "GROUP_RANK", "TRACEPARENT")
    }
    environment.update(
        WORLD_SIZE=str(GLOO_WORLD),
        LOCAL_WORLD_SIZE=str(GLOO_WORLD),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        STARTUP_ORCHESTRATOR_RUN_ID="gloo-agreement",
        OMP_NUM_THREADS="1",
        # Loopback only: a host name that resolves elsewhere must not matter.
        **({"GLOO_SOCKET_IFNAME": "lo"} if Path("/sys/class/net/lo").exists() else {}),
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    outputs: list[tuple[bytes, bytes]] = []
    try:
        for rank in range(GLOO_WORLD):
            processes.append(
                subprocess.Popen(
                    [sys.executable, "-m", "tests.orchestrator.engine.gloo_worker", str(tmp_path)],
                    cwd=ROOT,
                    env={**environment, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                )
            )
        for process in processes:
            outputs.append(process.communicate(timeout=GLOO_TIMEOUT_S))
    except subprocess.TimeoutExpired:
        for process in processes:
            process.kill()
        tails = [process.communicate()[1].decode(errors="replace")[-2000:] for process in processes]
        pytest.fail(f"gloo ranks did not finish within {GLOO_TIMEOUT_S:g} s; stderr: {tails}")
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    failures = [
        f"rank {rank} exited {process.returncode}:\n{err.decode(errors='replace')[-3000:]}"
        for rank, (process, (_, err)) in enumerate(zip(processes, outputs, strict=True))
        if process.returncode != 0
    ]
    assert not failures, "\n".join(failures)

    summaries = [
        orjson.loads((tmp_path / f"rank-{rank}.json").read_bytes()) for rank in range(GLOO_WORLD)
    ]
    for rank, summary in enumerate(summaries):
        assert summary["group_rank"] == rank
        assert summary["result"]["enabled"] is False, summary
        assert summary["result"]["backend"] is None
        assert summary["result"]["reason"] == (
            "no all-reduce workspace backend worked on every rank: "
            "mnnvl failed on ranks 0-3; trtllm failed on rank 2"
        )
    assert [s["created"] for s in summaries] == [["trtllm"], ["trtllm"], [], ["trtllm"]]
    assert [s["released"] for s in summaries] == [["trtllm"], ["trtllm"], [], ["trtllm"]]

    agreed: list[JsonValue] = []
    for rank in range(GLOO_WORLD):
        contents = read_log(tmp_path / f"rank-{rank}.jsonl")
        events = contents.events
        assert check_decisions(events) == []
        finished = [e for e in events if isinstance(e, RunFinished)]
        assert [f.outcome for f in finished] == [RunOutcome.READY]
        decisions = {e.name: e.value for e in events if isinstance(e, DecisionMade)}
        agreed.append(decisions["allreduce.agreed"])
        gathered = [
            e.result
            for e in events
            if isinstance(e, StepSucceeded) and e.step == ALLREDUCE_AGREE_STEP
        ]
        assert len(gathered) == 1
        assert isinstance(gathered[0], dict)
        assert gathered[0]["rounds"] == 1
    assert agreed == [None] * GLOO_WORLD
