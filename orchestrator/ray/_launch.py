"""The driver's side: start one rank per Ray actor and gather the launch.

:func:`launch_on_ray` does what an engine's driver does with its Ray
workers, and keeps the record a replay needs:

1. claims the driver's run directory and writes its manifest (world size,
   injected faults, simulated host) before any actor starts;
2. creates one :class:`~orchestrator.ray.RankActor` per rank and asks each
   where it landed; ranks are numbered node by node (the driver's node
   first), so each rank's local rank and node rank follow Ray's node ids;
3. hosts the process group's rendezvous (a ``torch.distributed`` TCP store
   on a port the kernel picks, so no free port is guessed and raced for) and
   hands every actor its :class:`~orchestrator.ray.RankAssignment`: identity,
   run id, the store's address, and the driver's ``TRACEPARENT`` and
   ``OTEL_*`` variables (every rank's spans are of one trace: the caller's,
   else the one the run id names);
4. writes each rank's log that came back into the run directory as
   ``rank-N.jsonl``, and records in the manifest how each rank ended: an
   actor that died, never answered, or never opened its log is **lost**,
   with its actor id, node and the error, so a replay names it rather than
   leaving it silently absent. What a lost actor on the driver's node had
   logged is read from its workspace (a replay then shows the step it died
   in); on another node the manifest says where that log was left.

Then ``startup-orchestrator replay <run-dir>`` reads one run with every rank.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import itertools
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from events import Durability, RankIdentity, RankProcess, RunOutcome

from .._errors import OrchestratorError
from .._faults import FaultPlan
from .._identity import checked_run_id, new_run_id
from .._run_directory import LaunchBook, Manifest, rank_log_path, store_collected_log
from .._startup import DEFAULT_RUNS_ROOT, checked_fault_plan, trace_parent
from ._actor import ActorPlace, RankActor, RankAssignment, RankReport

if TYPE_CHECKING:
    from events import Replay

    from ..engine import EngineConfig, Profile

__all__ = ["RayLaunch", "RayLaunchError", "RayRank", "launch_on_ray", "rank_identities"]

#: The install command that brings Ray (and torch, for the process group).
INSTALL_HINT = "pip install 'startup-orchestrator[torch,ray]'"

#: Seconds the driver waits for actors beyond the launch's timeout: each
#: actor stops its own startup at the timeout, then flushes and sends its log.
GRACE_S = 15.0


class RayLaunchError(OrchestratorError):
    """A launch on Ray could not be made (nothing of it ran).

    Attributes:
        problem: what is wrong.
        remedy: what to do about it.
    """

    def __init__(self, problem: str, remedy: str) -> None:
        self.problem = problem
        self.remedy = remedy
        super().__init__(f"{problem}; {remedy}")


@attrs.frozen(kw_only=True)
class RayRank:
    """How one rank's actor ended, as the driver saw it.

    Attributes:
        rank: the global rank.
        outcome: how its startup ended; ``None`` when it was lost (the
            actor died, never answered, or never opened its log).
        error: the error its startup raised, or why it was lost.
        actor_id, node_id, pid: where it ran, when known.
        log_path: its log in the driver's run directory: the one it sent
            back, or what a lost actor on the driver's node had written;
            ``None`` when there is none.
    """

    rank: int
    outcome: RunOutcome | None
    error: str | None = None
    actor_id: str | None = None
    node_id: str | None = None
    pid: int | None = None
    log_path: Path | None = None

    @property
    def lost(self) -> bool:
        """Whether the actor was lost (no report came back from it)."""
        return self.outcome is None


@attrs.frozen(kw_only=True)
class RayLaunch:
    """A launch on Ray, gathered in the driver's run directory.

    Attributes:
        run_id: the launch.
        run_dir: the driver's run directory: every rank's log and the
            manifest (``startup-orchestrator replay RUN_DIR``).
        ranks: one entry per rank, in rank order.
    """

    run_id: str
    run_dir: Path
    ranks: tuple[RayRank, ...]

    @property
    def ready(self) -> bool:
        """Whether every rank reached ready."""
        return all(rank.outcome is RunOutcome.READY for rank in self.ranks)

    def replay(self) -> Replay:
        """The run replayed from the run directory with the reference
        engine's slice, judged against the manifest (a lost rank is named).

        Raises:
            events.EventsError: a log in the directory is corrupt.
            RunDirectoryError: the manifest is unreadable.
        """
        from .._launch_trace import replay_run_directory
        from ..engine import ENGINE

        return replay_run_directory(self.run_dir, slices=[ENGINE])[1]


def launch_on_ray(
    world_size: int,
    *,
    config: EngineConfig | None = None,
    profile: Profile | str | None = None,
    faults: FaultPlan | Sequence[str] | None = None,
    run_id: str | None = None,
    run_dir: str | os.PathLike[str] | None = None,
    runs_root: str | os.PathLike[str] = DEFAULT_RUNS_ROOT,
    timeout_s: float = 300.0,
    group_timeout_s: float = 60.0,
    process_group: bool = True,
    durability: Durability | str = Durability.INTERVAL,
    actor_options: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> RayLaunch:
    """Start ``world_size`` ranks, one per Ray actor, and gather their logs
    into the driver's run directory.

    Uses the Ray cluster this process is connected to (call ``ray.init``
    first). Returns once every rank has ended or been given up on; a failed
    start is a result, not an exception. Every input is checked before
    anything is written.

    Args:
        world_size: how many ranks (actors), at least 1.
        config: what the reference engine is asked to start (default
            ``EngineConfig(tp=world_size)``).
        profile: simulate this host on every actor (a built-in profile name,
            a profile file readable on every node, or a
            :class:`~orchestrator.engine.Profile`); ``None`` probes each
            actor's real host.
        faults: faults to inject (``[RANKS:]TARGET=EXCEPTION[:MESSAGE]``
            specs, or a plan), checked against the world before anything
            starts.
        run_id: the launch's id (default: a new one).
        run_dir: the driver's run directory (default
            ``<runs_root>/<run-id>``).
        runs_root: where run directories go by default.
        timeout_s: each actor stops its startup (recorded as
            ``interrupted``) when it has not ended this long after it began;
            an actor that has not answered 15 s later (its log flushed and
            sent) is killed and reported lost.
        group_timeout_s: how long forming the gloo group and each exchange
            may wait for the other ranks.
        process_group: form a torch.distributed (gloo) group across the
            actors, as the engine's workers do (needs torch on the driver
            and the actors); ``False`` for none (each rank decides alone).
        durability: when each rank's log is fsynced on its node.
        actor_options: passed to the actor class's ``.options()``
            (``num_cpus``, ``runtime_env``, ``scheduling_strategy``...);
            default ``{"num_cpus": 0}``.
        environ: where the driver's ``TRACEPARENT`` and ``OTEL_*``
            variables are read (default :data:`os.environ`).

    Returns:
        The launch: run id, run directory, and how each rank ended.

    Raises:
        ValueError: ``world_size`` < 1 or a timeout is not positive.
        FaultSpecError: a fault cannot be parsed or names a rank outside the
            world (nothing is written).
        RankEnvironmentError: ``run_id`` is not a valid run id.
        RunDirectoryError: the run directory holds another run or cannot be
            written; or the manifest could not be written again as the launch
            went (raised once every rank has ended: the logs hold the run).
        RayLaunchError: Ray (or torch, for the process group) is not
            installed on the driver, or this process is not connected to a
            Ray cluster.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, not {world_size}")
    if not (timeout_s > 0 and group_timeout_s > 0):
        raise ValueError(
            f"timeouts must be > 0, not timeout_s={timeout_s}, group_timeout_s={group_timeout_s}"
        )
    # Checked against the engine's targets before anything starts (each
    # actor checks it again).
    plan = checked_fault_plan(faults, world_size)
    run_id = new_run_id() if run_id is None else checked_run_id(run_id)
    ray = _connected_ray()
    directory = Path(run_dir) if run_dir is not None else Path(runs_root) / run_id
    env = os.environ if environ is None else environ
    # The actors' spans join the caller's trace and go where the caller's would.
    traced = {k: v for k, v in env.items() if k == "TRACEPARENT" or k.startswith("OTEL_")}
    manifest = Manifest.begin(
        run_id=run_id,
        world_size=world_size,
        faults=plan,
        simulating=profile,
        caller_span=trace_parent(env),
        command=sys.argv,
    )
    # The rendezvous first: without torch nothing is written.
    store, rendezvous = _rendezvous_store(ray) if process_group and world_size > 1 else (None, {})
    try:
        book = LaunchBook.claim(directory, manifest)
        launch = _Launch(ray=ray, book=book)
        try:
            launch.place(actor_options, timeout_s=timeout_s)
            launch.start(
                lambda identity: RankAssignment(
                    identity=identity,
                    run_id=run_id,
                    rendezvous=rendezvous,
                    environ=traced,
                    config=config,
                    profile=profile,
                    faults=plan,
                    group_timeout_s=group_timeout_s,
                    timeout_s=timeout_s,
                    durability=Durability(durability),
                )
            )
            launch.gather(timeout_s=timeout_s + GRACE_S)
        finally:
            launch.release()
        if book.unwritten is not None:
            raise book.unwritten
        from exporters import Tracing

        from .._launch_trace import send_launch_span_of
        from ..engine import ENGINE

        # Where the actors' spans went: the driver's ``OTEL_*`` variables.
        send_launch_span_of(Tracing(environ=env), directory, slices=[ENGINE], ranks_ended=True)
    finally:
        # Dropping the last reference to the store stops its server.
        del store
    return RayLaunch(run_id=run_id, run_dir=directory, ranks=launch.ranks())


