"""The derived state per rank, the root cause across ranks, and cross-rank
divergences; :func:`replay` folds a whole run in one pass."""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

import attrs
import orjson

from ._builders import evolve
from ._errors import LogError
from ._failures import _track
from ._launch import LaunchRecord, RankProcess, implausible_world, signal_name
from ._messages import (
    GroupedMessage,
    Message,
    Messages,
    MessagesState,
    RankMessages,
    format_ranks,
    group_messages,
)
from ._model import (
    _UNAVAILABLE_OUTCOMES,
    DecisionMade,
    Event,
    JsonValue,
    RunFinished,
    RunOutcome,
    RunStarted,
    StepCancelled,
    StepCrashed,
    StepStalled,
    StepStarted,
    StepSucceeded,
)
from ._rank_state import ELSEWHERE, RankState, RootCause, _root_cause, _StateTracking
from ._reader import LogContents, check_logs
from ._reducers import (
    DECISION,
    ENDED,
    KINDS,
    RUN_FINISHED,
    RUN_STARTED,
    STALLED,
    STARTED,
    SUCCEEDED,
    Projection,
    fold,
)
from ._severity import Scope, Severity
from ._slices import Slice, cause_of, checked_slices
from ._timeline import RankTimeline, Timeline, TimelineState

__all__ = [
    "Divergence",
    "FoldedRank",
    "RankFolder",
    "RankStates",
    "Replay",
    "find_divergences",
    "replay",
    "root_cause",
]

#: Which of several root causes came first: the earliest, then the lowest rank.
_first = operator.attrgetter("wall_ns", "rank")


class RankStates(Projection[Mapping[int, RankState]]):
    """Projection: rank -> :class:`RankState` from any stream of events.

    Args:
        slices: whose facts to keep (their initial values, result columns
            and ``derive_facts`` hooks) and whose ``state_type`` to build
            (the first slice that names one).
    """

    def __init__(self, slices: Sequence[Slice] = ()) -> None:
        #: The slices the states are derived with.
        self.slices = tuple(slices)
        self._facts: dict[str, JsonValue] = {}
        self._results: dict[str, list[tuple[str, str | None]]] = {}
        for part in self.slices:
            self._facts.update(part.facts)
            for column in part.columns:
                if column.step is not None:
                    self._facts.setdefault(column.fact, None)
                    self._results.setdefault(column.step, []).append((column.fact, column.key))
        self._hooks = tuple(
            part.derive_facts for part in self.slices if part.derive_facts is not None
        )
        self._type: type[RankState] = next(
            (part.state_type for part in self.slices if part.state_type is not None), RankState
        )

    def new(self, rank: int, run_id: str | None) -> RankState:
        """A rank's state before its first event."""
        return self._type(rank=rank, run_id=run_id, facts=self._facts)

    def initial(self) -> Mapping[int, RankState]:
        """No ranks yet."""
        return {}

    def apply_many(
        self, state: Mapping[int, RankState], events: Iterable[Event]
    ) -> Mapping[int, RankState]:
        """The state after every event of ``events`` in turn; unchanged ranks
        are shared, and ``state`` itself is returned when no rank changed."""
        ranks = dict(state)
        changed = False
        for rank, run in itertools.groupby(events, operator.attrgetter("rank")):
            first = next(run)
            fold = _StateFold(self, ranks.get(rank) or self.new(rank, first.run_id))
            for event in itertools.chain((first,), run):
                fold.derive(event)
            ranks[rank], changed = fold.freeze(), True
        return ranks if changed else state


