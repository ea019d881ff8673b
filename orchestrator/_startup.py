"""The embedding API: one rank's startup in a few lines of a launcher.

:class:`Startup` is what an engine's entry point calls once per rank process
(under torchrun, SLURM ``srun``, Open MPI ``mpirun``, Ray or its own
spawner)::

    from orchestrator import Startup
    from orchestrator.engine import EngineConfig

    with Startup(EngineConfig(tp=2)) as startup:
        result = startup.run()
    print(result.state.platform_class, result.state.attention_backend, result.log_path)

Constructed with nothing, it reads everything from the environment (each
argument of :class:`Startup` says its default): who this rank is, the run
id every rank of the launch shares (never one per rank), the run directory
``startup-runs/<run-id>`` (claimed atomically; one that holds another run
is refused before anything is written), the process group (formed by the
recorded ``process_group`` step), tracing (``OTEL_*``, ``TRACEPARENT``),
logging and signals. At the end every rank's log reaches the run directory
of the launch's rank 0 over the process group, so that a multi-node run
needs no shared filesystem.

Lifecycle: :meth:`Startup.open` (or entering the ``with`` block) claims the
directory, creates this rank's log and records ``run.started`` before
anything slow; :meth:`Startup.run` (or ``await`` :meth:`Startup.arun`) runs
the graph; :meth:`Startup.close` (or leaving the block) flushes and closes
the log, the spans and the process group — on every exit path. ``run`` opens
and closes by itself when used without ``with``.

``run`` returns a :class:`StartupResult` when the rank reached ready. When a
probe's error failed the startup it raises that **original exception**
(SPEC §2) after everything is flushed; when the startup was stopped it
raises :class:`~orchestrator.StartupInterrupted`. Either way
:attr:`Startup.result` then holds the outcome and the messages.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import signal
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Self, TypeVar

import anyio
import attrs

# Only what defining the two classes needs is imported with the module: the
# runtime (the event model, the runner, the run directory, the process
# group) is imported by the methods that use it, and ``events`` names load
# on first use, so that ``from orchestrator import Startup`` in a launcher
# costs little until a startup is made (BENCHMARKS.md).
import events
from events._severity import Scope, Severity

if TYPE_CHECKING:
    from events import (
        Durability,
        Event,
        JsonlLog,
        JsonValue,
        Message,
        RankIdentity,
        RankProcess,
        RankState,
        RunFinished,
        RunOutcome,
        Slice,
    )
    from exporters import LoggingBridge, Tracing

    from ._context import StepResult
    from ._errors import StartupInterrupted
    from ._faults import FaultPlan
    from ._graph import Graph
    from ._group import Group, GroupError, Mailbox
    from ._run_directory import Manifest
    from ._runner import Runner
    from .engine import EngineConfig, Profile

__all__ = ["DEFAULT_RUNS_ROOT", "Startup", "StartupResult"]

_T = TypeVar("_T")

#: Where run directories go unless one is given: ``./startup-runs``.
DEFAULT_RUNS_ROOT = Path("startup-runs")

#: Tags the ranks' last exchange (see :meth:`Startup.arun`).
_END_OF_RUN = "run.finished"

#: How long rank 0 of an interrupted run waits for the other ranks' logs (at
#: most the group timeout): a launcher that stops its ranks gives them a few
#: seconds before it kills them, and the ranks stopped together post at once.
_INTERRUPTED_COLLECTION_S = 5.0

#: How long rank 0 still waits for the other ranks' logs after the last
#: exchange, however long that took: the ranks post right after it, and a
#: last exchange that timed out on every rank ends at about the same moment.
_LAST_POSTS_S = 2.0


@attrs.frozen(kw_only=True)
class StartupResult:
    """What one rank's startup decided.

    Attributes:
        run_id, rank: the stream.
        world_size: how many ranks the launch has.
        outcome: ``ready``, ``failed`` or ``interrupted``.
        state: what the run's slices derived for this rank, of the type
            the first slice that declares one gives it
            (:attr:`events.Slice.state_type`): for the reference engine an
            :class:`~orchestrator.engine.EngineState`, whose views read the
            selected platform and backends (``result.state.platform_class``);
            for a graph of your own, its ``slices``' facts in
            ``result.state.facts``, and no engine field.
        steps: how every step and child step that ended on this rank ended,
            by step path: its outcome, its value when ``ok``, its reasons
            and exception otherwise.
        messages: every message derived on this rank, in order (printed or
            not).
        log_path: this rank's log.
        run_dir: the run directory every rank of the launch writes to.
        peers_finished: whether every rank reached the end of its startup
            (the last exchange; ``False`` without one when the run failed in
            an exchange with its peers); ``None`` when there was no exchange.
        undelivered: on the rank 0 that collected the run's logs, the ranks
            whose log is not in its run directory (the manifest says why);
            empty elsewhere.
    """

    run_id: str
    rank: int
    world_size: int
    outcome: RunOutcome
    state: RankState
    steps: Mapping[str, StepResult] = attrs.field(factory=dict)
    messages: tuple[Message, ...] = ()
    log_path: Path
    run_dir: Path
    peers_finished: bool | None = None
    undelivered: tuple[int, ...] = ()

    @property
    def ready(self) -> bool:
        """Whether this rank reached ready."""
        return self.outcome is events.RunOutcome.READY


class Startup:
    """One rank's startup: identity, run id, run directory, log, logging,
    tracing, signals and process group, set up from the environment.

    Args:
        config: what the reference engine is asked to start (default
            ``EngineConfig(tp=world size)``). Ignored when ``graph`` is given.
        graph: run this graph of your own probes instead of the reference
            engine's.
        slices: what the steps of ``graph`` mean (:class:`events.Slice`:
            message rules, hooks, facts): the live messages and the result's
            ``facts`` come from these alone, with the kernel's generic
            messages; the reference engine's meaning applies only to its
            own graph.
        identity: this rank (default: from the launcher environment).
        run_id: the launch's id (default: the launcher's, else agreed over the
            process group); a worker group torchrun restarted is run
            ``<run_id>-restart-K``, and one whose nodes never met to agree
            on K is ``<run_id>-node-N-unjoined-L`` (L: node N's own count);
            a rank that could agree on no run id records its failed
            ``process_group`` step as ``<a new id>-rank-R-unjoined``.
        run_dir: the run directory (default ``<runs_root>/<run-id>``); a
            worker group torchrun restarted writes to ``<run_dir>`` with its
            run id's suffix (``-restart-K``).
        runs_root: where run directories go by default.
        durability: when this rank's log is fsynced.
        profile: simulate this host (a built-in profile name, a profile file,
            or a :class:`~orchestrator.engine.Profile`) instead of probing
            the real one (reference engine only).
        simulated: how reports name the simulated host (default: the
            profile's name).
        faults: faults to inject (a plan, or ``[RANKS:]TARGET=EXCEPTION``
            specs), checked against the world size.
        group: ``"auto"`` forms a torch.distributed (gloo) group in the
            ``process_group`` step when the launcher set ``MASTER_ADDR``; a
            :class:`~orchestrator.Group` to use one you formed; ``None`` for
            none (each rank decides alone).
        group_timeout_s: how long forming the group and each exchange may
            wait for the other ranks; at the end, how long rank 0 waits for
            the other ranks' logs (5 s at most when the run was
            interrupted).
        stall_s: seconds a step may run before this rank records where it
            waits (``step.stalled``, with the stacks of the threads doing
            its work), as the command line's ``--stall-s``; ``None`` for
            never.
        tracing: ``"auto"`` reads the ``OTEL_*`` variables; a
            :class:`exporters.Tracing`; ``None`` for none.
        configure_logging: add a stderr handler to the ``orchestrator``
            logger; ``None`` does so unless logging is already configured.
        level: the lowest severity printed live.
        handle_signals: record SIGINT/SIGTERM/SIGHUP as ``interrupted`` (main thread
            only); with ``False`` the caller owns the signals and stops the
            run with :meth:`stop`.
        wait_for_peers: at the end, exchange with the other ranks (who
            finished; which WARNINGs each printed, so one that only this
            rank saw is printed here), and collect every rank's log into
            rank 0's run directory when the group is a
            :class:`~orchestrator.Mailbox`, rank 0 then writing the run's
            manifest. A launcher that reads every rank's log afterwards and
            writes its own manifest passes ``False``; the command line's
            launcher then prints once for all ranks the WARNINGs they held
            and the ERRORs of failures that follow a peer's. Under any
            other launcher (the Ray driver, your own) a rank prints only the
            WARNINGs its scope gives it (rank 0's, or local rank 0's), not
            one that only it saw, lest every rank repeat rank 0's: ``replay``
            of the logs shows them all.
        launch_span: whether, in a run of several ranks, this rank's root
            span is a child of the launch's own span
            (:func:`events.launch_span_id`), sent at the end by whoever
            holds the whole record. ``None``: when rank 0 collects the run
            (``wait_for_peers``) or under the command line's launcher;
            otherwise the root is a child of ``TRACEPARENT``'s span. A
            launcher of your own that sends the launch's span passes ``True``.
        environ: the environment to read (default :data:`os.environ`).
        engine_options: passed on to
            :func:`~orchestrator.engine.prepare_engine` (``plugins``,
            ``host``, ``importer``, ``workspace_factory``...).

    Raises:
        ValueError: ``slices`` without a ``graph`` of your own.
        TypeError: ``graph`` is not a :class:`~orchestrator.Graph`, an
            item of ``slices`` is not an :class:`events.Slice`, or ``group``
            or ``tracing`` is none of its choices.
    """

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        graph: Graph | None = None,
        slices: Sequence[Slice] = (),
        identity: RankIdentity | None = None,
        run_id: str | None = None,
        run_dir: str | os.PathLike[str] | None = None,
        runs_root: str | os.PathLike[str] = DEFAULT_RUNS_ROOT,
        durability: Durability | str = "interval",
        profile: Profile | str | os.PathLike[str] | None = None,
        simulated: str | None = None,
        faults: FaultPlan | Sequence[str] | None = None,
        group: Group | Literal["auto"] | None = "auto",
        group_timeout_s: float = 120.0,
        stall_s: float | None = 10.0,
        tracing: Tracing | Literal["auto"] | None = "auto",
        configure_logging: bool | None = None,
        level: Severity = Severity.INFO,
        handle_signals: bool = True,
        wait_for_peers: bool = True,
        launch_span: bool | None = None,
        environ: Mapping[str, str] | None = None,
        **engine_options: Any,
    ) -> None:
        from events._slices import checked_slices

        from ._graph import Graph
        from ._group import DeferredGroup, Group
        from ._signals import StopRequests
        from ._threads import StepThreads

        self._env = os.environ if environ is None else environ
        self._config = config
        if slices and graph is None:
            raise ValueError(
                "slices describe a graph of your own (pass graph=...); the reference "
                "engine's graph has its own"
            )
        if graph is not None and not isinstance(graph, Graph):
            raise TypeError(f"graph is {graph!r}, not an orchestrator.Graph")
        if group not in ("auto", None) and not isinstance(group, Group):
            raise TypeError(f"group is {group!r}, not an orchestrator.Group, 'auto' or None")
        if tracing not in ("auto", None):
            from exporters import Tracing

            if not isinstance(tracing, Tracing):
                raise TypeError(f"tracing is {tracing!r}, not an exporters.Tracing, 'auto' or None")
        self._graph = graph
        #: what the run's events mean: the caller's slices, or the engine's once open
        self._slices = checked_slices(slices)
        self._identity = identity
        self._run_id = run_id
        self._run_dir = None if run_dir is None else Path(run_dir)
        self._runs_root = Path(runs_root)
        self._durability = events.Durability(durability)
        self._profile = profile
        self._simulated = simulated
        self._faults = faults
        self._forms_group = group == "auto"
        self._group_timeout_s = group_timeout_s
        self._stall_s = stall_s
        self._tracing_choice = tracing
        self._configure_logging = configure_logging
        self._level = level
        self._handle_signals = handle_signals
        self._wait_for_peers = wait_for_peers
        self._launch_span = launch_span
        self._engine_options = engine_options
        self._state: Literal["new", "open", "closed"] = "new"
        self._stops = StopRequests()  # made again, for the launcher, when opened
        #: a stop asked before the startup opened (see :meth:`stop`)
        self._stop_asked: StartupInterrupted | None = None
        self._scope: anyio.CancelScope | None = None
        self._log: JsonlLog | None = None
        self._runner: Runner | None = None
        self._graph_to_run: Graph | None = None
        self._group = DeferredGroup(group if isinstance(group, Group) else None)
        # The end-of-run exchanges with peers that may hang: daemon threads.
        self._threads = StepThreads()
        self._bridge: LoggingBridge | None = None
        self._tracing: Tracing | None = None
        self._finished: RunFinished | None = None
        self._error: BaseException | None = None
        #: why the ranks could not agree on the run's name (see _agree_run_id)
        self._unjoined: GroupError | None = None
        self._peers_finished: bool | None = None
        #: the caller's ``TRACEPARENT`` (trace id, span id), once open
        self._caller_span: tuple[str, str] | None = None
        #: this launch's record, once open: what rank 0's manifest says of it
        self._launch: Manifest | None = None
        self._undelivered: tuple[int, ...] = ()
        self._ran = False
        self.identity: RankIdentity | None = None
        self.run_id: str | None = None
        self.run_dir: Path | None = None

    # --- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> Self:
        # Entering an already opened startup (opened to catch its errors
        # apart from the run's) keeps it open; closing happens on leaving.
        return self if self._state == "open" else self.open()

    def __exit__(self, *_exc_info: object) -> None:
        self.close()

    @property
    def log_path(self) -> Path | None:
        """This rank's log, once open."""
        return None if self._log is None else self._log.path

    @property
    def log(self) -> JsonlLog | None:
        """This rank's log, once open (subscribe to follow its events)."""
        return self._log

    def open(self) -> Self:
        """Claim the run directory, create this rank's log and record
        ``run.started`` (before anything slow), then set up logging,
        tracing and signals.

        Raises:
            RankEnvironmentError: the launcher's variables are inconsistent,
                or the ranks share no run id.
            RunDirectoryError: the run directory holds another run (or this
                rank's log exists), or cannot be written.
            FaultSpecError: an injected fault names a rank outside the world.
            ValueError: ``TRACEPARENT`` is malformed (nothing is written), or
                the ``otlp_protocol`` of an explicit :class:`exporters.Tracing`
                is unsupported (the log then records the start as failed). A
                tracing variable with an unsupported value is a warning: the
                start goes on.
            RuntimeError: opened twice.
        """
        from ._identity import identity_from_environment
        from ._run_directory import Manifest
        from ._signals import LAUNCHER_PID_VARIABLE, StopRequests, follow_launcher

        if self._state != "new":
            raise RuntimeError("a Startup opens once; make a new one for the next run")
        identity = self._identity or identity_from_environment(self._env)
        engine = self._engine_options.get("engine", "reference")
        faults = checked_fault_plan(self._faults, identity.world_size, self._graph, engine)
        self._caller_span = trace_parent(self._env)
        run_id, attempt = self._agree_run_id(identity)
        # A restarted worker group is a new run: a run directory named for
        # the launch takes the attempt's suffix, as the run id does.
        run_dir = (
            self._runs_root / run_id
            if self._run_dir is None
            else Path(os.fspath(self._run_dir) + attempt)
        )
        pid = self._env.get(LAUNCHER_PID_VARIABLE, "").strip()
        launcher_pid = int(pid) if pid.isdecimal() else None
        self._stops = StopRequests(launcher_pid=launcher_pid)
        if self._handle_signals:
            # Stops are caught from before the log exists: one that lands
            # while it is created is recorded once the run starts, so the
            # log never ends up empty for one.
            self._stops.install()
        try:
            log = self._create_log(run_dir, run_id, identity)
        except BaseException:
            self._stops.restore()
            for signum in self._stops.received:
                # A stop that came meanwhile acts as it would have.
                signal.raise_signal(signum)
            raise
        self._log = log
        if self._graph is None:
            from .engine import ENGINE

            self._slices = (ENGINE,)
        self._launch = Manifest.begin(
            run_id=run_id,
            world_size=identity.world_size,
            faults=faults,
            simulating=self._simulated or self._profile,
            caller_span=self._caller_span,
            collected_by=identity.rank,
        )
        self._state = "open"
        self.identity, self.run_id, self.run_dir = identity, run_id, run_dir
        if self._handle_signals:
            followed = launcher_pid if launcher_pid is not None else _elastic_agent(self._env)
            if followed is not None:
                # A rank never outlives its launcher; asked once stops are
                # caught, so a launcher that is already gone is recorded.
                follow_launcher(followed)
        try:
            self._prepare(log, identity, faults)
        except BaseException:
            self.close()
            if log.next_seq == 0:
                # Refused before run.started (an option the run rejects):
                # nothing written, as for a refused directory.
                log.path.unlink(missing_ok=True)
            raise
        return self

    def _create_log(self, run_dir: Path, run_id: str, identity: RankIdentity) -> JsonlLog:
        from ._run_directory import (
            RunDirectoryError,
            claim_run_directory,
            rank_log_path,
            refuse_foreign_rank,
            refused_by_system,
        )

        claim_run_directory(run_dir, run_id)
        path = rank_log_path(run_dir, identity.rank)
        with refused_by_system(run_dir, "cannot write the run directory"):
            try:
                # Created exclusively: a stored log is never resumed or
                # changed, and of two runs started into one directory only
                # one writes.
                log = events.JsonlLog(
                    path,
                    run_id=run_id,
                    rank=identity.rank,
                    durability=self._durability,
                    exclusive=True,
                )
            except FileExistsError:
                raise RunDirectoryError(
                    path,
                    f"already exists: run {run_id} already has a rank {identity.rank}; "
                    "use a new run id or run directory",
                ) from None
        try:
            refuse_foreign_rank(run_dir, self._stops.launcher_pid)
        except RunDirectoryError:
            log.close()
            path.unlink(missing_ok=True)
            raise
        return log

    def _prepare(self, log: JsonlLog, identity: RankIdentity, faults: FaultPlan) -> None:
        from ._group import follows_a_peer, process_group_step
        from ._run_directory import refused_by_system

        setup = None
        if self._unjoined is not None or (
            self._group.group is None and self._torch_group_wanted(identity)
        ):
            setup = process_group_step(
                identity,
                self._group,
                timeout_s=self._group_timeout_s,
                on_formed=self._announce,
                failed=self._unjoined,
            )
        elif self._group.group is not None:  # the caller's, or formed to agree on the run id
            self._announce(self._group.group)
        runner, graph = self._runner_and_graph(log, identity, faults)
        if setup is not None:
            graph = graph.after(setup)
        # Recorded before any slow set-up: a rank killed from here on leaves
        # a log that says who it was and what it was doing (on a full disk,
        # nothing is recorded).
        with refused_by_system(log.path, "cannot write the run directory"):
            runner.begin(graph)
        # Only a run that began is the startup's to end (see close()).
        self._runner, self._graph_to_run = runner, graph
        if self._stop_asked is not None:
            runner.stopping(self._stop_asked)  # the run begins stopped
        log.subscribe(self._watch_finish)
        try:
            from exporters import MESSAGE_LOGGER_PREFIX, LoggingBridge, Tracing

            # Under the command line's launcher (it started this rank and
            # reads every log at the end), which prints what its ranks held
            # back once for them all, a failure that follows a peer's is held
            # too: one line for every rank that saw it, not one each.
            launcher_prints = not self._wait_for_peers and self._stops.launcher_pid is not None
            held = follows_a_peer if launcher_prints else None
            self._bridge = LoggingBridge(hold_warnings=True, hold=held, slices=self._slices)
            configure = self._configure_logging
            if configure is None:
                logger = logging.getLogger(MESSAGE_LOGGER_PREFIX)
                configure = not logger.handlers and not logging.getLogger().handlers
            if configure:
                print_messages(self._level)
            # The bridge first: span status reads the severities it derives.
            log.subscribe(self._bridge, from_seq=0)
            choice = self._tracing_choice
            self._tracing = Tracing.from_environment(self._env) if choice == "auto" else choice
            if self._tracing is not None:
                self._tracing.attach(log, severity_of=self._bridge.severity_of)
                runner.span_activator = self._tracing.span_activator
        except BaseException as exc:
            if self._stops.requested:
                runner.stopping(self._stops.cause())
            runner.abandon(exc)
            raise

    def _runner_and_graph(
        self, log: JsonlLog, identity: RankIdentity, faults: FaultPlan
    ) -> tuple[Runner, Graph]:
        from events._launch import derive_trace_id

        from ._runner import Runner

        parent = self._caller_span
        options: dict[str, Any] = {"stall_s": self._stall_s, **self._engine_options}
        if self._simulated is not None:
            options["simulated"] = self._simulated
        trace_id = parent[0] if parent is not None else derive_trace_id(log.run_id)
        launch_span = self._launch_span
        if launch_span is None:
            launch_span = self._wait_for_peers or self._stops.launcher_pid is not None
        if identity.world_size > 1 and launch_span:
            options.update(
                trace_id=trace_id, parent_span_id=events.launch_span_id(trace_id, log.run_id)
            )
        elif parent is not None:
            options.update(trace_id=parent[0], parent_span_id=parent[1])
        if self._graph is not None:
            runner = Runner(
                log,
                identity=identity,
                faults=faults,
                services={"group": self._group},
                slices=tuple(part.import_path() for part in self._slices),
                **options,
            )
            return runner, self._graph
        from .engine import EngineConfig, load_profile, prepare_engine

        profile = self._profile
        if profile is not None and not hasattr(profile, "modules"):
            profile = load_profile(os.fspath(profile))
        config = self._config or EngineConfig(tp=identity.world_size)
        return prepare_engine(
            config,
            log,
            identity=identity,
            profile=profile,  # type: ignore[arg-type]
            faults=faults,
            group=self._group,
            **options,
        )

    def _agree_run_id(self, identity: RankIdentity) -> tuple[str, str]:
        """The run id, and the suffix it adds to the launch's own name (a
        restarted worker group's ``-restart-K``); the process group is
        formed here when agreeing over it is the only way to them."""
        from ._errors import RankEnvironmentError
        from ._group import GroupError
        from ._identity import (
            RUN_ID_VARIABLE,
            checked_run_id,
            new_run_id,
            restarted,
            run_id_from_environment,
            torchrun_restart_count,
        )

        env = self._env
        # The name every attempt of the launch shares: the run id passed in,
        # else torchrun's (``None``: neither).
        named: str | None = self._run_id or env.get("TORCHELASTIC_RUN_ID", "").strip()
        named = None if named in ("", "none") else named
        node_restarts = restarts = torchrun_restart_count(env)
        try:
            if (
                # A worker group that spans several torchrun agents that may
                # restart it, named after torchrun's id or the one passed in.
                not env.get(RUN_ID_VARIABLE, "").strip()
                and named is not None
                and env.get("TORCHELASTIC_MAX_RESTARTS", "0").strip() not in ("", "0")
                and identity.world_size > identity.local_world_size
            ):
                # Each node's agent counts only its own failures: a healthy
                # node restarted for a failed one sees the count of the
                # attempt before, so no one node's count (nor their maximum)
                # tells the attempts apart. Their sum, each node's counted
                # once (by its local rank 0), grows with every restart.
                group = self._early_group(identity)
                if group is not None:
                    own = node_restarts if identity.local_rank == 0 else 0
                    counts = group.all_gather(own)
                    restarts = sum(count for count in counts if isinstance(count, int))
            attempt = restarted("", restarts)
            if self._run_id is not None:
                # A run id passed in names every attempt of a restarted group.
                return checked_run_id(self._run_id + attempt), attempt
            found = run_id_from_environment(env, restarts=restarts)
            if found is not None:
                return found, attempt
            if identity.world_size == 1:
                return new_run_id(), ""
            group = self._early_group(identity)
            if group is None:
                raise RankEnvironmentError(
                    RUN_ID_VARIABLE,
                    None,
                    "the ranks of this launch share no run id and have no process group to "
                    "agree on one: set it (or torchrun --rdzv-id), or pass run_id",
                )
            return str(group.all_gather(new_run_id())[0]), ""
        except GroupError as exc:
            # The peers never met to agree: this rank records the failure
            # under a name no agreed run takes. A named group's attempt is
            # unknown, so its node's ranks take the node's own count (which
            # each such failure raises); an unnamed launch's rank, one of
            # its own.
            self._unjoined = exc
            if named is None:
                attempt = f"-rank-{identity.rank}-unjoined"
                return new_run_id() + attempt, attempt
            attempt = f"-node-{identity.node_rank}-unjoined-{node_restarts}"
            return checked_run_id(named + attempt), attempt

    def _early_group(self, identity: RankIdentity) -> Group | None:
        """The process group, formed now when none is (``None``: none can be)."""
        from ._group import init_torch_distributed_group

        group = self._group.group
        if group is None and self._torch_group_wanted(identity):
            group = init_torch_distributed_group(identity, timeout_s=self._group_timeout_s)
            self._group.group = group
        return group

    def _torch_group_wanted(self, identity: RankIdentity) -> bool:
        return (
            self._forms_group
            and identity.world_size > 1
            and bool(self._env.get("MASTER_ADDR", "").strip())
        )

    def _watch_finish(self, event: Event) -> None:
        if isinstance(event, events.RunFinished):
            self._finished = event

    def close(self) -> None:
        """Flush and close the log, export the spans left, close the process
        group and put the signal handlers back. Closing twice is harmless."""
        was_open, self._state = self._state == "open", "closed"
        if not was_open:
            return
        try:
            if self._runner is not None and not self._ran and not self._runner.ended:
                # Opened and never run: the log still says how it ended.
                from ._errors import StartupInterrupted

                never_ran = StartupInterrupted(None, "closed before it ran")
                if not self._runner.stop_requested:
                    self._runner.stopping(never_ran)
                self._runner.abandon(never_ran)
            if self._tracing is not None:
                self._tracing.close()
        finally:
            if self._log is not None:
                self._log.close()
            with contextlib.suppress(Exception):
                self._group.close()
            self._stops.restore()

    # --- running -----------------------------------------------------------------------

    def run(self) -> StartupResult:
        """Run the startup to its end in a new event loop (opening and
        closing around it when not inside ``with``).

        Returns:
            The result, when this rank reached ready.

        Raises:
            BaseException: the original error that failed the startup, after
                its events and the run's end are flushed.
            StartupInterrupted: a stop was asked (a signal, or :meth:`stop`).
        """
        return anyio.run(self.arun)

    async def arun(self) -> StartupResult:
        """:meth:`run` for a caller already in an event loop (asyncio or
        trio); signals are watched only when it runs in the main thread."""
        opened_here = self._state == "new"
        if opened_here:
            self.open()
        if self._state != "open" or self._ran:
            raise RuntimeError("a Startup runs once, while open")
        self._ran = True
        try:
            await self._run_watching_signals()
        finally:
            self._scope = None
            _write_elastic_error(self._env, self._finished, consequence=self._group_broken())
            if opened_here:
                self.close()
        return self._returned()

    async def _end_with_peers(self) -> None:
        """After the run, for a rank that waits for its peers (only such a
        rank prints the WARNINGs it held, see ``wait_for_peers``): the last
        exchange, or the held WARNINGs printed without one, then the logs
        in one place. A stop asked meanwhile ends whichever wait is going on."""
        end_started = anyio.current_time()
        bridge, identity, group = self._bridge, self.identity, self._group.group
        if bridge is None or identity is None or not self._wait_for_peers:
            return
        interrupted = self._outcome() is events.RunOutcome.INTERRUPTED
        broken = not interrupted and self._group_broken()
        if broken and group is not None:
            # Known without asking: the ranks did not end together.
            self._peers_finished = False
        if interrupted or broken or group is None or identity.world_size == 1:
            bridge.release()
        else:
            await self._exchange_with_peers(bridge, identity, group)
        await self._collect_logs(identity, end_started)

    async def _run_watching_signals(self) -> None:
        assert self._runner is not None
        assert self._graph_to_run is not None
        from ._signals import STOP_SIGNALS

        stops = self._stops
        watch = self._handle_signals and threading.current_thread() is threading.main_thread()
        # Made before the signals are watched: a stop asked before the loop
        # ran (even before open) cancels it at once, and the run then begins
        # cancelled.
        run_scope = self._scope = anyio.CancelScope()
        if self._runner.stop_requested:
            run_scope.cancel()
        try:
            async with anyio.create_task_group() as group:
                if watch:

                    async def watch_signals(
                        *, task_status: Any = anyio.TASK_STATUS_IGNORED
                    ) -> None:
                        with anyio.open_signal_receiver(*STOP_SIGNALS) as signals:
                            task_status.started()
                            async for signum in signals:
                                stops.record(signum)

                    await group.start(watch_signals)
                    stops.on_signal = lambda _signum: self.stop()
                    if stops.requested:
                        self.stop()
                try:
                    with run_scope:
                        try:
                            await self._runner.run(self._graph_to_run)
                        except anyio.get_cancelled_exc_class():
                            raise
                        except BaseException as exc:
                            # Recorded in the log (run.finished names it);
                            # raised to the caller once everything is flushed.
                            self._error = exc
                    # Still watching: a stop during the last exchange or the
                    # collection of the logs ends that wait, not the process;
                    # one from now on, before a wait begins, ends the next.
                    self._scope = anyio.CancelScope()
                    await self._end_with_peers()
                finally:
                    stops.on_signal = None
                    group.cancel_scope.cancel()
        finally:
            if watch:
                # The receiver closed and put the default handlers back: a
                # stop from now on (the launcher's, while the logs are
                # collected) is recorded, not the process's end.
                stops.reinstall()

    def stop(self, reason: StartupInterrupted | None = None) -> None:
        """Stop the running startup: it ends ``interrupted`` with ``reason``
        (default: the signal received, or "asked by its launcher") as its
        cause; asked before the run (even before :meth:`open`), it begins
        stopped. Call it from the thread that runs the startup."""
        from ._errors import StartupInterrupted

        if reason is None:
            reason = (
                self._stops.cause()
                if self._stops.requested
                else StartupInterrupted(None, "asked by its launcher")
            )
        if self._runner is None:
            self._stop_asked = reason
            return
        self._runner.stopping(reason)
        if self._scope is not None:
            self._scope.cancel()

    @contextlib.contextmanager
    def _wait_after_run(self) -> Iterator[anyio.CancelScope]:
        """The scope of a wait after the run, which :meth:`stop` cancels;
        a stop asked since the previous wait ended cancels it at once."""
        assert self._scope is not None
        try:
            with self._scope as scope:
                yield scope
        finally:
            self._scope = anyio.CancelScope()

    def _group_broken(self) -> bool:
        """Whether the run failed in an exchange with its peers: their
        collectives no longer line up, so a last exchange would only wait
        out the group timeout."""
        from ._group import GROUP_ERROR_NAME, GroupError

        if isinstance(self._error, GroupError):
            return True
        cause = self._finished.cause if self._finished is not None else None
        return cause is not None and cause.type == GROUP_ERROR_NAME

    async def _exchange_with_peers(
        self, bridge: LoggingBridge, identity: RankIdentity, group: Group
    ) -> None:
        """The ranks' last exchange: who finished, and which WARNINGs each
        derived; then print the held WARNINGs no lower rank printed."""
        payload: JsonValue = {
            "exchange": _END_OF_RUN,
            "node_rank": identity.node_rank,
            "warnings": [
                [message.code, message.text]
                for message in bridge.state.messages(identity.rank)
                if message.severity is Severity.WARNING
            ],
        }
        gathered: list[JsonValue] = []
        with self._wait_after_run():
            gathered = (
                await self._with_peers("end-of-run exchange", group.all_gather, payload) or []
            )
        # The exchange is tagged: a rank that left early may meet its peers
        # still inside the startup's own exchanges, and both sides must see
        # that rather than misread it.
        self._peers_finished = bool(gathered) and all(
            isinstance(entry, dict) and entry.get("exchange") == _END_OF_RUN for entry in gathered
        )
        # Unless every peer answered, none is known to have printed a WARNING.
        printed = _printed_below(gathered, identity) if self._peers_finished else {}
        bridge.release(lambda m: (m.code, m.text) in printed.get(m.scope, ()))

    # --- the whole run in one place ------------------------------------------------------

    def _mailbox_key(self, kind: str, rank: int) -> str:
        return f"startup-orchestrator/{self.run_id}/{kind}/{rank}"

    def _announce(self, group: Group) -> None:
        """Tell rank 0, as soon as the group is formed, where this rank runs,
        so that the run's record says who it was even if its log never
        arrives."""
        import orjson

        from events._codec import unstructure

        from ._group import Mailbox

        identity = self.identity
        if identity is None or identity.rank == 0 or not isinstance(group, Mailbox):
            return
        whereabouts = unstructure(_own_process(identity))
        # Any error: a group of the caller's own may break its contract, and
        # delivery never fails a run.
        with contextlib.suppress(Exception):
            group.post(self._mailbox_key("peer", identity.rank), orjson.dumps(whereabouts))

    async def _collect_logs(self, identity: RankIdentity, end_started: float) -> None:
        """The run's logs in one place: every rank but 0 posts its whole log
        to the process group's store; rank 0 takes them until the group
        timeout has passed since ``end_started`` (bounded by the two
        constants above), stores those its run directory lacks (a shared
        filesystem already has them), and writes the run's manifest: every
        rank, where it ran, and why a log did not arrive."""
        from ._group import Mailbox
        from ._run_directory import RunDirectoryError

        log, run_dir, launch = self._log, self.run_dir, self._launch
        if log is None or run_dir is None or launch is None or identity.world_size == 1:
            return
        group = self._group.group
        mailbox = group if isinstance(group, Mailbox) else None
        bound = self._group_timeout_s
        if self._outcome() is events.RunOutcome.INTERRUPTED or (
            identity.rank == 0 and mailbox is not None and self._stops.requested
        ):
            # Stopped during the run: the peers were most likely stopped
            # together and post at once; do not hold the launcher.
            bound = min(bound, _INTERRUPTED_COLLECTION_S)
        if identity.rank != 0:
            if mailbox is None:
                return
            key, content = self._mailbox_key("log", identity.rank), log.path.read_bytes()
            with anyio.move_on_after(bound):
                await self._with_peers("log hand-in", mailbox.post, key, content)
            return
        deadline = max(end_started + bound, anyio.current_time() + min(bound, _LAST_POSTS_S))
        entries = await self._take_logs(identity, run_dir, mailbox, bound, deadline)
        self._undelivered = tuple(entry.rank for entry in entries if entry.not_delivered)
        launcher = attrs.evolve(launch.launcher, finished_wall_ns=time.time_ns())
        manifest = attrs.evolve(launch, launcher=launcher, ranks=tuple(entries))
        # A launcher's manifest (one that started the ranks itself) is
        # never replaced: it knows more.
        with contextlib.suppress(RunDirectoryError):
            manifest.write(run_dir, exclusive=True)
        if self._tracing is not None:
            from ._launch_trace import send_launch_span_of

            send_launch_span_of(self._tracing, run_dir, slices=self._slices)

    async def _take_logs(
        self,
        identity: RankIdentity,
        run_dir: Path,
        mailbox: Mailbox | None,
        bound: float,
        deadline: float,
    ) -> list[RankProcess]:
        """Rank 0's side of :meth:`_collect_logs`: one manifest entry per rank."""
        from ._run_directory import Collected, RunDirectoryError, rank_log_path, store_collected_log

        entries = [attrs.evolve(_own_process(identity), collected=True)]
        announced: dict[int, bytes | None] = {}

        def entry(rank: int, reason: str | None, content: bytes | None = None) -> RankProcess:
            path = rank_log_path(run_dir, rank)
            if content is not None:
                try:
                    stored = store_collected_log(run_dir, rank, content)
                except RunDirectoryError as exc:
                    reason = f"delivered, not stored: {exc}"
                else:
                    reason = (
                        f"delivered a log that differs from the one already in {path.name} (kept)"
                        if stored is Collected.CONFLICT
                        else None
                    )
            elif path.exists():
                reason = None
            found = events.RankProcess(rank=rank, not_delivered=reason, collected=path.exists())
            return _whereabouts(found, announced.get(rank))

        if mailbox is None:
            formed = self._group.group is not None
            state = "no store to deliver it through" if formed else "no process group was formed"
            reason = f"did not deliver its log to rank 0 ({state})"
            return [*entries, *(entry(rank, reason) for rank in range(1, identity.world_size))]
        # Where each rank ran, as it announced once the group formed: one
        # quick look each, first, so a stop while waiting loses none of it.
        for rank in range(1, identity.world_size):
            announced[rank] = await self._take(mailbox, "peer", rank, 0.0)
        with self._wait_after_run():
            for rank in range(1, identity.world_size):
                reason = (
                    # Rank 0 was stopped after its run ended, cutting the
                    # wait short: the rank is not to blame for a log that
                    # may be on its way (the log, closed, cannot say so).
                    self._not_collected()
                    if self._stops.requested
                    and self._outcome() is not events.RunOutcome.INTERRUPTED
                    else f"did not deliver its log to rank 0 within {bound:g} s of rank 0's "
                    "end (dead, partitioned, or still running)"
                )
                if announced.get(rank) is None:  # a late announcement
                    announced[rank] = await self._take(mailbox, "peer", rank, 0.0)
                wait = max(0.0, deadline - anyio.current_time())
                content = await self._take(mailbox, "log", rank, wait)
                entries.append(entry(rank, reason, content))
        # The ranks a stop left unreached.
        unreached = range(len(entries), identity.world_size)
        return [*entries, *(entry(rank, self._not_collected()) for rank in unreached)]

    def _not_collected(self) -> str:
        """Why a rank's log is not here when rank 0 was stopped first."""
        stop = self._stops.cause()
        by = f"by {stop.signal}" if stop.signal else "by its caller"
        if self._outcome() is events.RunOutcome.INTERRUPTED:
            return f"was not collected: rank 0 was stopped {by} before the end of the run"
        return (
            f"was not collected: rank 0 was stopped {by} after its startup ended, before this "
            "rank's log came (its own node's run directory may hold it)"
        )

    async def _take(self, mailbox: Mailbox, kind: str, rank: int, wait: float) -> bytes | None:
        """What ``rank`` posted under ``kind``; ``None`` when nothing came or
        the store cannot be reached (the rank is then named missing)."""
        key = self._mailbox_key(kind, rank)
        return await self._with_peers("log collection", mailbox.take, key, wait)

    async def _with_peers(self, what: str, call: Callable[..., _T], *args: Any) -> _T | None:
        """``call(*args)``, which may wait on peers that never come, in a
        daemon thread; ``None`` when it raised: a peer, or a group of the
        caller's own that breaks its contract, never fails this rank's end.
        A stop asked meanwhile cancels the wait (see :meth:`stop`)."""
        try:
            return await self._threads.run("", call, *args, name=f"startup: {what}")
        except Exception:
            return None

    # --- results -----------------------------------------------------------------------

    def _outcome(self) -> RunOutcome:
        return events.RunOutcome.FAILED if self._finished is None else self._finished.outcome

    @property
    def result(self) -> StartupResult | None:
        """What the startup decided, once it ran (whatever its outcome)."""
        if not self._ran or self._log is None or self.run_dir is None:
            return None
        assert self.identity is not None
        assert self.run_id is not None
        rank = self.identity.rank
        logged = list(self._log.read())
        messages = () if self._bridge is None else self._bridge.state.messages(rank)
        return StartupResult(
            run_id=self.run_id,
            rank=rank,
            world_size=self.identity.world_size,
            outcome=self._outcome(),
            state=events.replay(logged, slices=self._slices).states[rank],
            steps=_step_results(logged),
            messages=messages,
            log_path=self._log.path,
            run_dir=self.run_dir,
            peers_finished=self._peers_finished,
            undelivered=self._undelivered,
        )

    def _returned(self) -> StartupResult:
        from ._errors import OrchestratorError, StartupInterrupted

        result = self.result
        assert result is not None
        if result.outcome is events.RunOutcome.READY:
            return result
        if self._error is not None:
            raise self._error
        stop = self._finished.stop if self._finished is not None else None
        if stop is not None:
            raise StartupInterrupted(stop.signal, stop.reason)
        raise OrchestratorError(f"rank {result.rank} did not reach ready ({result.outcome})")


def print_messages(level: Severity) -> None:
    """Print the derived messages (the ``orchestrator.*`` loggers) from
    ``level`` up on stderr, and nowhere else: a rank's live stream."""
    from exporters import MESSAGE_LOGGER_PREFIX

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)-7s %(message)s"))
    logger = logging.getLogger(MESSAGE_LOGGER_PREFIX)
    logger.addHandler(handler)
    logger.setLevel(int(level))
    logger.propagate = False