# --- the launch, step by step ------------------------------------------------------------


def rank_identities(nodes: Sequence[str | None], driver_node: str) -> list[RankIdentity]:
    """Each actor's identity, given the node each landed on (in the order
    they were created; ``None`` for one that was never placed): ranks are
    numbered node by node, the driver's node first, then the others in the
    order they first appear (the unplaced last); within a node, in creation
    order. Node rank and local rank follow."""
    first_seen: dict[str | None, int] = {driver_node: 0}
    for node in nodes:
        if node is not None:
            first_seen.setdefault(node, len(first_seen))
    # A stable sort: within a node, in creation order; the unplaced last.
    by_rank = sorted(range(len(nodes)), key=lambda i: first_seen.get(nodes[i], len(first_seen)))
    identities: dict[int, RankIdentity] = {}
    ranks = itertools.count()  # by_rank, node by node
    for node_rank, (_node, group) in enumerate(itertools.groupby(by_rank, key=nodes.__getitem__)):
        peers = list(group)
        for local_rank, index in enumerate(peers):
            identities[index] = RankIdentity(
                rank=next(ranks),
                local_rank=local_rank,
                world_size=len(nodes),
                local_world_size=len(peers),
                node_rank=node_rank,
            )
    return [identities[index] for index in range(len(nodes))]