class _StateFold:
    """One rank's state while a run of its events is folded."""

    def __init__(self, setup: RankStates, state: RankState) -> None:
        tracking = state.tracking
        self.base = state
        self.results = setup._results
        self.hooks = setup._hooks
        self.rank = state.rank
        self.run_id = state.run_id
        self.identity = state.identity
        self.outcome = state.outcome
        self.facts = dict(state.facts)
        self.failure = state.failure
        self.open_steps = list(state.open_steps)
        self.last_event_step = state.last_event_step
        self.last_wall_ns = state.last_wall_ns
        self.last_seq = state.last_seq
        self.stalls = dict(state.stalls)
        self.root_span_id = tracking.root_span_id
        self.failures = tracking.failures
        self.finished = tracking.finished
        self.cancelled = list(tracking.cancelled)

    def freeze(self) -> RankState:
        return evolve(
            self.base,
            {
                "run_id": self.run_id,
                "identity": self.identity,
                "outcome": self.outcome,
                "facts": self.facts,
                "failure": self.failure,
                "open_steps": tuple(self.open_steps),
                "last_event_step": self.last_event_step,
                "last_wall_ns": self.last_wall_ns,
                "last_seq": self.last_seq,
                "stalls": self.stalls,
                "tracking": _StateTracking(
                    root_span_id=self.root_span_id,
                    failures=self.failures,
                    finished=self.finished,
                    cancelled=tuple(self.cancelled),
                ),
            },
        )

    # Any: the kind table stands for isinstance tests the type checker cannot follow.
    def derive(self, event: Any) -> None:
        self.last_wall_ns = event.wall_ns
        self.last_seq = event.seq
        kind = KINDS[type(event)]
        if kind == STARTED:
            self.open_steps.append(event.step)
            self.last_event_step = event.step
        elif kind in (SUCCEEDED, ENDED):
            step = event.step
            if step in self.open_steps:
                self.open_steps = [s for s in self.open_steps if s != step]
            self.last_event_step = step
            if isinstance(event, StepCancelled):
                self.cancelled.append(step)
            self.failures, settled, _ = _track(self.failures, event, self.root_span_id)
            if settled is not None and self.failure is None:
                self.failure = _root_cause(settled, None, self.rank, self.outcome, self.stalls)
        elif kind == STALLED:
            self.stalls[event.step] = event
        elif kind == RUN_STARTED:
            self.identity = event.identity
            self.run_id = event.run_id
            self.root_span_id = event.span_id
        elif kind == RUN_FINISHED:
            self.failures, settled, _ = _track(self.failures, event, self.root_span_id)
            self.finished = event
            self.outcome = event.outcome
            if settled is not None and self.failure is None:
                self.failure = _root_cause(
                    settled, event.cause, self.rank, self.outcome, self.stalls
                )
            elif self.failure is not None:
                self.failure = attrs.evolve(self.failure, outcome=event.outcome)
        if kind in (SUCCEEDED, ENDED, DECISION):
            # The facts it settles: the slices' result columns of a
            # succeeded step, then their hooks, each seeing the facts so far.
            facts = self.facts
            if isinstance(event, StepSucceeded):
                result = event.result
                keyed = result if isinstance(result, dict) else {}
                for fact, key in self.results.get(event.step, ()):
                    facts[fact] = result if key is None else keyed.get(key)
            for hook in self.hooks:
                if changed := hook(facts, event):
                    facts.update(changed)


def root_cause(states: Mapping[int, RankState] | Iterable[RankState]) -> RootCause | None:
    """The run's root cause: the earliest (by wall-clock time, then rank) of
    the ranks' root causes. A rank that died counts, at its last event."""
    values = states.values() if isinstance(states, Mapping) else states
    causes = [cause for state in values if (cause := state.root_cause) is not None]
    return min(causes, key=_first, default=None)


@attrs.frozen(kw_only=True)
class Divergence:
    """Values that must agree and do not: ranks that decided differently
    where a slice's :class:`~events.Agreement` says they must agree (found
    on replay by :func:`find_divergences`), or a recorded decision that the
    current code decides differently (:meth:`of_decision`; the
    orchestrator's decision check).

    Attributes:
        code: the agreement's code (``my_engine.backend_divergence``), or
            :attr:`DECISION` for a decision.
        severity, scope: the code's, from the slices (a decision's: error, process).
        subject: the fact compared, or the decision's name.
        values: each value (``None``: the agreement's ``none_text``) with its
            ranks, ordered by lowest rank; a decision's recorded value (as
            JSON text) with its rank.
        text: what differs and what to do.
        step, seq: where a decision was recorded (``None`` across ranks).
        recorded, recomputed: a decision's value in the live run and the
            value the current deciders give (or an error text); ``None``
            across ranks.
    """

    #: The code of a recorded decision that current code decides differently.
    DECISION: ClassVar[str] = "decision.divergence"

    code: str
    severity: Severity
    scope: Scope
    subject: str
    values: tuple[tuple[str | None, tuple[int, ...]], ...]
    text: str
    step: str | None = None
    seq: int | None = None
    recorded: JsonValue = None
    recomputed: JsonValue = None

    @classmethod
    def of_decision(cls, decision: DecisionMade, recomputed: JsonValue) -> Divergence:
        """``decision`` as recorded, against the ``recomputed`` value that
        current code gives for the same events."""
        return cls(
            code=cls.DECISION,
            severity=Severity.ERROR,
            scope=Scope.PROCESS,
            subject=decision.name,
            values=((orjson.dumps(decision.value).decode(), (decision.rank,)),),
            text=(
                f"rank {decision.rank} seq {decision.seq} ({decision.step}): decision "
                f"{decision.name} was {decision.value!r} live, replay decides {recomputed!r}"
            ),
            step=decision.step,
            seq=decision.seq,
            recorded=decision.value,
            recomputed=recomputed,
        )

    @property
    def ranks(self) -> tuple[int, ...]:
        """Every rank involved, ascending."""
        return tuple(sorted(rank for _value, ranks in self.values for rank in ranks))

    def grouped(self) -> GroupedMessage:
        """As a grouped message, for reports."""
        return GroupedMessage(
            code=self.code,
            severity=self.severity,
            scope=self.scope,
            text=self.text,
            ranks=self.ranks,
        )