def _own_process(identity: RankIdentity) -> RankProcess:
    return events.RankProcess(
        rank=identity.rank,
        pid=os.getpid(),
        host=platform.node(),
        node_rank=identity.node_rank,
        local_rank=identity.local_rank,
    )


def _whereabouts(entry: RankProcess, posted: bytes | None) -> RankProcess:
    """``entry`` with what the rank announced of itself (its own
    :class:`~events.RankProcess` record), when it did."""
    import orjson

    from events._codec import structure

    if posted is None:
        return entry
    try:
        said = structure(events.RankProcess, orjson.loads(posted))
    except (orjson.JSONDecodeError, events.DecodeError):
        return entry
    return attrs.evolve(
        entry, pid=said.pid, host=said.host, node_rank=said.node_rank, local_rank=said.local_rank
    )


def _printed_below(
    gathered: list[JsonValue], identity: RankIdentity
) -> dict[Scope, set[tuple[str, str]]]:
    """The WARNINGs a lower rank derived, by scope: of this node (scope
    ``local``: local rank 0 printed them, or a lower rank releases them) or
    of the world (scope ``global``). This rank prints only the others."""
    local: set[tuple[str, str]] = set()
    world: set[tuple[str, str]] = set()
    for rank, entry in enumerate(gathered):
        if rank >= identity.rank or not isinstance(entry, dict):
            continue
        warnings = entry.get("warnings")
        keys = {
            (str(item[0]), str(item[1]))
            for item in (warnings if isinstance(warnings, list) else [])
            if isinstance(item, list) and len(item) == 2
        }
        world |= keys
        if entry.get("node_rank") == identity.node_rank:
            local |= keys
    return {Scope.LOCAL: local, Scope.GLOBAL: world}