@attrs.define(eq=False)  # each actor is itself, the key of its answers
class _Actor:
    handle: Any
    actor_id: str
    node_id: str | None = None
    pid: int | None = None
    workspace: Path | None = None
    identity: RankIdentity | None = None
    pending: Any = None  # the ObjectRef of its run, while it runs
    report: RankReport | None = None
    lost: str | None = None

    @property
    def rank(self) -> int:
        assert self.identity is not None, "ranks are numbered once the actors are placed"
        return self.identity.rank


class _Launch:
    def __init__(self, *, ray: Any, book: LaunchBook) -> None:
        self.ray = ray
        self.book = book
        self.actors: list[_Actor] = []
        self.driver_node = str(ray.get_runtime_context().get_node_id())

    def place(self, options: Mapping[str, Any] | None, *, timeout_s: float) -> None:
        """Create the actors and number the ranks by where each landed."""
        options = {"num_cpus": 0} if options is None else options
        remote = self.ray.remote(RankActor).options(**options)
        for _ in range(self.book.manifest.world_size):
            handle = remote.remote()
            self.actors.append(_Actor(handle=handle, actor_id=_actor_id(handle)))
        where = {actor.handle.where.remote(): actor for actor in self.actors}
        answers = dict(self._answers(where, timeout_s))
        for actor in self.actors:
            answer = answers.get(actor)
            if isinstance(answer, ActorPlace):
                actor.node_id, actor.workspace = answer.node_id, answer.workspace
                actor.pid = answer.pid
            else:
                actor.lost = _lost(actor, answer, f"was not placed within {timeout_s:g} s")
        identities = rank_identities([actor.node_id for actor in self.actors], self.driver_node)
        for actor, identity in zip(self.actors, identities, strict=True):
            actor.identity = identity
        self.actors.sort(key=lambda actor: actor.rank)

    def start(self, assign: Callable[[RankIdentity], RankAssignment]) -> None:
        """Give every placed actor its assignment; record each start."""
        now = time.time_ns()
        for actor in self.actors:
            if actor.lost is None:
                assert actor.identity is not None
                actor.pending = actor.handle.run.remote(assign(actor.identity))
        self.book.record(
            *(
                RankProcess(
                    rank=actor.rank,
                    pid=actor.pid,
                    started_wall_ns=now,
                    ended_wall_ns=now if actor.lost is not None else None,
                    lost=actor.lost,
                )
                for actor in self.actors
            )
        )

    def gather(self, *, timeout_s: float) -> None:
        """Wait for every running actor's report (at most ``timeout_s``);
        write each log that came back and record how each rank ended."""
        running = {actor.pending: actor for actor in self.actors if actor.pending is not None}
        for actor, answer in self._answers(running, timeout_s):
            self._record(actor, answer)
        for actor in self.actors:
            if actor.pending is not None:  # _record clears it for each answer
                self._record(actor, None)
        self.book.finish()

    def _record(self, actor: _Actor, answer: object) -> None:
        actor.pending = None
        # Done with this launch: its process ends now, as a torchrun worker's
        # does, so peers still waiting on it in a collective fail at once, not
        # at the group timeout; one given up on is killed before its workspace
        # is read, so nothing writes to it.
        with contextlib.suppress(Exception):
            self.ray.kill(actor.handle)
        if isinstance(answer, RankReport):
            actor.report = answer
            if answer.outcome is not None:
                store_collected_log(self.book.run_dir, actor.rank, answer.log)
            else:
                actor.lost = _lost(actor, None, f"did not start: {answer.error}")
        else:
            actor.lost = _lost(actor, answer, "did not answer in time; the launcher killed it")
            actor.lost += self._recover(actor)
        self.book.ended(actor.rank, lost=actor.lost)

    def _recover(self, actor: _Actor) -> str:
        """Read what a lost actor had logged when it ran on this node (its
        workspace is then removed); say where it was left otherwise."""
        if actor.workspace is None:
            return ""
        if actor.node_id != self.driver_node:
            return f"; what it logged was left on that node in {actor.workspace}"
        left = rank_log_path(actor.workspace / self.book.manifest.run_id, actor.rank)
        content = b""
        with contextlib.suppress(OSError):
            content = left.read_bytes()
        shutil.rmtree(actor.workspace, ignore_errors=True)
        if not content:
            return ""
        store_collected_log(self.book.run_dir, actor.rank, content)
        return "; what it logged until then was read from its workspace on this node"

    def _answers(
        self, refs: Mapping[Any, _Actor], timeout_s: float
    ) -> Iterator[tuple[_Actor, object]]:
        """Each ref's actor and value, or the exception getting it raised, as
        they come, for at most ``timeout_s``: the actors not yielded did not
        answer in time."""
        left = list(refs)
        deadline = time.monotonic() + timeout_s
        while left and (remaining := deadline - time.monotonic()) > 0:
            done, left = self.ray.wait(left, num_returns=1, timeout=remaining)
            for ref in done:
                try:
                    answer: object = self.ray.get(ref, timeout=remaining)
                except Exception as exc:  # ActorDiedError, RayTaskError...: the answer
                    answer = exc
                yield refs[ref], answer

    def release(self) -> None:
        """Kill every actor (done, or given up on): none outlives the launch."""
        for actor in self.actors:
            with contextlib.suppress(Exception):
                self.ray.kill(actor.handle)

    def ranks(self) -> tuple[RayRank, ...]:
        launched = []
        for actor in self.actors:  # in rank order (see place)
            report = None if actor.lost is not None else actor.report
            log = rank_log_path(self.book.run_dir, actor.rank)
            launched.append(
                RayRank(
                    rank=actor.rank,
                    outcome=None if report is None else report.outcome,
                    error=actor.lost if report is None else report.error,
                    actor_id=actor.actor_id,
                    node_id=actor.node_id,
                    pid=actor.pid,
                    log_path=log if log.exists() else None,
                )
            )
        return tuple(launched)