def find_divergences(
    states: Mapping[int, RankState] | Iterable[RankState], *, slices: Sequence[Slice] = ()
) -> tuple[Divergence, ...]:
    """Compare the ranks' facts that ``slices`` say must agree
    (:class:`~events.Agreement`), in the slices' order, with the severities
    and scopes the slices give their codes."""
    # By rank: each value's ranks come ascending, the values by their lowest rank.
    values = sorted(
        states.values() if isinstance(states, Mapping) else states, key=operator.attrgetter("rank")
    )
    rule = Messages(slices=slices).rule
    found: list[Divergence] = []
    for agreement in (agreement for part in slices for agreement in part.agreements):
        subject, among = agreement.fact, agreement.among
        by_value: dict[str | None, list[int]] = {}
        for state in values:
            value = state.facts.get(subject)
            took_part = value is not None if among is None else state.facts.get(among)
            if took_part:
                by_value.setdefault(None if value is None else str(value), []).append(state.rank)
        if len(by_value) < 2:
            continue
        ordered = [(value, tuple(ranks)) for value, ranks in by_value.items()]
        listing = "; ".join(
            f"{agreement.none_text if value is None else value} on {format_ranks(ranks)}"
            for value, ranks in ordered
        )
        severity, scope = rule(agreement.code)
        advice = agreement.advice
        found.append(
            Divergence(
                code=agreement.code,
                severity=severity,
                scope=scope,
                subject=subject,
                values=tuple(ordered),
                text=f"{agreement.what}: {listing}. {advice[0].upper()}{advice[1:]}",
            )
        )
    return tuple(found)


