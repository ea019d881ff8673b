"""One rank inside a Ray actor: what the driver assigns it, what it sends back.

The driver (:func:`orchestrator.ray.launch_on_ray`) gives each actor a
:class:`RankAssignment`; the actor runs :func:`run_assigned_rank` in a
workspace on its own node (no shared filesystem is assumed) and hands back a
:class:`RankReport` carrying the rank's whole log. An actor that dies leaves
its workspace, which the driver reads when the actor ran on the driver's
node.

Nothing here imports Ray at module level: an assignment and a report are
plain picklable data, and the actor class becomes a Ray actor only when the
driver wraps it (``ray.remote(RankActor)``).
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import attrs

from events import Durability, RankIdentity, RunOutcome

from .._errors import StartupInterrupted
from .._faults import FaultPlan
from .._startup import Startup

if TYPE_CHECKING:
    from ..engine import EngineConfig, Profile

__all__ = ["ActorPlace", "RankActor", "RankAssignment", "RankReport", "run_assigned_rank"]


@attrs.frozen(kw_only=True)
class RankAssignment:
    """What the driver tells one actor: who it is and how to start.

    Attributes:
        identity: this rank (rank, local rank, world size, node rank).
        run_id: the launch's run id, shared by every rank.
        rendezvous: the variables the process group is formed from
            (``MASTER_ADDR``, ``MASTER_PORT``...), set in the actor's
            environment before the startup; empty for no group.
        environ: more variables the startup reads (``TRACEPARENT`` and the
            driver's ``OTEL_*``), on top of the actor's environment.
        config: what the reference engine is asked to start (default
            ``EngineConfig(tp=world size)``).
        profile: the simulated host (a built-in name, a profile file on the
            actor's node, or a :class:`~orchestrator.engine.Profile`), or
            ``None`` to probe the actor's real host.
        faults: faults to inject, for the whole launch (each names its ranks).
        group_timeout_s: how long forming the group and each exchange may
            wait for the other ranks.
        timeout_s: the startup is stopped (recorded as ``interrupted``) when
            it has not ended this many seconds after it began.
        durability: when the rank's log is fsynced.
    """

    identity: RankIdentity
    run_id: str
    rendezvous: Mapping[str, str] = attrs.field(factory=dict)
    environ: Mapping[str, str] = attrs.field(factory=dict)
    config: EngineConfig | None = None
    profile: Profile | str | None = None
    faults: FaultPlan = attrs.field(factory=FaultPlan)
    group_timeout_s: float = 60.0
    timeout_s: float = 300.0
    durability: Durability = Durability.INTERVAL


@attrs.frozen(kw_only=True)
class RankReport:
    """What one actor sends back to the driver.

    Attributes:
        rank: the rank it ran.
        outcome: how its startup ended (``ready``, ``failed``,
            ``interrupted``); ``None`` when it never opened its log.
        error: the error its startup raised (``"RuntimeError: ..."``), or
            ``None`` when it reached ready.
        log: its log, byte for byte (empty when it never opened one).
        pid, node_id: where it ran.
    """

    rank: int
    outcome: RunOutcome | None
    error: str | None = None
    log: bytes = b""
    pid: int
    node_id: str | None = None


def run_assigned_rank(
    assignment: RankAssignment, *, node_id: str | None = None, workspace: Path | None = None
) -> RankReport:
    """Run one rank's startup as assigned, in a run directory of its own,
    and return its outcome and its log.

    Call it once per process (the process group is the process's default
    one). The rendezvous variables are set in this process's environment,
    where ``torch.distributed`` reads them. The startup's own errors never
    leave this function: they are in the log and in the report.

    Args:
        assignment: who this rank is and how to start.
        node_id: the Ray node it runs on, for the report.
        workspace: an empty directory for the rank's run directory (default:
            a new temporary one); removed before returning.
    """
    os.environ.update(assignment.rendezvous)
    workspace = new_workspace() if workspace is None else workspace
    try:
        startup = Startup(
            assignment.config,
            identity=assignment.identity,
            run_id=assignment.run_id,
            run_dir=workspace / assignment.run_id,
            durability=assignment.durability,
            profile=assignment.profile,
            faults=assignment.faults,
            group="auto" if assignment.rendezvous else None,
            group_timeout_s=assignment.group_timeout_s,
            # Ray owns the actor's signals; the launch's timeout stops it.
            handle_signals=False,
            # The driver reads every rank's log once all have ended, and
            # sends the launch's span.
            wait_for_peers=False,
            launch_span=True,
            environ={**os.environ, **assignment.environ},
        )
        report = functools.partial(
            RankReport, rank=assignment.identity.rank, pid=os.getpid(), node_id=node_id
        )
        try:
            startup.open()
        except Exception as exc:
            return report(outcome=None, error=_describe(exc))
        failure: BaseException | None
        with startup:
            try:
                failure = anyio.run(_run_bounded, startup, assignment.timeout_s)
            except BaseException as exc:  # recorded in the log; reported, not raised
                failure = exc
        result = startup.result
        return report(
            outcome=None if result is None else result.outcome,
            error=None if failure is None else _describe(failure),
            log=b"" if startup.log_path is None else startup.log_path.read_bytes(),
        )
    finally:
        shutil.rmtree(workspace, ignore_errors=True)


async def _run_bounded(startup: Startup, timeout_s: float) -> Exception | None:
    """Run the startup and return the error it raised, if any; when it has
    not ended within ``timeout_s``, stop it (from a task of its own event
    loop, as :meth:`Startup.stop` asks), so that it records ``interrupted``
    and its log still comes back."""
    async with anyio.create_task_group() as tasks:

        async def stop_when_late() -> None:
            await anyio.sleep(timeout_s)
            startup.stop(
                StartupInterrupted(None, f"not ended within the Ray launch's {timeout_s:g} s")
            )

        tasks.start_soon(stop_when_late)
        try:
            await startup.arun()
        except Exception as exc:
            return exc
        finally:
            tasks.cancel_scope.cancel()
    return None


def new_workspace() -> Path:
    """A new, empty temporary directory for one rank's run directory."""
    return Path(tempfile.mkdtemp(prefix="startup-orchestrator-ray-"))


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


@attrs.frozen(kw_only=True)
class ActorPlace:
    """Where an actor landed: its node (id and address), process and
    workspace (where its rank's log will be written)."""

    node_id: str
    node_ip: str
    pid: int
    workspace: Path


class RankActor:
    """The actor :func:`~orchestrator.ray.launch_on_ray` creates per rank
    (wrapped with ``ray.remote`` by the driver). One startup per actor:
    :meth:`where`, then :meth:`run`."""

    def __init__(self) -> None:
        self._workspace: Path | None = None

    def where(self) -> ActorPlace:
        """Where this actor runs, its workspace made, for the driver to
        number nodes, place rank 0, and find the log of an actor that died."""
        import ray

        util: Any = ray.util  # partly typed: its helpers are untyped
        self._workspace = new_workspace()
        return ActorPlace(
            node_id=str(ray.get_runtime_context().get_node_id()),
            node_ip=str(util.get_node_ip_address()),
            pid=os.getpid(),
            workspace=self._workspace,
        )

    def run(self, assignment: RankAssignment) -> RankReport:
        """Run the assigned rank (see :func:`run_assigned_rank`)."""
        import ray

        node_id = str(ray.get_runtime_context().get_node_id())
        return run_assigned_rank(assignment, node_id=node_id, workspace=self._workspace)