def _lost(actor: _Actor, error: object, what: str) -> str:
    """``"Ray actor 9f3c... on node 1a2b...: ActorDiedError: ..."``."""
    where = f"Ray actor {actor.actor_id}" + (f" on node {actor.node_id}" if actor.node_id else "")
    if isinstance(error, BaseException):
        first = (str(error).strip().splitlines() or [""])[0]
        return f"{where}: {type(error).__name__}" + (f": {first}" if first else "")
    return f"{where} {what}"


def _actor_id(handle: Any) -> str:
    # Ray has no public accessor for a handle's id on the driver; the actor
    # itself can tell (get_actor_id), but only once it is placed, and an
    # actor that never is must still be named.
    actor_id = getattr(handle, "_actor_id", None)
    return actor_id.hex() if actor_id is not None else "(unknown id)"


# --- the pieces ---------------------------------------------------------------------------


def _connected_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise RayLaunchError(
            f"Ray is not importable ({exc})", f"install it: {INSTALL_HINT}"
        ) from None
    if not ray.is_initialized():
        # Ray would start a cluster of every CPU by itself: the caller says
        # which cluster, and with what resources.
        raise RayLaunchError(
            "this process is not connected to a Ray cluster",
            "call ray.init() first (ray.init(address=...) joins a running cluster)",
        )
    return ray


def _rendezvous_store(ray: Any) -> tuple[Any, Mapping[str, str]]:
    """A ``torch.distributed`` TCP store on this node, on a port the kernel
    picked, and the variables that reach it: every rank connects to it as
    torchrun's workers connect to their agent's store
    (``TORCHELASTIC_USE_AGENT_STORE``), so rank 0 need not bind a port
    chosen earlier, which another process may take first.

    Raises:
        RayLaunchError: torch is not importable on the driver.
    """
    try:
        # By name, as orchestrator._group does: torch's stubs do not export
        # TCPStore, and type-checking this module must not need torch.
        distributed: Any = importlib.import_module("torch.distributed")
    except ImportError as exc:
        raise RayLaunchError(
            f"torch is not importable on the driver ({exc}); the process group needs it",
            f"install it ({INSTALL_HINT}), or pass process_group=False",
        ) from None
    store = distributed.TCPStore(
        "0.0.0.0", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=60)
    )
    return store, {
        "MASTER_ADDR": str(ray.util.get_node_ip_address()),
        "MASTER_PORT": str(store.port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_RESTART_COUNT": "0",
    }