@attrs.frozen(kw_only=True)
class Replay:
    """A whole run, re-derived from its logs and judged against its world.

    Attributes:
        run_id: the launch (``None`` for no events).
        world_size: the expected number of ranks: the launcher's, else the
            largest in the ranks' ``run.started``, else the highest rank + 1.
        slices: the slices the run was derived with (their columns make the
            report's table).
        states: rank -> :class:`RankState` (or the slices' state type), for
            the ranks that have events.
        message_state: the messages projection's state (for
            :func:`~events.step_severity`).
        messages: every rank's messages, by time.
        grouped: messages grouped across ranks, then the divergences.
        root_cause: the run's root cause, if it did not end ready.
        divergences: cross-rank divergences.
        timeline: when each step of each rank ran.
        warnings: about the logs themselves (torn tails, missing ranks).
        no_events: ranks of the world that have no events, with why
            (``"no log"``, ``"empty log"``, or, without a launcher's record,
            ``"another node's"`` for the ranks of a node none of whose logs
            are here: they are never taken for the root cause while a rank
            here is).
        launch: what the launcher recorded of the run, when known.
        until: the cutoff (``seq``) the run was replayed to, if any.
        simulated: the simulated host the ranks ran on, if any (several,
            each once, joined by ``", "``).
        injected: the faults injected on any rank, each once.
        pids: rank -> the process id its ``run.started`` recorded.
    """

    run_id: str | None
    world_size: int
    states: Mapping[int, RankState]
    message_state: MessagesState
    messages: tuple[Message, ...]
    grouped: tuple[GroupedMessage, ...]
    root_cause: RootCause | None
    divergences: tuple[Divergence, ...]
    timeline: TimelineState
    warnings: tuple[str, ...] = ()
    no_events: Mapping[int, str] = attrs.field(factory=dict)
    launch: LaunchRecord | None = None
    until: int | None = None
    simulated: str | None = None
    injected: tuple[str, ...] = ()
    slices: tuple[Slice, ...] = ()
    pids: Mapping[int, int] = attrs.field(factory=dict)

    @property
    def ranks(self) -> tuple[int, ...]:
        """The ranks that have events, ascending."""
        return tuple(sorted(self.states))

    def outcome_of(self, rank: int) -> RunOutcome:
        """A rank's outcome (``incomplete`` for a rank without events;
        ``running`` for an unfinished rank at a cutoff, or one whose
        process was seen alive)."""
        if (state := self.states.get(rank)) is None:
            return RunOutcome.INCOMPLETE
        if not state.finished and (self.until is not None or rank in self.running):
            return RunOutcome.RUNNING
        return state.outcome

    def waits_for_another(self, stall: StepStalled | None) -> bool:
        """Whether ``stall`` shows its thread waiting for another process of
        the launch (where the slices' :attr:`Slice.peer_waits` say)."""
        return any(part.waits_for_another(stall) for part in self.slices)

    @property
    def running(self) -> frozenset[int]:
        """The ranks seen still running when the logs were read
        (:attr:`LaunchRecord.running`)."""
        return self.launch.running if self.launch is not None else frozenset()

    @property
    def outcome(self) -> RunOutcome:
        """The run's outcome, judged against its world (SPEC §6):
        ``incomplete`` if a rank of the world has no events or no
        ``run.finished`` (it died, was killed, or never started); else the
        root cause's own outcome, ``failed`` or ``interrupted`` (a stop that
        made the other ranks fail in their exchanges is an interrupted run;
        a failure that the others were then stopped for is a failed one);
        else ``ready``. At a cutoff (``until``), a rank that had not finished
        yet is ``running``, as is an unfinished rank seen alive
        (:attr:`running`), and so is the run unless a rank had already
        failed or been interrupted. No ranks at all is ``incomplete``."""
        outcomes = {self.outcome_of(rank) for rank in {*range(self.world_size), *self.states}}
        if RunOutcome.INCOMPLETE in outcomes or not self.states:
            return RunOutcome.INCOMPLETE
        cause = self.root_cause
        if cause is not None and cause.outcome in (RunOutcome.FAILED, RunOutcome.INTERRUPTED):
            return cause.outcome
        worst = (RunOutcome.FAILED, RunOutcome.INTERRUPTED, RunOutcome.RUNNING)
        return next((outcome for outcome in worst if outcome in outcomes), RunOutcome.READY)


@attrs.frozen(kw_only=True)
class FoldedRank:
    """One rank's log folded on its own (:meth:`RankFolder.fold`): everything
    :func:`replay` needs of the rank to judge the run, in place of its
    events; small and picklable, so it can be sent on.

    Attributes:
        rank, run_id: whose log it is.
        owner: where the events came from (a log's path), for errors.
        slices: the names of the slices it was folded with.
        until: the cutoff (``seq``) it was folded to, if any.
        state: the rank's :class:`RankState` (or the slices' state type).
        messages: the rank's messages (``None`` before any).
        timeline: when each of its steps ran (``None`` before any started).
        started: its ``run.started``, when its log begins with one.
        first_wall_ns: when its first event was written.
        watched: the processes it started and saw end (a step with a
            ``pid`` attribute that ended ``crashed``): ``(pid, started,
            ended, exit code, signal name)``, in the order they ended.
        left_out: the first :class:`~events.Collective` step it went on
            without, as a root cause (``None`` if none).
        warnings: about the log itself (its torn tail).
    """

    rank: int
    run_id: str
    owner: str | None
    slices: tuple[str, ...]
    until: int | None
    state: RankState
    messages: RankMessages | None
    timeline: RankTimeline | None
    started: RunStarted | None
    first_wall_ns: int
    watched: tuple[tuple[int, int, int, int | None, str | None], ...] = ()
    left_out: RootCause | None = None
    warnings: tuple[str, ...] = ()


