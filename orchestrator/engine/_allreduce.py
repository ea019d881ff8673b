"""The all-reduce fusion workspace step (SPEC §3.4), per rank.

When tensor parallelism is on (``tp > 1``) and ``flashinfer.comm`` is
usable, each rank creates a fusion workspace. The backend chain comes from
the configuration:

* ``auto``   — ``[mnnvl, trtllm]`` on one node; ``[mnnvl]`` on several
  with an MNNVL-capable (Blackwell, SM100) system, else none: the fusion is
  off at DEBUG, as vLLM 0.33 leaves it (trtllm only reaches within a node);
* ``mnnvl``  — ``[mnnvl]``, no fallback;
* ``trtllm`` — ``[trtllm]``, no fallback; on several nodes a terminal
  :class:`~orchestrator.engine.EngineConfigError`.

Each backend is an attempt child (``allreduce_workspace/<backend>``) run by
:func:`orchestrator.run_fallback_chain`; an attempt fails when the workspace
factory raises an ``Exception`` (recorded, never a crash of the engine) or
returns ``None``. Exhausting the chain disables the fusion; the run is still
ready. ``EngineConfig.step_timeout`` bounds each attempt (a timed-out attempt
counts as failed) and the quantization workspace; the agreement may take
three times as long (two exchanges and a catch-up attempt) and the whole step
seven times, so the innermost step that hangs is the one that times out.
Exchanges between ranks are also bounded by the group's own timeout; a
failed exchange (:class:`~orchestrator.GroupError`) or an agreement or step
that runs out of time ends the run, since ranks that cannot agree must not
go on.

Cross-rank agreement (``allreduce_workspace/agree``)
----------------------------------------------------

A collective needs every rank on the same backend, so with a
:class:`~orchestrator.Group` of more than one rank (``services["group"]``)
the ranks agree before anything is used. Each rank keeps a status per chain
backend: ``ok`` (it holds a workspace), ``failed``, ``untried`` (its own
chain stopped earlier) or ``unavailable`` (it has no ``flashinfer.comm``).
Then, in rounds:

1. every rank all-gathers ``{"chain", "status"}``;
2. from the gathered list alone (identical on every rank) take the first
   backend, in rank 0's chain order, that no rank reports as ``failed`` or
   ``unavailable``:

   * none → no backend can work everywhere: fusion is disabled on all ranks;
   * ``ok`` on every rank → that is the agreed backend;
   * otherwise some ranks have not tried it yet: they create it now (a
     catch-up attempt child ``allreduce_workspace/<backend>`` with attribute
     ``catch_up: true``) and every rank goes to the next round.

Every backend before the chosen one failed on some rank, so the result is
the first backend of the chain that works on every rank. After a catch-up
round every rank has tried that backend, so each backend adds at most one
round (at most ``len(chain) + 1`` exchanges), and every rank runs the same
rounds because it decides from the same gathered data. Workspaces are
created only as far as needed: in a healthy launch there is one exchange
and no extra workspace. Afterwards a rank releases every workspace it holds
for a backend other than the agreed one (``factory.release``).

The agreement step's result: ``backend`` (the agreed one), ``local`` (this
rank's own chain result), ``group`` (every rank's final ``{"chain",
"status"}``; ``null`` without a group), ``rounds`` and ``released`` (the
backends this rank released).

A rank without ``flashinfer.comm`` still takes part (with every backend
``unavailable``), so its peers do not wait for it forever and disable the
fusion too. Without a group (or with a world of 1) the rank decides alone.
The agreed backend is recorded as decision ``allreduce.agreed``.

Workspace creation is treated as rank-local: a rank that fails creates
nothing its peers wait for. A factory whose creation is itself collective
must fail on every rank together, or the step's peers wait for the group's
timeout.

The quantization-fusion workspace (``allreduce_workspace/quant``, attribute
``backend``) always uses the agreed backend, so it reuses the plain
workspace instead of creating a second one. When it fails anyway (any
``Exception``, or a timeout: recorded, never a crash of the engine), the
quantization fusion is disabled on this rank and the plain fusion stays on:
the result has ``quant_backend`` null and ``quant_reason`` saying why.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Protocol, runtime_checkable

import attrs

from events import InvalidValueError, JsonValue, StepKind, format_ranks

from .._context import StepContext, StepResult, Unavailable
from .._fallback import Attempt, run_fallback_chain
from .._graph import Step
from .._group import Group, GroupError
from .._policy import ANY_EXCEPTION_POLICY, Action, ErrorPolicy
from ._config import AllreduceBackend, EngineConfig, EngineConfigError, _allreduce_backend
from ._conventions import (
    ALLREDUCE_AGREE_STEP,
    ALLREDUCE_QUANT_STEP,
    ALLREDUCE_STEP,
    ALLREDUCE_TP1_REASON,
    ALLREDUCE_UNSUPPORTED_REASON,
    FLASHINFER_COMM_STEP,
    PLATFORM_STEP,
)
from ._platform import _device_capability, _why

__all__ = [
    "WORKSPACE_MODULES",
    "RealWorkspaceFactory",
    "SimulatedWorkspace",
    "SimulatedWorkspaceFactory",
    "WorkspaceFactory",
    "WorkspaceHost",
    "allreduce_chain",
    "make_allreduce_step",
]

MNNVL = AllreduceBackend.MNNVL.value
TRTLLM = AllreduceBackend.TRTLLM.value

#: What :class:`RealWorkspaceFactory` imports to create a workspace.
WORKSPACE_MODULES = ("flashinfer.comm", "torch")

#: Records nothing, timeouts included (a set-up that runs out of time leaves
#: the ranks' collectives out of step); workspace attempts use ANY_EXCEPTION_POLICY.
_STEP_POLICY = ErrorPolicy(name="allreduce workspace", on_timeout=Action.PROPAGATE)

_AGREE = ALLREDUCE_AGREE_STEP.rpartition("/")[2]
_QUANT = ALLREDUCE_QUANT_STEP.rpartition("/")[2]

# Per-backend status of a rank, as exchanged during agreement.
_OK = "ok"
_FAILED = "failed"
_UNTRIED = "untried"
_UNAVAILABLE = "unavailable"
_USABLE = (_OK, _UNTRIED)


# Factories --------------------------------------------------------------------------------


@runtime_checkable
class WorkspaceHost(Protocol):
    """The host facts the simulated factory needs (real and simulated hosts
    of ``orchestrator.engine`` provide them)."""

    def nvswitch_multicast(self) -> bool | None:
        """Whether the GPUs support NVSwitch multicast (``None``: unknown)."""
        ...

    def nodes(self) -> int | None:
        """How many nodes the launch spans (``None``: unknown)."""
        ...


@runtime_checkable
class WorkspaceFactory(Protocol):
    """Creates and releases all-reduce fusion workspaces.

    ``create`` runs in a worker thread. It returns the workspace, returns
    ``None`` when it cannot make one, or raises; an ``Exception`` is recorded
    as a failed attempt, a BaseException propagates. ``import_module`` is
    the run's importer (fault injection and simulated hosts go through it).
    ``release`` frees a workspace the ranks decided not to use.
    """

    def create(
        self,
        backend: str,
        *,
        rank: int,
        world_size: int,
        gpus_per_node: int,
        import_module: Callable[[str], ModuleType],
    ) -> object | None: ...

    def release(self, workspace: object) -> None: ...


@attrs.frozen(kw_only=True)
class SimulatedWorkspace:
    """What :class:`SimulatedWorkspaceFactory` hands out."""

    backend: str
    rank: int
    world_size: int


@attrs.frozen
class SimulatedWorkspaceFactory:
    """Answers from host facts instead of GPUs: mnnvl works only with NVSwitch
    multicast, trtllm only within one node. Failures raise RuntimeError, as
    the real library does. Per-rank failures come from the run's fault plan
    (a fault on ``allreduce_workspace/<backend>``), not from here."""

    _host: WorkspaceHost

    def create(
        self,
        backend: str,
        *,
        rank: int,
        world_size: int,
        gpus_per_node: int,
        import_module: Callable[[str], ModuleType],
    ) -> SimulatedWorkspace:
        """A :class:`SimulatedWorkspace`, or RuntimeError when this host cannot
        have one; ValueError for an unknown backend."""
        if backend == MNNVL:
            if self._host.nvswitch_multicast() is not True:
                raise RuntimeError(
                    "mnnvl all-reduce workspace needs NVSwitch multicast, "
                    "which this host does not support"
                )
        elif backend == TRTLLM:
            nodes = self._host.nodes()
            if nodes is not None and nodes > 1:
                raise RuntimeError(
                    f"trtllm all-reduce workspace works within one node; this launch spans "
                    f"{nodes} nodes"
                )
        else:
            raise InvalidValueError("all-reduce backend", backend, (MNNVL, TRTLLM))
        return SimulatedWorkspace(backend=backend, rank=rank, world_size=world_size)

    def release(self, workspace: object) -> None:
        """Nothing to free."""


@attrs.frozen(kw_only=True)
class RealWorkspaceFactory:
    """Creates workspaces with ``flashinfer.comm.create_allreduce_fusion_workspace``.

    Attributes:
        max_token_num: the most tokens one all-reduce carries.
        hidden_dim: the model's hidden size.
        dtype: name of a ``torch`` dtype (``bfloat16``).
        comm_backend: flashinfer's communication backend (e.g. its
            ``TorchDistBackend`` over the tensor-parallel group), or ``None``
            for flashinfer's default.
    """

    max_token_num: int = 2048
    hidden_dim: int = 4096
    dtype: str = "bfloat16"
    comm_backend: object | None = None

    def create(
        self,
        backend: str,
        *,
        rank: int,
        world_size: int,
        gpus_per_node: int,
        import_module: Callable[[str], ModuleType],
    ) -> object | None:
        """The flashinfer workspace; whatever flashinfer raises propagates to
        the attempt (and is recorded there)."""
        comm, torch = map(import_module, WORKSPACE_MODULES)
        workspace: object | None = comm.create_allreduce_fusion_workspace(
            backend=backend,
            world_size=world_size,
            rank=rank,
            max_token_num=self.max_token_num,
            hidden_dim=self.hidden_dim,
            dtype=getattr(torch, self.dtype),
            gpus_per_node=gpus_per_node,
            comm_backend=self.comm_backend,
        )
        return workspace

    def release(self, workspace: object) -> None:
        """``workspace.destroy()`` when the workspace has it."""
        destroy = getattr(workspace, "destroy", None)
        if callable(destroy):
            destroy()


# The chain ------------------------------------------------------------------------------


def allreduce_chain(
    requested: AllreduceBackend | str, nodes: int, capability: tuple[int, int] | None = None
) -> tuple[str, ...]:
    """The backends to try, in order, for ``requested`` on ``nodes`` nodes
    of GPUs of compute ``capability`` (``None``: unknown). Empty when
    ``auto`` has none for the launch: several nodes without a known
    MNNVL-capable (SM100 or newer) GPU.

    Raises:
        EngineConfigError: trtllm requested on several nodes, or an unknown
            backend.
    """
    backend = _allreduce_backend(requested)
    if backend is AllreduceBackend.AUTO:
        if nodes == 1:
            return (MNNVL, TRTLLM)
        return (MNNVL,) if capability is not None and capability >= (10, 0) else ()
    if backend is AllreduceBackend.TRTLLM and nodes > 1:
        raise EngineConfigError(
            "allreduce_backend",
            TRTLLM,
            f"trtllm works within one node and this launch spans {nodes} nodes; use mnnvl or auto",
        )
    return (backend.value,)


# The step -------------------------------------------------------------------------------


def make_allreduce_step(config: EngineConfig) -> Step:
    """The ``allreduce_workspace`` step for ``config`` (see the module docs).

    Its result is ``{"enabled", "backend", "quant_backend", "reason",
    "quant_reason", "nodes"}``: ``reason`` says why the fusion is off,
    ``quant_reason`` why the quantization fusion is while the fusion is on
    (null otherwise). It raises :class:`~orchestrator.engine.EngineConfigError`
    (the run fails) for trtllm on several nodes, and
    :class:`~orchestrator.GroupError` when the ranks cannot exchange results.
    """

    async def allreduce_workspace(ctx: StepContext) -> JsonValue:
        return await _Setup(ctx, config).run()

    return Step(
        name=ALLREDUCE_STEP,
        body=allreduce_workspace,
        depends_on=(PLATFORM_STEP, FLASHINFER_COMM_STEP),
        policy=_STEP_POLICY,
        timeout=config.bound(7),
        attributes={"requested": str(config.allreduce_backend), "tp": config.tp},
    )


class _Setup:
    """One rank's run of the step."""

    def __init__(self, ctx: StepContext, config: EngineConfig) -> None:
        self.ctx = ctx
        self.config = config
        nodes_of = getattr(ctx.host, "nodes", None)
        nodes = nodes_of() if callable(nodes_of) else None
        if nodes is None:
            nodes = -(-ctx.identity.world_size // ctx.identity.local_world_size)
        self.nodes = max(1, int(nodes))
        group: Group | None = ctx.services.get("group")
        self.group = group if group is not None and group.world_size > 1 else None
        self.held: dict[str, object] = {}
        factory: WorkspaceFactory | None = ctx.services.get("workspace_factory")
        if factory is None:
            simulated = getattr(ctx.host, "name", "real") != "real"
            factory = SimulatedWorkspaceFactory(ctx.host) if simulated else RealWorkspaceFactory()
        self.factory = factory
        self.chain: tuple[str, ...] = ()

    def finish(
        self,
        backend: str | None,
        reason: str | None,
        quant: str | None = None,
        quant_reason: str | None = None,
    ) -> JsonValue:
        if backend is not None and quant is None and quant_reason is None:
            quant_reason = "quantization fusion is off in the configuration"
        return {
            "enabled": backend is not None,
            "backend": backend,
            "quant_backend": quant,
            "reason": reason,
            "quant_reason": quant_reason,
            "nodes": self.nodes,
        }

    async def launch_chain(self) -> tuple[str, ...]:
        """The chain for this launch (the GPUs' capability matters only for
        ``auto`` on several nodes)."""
        capability = None
        if self.nodes > 1 and self.config.allreduce_backend is AllreduceBackend.AUTO:
            platform = self.ctx.result(PLATFORM_STEP)
            if isinstance(platform, dict) and platform.get("device") == "cuda":
                capability = await self.ctx.to_thread(_device_capability, self.ctx, "cuda")
        return allreduce_chain(self.config.allreduce_backend, self.nodes, capability)

    async def run(self) -> JsonValue:
        if self.config.tp == 1:
            return self.finish(None, ALLREDUCE_TP1_REASON)
        if not self.ctx.dependency(FLASHINFER_COMM_STEP).ok:
            await self.join_without_flashinfer()
            return self.finish(None, "flashinfer.comm unavailable")
        self.chain = await self.launch_chain()
        if not self.chain:
            # Every rank of the launch finds the same: no exchange needed.
            return self.finish(None, ALLREDUCE_UNSUPPORTED_REASON)
        chain = await run_fallback_chain(
            self.ctx,
            [
                Attempt(name=backend, body=functools.partial(self.attempt, backend))
                for backend in self.chain
            ],
            policy=ANY_EXCEPTION_POLICY,
            timeout=self.config.step_timeout,
        )
        statuses = dict.fromkeys(self.chain, _UNTRIED)
        for result in chain.attempts:
            statuses[_backend_of(result)] = _OK if result.ok else _FAILED
        agreed, reason = await self.agree(chain.backend, statuses, chain.attempts)
        if agreed is None or not self.config.quant_fusion:
            return self.finish(agreed, reason)
        quant, quant_reason = await self.quant(agreed)
        return self.finish(agreed, reason, quant, quant_reason)

    async def join_without_flashinfer(self) -> None:
        # Peers with flashinfer.comm are about to exchange their results; take
        # part so they learn that no backend can work here. With an invalid
        # configuration they fail before exchanging, so this rank must not.
        if self.group is None:
            return
        try:
            self.chain = await self.launch_chain()
        except EngineConfigError:
            return
        if self.chain:
            await self.agree(None, dict.fromkeys(self.chain, _UNAVAILABLE), ())

    async def attempt(self, backend: str, child: StepContext) -> JsonValue | Unavailable:
        group = self.group
        tp_rank = (
            group.rank
            if group is not None and group.world_size == self.config.tp
            else self.ctx.identity.rank % self.config.tp
        )
        make = functools.partial(
            self.factory.create,
            backend,
            rank=tp_rank,
            world_size=self.config.tp,
            gpus_per_node=min(self.ctx.identity.local_world_size, self.config.tp),
            import_module=child.import_module,
        )
        workspace = await child.to_thread(make)
        if workspace is None:
            return Unavailable(reasons=(f"the workspace factory created no {backend} workspace",))
        self.held[backend] = workspace
        return {"backend": backend}

    async def agree(
        self, local: str | None, statuses: dict[str, str], attempts: Sequence[StepResult]
    ) -> tuple[str | None, str | None]:
        """Run the agreement child; the agreed backend and, if none, why."""
        agreed: str | None = local
        gathered: list[JsonValue] | None = None

        async def agree(child: StepContext) -> JsonValue:
            nonlocal agreed, gathered
            group = self.group
            rounds = 0
            while group is not None:
                rounds += 1
                mine: JsonValue = {
                    # Tags this rank's part of the agreement, so an exchange
                    # that a peer joined for something else (it left the
                    # startup early and is waiting at its end) is recognised
                    # instead of being read as "that rank has no backend".
                    "exchange": ALLREDUCE_AGREE_STEP,
                    "chain": list(self.chain),
                    "status": dict(statuses),
                }
                gathered = await child.to_thread(group.all_gather, mine)
                _check_exchange(gathered, group)
                backend, everywhere = _judge(gathered, self.chain)
                if backend is None or everywhere:
                    agreed = backend
                    break
                if statuses[backend] == _UNTRIED:
                    statuses[backend] = await self.catch_up(backend)
            released = [backend for backend in self.held if backend != agreed]
            for backend in released:
                await child.to_thread(self.factory.release, self.held.pop(backend))
            return {
                "backend": agreed,
                "local": local,
                "group": gathered,
                "rounds": rounds,
                "released": list(released),
            }

        await self.ctx.run_child(_AGREE, agree, policy=_STEP_POLICY, timeout=self.config.bound(3))
        self.ctx.record_decision(
            "allreduce.agreed",
            agreed,
            {
                "local": local,
                "chain": list(self.chain),
                "ranks": 1 if self.group is None else self.group.world_size,
            },
        )
        if agreed is not None:
            return agreed, None
        if gathered is not None:
            return None, _group_reason(gathered, self.chain)
        return None, _local_reason(attempts)

    async def catch_up(self, backend: str) -> str:
        index = self.chain.index(backend)
        result = await self.ctx.run_child(
            backend,
            functools.partial(self.attempt, backend),
            kind=StepKind.ATTEMPT,
            policy=ANY_EXCEPTION_POLICY,
            timeout=self.config.step_timeout,
            attributes={
                "backend": backend,
                "attempt": index,
                "attempts": len(self.chain),
                "fallback_left": index < len(self.chain) - 1,
                "catch_up": True,
            },
        )
        return _OK if result.ok else _FAILED

    async def quant(self, backend: str) -> tuple[str | None, str | None]:
        """The quantization workspace's backend, or ``None`` and why not."""

        # After agreement the quantization workspace wants the same backend as
        # the plain one, which this rank holds: reuse it, never build a second.
        async def quant(child: StepContext) -> JsonValue:
            return {"backend": backend, "reused": True}

        result = await self.ctx.run_child(
            _QUANT,
            quant,
            policy=ANY_EXCEPTION_POLICY,
            timeout=self.config.step_timeout,
            attributes={"backend": backend},
        )
        if result.ok:
            return backend, None
        return None, f"the quantization fusion workspace failed ({_why(result)})"


def _check_exchange(gathered: Sequence[JsonValue], group: Group) -> None:
    for rank, entry in enumerate(gathered):
        tag = entry.get("exchange") if isinstance(entry, dict) else None
        if tag != ALLREDUCE_AGREE_STEP:
            seen = tag if isinstance(tag, str) else type(entry).__name__
            raise GroupError(
                group.rank,
                group.world_size,
                "all_gather",
                f"rank {rank} is not in the all-reduce agreement (it joined {seen!r}); "
                f"it probably left the startup early: see rank {rank}'s log",
            )


def _backend_of(result: StepResult) -> str:
    return result.step.rpartition("/")[2]


def _status(entry: JsonValue, backend: str) -> str:
    # A malformed entry (a peer running other code) counts as unable.
    if not isinstance(entry, dict):
        return _UNAVAILABLE
    chain, status = entry.get("chain"), entry.get("status")
    if not isinstance(chain, list) or backend not in chain or not isinstance(status, dict):
        return _UNAVAILABLE
    value = status.get(backend)
    return value if isinstance(value, str) else _UNAVAILABLE


def _order(gathered: Sequence[JsonValue], fallback: Sequence[str]) -> list[str]:
    first = gathered[0] if gathered else None
    chain = first.get("chain") if isinstance(first, dict) else None
    if isinstance(chain, list) and all(isinstance(b, str) for b in chain):
        return [str(b) for b in chain]
    return list(fallback)


def _judge(gathered: Sequence[JsonValue], chain: Sequence[str]) -> tuple[str | None, bool]:
    """The first backend no rank reports unusable (``None``: none) and whether
    every rank holds it — a pure function of the gathered statuses, so every
    rank reaches the same verdict."""
    for backend in _order(gathered, chain):
        states = [_status(entry, backend) for entry in gathered]
        if all(state in _USABLE for state in states):
            return backend, all(state == _OK for state in states)
    return None, False


def _group_reason(gathered: Sequence[JsonValue], chain: Sequence[str]) -> str:
    parts: list[str] = []
    for backend in _order(gathered, chain):
        by_status: dict[str, list[int]] = {}
        for rank, entry in enumerate(gathered):
            state = _status(entry, backend)
            if state not in _USABLE:
                by_status.setdefault(state, []).append(rank)
        for state, ranks in by_status.items():
            why = " (no flashinfer.comm)" if state == _UNAVAILABLE else ""
            parts.append(f"{backend} {state}{why} on {format_ranks(ranks, separator=', ')}")
    return "no all-reduce workspace backend worked on every rank: " + "; ".join(parts)


def _local_reason(attempts: Sequence[StepResult]) -> str:
    parts = [f"{_backend_of(result)} ({_why(result)})" for result in attempts]
    return "no all-reduce workspace backend worked: " + ", ".join(parts)