def _elastic_agent(env: Mapping[str, str]) -> int | None:
    """The torchrun agent that started this rank, when it did: its workers
    run in sessions of their own, so an agent killed outright (its node
    going down, the OOM killer) would otherwise leave them running."""
    if "TORCHELASTIC_RUN_ID" not in env or "TORCHELASTIC_RESTART_COUNT" not in env:
        return None
    parent = os.getppid()
    return parent if parent > 1 else None


def _write_elastic_error(
    env: Mapping[str, str], finished: RunFinished | None, *, consequence: bool
) -> None:
    """Under torchrun, a rank that did not reach ready says why in
    torchelastic's error file (the exception, its traceback, the time), so
    that torchrun's summary shows it; its "Root Cause (first observed
    failure)" is the failure with the earliest time there, in whole seconds,
    the lowest rank on a tie. So a rank's own failure is stamped with the
    second it happened in, and a failure that follows another rank's (this
    one was stopped, or failed in an exchange with its peers) with the
    second after it happened: never earlier than the failure it follows.
    Nothing is written for a ready rank, or where the file cannot be."""
    import orjson

    from events._files import write_file

    path = env.get("TORCHELASTIC_ERROR_FILE")  # set per worker
    if not path or finished is None or finished.outcome is events.RunOutcome.READY:
        return
    seconds = finished.wall_ns // 1_000_000_000
    if consequence or finished.outcome is events.RunOutcome.INTERRUPTED:
        seconds += 1
    cause = finished.cause
    where = f" (step {finished.failed_step})" if finished.failed_step else ""
    reason = cause.reason if cause is not None else f"startup {finished.outcome.value}"
    document = {
        "message": {
            "message": f"{reason}{where}",
            "extraInfo": {
                "py_callstack": cause.format() if cause is not None else reason,
                "timestamp": str(seconds),
            },
        }
    }
    with contextlib.suppress(OSError):
        write_file(Path(path), orjson.dumps(document))