class RankFolder:
    """Folds ranks' logs one at a time, each on its own, with ``slices`` and
    to ``until``, as :func:`replay` does: pass what :meth:`fold` gives to
    :func:`replay` with the same ``slices`` and ``until`` to judge the run.
    Use one folder for every rank of a run (where the logs are: a worker
    process, the node that wrote them); it keeps what the slices' rules
    resolve to from one rank to the next.

    Attributes:
        slices: the slices it folds with.
        until: the cutoff (``seq``) it folds to, if any.

    Raises:
        TypeError: one of ``slices`` is not a :class:`~events.Slice`.
    """

    def __init__(self, slices: Sequence[Slice] = (), until: int | None = None) -> None:
        self.slices = checked_slices(slices)
        self.until = until
        self._names = tuple(part.name for part in self.slices)
        self._states = RankStates(self.slices)
        self._messages = Messages(slices=self.slices)
        self._timeline = Timeline()
        self._collectives = [collective for part in self.slices for collective in part.collectives]

    def fold(self, source: LogContents | Sequence[Event]) -> FoldedRank:
        """One rank's log (its :class:`~events.LogContents`, or its events in
        ``seq`` order), folded.

        Raises:
            FoldError: the events skip, repeat or reorder ``seq``.
            LogError: an event follows ``run.finished``.
            ValueError: no events (to ``until``), or events of several ranks.
        """
        if isinstance(source, LogContents):
            return self._fold(source.events, str(source.path), source.warnings)
        return self._fold(source, None, ())

    def _fold(
        self, events: Sequence[Event], owner: str | None, warnings: tuple[str, ...]
    ) -> FoldedRank:
        if (until := self.until) is not None:
            events = [event for event in events if event.seq <= until]
        if not events:
            raise ValueError(f"{owner or 'an event stream'}: no events to fold")
        late = next((i for i, e in enumerate(events[:-1]) if type(e) is RunFinished), None)
        if late is not None:
            after = events[late + 1]
            raise LogError(
                f"{owner or f'rank {after.rank}'}:{late + 2}: {after.TYPE} (seq {after.seq}) "
                "after run.finished: a finished rank writes nothing more"
            )
        # Each projection over the rank's whole stream: they are
        # independent, so this is what one Composite fold gives, without a
        # mapping per event. The order is checked once, by the first fold.
        states = fold(self._states, events)
        if len(states) != 1:
            raise ValueError(
                f"{owner or 'an event stream'}: events of ranks {sorted(states)}; "
                "a rank is folded alone"
            )
        ((rank, state),) = states.items()
        timeline = fold(self._timeline, events, check_order=False).ranks.get(rank)
        first = events[0]
        return FoldedRank(
            rank=rank,
            run_id=first.run_id,
            owner=owner,
            slices=self._names,
            until=until,
            state=state,
            messages=fold(self._messages, events, check_order=False).ranks.get(rank),
            timeline=timeline,
            started=first if isinstance(first, RunStarted) else None,
            first_wall_ns=first.wall_ns,
            watched=_watched(events),
            left_out=self._left_out(timeline, state),
            warnings=warnings,
        )

    def _left_out(self, timeline: RankTimeline | None, state: RankState) -> RootCause | None:
        """The first collective step (see :class:`~events.Collective`) the
        rank went on without, at the event that ended it."""
        if timeline is None:
            return None
        for collective in self._collectives:
            timing = timeline.steps.get(collective.step)
            if timing is None or timing.end is None or timing.outcome not in _UNAVAILABLE_OUTCOMES:
                continue  # not ended, joined, or failed there (a failure of its own)
            end = timing.end
            return RootCause(
                rank=state.rank,
                step=collective.step,
                exception=cause_of(end),
                outcome=state.outcome,
                wall_ns=end.wall_ns,
                seq=end.seq,
                left_out=collective.what,
            )
        return None


def replay(
    source: Iterable[Event | LogContents | FoldedRank | Sequence[Event]],
    *,
    slices: Sequence[Slice] = (),
    launch: LaunchRecord | None = None,
    until: int | None = None,
) -> Replay:
    """Re-derive a run: rank state, messages, root cause, divergences and
    timeline, folding each rank's events on its own through each projection
    (as one :class:`~events.Composite` fold would; :class:`RankFolder`), then
    judging the ranks together against the run's expected ranks.

    ``slices`` say what the run's steps mean (their facts, message rules,
    agreements and report columns); without them the run gets the kernel's
    generic state and messages. A code's severity and scope are the last
    slice's that names it (a :meth:`~events.SeverityPolicy.as_slice` put
    last overrides the others), else the kernel's.

    ``source`` may be a stream of events (one rank's, or several ranks'
    merged in any interleaving that keeps each rank's order), the
    :class:`~events.LogContents` of each rank (their torn tails become
    warnings), one event sequence per rank, or each rank already folded
    with the same ``slices`` and ``until`` (:class:`FoldedRank`).

    The world size is the launcher's (``launch``), else the largest in the
    ranks' ``run.started``. A rank of that world with no events makes the
    run ``incomplete`` and is named first: it is the root cause unless its
    launcher stopped it because of something else. Otherwise the root cause
    is the earliest failure by wall-clock time among the ranks that did not
    end ready, preferring ranks the launcher did not stop; or a rank that
    went on without a :class:`~events.Collective` step before any of them
    failed.

    With ``until``, each rank's events after ``seq`` ``until`` are left out:
    the state at that point, where an unfinished rank is ``running``.

    Raises:
        LogError: two logs of the same rank, logs of different runs, or a
            launch record of another run.
        FoldError: a rank's events skip, repeat or reorder ``seq``.
        ValueError: a :class:`FoldedRank` folded with other slices or
            another ``until``.
        TypeError: one of ``slices`` is not a :class:`~events.Slice` (an
            import path such as ``"orchestrator.engine:ENGINE"`` is what the
            command line's ``--slice`` loads; in code, pass the object), or
            ``source`` is one log or a path, not a list of them.
    """
    check_logs(source, "source")
    folder = RankFolder(slices, until)
    by_rank: dict[int, list[Event]] = {}
    #: rank -> the item of ``source`` that holds it, and what that is
    owners: dict[int, tuple[int, str]] = {}
    warnings: list[str] = []
    ranks: dict[int, FoldedRank] = {}

    def own(rank: int, owner: str) -> None:
        # By item: one log given twice is two logs of its rank.
        if (previous := owners.setdefault(rank, (index, owner))) != (index, owner):
            raise LogError(
                f"two logs for rank {rank} ({previous[1]} and {owner}); pass one log per rank"
            )

    def take(events: Iterable[Event], owner: str) -> None:
        # A log's events are, in the usual case, all of one rank: one run.
        for rank, run in itertools.groupby(events, operator.attrgetter("rank")):
            own(rank, owner)
            by_rank.setdefault(rank, []).extend(run)

    for index, item in enumerate(source):
        if isinstance(item, Event):
            by_rank.setdefault(item.rank, []).append(item)
        elif isinstance(item, FoldedRank):
            if (item.slices, item.until) != (folder._names, until):
                raise ValueError(
                    f"rank {item.rank} was folded with slices {list(item.slices)} to "
                    f"{item.until}, not {list(folder._names)} to {until}: fold every rank as "
                    "it is replayed"
                )
            own(item.rank, item.owner or f"folded rank {item.rank}")
            ranks[item.rank] = item
        elif isinstance(item, LogContents):
            warnings.extend(item.warnings)
            take(item.events, str(item.path))
        else:
            take(item, f"event stream {index}")
    for rank, events in by_rank.items():
        if until is None or any(event.seq <= until for event in events):
            ranks[rank] = folder._fold(events, owners[rank][1] if rank in owners else None, ())
    by_rank.clear()
    return _judged([ranks[rank] for rank in sorted(ranks)], folder.slices, launch, until, warnings)