def trace_parent(env: Mapping[str, str]) -> tuple[str, str] | None:
    """The launcher's ``TRACEPARENT``, checked before the log opens.

    Raises:
        ValueError: it is malformed.
    """
    traceparent = env.get("TRACEPARENT", "").strip()
    if not traceparent:
        return None
    from exporters import parse_traceparent

    try:
        parsed = parse_traceparent(traceparent)
    except ValueError as exc:
        raise ValueError(f"TRACEPARENT={traceparent!r}: {exc}") from None
    return parsed.trace_id, parsed.span_id


def checked_fault_plan(
    faults: FaultPlan | Sequence[str] | None,
    world_size: int,
    graph: Graph | None = None,
    engine: Literal["reference", "vllm"] = "reference",
) -> FaultPlan:
    """The plan of ``faults``, checked against the world and the targets a
    fault may name: the ``engine``'s (``process_group`` only in a world of
    several ranks: one rank forms no group), or the steps of a ``graph`` of
    the caller's own and any module (its probes' imports are not known in
    advance)."""
    from ._faults import FaultPlan

    plan = faults if isinstance(faults, FaultPlan) else FaultPlan.parse(faults or ())
    if plan:
        targets: Collection[str]
        if graph is None:
            from ._errors import FaultSpecError
            from ._group import PROCESS_GROUP_STEP
            from .engine import injection_targets

            targets = injection_targets(engine=engine)
            lone = next((f for f in plan.faults if f.target == PROCESS_GROUP_STEP), None)
            if world_size == 1 and lone is not None:
                raise FaultSpecError(
                    lone.describe(),
                    lone.target,
                    "a run of one rank forms no process group, so the fault would never "
                    "fire; launch two ranks or more",
                )
        else:
            targets = [*graph.steps, *(f.target for f in plan.faults if "/" not in f.target)]
        plan.check(world_size=world_size, targets=targets)
    return plan


def _step_results(logged: Sequence[Event]) -> dict[str, StepResult]:
    """How each step that ended in ``logged`` ended, by step path, in the
    order they ended."""
    from events import StepCancelled, StepSucceeded, StepUnavailable, outcome_of, reason_of

    from ._context import StepResult

    results: dict[str, StepResult] = {}
    for event in logged:
        outcome = outcome_of(event)
        if outcome is None:
            continue
        reasons: tuple[str, ...] = ()
        if isinstance(event, StepUnavailable):
            reasons = event.reasons
        elif not isinstance(event, StepSucceeded):
            # Failed, timed out, crashed or cancelled: why, as the run said it.
            reason = event.reason if isinstance(event, StepCancelled) else reason_of(event)
            reasons = (reason,) if reason else ()
        results[event.step] = StepResult(
            step=event.step,
            outcome=outcome,
            value=event.result if isinstance(event, StepSucceeded) else None,
            reasons=reasons,
            exception=getattr(event, "cause", None),
        )
    return results