def _judged(
    ranks: Sequence[FoldedRank],
    slices: tuple[Slice, ...],
    launch: LaunchRecord | None,
    until: int | None,
    warnings: list[str],
) -> Replay:
    """The run of its folded ``ranks`` (ascending), judged together."""
    run_ids = {folded.run_id for folded in ranks}
    if len(run_ids) > 1:
        raise LogError(f"logs of different runs cannot be replayed together: {sorted(run_ids)}")
    if launch is not None and launch.run_id is not None and run_ids - {launch.run_id}:
        raise LogError(
            f"the launch record ({launch.source or 'manifest'}) is of run {launch.run_id}, "
            f"the logs of run {sorted(run_ids)[0]}; pass the manifest of the same run"
        )
    states = {folded.rank: folded.state for folded in ranks}
    if watched := _watched_processes(ranks):
        # A rank's launcher knows its process better than a peer watching it.
        launch = (
            LaunchRecord(
                processes=watched, started_wall_ns=min(folded.first_wall_ns for folded in ranks)
            )
            if launch is None
            else attrs.evolve(launch, processes={**watched, **launch.processes})
        )
    logged_world = max(
        (s.identity.world_size for s in states.values() if s.identity is not None), default=0
    )
    for folded in ranks:
        warnings.extend(folded.warnings)
        state = folded.state
        claimed = max(state.rank + 1, 0 if state.identity is None else state.identity.world_size)
        if why := implausible_world(claimed, folded.owner or "a log", len(states)):
            raise LogError(why)
    empty = launch.empty_logs if launch is not None else frozenset()
    if launch is not None and launch.world_size is not None:
        if why := implausible_world(launch.world_size, launch.source or "the launch", len(states)):
            raise LogError(why)
        if logged_world and logged_world != launch.world_size:
            warnings.append(
                f"the launcher started {launch.world_size} ranks but the logs say a world "
                f"of {logged_world}; judged against the launcher's"
            )
        world_size = launch.world_size
    else:
        # Without a launcher's word, the ranks known of make the world: an
        # empty log names its rank, as a log with events does.
        world_size = logged_world or max((*states, *empty), default=-1) + 1
    no_events = {
        rank: "empty log" if rank in empty else "no log"
        for rank in range(world_size)
        if rank not in states
    }
    if launch is None or launch.source is None:
        # Without a launcher's record, each node keeps its own copy: the
        # ranks of a node none of whose logs are here are elsewhere.
        no_events.update(dict.fromkeys(_of_absent_nodes(no_events, states), ELSEWHERE))
    elif never := {
        rank: RankProcess(rank=rank, stopped_by_launcher="never started")
        for rank in no_events
        if rank not in launch.processes
    }:
        # A launcher's record lists every rank it started: one it does not
        # list was never started (the launch was stopped first).
        launch = attrs.evolve(launch, processes={**launch.processes, **never})
    if outside := sorted(rank for rank in empty if rank >= world_size):
        warnings.append(
            f"empty logs name {format_ranks(outside)}, outside the world size {world_size}: "
            "not counted"
        )
    if silent := [rank for rank, why in no_events.items() if why != ELSEWHERE]:
        warnings.append(
            f"no events from {format_ranks(silent)} of world size {world_size}: "
            "never started, or stopped before the first event"
        )
    message_state = MessagesState(
        ranks={folded.rank: folded.messages for folded in ranks if folded.messages is not None}
    )
    messages = message_state.messages()
    divergences = find_divergences(states, slices=slices)
    grouped = [*group_messages(messages), *(d.grouped() for d in divergences)]
    grouped.sort(key=lambda group: -group.severity)
    started = [folded.started for folded in ranks if folded.started is not None]
    judged = Replay(
        run_id=next(iter(run_ids), None) or (launch.run_id if launch is not None else None),
        world_size=world_size,
        states=states,
        message_state=message_state,
        messages=messages,
        grouped=tuple(grouped),
        root_cause=None,
        divergences=divergences,
        timeline=TimelineState(
            ranks={folded.rank: folded.timeline for folded in ranks if folded.timeline is not None}
        ),
        warnings=tuple(warnings),
        no_events=no_events,
        launch=launch,
        until=until,
        # Each node of a launch may simulate another host: every one, once.
        simulated=", ".join(dict.fromkeys(event.simulated for event in started if event.simulated))
        or None,
        injected=tuple(dict.fromkeys(spec for event in started for spec in event.injected)),
        slices=tuple(slices),
        pids={event.rank: event.pid for event in started},
    )
    left_out = [folded.left_out for folded in ranks if folded.left_out is not None]
    return attrs.evolve(
        judged, root_cause=_run_root_cause(judged, left_out if world_size > 1 else [])
    )


def _watched(events: Sequence[Event]) -> tuple[tuple[int, int, int, int | None, str | None], ...]:
    """:attr:`FoldedRank.watched` of a rank's ``events``."""
    if not isinstance(events[0], RunStarted):
        return ()
    watching: dict[str, tuple[int, int]] = {}
    found: list[tuple[int, int, int, int | None, str | None]] = []
    for event in events:
        if isinstance(event, StepStarted):
            if isinstance(pid := event.attributes.get("pid"), int):
                watching[event.span_id] = (pid, event.wall_ns)
        elif isinstance(event, StepCrashed) and event.span_id in watching:
            pid, started_ns = watching[event.span_id]
            killed_by = None if event.signal is None else signal_name(event.signal)
            found.append((pid, started_ns, event.wall_ns, event.exit_code, killed_by))
    return tuple(found)


def _watched_processes(ranks: Sequence[FoldedRank]) -> dict[int, RankProcess]:
    """How the processes a rank started and watched ended, for the ranks
    those processes are: a step with a ``pid`` attribute that ended
    ``crashed`` saw that process end (a recorded engine's parent process
    watching its children), and the rank whose log that pid wrote, on the
    same host, is described with it."""
    ranks_by_pid = {
        (folded.started.host, folded.started.pid): folded.rank
        for folded in ranks
        if folded.started is not None
    }
    found: dict[int, RankProcess] = {}
    for folded in ranks:
        if folded.started is None:
            continue
        for pid, started_ns, ended_ns, exit_code, killed_by in folded.watched:
            watched = ranks_by_pid.get((folded.started.host, pid))
            if watched is None or watched == folded.rank or watched in found:
                continue
            identity = folded.state.identity
            role = identity.role if identity is not None else None
            found[watched] = RankProcess(
                rank=watched,
                pid=pid,
                started_wall_ns=started_ns,
                ended_wall_ns=ended_ns,
                exit_code=exit_code,
                signal=killed_by,
                observer=f"rank {folded.rank}" + (f", {role}" if role else ""),
            )
    return found


def _of_absent_nodes(no_events: Mapping[int, str], states: Mapping[int, RankState]) -> list[int]:
    """The ranks without events (no log) whose node has no log here, in a
    copy of another node than rank 0's (whose directory holds the whole run
    and its manifest once the ranks end together), when the logs present
    say how ranks make nodes (one local world size)."""
    identities = [state.identity for state in states.values() if state.identity is not None]
    sizes = {identity.local_world_size for identity in identities}
    if len(sizes) != 1 or (local := sizes.pop()) < 1:
        return []
    present = {identity.node_rank for identity in identities}
    if 0 in present:
        return []  # rank 0's node: a node without logs here did not write any
    return [
        rank for rank, why in no_events.items() if why == "no log" and rank // local not in present
    ]


def _run_root_cause(replay: Replay, left_out: Sequence[RootCause]) -> RootCause | None:
    """The rank to look at first (see :func:`replay`); a rank that went on
    without a collective step (``left_out``) when it left before any rank
    failed on its own."""
    states = replay.states
    processes = replay.launch.processes if replay.launch is not None else {}
    stopped = {rank for rank, process in processes.items() if process.stopped_by_launcher}
    # The launcher stops ranks only after one ended on its own: a stopped
    # rank whose log had already finished before then (a failed rank waiting
    # for its peers) was not failed by the stop.
    if ends := [
        process.ended_wall_ns
        for process in processes.values()
        if not process.stopped_by_launcher and process.ended_wall_ns
    ]:
        first_end = min(ends)
        stopped = {
            rank
            for rank in stopped
            if (state := states.get(rank)) is None
            or (finished := state.tracking.finished) is None
            or not state.finished
            or (finished.wall_ns or state.last_wall_ns) >= first_end
        }
    silent = [
        RootCause(
            rank=rank,
            step=None,
            exception=None,
            outcome=RunOutcome.INCOMPLETE,
            wall_ns=(processes[rank].ended_wall_ns or 0) if rank in processes else 0,
            seq=-1,
            no_events=why,
        )
        for rank, why in sorted(replay.no_events.items())
    ]
    # A rank still running (at the cutoff, or now) has nothing to blame yet.
    causes = [
        cause
        for state in states.values()
        if replay.outcome_of(state.rank) is not RunOutcome.RUNNING
        and (cause := state.root_cause) is not None
    ]
    if causes and left_out:
        # Its peers' failures are its doing if it left before they failed.
        gone = min(left_out, key=_first)
        if gone.wall_ns <= min(causes, key=_first).wall_ns:
            causes = [gone]
    for candidates in (
        [cause for cause in silent if cause.rank not in stopped and cause.no_events != ELSEWHERE],
        [cause for cause in causes if cause.rank not in stopped],
        causes,
        silent,
    ):
        # A rank that waited for another process when it stopped is not the
        # one that stopped the run.
        candidates = [
            c for c in candidates if not replay.waits_for_another(c.waiting)
        ] or candidates
        if not candidates:
            continue
        found = (
            candidates[0] if candidates[0].no_events is not None else min(candidates, key=_first)
        )
        process = processes.get(found.rank)
        return found if process is None else attrs.evolve(found, process=process)
    return None
